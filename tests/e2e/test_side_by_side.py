"""``check`` runs its runs side by side where the machine has room (commands/launcher.side_by_side,
commands/check/runs.py): the jobs really run at once, a stop signal reaches every one of them (one
started after the signal too), and the rule for when they may is the documented one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from torchrepro.commands.check.runs import SIDE_BY_SIDE_VAR, side_by_side_allowed
from torchrepro.commands.launcher import run_child, side_by_side

WAIT_FOR = """
import sys, time
from pathlib import Path
Path(sys.argv[1]).write_text("started")
deadline = time.monotonic() + 60
while not Path(sys.argv[2]).exists():  # the other job, which must be running at the same time
    if time.monotonic() > deadline:
        sys.exit(7)
    time.sleep(0.05)
"""

SLEEP = "import sys, time; from pathlib import Path; Path(sys.argv[1]).write_text('started'); time.sleep(120)"


def test_jobs_side_by_side_run_at_once(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    results = side_by_side(
        [
            lambda: run_child([sys.executable, "-c", WAIT_FOR, str(a), str(b)], tmp_path / "la", quiet=True),
            lambda: run_child([sys.executable, "-c", WAIT_FOR, str(b), str(a)], tmp_path / "lb", quiet=True),
        ]
    )
    assert [r.exit_code for r in results] == [0, 0]  # each saw the other's start while it waited


def test_a_stop_signal_reaches_every_job_side_by_side(tmp_path):
    started = [tmp_path / f"s{i}" for i in range(2)]
    late = threading.Event()

    def first() -> object:
        return run_child([sys.executable, "-c", SLEEP, str(started[0])], tmp_path / "l0", quiet=True)

    def second() -> object:
        late.wait(60)  # starts only after the signal was taken
        return run_child([sys.executable, "-c", SLEEP, str(started[1])], tmp_path / "l1", quiet=True)

    def stop_when_started() -> None:
        while not started[0].exists():
            threading.Event().wait(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # taken by side_by_side's handler in the main thread
        threading.Event().wait(0.5)
        late.set()

    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=stop_when_started, daemon=True).start()
    results = side_by_side([first, second])
    assert [r.stopped_by for r in results] == ["SIGTERM", "SIGTERM"]
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers put back


def test_an_error_in_one_call_is_raised_after_all_ended(tmp_path):
    ran = []

    def fails() -> None:
        raise ValueError("planted")

    with pytest.raises(ValueError, match="planted"):
        side_by_side([fails, lambda: ran.append(run_child([sys.executable, "-c", "pass"], tmp_path / "l", quiet=True))])
    assert ran and ran[0].exit_code == 0


@pytest.mark.parametrize("said, expected", [("0", False), ("1", True)])
def test_the_variable_decides_when_set(monkeypatch, said, expected):
    monkeypatch.setenv(SIDE_BY_SIDE_VAR, said)
    assert side_by_side_allowed(10_000) is expected


def test_without_the_variable_a_core_for_each_process(monkeypatch):
    monkeypatch.delenv(SIDE_BY_SIDE_VAR, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU this process could use
    cores = len(os.sched_getaffinity(0))
    assert side_by_side_allowed(cores) and not side_by_side_allowed(cores + 1)
    if any(Path("/dev").glob("nvidia[0-9]*")):
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
        assert not side_by_side_allowed(1)  # runs sharing a GPU could run out of its memory


# Two threads and a product large enough for OpenMP to split it: the runs' idle threads wait as told.
THREADED = """
import hashlib, os, sys
import torch
torch.manual_seed(0)
torch.set_num_threads(2)
model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(4):
    opt.zero_grad()
    model(torch.randn(512, 256)).square().mean().backward()
    opt.step()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
print("wait", os.environ.get("OMP_WAIT_POLICY"), "params", digest)
"""


def _said(run_dir: Path) -> tuple[dict, str]:
    """A check run's run.json and what its script printed."""
    return json.loads((run_dir / "run.json").read_text()), (run_dir / "logs" / "stdout.log").read_text().split()


@pytest.mark.parametrize(
    "users", [pytest.param(None, marks=pytest.mark.slow), "ACTIVE"]
)  # None: make test-slow, for time
def test_runs_side_by_side_let_idle_threads_sleep_unless_the_user_chose_and_train_bit_identically(tmp_path, users):
    """check's runs side by side get OMP_WAIT_POLICY=PASSIVE (said in run.json), unless the user
    set the variable; either way they train as a plain run does, bit for bit."""
    script = tmp_path / "threaded.py"
    script.write_text(THREADED)
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | {SIDE_BY_SIDE_VAR: "1"}
    if users:
        env["OMP_WAIT_POLICY"] = users
    plain = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True)
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "check", "--out", "out", str(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and "2 runs side by side" in proc.stdout + proc.stderr, proc.stderr[-2000:]
    notes = json.loads((tmp_path / "out" / "report.json").read_text())["determinism"]["notes"]
    shared = [n for n in notes if n.startswith("the runs ran side by side, 2 intra-op threads each on")]
    assert len(shared) == (2 * 2 > len(os.sched_getaffinity(0)))  # agreeing runs whose threads shared the cores
    expected_policy = users or "PASSIVE"
    for label in ("run-1", "run-2"):
        meta, printed = _said(tmp_path / "out" / label)
        assert meta.get("env_set") == (None if users else {"OMP_WAIT_POLICY": "PASSIVE"})
        assert printed[:2] == ["wait", expected_policy]
        assert printed[2:] == plain.stdout.split()[2:] and len(printed[3]) == 64  # the plain run's parameters
