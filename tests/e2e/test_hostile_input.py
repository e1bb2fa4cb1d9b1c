"""Bad input and hostile output, as a new user would try them: one line `torchrepro: error: ...`,
exit 2, no traceback, no user file overwritten or changed, and nothing from the script reaching
the terminal or an XML file raw. Real files, real processes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from torchrepro.cli import main
from torchrepro.eventlog.event_reader import read_events
from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import End, Header, Step

SCRIPTS = Path(__file__).parents[1] / "scripts"
SMALL = SCRIPTS / "train_small.py"


def torchrepro(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run(
        [sys.executable, "-m", "torchrepro", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def one_line_error(proc_or_err, code: int = 2) -> str:
    """The single error line (asserting exit ``code``, no traceback)."""
    if isinstance(proc_or_err, subprocess.CompletedProcess):
        assert proc_or_err.returncode == code, proc_or_err.stderr[-3000:]
        err = proc_or_err.stderr
    else:
        err = proc_or_err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("torchrepro: error: "), err[-3000:]
    return lines[0]


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def fake_run(
    path: Path, ranks: dict[str, int] | None = None, steps: list[dict] | None = None, script: str = "train.py"
) -> Path:
    """A stored run: ``rank-<folder>`` holding a log whose header says rank ``r``."""
    for folder, rank in (ranks or {"0": 0}).items():
        events = [
            Header(rank=rank, argv=[script]),
            *[
                Step(rank=rank, **s)
                for s in steps or [{"index": i, "loss": 1.0 / (i + 1), "time_s": 0.01} for i in range(3)]
            ],
            End(rank=rank, step=3),
        ]
        write_all(path / f"rank-{folder}" / "events.jsonl", events)
    (path / "run.json").write_text(json.dumps({"script": script, "world_size": len(ranks or {"0": 0})}))
    return path


def snapshot(directory: Path) -> dict[str, tuple]:
    return {
        str(p.relative_to(directory)): (p.stat().st_mode, p.stat().st_mtime_ns, None if p.is_dir() else p.read_bytes())
        for p in directory.rglob("*")
    }


# ---------------------------------------------------------------- files the user owns


def test_json_and_junit_never_replace_a_file_without_force(tmp_path):
    victim = tmp_path / "victim.py"
    victim.write_text(SMALL.read_text())
    victim.chmod(0o755)
    before = snapshot(tmp_path)
    for flag in ("--json", "--junit"):
        line = one_line_error(torchrepro("doctor", flag, victim, victim, cwd=tmp_path))
        assert "input" in line
    assert snapshot(tmp_path) == before
    run = fake_run(tmp_path / "run")
    mine = tmp_path / "mine.json"
    mine.write_text("keep")
    mine.chmod(0o640)
    line = one_line_error(torchrepro("report", run, "--json", mine, cwd=tmp_path))
    assert "--force" in line and mine.read_text() == "keep"
    proc = torchrepro("report", run, "--json", mine, "--force", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(mine.read_text())["schema"] == "torchrepro.doctor/1"
    assert stat.S_IMODE(mine.stat().st_mode) == 0o640  # the mode it had
    line = one_line_error(torchrepro("report", run, "--force", "--json", run / "rank-0" / "events.jsonl", cwd=tmp_path))
    assert "input" in line


def test_report_does_not_replace_the_stored_report(tmp_path, capsys):
    run = fake_run(tmp_path / "run")
    stored = run / "report.json"
    stored.write_text('{"stored": true}')
    assert cli(capsys, "report", run)[0] == 0
    assert stored.read_text() == '{"stored": true}'
    code, _, err = cli(capsys, "report", run, "--json", run / "report.again.json")  # inside the run read
    assert code == 2 and "input" in one_line_error(err) and not (run / "report.again.json").exists()
    assert cli(capsys, "report", run, "--json", tmp_path / "report.again.json")[0] == 0
    assert json.loads((tmp_path / "report.again.json").read_text())["schema"] == "torchrepro.doctor/1"
    assert stored.read_text() == '{"stored": true}'
    assert cli(capsys, "report", run, "--junit", tmp_path / "new" / "dir" / "out.xml")[0] == 0  # folders made
    ElementTree.parse(tmp_path / "new" / "dir" / "out.xml")


def test_run_into_an_existing_run_is_refused(tmp_path):
    run = tmp_path / "run"
    proc = torchrepro("run", "--out", run, SMALL, "--", "--epochs", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before = snapshot(run)
    line = one_line_error(torchrepro("run", "--out", run, SMALL, "--", "--epochs", "1", cwd=tmp_path))
    assert "already holds a run" in line
    assert snapshot(run) == before


def test_duplicate_rank_folders_are_an_input_error(tmp_path, capsys):
    run = fake_run(tmp_path / "run", ranks={"0": 0, "00": 0, "abc": 0, "1": 1})
    code, _, err = cli(capsys, "report", run)
    assert code == 2 and "rank 0 is logged twice" in one_line_error(err)


def test_cache_clear_leaves_files_it_does_not_recognise(tmp_path, capsys):
    from test_cache import fake_cache

    cache = fake_cache(tmp_path / "c")
    mine = cache / "ab" / "my_model.py"
    mine.write_text("my own code\n")
    code, out, _ = cli(capsys, "cache", "clear", cache, "--yes")
    assert code == 0
    assert mine.read_text() == "my own code\n"
    assert not (cache / "ab" / "cabc.so").exists()  # a real entry is gone
    assert "left alone: 1" in out and "ab/my_model.py" in out


# ---------------------------------------------------------------- one line, exit 2


def _bad_commands(tmp_path: Path) -> dict[str, list]:
    from test_cache import fake_cache

    run = fake_run(tmp_path / "run")
    regular = tmp_path / "regular"
    regular.write_text("x")
    (tmp_path / "dir").mkdir()
    notar = tmp_path / "warm.tar"
    notar.write_text("not a tar")
    return {
        "doctor --out /proc/x": ["doctor", "--out", "/proc/x", SMALL],
        "--out under a file": ["doctor", "--out", regular / "run", SMALL],
        "report --json DIR": ["report", run, "--json", tmp_path / "dir"],
        "report --junit /proc": ["report", run, "--junit", "/proc/x.xml"],
        "cache pack /proc": ["cache", "pack", "/proc/x.tar", "--from", fake_cache(tmp_path / "cache")],
        "cache pack zip": ["cache", "pack", tmp_path / "x.zip"],
        "--seed -1": ["doctor", "--seed", "-1", SMALL],
        "--cache-root FILE": ["doctor", "--cache-root", regular, SMALL],
        "--timeout 0": ["doctor", "--timeout", "0", SMALL],
        "--timeout nan": ["doctor", "--timeout", "nan", SMALL],
        "--rtol nan": ["diff", run, run, "--rtol", "nan"],
        "--atol nan": ["check", "--atol", "nan", SMALL],
        "--runs with --against": ["check", "--runs", "3", "--against", "eager", SMALL],
        "--warm-from non-tar": ["doctor", "--warm-from", notar, SMALL],
        "--nproc 0": ["check", "--nproc", "0", SMALL],
        "--older-than 7x": ["cache", "clear", tmp_path, "--older-than", "7x"],
        "--ranks -1": ["cache", "explain-miss", run, "--ranks", "-1", "0"],
        "--max-size 2X": ["cache", "unpack", notar, "--max-size", "2X"],
    }


@pytest.mark.parametrize(
    "case",
    [
        "doctor --out /proc/x",
        "--out under a file",
        "report --json DIR",
        "report --junit /proc",
        "cache pack /proc",
        "cache pack zip",
        "--seed -1",
        "--cache-root FILE",
        "--timeout 0",
        "--timeout nan",
        "--rtol nan",
        "--atol nan",
        "--runs with --against",
        "--warm-from non-tar",
        "--nproc 0",
        "--older-than 7x",
        "--ranks -1",
        "--max-size 2X",
    ],
)
def test_bad_input_is_one_line_and_creates_nothing(tmp_path, case):
    args = _bad_commands(tmp_path)[case]
    (tmp_path / "cwd").mkdir()
    proc = torchrepro(*args, cwd=tmp_path / "cwd")
    one_line_error(proc)
    assert not any((tmp_path / "cwd").iterdir()), "a run directory was created"


def test_wrong_typed_fields_and_missing_step_times(tmp_path, capsys):
    run = fake_run(tmp_path / "run", steps=[{"index": 0, "loss": 1.0}, {"index": 1, "loss": 0.5}])
    log = run / "rank-0" / "events.jsonl"
    lines = log.read_text().splitlines()
    lines.insert(2, json.dumps({"kind": "step", "index": 2, "loss": "0.3", "time_s": 0.1}))
    lines.insert(3, json.dumps({"kind": "compile", "compile_id": "0/0", "line": "twelve", "dynamo_s": [1]}))
    log.write_text("\n".join(lines) + "\n")
    code, out, err = cli(capsys, "report", run, "--json", tmp_path / "r.json")
    assert code == 0 and "Traceback" not in err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["steps"]["steps"] == 2 and len(report["run"]["problems"]) == 2
    assert "no step times" in out


def test_report_on_a_fifo_does_not_block(tmp_path):
    run = fake_run(tmp_path / "run", ranks={"0": 0, "1": 1})
    fifo = run / "rank-1" / "events.jsonl"
    fifo.unlink()
    os.mkfifo(fifo)
    proc = torchrepro("report", run, "--json", tmp_path / "r.json", cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stderr  # rank 1's log could not be read: the report covers rank 0 only
    report = json.loads((tmp_path / "r.json").read_text())
    assert any("not a regular file" in p for p in report["run"]["problems"])
    assert "RANKS_MISSING" in report["failing_findings"]


def test_diff_of_runs_of_different_scripts(tmp_path, capsys):
    a, b = fake_run(tmp_path / "a", script="one.py"), fake_run(tmp_path / "b", script="two.py")
    code, _, err = cli(capsys, "diff", a, b)
    assert code == 2 and "one.py" in one_line_error(err)


def test_torch_logs_nonsense_is_one_line_and_creates_no_run_dir(tmp_path):
    assert "TORCH_LOGS" in one_line_error(torchrepro("env", cwd=tmp_path, env={"TORCH_LOGS": "nonsense"}))
    one_line_error(torchrepro("doctor", SMALL, cwd=tmp_path, env={"TORCH_LOGS": "nonsense"}))
    assert not any(tmp_path.iterdir())


def test_env_shows_a_cache_dir_that_is_a_file_as_a_risk(tmp_path):
    cache = tmp_path / "cache"
    cache.write_text("x")
    proc = torchrepro("env", "--json", cwd=tmp_path, env={"TORCHINDUCTOR_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr
    entry = next(c for c in json.loads(proc.stdout)["caches"] if c["path"] == str(cache))
    assert any("not a directory" in r for r in entry["risks"])


# ---------------------------------------------------------------- output safety


HOSTILE = "\x1b[2J\x1b[H\x1b]0;pwned\x07 boom\x00\x9b"


def test_control_characters_from_the_script_never_reach_the_summary_or_junit(tmp_path):
    script = tmp_path / "evil.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(2, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model(torch.ones(1, 2)).sum().backward()\n"
        "opt.step()\n"
        f"raise RuntimeError({HOSTILE!r})\n"
    )
    junit = tmp_path / "out.xml"
    proc = torchrepro("doctor", "--out", tmp_path / "run", "--junit", junit, script, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "boom" in proc.stdout and "\\x1b[2J" in proc.stdout
    assert not any(c in proc.stdout for c in "\x1b\x07\x00\x9b")
    assert "Traceback (most recent call last)" not in proc.stderr.split("RuntimeError")[-1]
    raw = junit.read_bytes()
    assert not any(c in raw for c in b"\x1b\x07\x00")
    failures = [f.get("message") for f in ElementTree.parse(junit).iter("failure")]
    assert any("boom" in m for m in failures)


def test_a_terminal_that_cannot_encode_the_summary(tmp_path):
    proc = torchrepro(
        "doctor",
        "--out",
        tmp_path / "run",
        SCRIPTS / "long_train.py",
        "--",
        "--steps",
        "2",
        cwd=tmp_path,
        env={"PYTHONIOENCODING": "ascii"},
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "HEALTHY" in proc.stdout


UNHASHABLE_BATCHES = """
import torch
from torch.utils.data import DataLoader

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)

    def forward(self, x):
        x = torch.stack([t.sum(0) for t in x.unbind()]) if x.is_nested else x.to_dense()
        return self.lin(x).sum()

torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
rows = [torch.randn(n, 3) for n in (1, 2, 3, 4)]
loader = DataLoader(rows, batch_size=2, collate_fn=torch.nested.nested_tensor)  # nested batches
for x in loader:
    model(x).backward()
    opt.step()
    opt.zero_grad()
for _ in range(2):  # no DataLoader: the step's input is the module call's, a sparse tensor
    model(torch.eye(3).to_sparse()).backward()
    opt.step()
    opt.zero_grad()
"""


def test_batches_capture_cannot_hash_do_not_stop_capture(tmp_path):
    """Nested batches from a DataLoader and sparse inputs to the model have no row-major bytes to
    fingerprint: their steps are recorded with an "unhashable" batch, and capture goes on."""
    (tmp_path / "unhashable.py").write_text(UNHASHABLE_BATCHES)
    proc = torchrepro("run", "--out", "run", "unhashable.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [e.to_json() for e in read_events(tmp_path / "run" / "rank-0" / "events.jsonl").events]
    assert not [e for e in events if e["kind"] == "capability" and e["name"] == "capture_error"]
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 4 and all(s["loss"] is not None and s["batch_fp"] for s in steps)
    assert steps[0]["batch_fp"] == steps[1]["batch_fp"]  # both "unhashable"
