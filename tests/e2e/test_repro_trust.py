"""`torchrepro repro` on a run directory someone else made (a colleague's, a bug report's, a CI
artifact): every file it writes is created fresh (never through a link, never onto a file without
--force, never onto an input); the run's graph.py runs only with consent, announced with its path
and sha256, and never in torchrepro's own process; repro.py and --bisect end with documented exit
codes, a signal with 128+N and no verdict. Real files, processes, signals and owners (the command
in this process where no signal is sent: torch is imported once)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from test_hostile_input import cli, one_line_error, torchrepro
from torchrepro.capture.graph_probe import GraphProbe, _Call, save_graph

FOLDER = Path("rank-0") / "graphs" / "0_0-forward"


class Gelu(torch.nn.Module):
    def forward(self, x):
        return (torch.ops.aten.gelu.default(x),)


def _run(root: Path, code: str | None = None) -> Path:
    """A run directory holding one saved graph (aten.gelu of a 64 x 8 input), its graph.py
    replaced by ``code`` where given."""
    gm = torch.fx.symbolic_trace(Gelu())
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    call = _Call("0/0", "forward", lambda args: gm(*args), [x], torch.random.get_rng_state(), [])
    save_graph(root / FOLDER, gm, call, GraphProbe(compile_id="0/0", graph="forward", repeats=2, threads=1))
    if code is not None:
        (root / FOLDER / "graph.py").write_text(code)
    return root


def _state(directory: Path) -> dict[str, tuple]:
    """Every entry under ``directory`` as it is (links not followed, FIFOs not opened)."""
    out = {}
    for folder, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = Path(folder) / name
            st = path.lstat()
            body = (
                path.read_bytes()
                if path.is_file() and not path.is_symlink()
                else os.readlink(path)
                if path.is_symlink()
                else None
            )
            out[str(path.relative_to(directory))] = (st.st_mode, st.st_mtime_ns, body)
    return out


MARKER_CODE = """import os, sys, time
import torch
with open({marker!r}, "w") as fp:
    fp.write(f"{{os.getpid()}} {{os.getppid()}}")
{then}

class Graph(torch.nn.Module):
    def forward(self, x):
        return (torch.ops.aten.gelu.default(x),)
"""


@pytest.mark.parametrize(
    "planted",
    ["repro/graph.py -> FILE", "repro/repro.py -> FILE", "repro -> DIR", "repro is a file", "repro/ holds a FIFO"],
)
def test_repro_never_writes_through_a_link_and_refuses_a_folder_holding_one(tmp_path, capsys, planted):
    run = _run(tmp_path / "run")
    victims = tmp_path / "victims"
    victims.mkdir()
    (victims / "bashrc").write_text("the user's own file")
    if planted.startswith("repro/"):
        (run / "repro").mkdir()
        if "FIFO" in planted:
            os.mkfifo(run / "repro" / "x")
        else:
            (run / planted.split(" ")[0]).symlink_to(victims / "bashrc")
    elif planted == "repro -> DIR":
        (run / "repro").symlink_to(victims)
    else:
        (run / "repro").write_text("a file")
    before = _state(tmp_path)
    for force in ((), ("--force",)):
        code, out, err = cli(capsys, "repro", run, *force)
        line = one_line_error(err)
        assert (
            code == 2
            and not out
            and "run/repro" in line
            and ("link" in line or "not a directory" in line or "FIFO" in line)
        ), line
    assert _state(tmp_path) == before  # the victim and the run byte for byte as they were, nothing new


def test_out_is_never_written_onto_earlier_files_without_force_nor_onto_the_script(tmp_path, capsys):
    run = _run(tmp_path / "run")
    out = tmp_path / "out"
    assert cli(capsys, "repro", run, "--out", out)[0] == 0
    earlier = _state(out)
    code, _, err = cli(capsys, "repro", run, "--out", out)
    line = one_line_error(err)
    assert code == 2 and "already exists" in line and "--force" in line and _state(out) == earlier
    kept = tmp_path / "kept.py"
    os.link(out / "repro.py", kept)  # another name of the earlier repro.py: --force replaces the name only
    (out / "repro.py").write_text("edited by the user")
    assert cli(capsys, "repro", run, "--out", out, "--force")[0] == 0
    assert kept.read_text() == "edited by the user" and "def reproduce" in (out / "repro.py").read_text()
    # the training script in the folder written to: recorded in run.json, an input, --force or not
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "repro.py").write_text("# the user's training script\n")
    (run / "run.json").write_text(f'{{"script": "repro.py", "cwd": "{scripts}"}}')
    before = _state(scripts)
    code, _, err = cli(capsys, "repro", run, "--out", scripts, "--force")
    assert code == 2 and "is an input of this command" in one_line_error(err) and _state(scripts) == before


def test_a_missing_graph_or_inputs_writes_no_reproducer(tmp_path, capsys):
    for name in ("graph.py", "inputs.safetensors"):
        run = _run(tmp_path / name)
        (run / FOLDER / name).unlink()
        code, out, err = cli(capsys, "repro", run)
        line = one_line_error(err)
        assert code == 2 and f"{name}: missing: the saved graph is incomplete, no reproducer written" in line
        assert not (run / "repro").exists() and not out


def test_repro_announces_the_runs_code_and_never_runs_it_and_bisect_runs_it_in_a_child(tmp_path, capsys):
    marker = tmp_path / "ran"
    run = _run(tmp_path / "run", MARKER_CODE.format(marker=str(marker), then="raise SystemExit(0)"))
    code, out, _ = cli(capsys, "repro", run)
    sha = hashlib.sha256((run / FOLDER / "graph.py").read_bytes()).hexdigest()
    assert (
        code == 0 and f"/repro/graph.py is the run's code (sha256 {sha}): repro.py runs it, and so does --bisect" in out
    )
    assert not marker.exists()  # written, never run
    code, out, err = cli(capsys, "repro", run, "--out", tmp_path / "out", "--bisect")
    pid, parent = map(int, marker.read_text().split())
    assert pid != os.getpid() and parent == os.getpid()  # a process of its own, started by torchrepro
    line = one_line_error(err)  # graph.py ended its process before the bisection: it could not run
    assert code == 2 and "bisect: its process ended with exit code 0" in line and "bisect:" not in out


@pytest.mark.skipif(os.geteuid() != 0, reason="making a run directory another user owns needs root")
def test_bisect_of_another_users_run_needs_trust_run_dir(tmp_path, capsys):
    marker = tmp_path / "ran"
    run = _run(tmp_path / "run", MARKER_CODE.format(marker=str(marker), then="raise SystemExit(0)"))
    for folder, dirs, files in os.walk(run):
        for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            os.lchown(name, 65534, 65534)
    sha = hashlib.sha256((run / FOLDER / "graph.py").read_bytes()).hexdigest()
    code, _, err = cli(capsys, "repro", run, "--out", tmp_path / "out", "--bisect")
    line = one_line_error(err)
    assert code == 2 and "belongs to uid 65534, not to you" in line and sha in line and "--trust-run-dir" in line
    assert not marker.exists() and not (tmp_path / "out").exists()  # nothing ran, nothing written
    assert cli(capsys, "repro", run, "--out", tmp_path / "out")[0] == 0 and not marker.exists()  # nothing of it runs
    code, _, err = cli(capsys, "repro", run, "--out", tmp_path / "out2", "--bisect", "--trust-run-dir")
    assert code == 2 and marker.exists() and "bisect: its process ended" in one_line_error(err)


def test_bisect_of_a_run_others_may_write_needs_trust_run_dir(tmp_path, capsys):
    marker = tmp_path / "ran"
    run = _run(tmp_path / "run", MARKER_CODE.format(marker=str(marker), then="raise SystemExit(0)"))
    (run / FOLDER / "graph.py").chmod(0o666)
    code, _, err = cli(capsys, "repro", run, "--out", tmp_path / "out", "--bisect")
    line = one_line_error(err)
    assert code == 2 and "graph.py can be written by others: --bisect would run the run's code" in line
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGTERM,
        pytest.param(signal.SIGINT, marks=pytest.mark.slow),
        pytest.param(signal.SIGHUP, marks=pytest.mark.slow),
    ],
    ids=lambda s: s.name,
)
def test_a_signal_during_bisect_ends_it_with_128_plus_n_and_no_verdict(tmp_path, sig):
    marker = tmp_path / "ran"
    run = _run(tmp_path / "run", MARKER_CODE.format(marker=str(marker), then="time.sleep(300)"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchrepro", "repro", str(run), "--bisect"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists() or not marker.read_text():  # the bisection's process has started
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    child = int(marker.read_text().split()[0])
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig.value, err
    assert one_line_error(err, 128 + sig.value) == f"torchrepro: error: bisect: stopped by {sig.name}; no verdict"
    assert "bisect:" not in out
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:  # ended with torchrepro
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


CUSTOM_OP = """import torch

@torch.library.custom_op("reprotest::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2

@twice.register_fake
def _(x):
    return torch.empty_like(x)
"""


def _repro_py(script: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), "--runs", "2", *args],
        capture_output=True,
        text=True,
        cwd=script.parent,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def _op_run(tmp_path: Path, capsys) -> Path:
    """A reproducer of a graph that calls the custom op reprotest::twice, written by repro (which
    says the op is not registered here); its repro.py."""
    run = _run(
        tmp_path / "op",
        "import torch\n\nclass Graph(torch.nn.Module):\n    def forward(self, x):\n"
        "        return (torch.ops.reprotest.twice.default(x),)\n",
    )
    code, out, _ = cli(capsys, "repro", run, "--out", tmp_path / "out-op")
    assert code == 0 and "note: graph.py calls torch.ops.reprotest.twice, which this process has not registered" in out
    return tmp_path / "out-op" / "repro.py"


def test_repro_py_that_cannot_run_exits_2_in_one_line_naming_the_input_or_the_op(tmp_path, capsys):
    run = _run(tmp_path / "run")
    assert cli(capsys, "repro", run, "--out", tmp_path / "out")[0] == 0
    (tmp_path / "out" / "inputs.json").write_text('{"inputs": [{"kind": "tensor", "key": "input_0", "size": [NaN]')
    broken = _repro_py(tmp_path / "out" / "repro.py")
    assert broken.returncode == 2 and len(broken.stderr.strip().splitlines()) == 1, broken.stderr
    assert broken.stderr.startswith("repro.py: error: inputs.json: not JSON") and not broken.stdout
    op_script = _op_run(tmp_path, capsys)
    code, out, err = cli(capsys, "repro", tmp_path / "op", "--out", tmp_path / "out-bisect", "--bisect")
    line = one_line_error(err)  # the bisection's process names the op too
    assert code == 2 and line.startswith("torchrepro: error: bisect: graph.py: calls torch.ops.reprotest.twice")
    assert "--import MODULE" in line
    missing = _repro_py(op_script, "--backend", "eager")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    assert missing.stderr.startswith(
        "repro.py: error: graph.py: calls torch.ops.reprotest.twice, which this process has not registered: "
        "run with --import MODULE"
    )


@pytest.mark.slow
def test_repro_py_exits_0_when_compiled_matches_eager_1_when_it_differs_and_runs_a_registered_op(tmp_path, capsys):
    run = _run(tmp_path / "run")
    assert cli(capsys, "repro", run, "--out", tmp_path / "out")[0] == 0
    script = tmp_path / "out" / "repro.py"
    same = _repro_py(script, "--backend", "eager")
    assert same.returncode == 0 and "compiled vs eager: bit for bit the same" in same.stdout, same.stderr
    differs = _repro_py(script, "--backend", "aot_eager_decomp_partition")  # gelu's decomposition rounds otherwise
    assert differs.returncode == 1 and "COMPILED VS EAGER: DIFFERS" in differs.stdout, differs.stderr
    (tmp_path / "reprotest_ops.py").write_text(CUSTOM_OP)
    registered = _repro_py(
        _op_run(tmp_path, capsys), "--backend", "eager", "--import", "reprotest_ops", env={"PYTHONPATH": str(tmp_path)}
    )
    assert registered.returncode == 0, registered.stdout + registered.stderr


@pytest.mark.slow
def test_bisect_of_a_graph_that_matches_eager_everywhere_exits_1_naming_nothing(tmp_path):
    class AddOne(torch.nn.Module):
        def forward(self, x):
            return (torch.ops.aten.add.Tensor(x, 1.0),)

    gm = torch.fx.symbolic_trace(AddOne())
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    call = _Call("0/0", "forward", lambda args: gm(*args), [x], torch.random.get_rng_state(), [])
    save_graph(tmp_path / "run" / FOLDER, gm, call, GraphProbe(compile_id="0/0", graph="forward", threads=1))
    proc = torchrepro("repro", tmp_path / "run", "--bisect", cwd=tmp_path, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == (
        "bisect: the compiled graph matches eager bit for bit under every backend: nothing to name"
    )


def test_a_graph_that_differs_from_itself_run_to_run_is_written_but_not_bisected(tmp_path, capsys):
    run = _run(tmp_path / "run")
    meta = json.loads((run / FOLDER / "meta.json").read_text())
    (run / FOLDER / "meta.json").write_text(json.dumps({**meta, "repeats": 4, "runs_differing": 2, "differing": [0]}))
    code, out, err = cli(capsys, "repro", run, "--bisect", "--out", tmp_path / "out")
    assert code == 1, out + err  # nothing named
    assert out.splitlines()[-1] == (
        "compiled graph 0/0/forward differs from itself run to run (2 of 4 repeats differed when probed): not bisected"
    )
    assert (tmp_path / "out" / "repro.py").is_file()  # the reproducer is still written: it shows the race
