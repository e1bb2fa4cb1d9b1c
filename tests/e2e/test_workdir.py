"""Each run of check, drift and doctor --fixes starts from the same files: a fresh copy of the working
directory per run, or (in place) a file one run wrote and a later run read named before anything else
is blamed (torchrepro.commands.workdir)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import run_torchrepro

from torchrepro.commands.workdir import Ledger, fresh_workdir

SCRIPTS = Path(__file__).parents[1] / "scripts"
WRITE_OR_RESUME = (
    "import os, pathlib; p = pathlib.Path('snapshot.pt'); "
    "n = int(p.read_text()) if p.exists() else 0; p.write_text(str(n + 1)); print(n)"
)


def _run(where, code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=where.cwd, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_each_run_starts_from_a_fresh_copy(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("input")
    (tmp_path / "empty").mkdir()
    skipped_dirs = (".git", ".venv", "data/__pycache__", ".venv-py311", "envs/cuda")
    for skipped in skipped_dirs:  # never copied: version control, environments (by name or by content), caches
        (tmp_path / skipped).mkdir(parents=True)
        (tmp_path / skipped / "big").write_bytes(b"x" * 1000)
    (tmp_path / ".venv-py311" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "envs" / "cuda" / "conda-meta").mkdir()
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    ledger = Ledger()
    printed = []
    for label in ("run-1", "run-2"):
        with fresh_workdir(out / label, Path("s.py"), [], label, ledger, skip=[out]) as where:
            assert where.cwd == (out / label / "cwd").resolve()
            assert (where.cwd / "data" / "x.txt").read_text() == "input" and (where.cwd / "empty").is_dir()
            assert not (where.cwd / "out").exists()  # the command's own output is not copied
            assert not any((where.cwd / d).exists() for d in skipped_dirs) and (where.cwd / "envs").is_dir()
            printed.append(_run(where, WRITE_OR_RESUME))
        assert not where.cwd.exists()  # removed once the run ended
        assert where.record() == {"mode": "copy", "copied_bytes": 5, "wrote_in_copy": ["snapshot.pt"]}
    assert printed == ["0", "0"]  # neither run resumed from the other's file
    assert not (tmp_path / "snapshot.pt").exists() and ledger.crossings == []


def test_in_place_a_file_one_run_wrote_and_the_next_read_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHREPRO_WORKDIR", "shared")
    ledger = Ledger()
    for label in ("run-1", "run-2", "run-3"):
        with fresh_workdir(tmp_path / "out" / label, Path("s.py"), [], label, ledger) as where:
            assert where.cwd is None and where.why_shared == "TORCHREPRO_WORKDIR=shared"
            code = WRITE_OR_RESUME if label != "run-3" else "open('other.txt', 'w').write('x')"
            _run(where, code)
        assert where.record()["wrote_shared"] == (["snapshot.pt"] if label != "run-3" else ["other.txt"])
    assert [(c.path, c.wrote, c.read) for c in ledger.crossings] == [("snapshot.pt", "run-1", "run-2")]


@contextlib.contextmanager
def _special_files(where: Path) -> Iterator[None]:
    """A FIFO and a bound Unix socket (its listener open while the block runs) in ``where``."""
    os.mkfifo(where / "pipe")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(where / "sock"))
        listener.listen()
        yield


NOT_COPIED = ["pipe (a FIFO)", "sock (a socket)"]


def test_special_files_are_neither_copied_nor_watched(tmp_path, monkeypatch, capsys):
    (tmp_path / "data.txt").write_text("input")
    monkeypatch.chdir(tmp_path)
    with _special_files(tmp_path):
        ledger = Ledger()
        for label in ("run-1", "run-2"):
            with fresh_workdir(
                tmp_path / "out" / label, Path("s.py"), [], label, ledger, skip=[tmp_path / "out"]
            ) as where:
                assert where.cwd is not None and sorted(p.name for p in where.cwd.iterdir()) == ["data.txt"]
                _run(where, "open('made.txt', 'w').write('x')")
            assert where.record() == {
                "mode": "copy",
                "copied_bytes": 5,
                "not_copied": NOT_COPIED,
                "wrote_in_copy": ["made.txt"],
            }
    warnings = [line for line in capsys.readouterr().err.splitlines() if "not copied" in line]
    assert warnings == [  # once for the command, not once per run
        "torchrepro: warning: not copied into the runs' working directories: pipe (a FIFO), sock (a socket): "
        "special files are not copied (a run that opens one there finds it missing)"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["check", "compare"])
def test_check_and_compare_beside_a_fifo_and_a_socket(tmp_path, command):
    (tmp_path / "train.py").write_text((SCRIPTS / "deterministic.py").read_text())
    argv = ["check", "--runs", "2"] if command == "check" else ["compare"]
    argv += ["--out", "out", "train.py"] + (["::", "train.py"] if command == "compare" else [])
    with _special_files(tmp_path):
        proc = run_torchrepro(*argv, cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.startswith("BIT-EXACT" if command == "check" else "EQUIVALENT"), proc.stdout
    assert proc.stderr.count("torchrepro: warning: not copied into the runs' working directories: pipe (a FIFO)") == 1
    for run in ("run-1", "run-2") if command == "check" else ("a-1", "a-2", "b"):
        assert json.loads((tmp_path / "out" / run / "run.json").read_text())["workdir"]["not_copied"] == NOT_COPIED


def test_a_relative_path_outside_the_working_directory_runs_in_place(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    with fresh_workdir(tmp_path / "work" / "out", Path("s.py"), ["--data=../data"], "run-1") as where:
        assert where.cwd is None and "'../data'" in (where.why_shared or "")
    with fresh_workdir(tmp_path / "work" / "out", Path("s.py"), ["--data", "data2"], "run-1") as where:
        assert where.cwd is not None  # a relative path that does not exist is the script's to write


SLOW_UNSEEDED = """
import time, torch
w = torch.zeros(4, requires_grad=True)
for step in range(8):
    loss = ((w - torch.randn(4)) ** 2).sum()
    loss.backward()
    with torch.no_grad():
        w -= 0.1 * w.grad
    w.grad = None
    time.sleep(0.3)
"""


@pytest.mark.parametrize(
    ("mode", "writer"),
    [("copy", "redirect"), pytest.param("shared", "tee", marks=pytest.mark.slow)]
    + [pytest.param("copy", "tee", marks=pytest.mark.slow)]
    + [pytest.param("shared", "redirect", marks=pytest.mark.slow)],
)
def test_a_log_of_torchrepros_output_in_the_working_directory_is_no_runs_file(tmp_path, mode, writer):
    """``torchrepro check ... > check.log 2>&1`` (or ``2>&1 | tee check.log``) in the script's
    directory, the log read while it grows (``tail -f``): torchrepro (or tee) writes it, not a run, so
    it is neither copied nor watched, and the runs of an unseeded script differ for want of a seed
    (the log was named as a file one run wrote and the next read, and the seeding never looked at)."""
    (tmp_path / "slow.py").write_text(SLOW_UNSEEDED)
    log = tmp_path / "check.log"
    log.touch()
    stop = threading.Event()

    def tail() -> None:
        while not stop.is_set():
            log.read_bytes()
            time.sleep(0.05)

    reader = threading.Thread(target=tail)
    reader.start()
    env = {"TORCHREPRO_PROGRESS_S": "0.5", **({"TORCHREPRO_WORKDIR": "shared"} if mode == "shared" else {})}
    argv = ("check", "--out", "out", "--no-localize", "--no-fixes", "slow.py")
    try:
        if writer == "redirect":
            returncode = run_torchrepro(*argv, cwd=tmp_path, env=env, log=log).returncode
        else:
            command = [sys.executable, "-m", "torchrepro", *argv]
            check = subprocess.Popen(
                command, cwd=tmp_path, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            tee = subprocess.Popen(["tee", str(log)], stdin=check.stdout, stdout=subprocess.DEVNULL)
            assert check.stdout is not None
            check.stdout.close()
            returncode = check.wait(timeout=600)
            tee.wait(timeout=60)
    finally:
        stop.set()
        reader.join()
    text = log.read_text()
    assert returncode == 1, text
    cause = json.loads((tmp_path / "out" / "report.json").read_text())["determinism"]["first_divergence"]["cause"]
    assert cause == "rng", text
    assert text.count("· run-") >= 2  # the log was written while the runs went on
    for run in ("run-1", "run-2"):
        workdir = json.loads((tmp_path / "out" / run / "run.json").read_text())["workdir"]
        assert workdir["mode"] == mode and "wrote_shared" not in workdir, workdir


def _check(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    proc = run_torchrepro("check", "--out", "check", "--no-localize", *args, cwd=tmp_path, env=env)
    report = json.loads((tmp_path / "check" / "report.json").read_text()) if proc.returncode in (0, 1) else {}
    return proc, report


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_check_of_a_script_resuming_from_its_own_snapshot(tmp_path):
    """Run 2 in run 1's directory would resume from run 1's snapshot.pt (fewer steps, other batches): each
    run in its own copy, they agree; in place, the file is named, never the data order."""
    script = tmp_path / "own_snapshot.py"
    script.write_text((SCRIPTS / "own_snapshot.py").read_text())
    proc, report = _check(tmp_path, "own_snapshot.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["determinism"]["verdict"] == "bit_exact" and report["determinism"]["steps_compared"] == 6
    assert not (tmp_path / "snapshot.pt").exists()  # the user's directory is left as it was
    assert any("run-1 wrote snapshot.pt" in n for n in report["determinism"]["notes"])
    run = json.loads((tmp_path / "check" / "run-2" / "run.json").read_text())
    assert run["workdir"]["mode"] == "copy" and run["workdir"]["wrote_in_copy"] == ["snapshot.pt"]

    (tmp_path / "check").rename(tmp_path / "copied")
    proc, report = _check(tmp_path, "own_snapshot.py", env={"TORCHREPRO_WORKDIR": "shared"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fd = report["determinism"]["first_divergence"]
    assert fd["cause"] == "shared_files" and fd["evidence"]["files"] == [
        {"path": "snapshot.pt", "written_by": "run-1", "read_by": "run-2"}
    ]
    assert "run-1 wrote snapshot.pt in the working directory, run-2 read it" in " ".join(proc.stdout.split())
    assert report["findings"][0]["code"] == "DIVERGED_SHARED_FILES" and "data pipeline" not in proc.stdout


@pytest.mark.slow
def test_check_of_the_ddp_tutorial_on_two_ranks(tmp_path):
    """The DDP tutorial's checkpoint-resume (tests/scripts/ddp_snapshot_resume.py) on gloo, 2 ranks."""
    (tmp_path / "ddp.py").write_text((SCRIPTS / "ddp_snapshot_resume.py").read_text())
    args = ("--seed", "0", "--nproc", "2", "ddp.py", "3", "1", "--size", "64", "--batch_size", "8")
    proc, report = _check(tmp_path, *args)
    assert proc.returncode == 0 and report["determinism"]["steps_compared"] == 12, proc.stdout + proc.stderr
    (tmp_path / "check").rename(tmp_path / "copied")
    proc, report = _check(tmp_path, *args, env={"TORCHREPRO_WORKDIR": "shared"})
    assert report["determinism"]["first_divergence"]["cause"] == "shared_files", proc.stdout + proc.stderr
