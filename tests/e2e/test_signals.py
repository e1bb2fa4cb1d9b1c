"""Signals to `torchrepro` and processes a script leaves behind: the whole job is stopped, the run
recorded as stopped and reported, and nothing outlives torchrepro (real processes, real signals)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torchrepro.eventlog.event_reader import read_events

SCRIPTS = Path(__file__).parents[1] / "scripts"
LONG = SCRIPTS / "long_train.py"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _events(run_dir: Path) -> list[list[dict]]:
    return [[e.to_json() for e in read_events(p).events] for p in sorted(run_dir.glob("rank-*/events.jsonl"))]


def _start(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torchrepro", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_steps(run_dir: Path, ranks: int, steps: int = 3, timeout: float = 240) -> list[int]:
    """The ranks' pids once each has recorded ``steps`` steps."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = _events(run_dir) if run_dir.is_dir() else []
        counts = [sum(e["kind"] == "step" for e in log) for log in logs]
        if len(counts) == ranks and min(counts) >= steps:
            return [log[0]["pid"] for log in logs]
        time.sleep(0.2)
    raise AssertionError(f"the ranks did not reach step {steps}")


def _children(pid: int) -> list[int]:
    """The children of ``pid`` but its guardian (commands/_guardian.py, which is no part of the job)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    children = [int(x) for x in path.read_text().split()] if path.exists() else []
    return [c for c in children if not _is_guardian(c)]


def _is_guardian(pid: int) -> bool:
    try:
        return any(arg.endswith(b"/_guardian.py") for arg in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"))
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_stop_signal_stops_the_job_and_writes_the_report(tmp_path, sig):
    run_dir = tmp_path / "run"
    proc = _start(tmp_path, "doctor", "--out", str(run_dir), str(LONG))
    [rank_pid] = _wait_for_steps(run_dir, 1)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    assert not _alive(rank_pid), "the training kept running after torchrepro exited"
    end = _events(run_dir)[0][-1]
    assert end["kind"] == "end" and end["status"] == "terminated" and end["exit_code"] == -sig
    report = json.loads((run_dir / "report.json").read_text())
    assert report["run"]["stopped_by"] == sig.name and report["run"]["failed"]
    assert not report["verdict"].startswith("HEALTHY")
    assert any(f["code"] == "RUN_STOPPED" for f in report["findings"])
    assert "another rank" not in json.dumps(report["findings"]).lower()


def test_sigint_single_process_is_not_blamed_on_another_rank(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(tmp_path, "doctor", "--out", str(run_dir), str(LONG))
    _wait_for_steps(run_dir, 1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    report = subprocess.run(
        [sys.executable, "-m", "torchrepro", "report", str(run_dir)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert "another rank" not in (report.stdout + report.stderr).lower()
    assert "SIGINT" in report.stdout


# fails at step 2; the launcher's SIGTERM (torchrun stopping the ranks that outlive a failed one)
# arrives while torchrepro writes the end record of that failure
FAILS_AS_STOPPED = """
import os, signal, torch
from torchrepro import _state
w = torch.nn.Parameter(torch.ones(2))
opt = torch.optim.SGD([w], lr=0.1)
for step in range(3):
    loss = (w ** 2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
steps = _state.session().steps
flush = steps.flush
def signalled_flush():
    os.kill(os.getpid(), signal.SIGTERM)
    flush()
steps.flush = signalled_flush
raise RuntimeError("the collective failed: a peer is gone")
"""


def test_a_stop_signal_while_the_end_record_is_written_waits_for_it(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(FAILS_AS_STOPPED)
    run_dir = tmp_path / "run"
    proc = _start(tmp_path, "doctor", "--out", str(run_dir), str(script))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    end = _events(run_dir)[0][-1]
    assert end["kind"] == "end" and end["status"] == "error" and "peer is gone" in end["error"]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["run"]["ranks"]["0"]["status"] == "error"
    codes = {f["code"] for f in report["findings"]}
    assert "SCRIPT_FAILED" in codes and not codes & {"RANK_CRASHED", "RANK_TERMINATED"}


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_a_job_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(tmp_path, "doctor", "--out", str(run_dir), str(LONG), "--", "--ignore-term")
    [rank_pid] = _wait_for_steps(run_dir, 1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert not _alive(rank_pid)
    report = json.loads((run_dir / "report.json").read_text())
    assert report["run"]["rank_exit_codes"] == {} or report["run"]["exit_code"] == -signal.SIGKILL
    assert report["run"]["ranks"]["0"]["status"] != "ok"


@pytest.mark.slow  # a 2-rank torchrun job: make test-slow
def test_sigterm_stops_torchrun_and_both_ranks(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(tmp_path, "doctor", "--nproc", "2", "--out", str(run_dir), str(LONG), "--", "--ranks")
    rank_pids = _wait_for_steps(run_dir, 2)
    [torchrun] = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err[-2000:]
    assert not any(_alive(p) for p in [torchrun, *rank_pids])
    report = json.loads((run_dir / "report.json").read_text())
    assert report["run"]["stopped_by"] == "SIGTERM"
    assert {r["status"] for r in report["run"]["ranks"].values()} != {"ok"}


def test_a_subprocess_of_the_script_does_not_outlive_torchrepro(tmp_path):
    pid_file = tmp_path / "sleep.pid"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchrepro",
            "doctor",
            "--out",
            str(tmp_path / "run"),
            str(LONG),
            "--",
            "--steps",
            "2",
            "--spawn",
            str(pid_file),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    sleeper = int(pid_file.read_text())
    assert not _alive(sleeper), "sleep 123 outlived torchrepro"


def test_sigterm_during_check_ends_the_check(tmp_path):
    out = tmp_path / "check"
    proc = _start(tmp_path, "check", "--out", str(out), str(LONG))
    _wait_for_steps(out / "run-1", 1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1].startswith("torchrepro: error: run-1: stopped by SIGTERM")
    for run in ("run-1", "run-2"):  # run-2 ran beside run-1 where the cores allow, and was stopped with it
        if run == "run-1" or (out / run).exists():
            assert json.loads((out / run / "run.json").read_text())["stopped_by"] == "SIGTERM"
