"""SIGINT, SIGTERM and SIGHUP to torchrepro in its long phases (doctor --fixes' fix runs, drift's
runs, between check's runs) are handled alike: one line on stderr, exit 128 + N, what finished
written and marked partial, no process left (real processes, real signals)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from torchrepro.eventlog.event_reader import read_events, read_header

from test_faults import _gone_within, _torchrepro

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux (/proc)")

# recompiles twice (an int attribute of the model) in a fast baseline; the run of the fix for it
# (allow_unspec_int_on_nn_module, which the script reads back) is slow: it is the one stopped
INT_ATTR = """
import time, torch, torch._dynamo
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.k = 0
    def forward(self, x):
        return self.lin(x) * self.k
model = M()
fast = torch.compile(model, backend="eager")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
slow = torch._dynamo.config.allow_unspec_int_on_nn_module
for step in range(8):
    model.k = min(step, 2)
    loss = fast(torch.ones(2, 4)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(5.0 if slow else 0.01)
"""
FIX = "allow_unspec_int_on_nn_module"

# the first run to start (no marker yet) ends at once with its metric; every later one loops
FIRST_FAST = """
import os, sys, time, torch, torchrepro
marker = sys.argv[1]
first = not os.path.exists(marker)
open(marker, "a").close()
w = torch.nn.Parameter(torch.ones(2))
opt = torch.optim.SGD([w], lr=0.1)
for step in range(2 if first else 300):
    loss = (w ** 2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0 if first else 0.2)
torchrepro.log_metric("m", float(loss))
"""


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children of any of its threads), but torchrepro's guardian,
    which is no part of any job."""
    parents = {}
    for entry in os.listdir("/proc"):
        try:
            parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if b"_guardian.py" in cmdline:
            del parents[int(entry)]
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        found += children
        todo += children
    return found


def _first_step_pid(log: Path, proc: subprocess.Popen, timeout: float = 240) -> int:
    """The pid of the rank writing ``log`` once it has recorded a step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if log.exists():
            events = [e.to_json() for e in read_events(log).events]
            if any(e["kind"] == "step" for e in events):
                return events[0]["pid"]
        time.sleep(0.2)
    raise AssertionError(f"no step in {log}")


def _stopped_cleanly(proc: subprocess.Popen, sig: signal.Signals, pids: list[int]) -> str:
    """torchrepro's stderr once ``sig`` stopped it: exit 128 + N, its last line the one error line."""
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    for pid in pids:
        assert _gone_within(pid, 5), f"process {pid} outlived torchrepro"
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "sig",
    # ~8 s of CPU each, all in make test-slow: the fix runs stop alike whatever the stop signal (a stop
    # signal to doctor's own run, SIGTERM and SIGHUP, is in make test: test_signals.py)
    [pytest.param(s, marks=pytest.mark.slow) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)],
    ids=lambda s: s.name,
)
def test_a_stop_signal_during_doctor_fixes_ends_the_fix_runs_and_writes_what_finished(tmp_path, sig):
    script = tmp_path / "int_attr.py"
    script.write_text(INT_ATTR)
    out = tmp_path / "run"
    proc = _torchrepro(tmp_path, "doctor", "--fixes", "--only-fixes", FIX, "--out", str(out), str(script))
    rank = _first_step_pid(out / "fixes" / FIX / "rank-0" / "events.jsonl", proc)
    job = _descendants(proc.pid)
    assert rank in job
    proc.send_signal(sig)
    last = _stopped_cleanly(proc, sig, job)
    assert last.startswith(f"torchrepro: error: doctor --fixes: stopped by {sig.name} after 0 of 1 fix run(s)"), last
    meta = json.loads((out / "fixes" / FIX / "run.json").read_text())
    assert "ended" in meta and meta["stopped_by"] == sig.name  # recorded, and run again next time
    stored = json.loads((out / "fixes" / "compile_fixes.json").read_text())
    assert stored["partial"] is True and stored["compile_fix_note"].startswith(f"partial: stopped by {sig.name}")
    report = json.loads((out / "report.json").read_text())
    assert report["compile_fix_note"] == stored["compile_fix_note"]
    assert report["compile_fix_recommended"] is None


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_a_stop_signal_during_drift_ends_its_runs_and_writes_a_partial_report(tmp_path):
    script = tmp_path / "first_fast.py"
    script.write_text(FIRST_FAST)
    exp = tmp_path / "exp"
    args = ["drift", "--vary", "init", "--runs", "2", "--jobs", "1", "--metric", "m", "--out", str(exp)]
    proc = _torchrepro(tmp_path, *args, str(script), "--", str(tmp_path / "marker"))
    deadline = time.monotonic() + 240
    while not (records := list(exp.glob("runs/*/drift-run.json"))):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    while not (slow := [p for p in exp.glob("runs/*") if p.is_dir() and p != records[0].parent]):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    while (header := read_header(slow[0] / "rank-0" / "events.jsonl")) is None:  # the run's capture started
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    rank = header.pid
    job = _descendants(proc.pid)
    assert rank in job
    proc.send_signal(signal.SIGHUP)
    last = _stopped_cleanly(proc, signal.SIGHUP, job)
    assert last == (
        f"torchrepro: error: drift: stopped by SIGHUP; finished runs are kept in {exp} "
        f"(partial report: {exp / 'report.json'}): run the same command again to go on"
    )
    report = json.loads((exp / "report.json").read_text())
    assert report["drift"]["notes"][0] == (
        "partial: stopped by SIGHUP after 1 of 2 runs; the same command again runs the others"
    )
    assert not (slow[0] / "drift-run.json").exists()  # no record: it runs again next time


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_with_no_job_running_ends_the_command_with_one_line(tmp_path, sig):
    # `watch` of a run that never ends starts no job: the signal ends it where it is, as between two runs
    (tmp_path / "run").mkdir()
    proc = _torchrepro(tmp_path, "watch", "--interval", "0.2", "run")
    time.sleep(3)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(sig)
    assert _stopped_cleanly(proc, sig, []) == f"torchrepro: error: stopped by {sig.name}"
