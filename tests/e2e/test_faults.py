"""Faults of torchrepro itself, with real processes and real signals: a supervisor killed with
SIGKILL takes its job with it and its run reads as interrupted; one writer per run directory (a
lock the kernel drops when its holder dies); what the script starts in a session of its own ends
with the job, and with a SIGKILLed torchrepro (its guardian ends it); a drift cell whose process was killed runs again on resume; a stored run stopped by
a signal is reported with the run's outcome, not as if ``report`` had been signalled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchrepro.commands.launcher import run_child
from torchrepro.errors import InputError
from torchrepro.eventlog.rundir import LOCK_FILE, claim_run_dir, release_run_dir
from torchrepro.eventlog.event_reader import read_events

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux (/proc, prctl)")

LOOP = """
import sys, time, torch
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 600):
    loss = model(torch.ones(3, 4)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.1)
"""

# leaves two `sleep 600` that run no Python, out of the job's process group and session: one started
# with start_new_session=True, one double-forked by a shell (`setsid` in a background job whose shell
# exits at once); trains argv[2] steps, writes "PID PID" to argv[1]-<its pid>, then sleeps argv[3] s
LEAVES = """
import os, subprocess, sys, time, torch
from pathlib import Path
out = Path(sys.argv[1])
own = subprocess.Popen(["sleep", "600"], start_new_session=True)
daemon = out.with_name(f"{out.name}.daemon-{os.getpid()}")
subprocess.run(["sh", "-c", 'setsid sh -c \\'echo $$ > "$0"; exec sleep 600\\' "$0" &', str(daemon)], check=True)
while not (daemon.exists() and daemon.read_text().endswith("\\n")):
    time.sleep(0.05)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(int(sys.argv[2])):
    loss = model(torch.ones(3, 4)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.1)
done = out.with_name(f"{out.name}.tmp-{os.getpid()}")
done.write_text(f"{own.pid} {daemon.read_text().strip()}")
done.rename(out.with_name(f"{out.name}-{os.getpid()}"))
time.sleep(float(sys.argv[3]))
"""

# the first process to run it (no marker yet) kills itself with SIGKILL after one step
KILLED_ONCE = """
import os, signal, sys
import torch, torchrepro
marker = sys.argv[1]
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.ones(2, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
torchrepro.log_metric("m", float(loss))
"""


def _start_time(pid: int) -> int | None:
    """The start time of a running process (None when it is gone or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def _alive(pid: int, start: int | None = None) -> bool:
    """Whether ``pid`` runs (and is the process that started at ``start``, when given)."""
    now = _start_time(pid)
    return now is not None and start in (None, now)


def _gone_within(pid: int, seconds: float, start: int | None = None) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid, start):
            return True
        time.sleep(0.1)
    return False


def _guardian_of(pid: int) -> int:
    """The guardian torchrepro ``pid`` started (its child running ``_guardian.py``), read from /proc."""
    for entry in os.listdir("/proc"):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and any(arg.endswith(b"/_guardian.py") for arg in cmdline):
            return int(entry)
    raise AssertionError(f"torchrepro (pid {pid}) has no guardian")


def _left_behind(tmp_path: Path, runs: int, torchrepro: subprocess.Popen) -> dict[int, int]:
    """The processes each of ``runs`` runs of LEAVES left behind and the run itself, pid -> start
    time, once every run has written them."""
    deadline = time.monotonic() + 240
    while len(files := list(tmp_path.glob("pids-[0-9]*"))) < runs:
        assert time.monotonic() < deadline and torchrepro.poll() is None, torchrepro.communicate()
        time.sleep(0.2)
    pids = [int(pid) for f in files for pid in (*f.read_text().split(), f.name.rsplit("-", 1)[1])]
    started = {pid: _start_time(pid) for pid in pids}
    assert None not in started.values(), started
    return started  # type: ignore[return-value]


def _torchrepro(cwd: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torchrepro", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "400"},  # one line per finding
    )


def _rank_pid_after_steps(run_dir: Path, steps: int, timeout: float = 240) -> int:
    """Rank 0's pid once it has recorded ``steps`` steps."""
    log = run_dir / "rank-0" / "events.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists():
            events = [e.to_json() for e in read_events(log).events]
            if sum(e["kind"] == "step" for e in events) >= steps:
                return events[0]["pid"]
        time.sleep(0.2)
    raise AssertionError(f"rank 0 did not reach step {steps}")


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_supervisor_killed_with_sigkill_takes_the_job_with_it_and_reads_interrupted(tmp_path):
    script = _script(tmp_path, "loop.py", LOOP)
    doctor = _torchrepro(tmp_path, "doctor", "--out", "run", str(script))
    rank = _rank_pid_after_steps(tmp_path / "run", 3)
    os.kill(doctor.pid, signal.SIGKILL)
    doctor.communicate()
    assert _gone_within(rank, 5), "the training child outlived its supervisor"
    report = subprocess.run(
        [sys.executable, "-m", "torchrepro", "report", "run", "--json", "r.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert report.returncode == 3, report.stderr
    said = f"interrupted: torchrepro's supervisor (pid {doctor.pid}) ended without recording the end of the job"
    assert said in report.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["verdict"].startswith("INTERRUPTED")
    finding = next(f for f in data["findings"] if f["code"] == "RUN_INTERRUPTED")
    last = data["run"]["ranks"]["0"]["last_step"]
    assert last >= 2 and finding["title"].endswith(f"last step seen: {last}")


def test_two_doctors_on_one_out_one_runs_the_other_names_it(tmp_path):
    script = _script(tmp_path, "loop.py", LOOP)
    first, second = (_torchrepro(tmp_path, "doctor", "--out", "same", str(script), "--", "5") for _ in range(2))
    results = {p.pid: (p.wait(timeout=240), p.communicate()) for p in (first, second)}
    codes = sorted(code for code, _ in results.values())
    assert codes == [0, 2], results
    loser = next(pid for pid, (code, _) in results.items() if code == 2)
    winner = next(pid for pid in results if pid != loser)
    err = results[loser][1][1].strip().splitlines()
    assert err == [f"torchrepro: error: same is being written by another torchrepro (pid {winner}): wait for it to end"]
    assert (tmp_path / "same" / "report.json").is_file()


def test_a_lock_held_by_a_killed_process_does_not_block_the_next_writer(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from torchrepro.eventlog.rundir import claim_run_dir; "
            "claim_run_dir(Path(sys.argv[1])); print('held', flush=True); time.sleep(300)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(InputError, match=f"pid {holder.pid}"):
        claim_run_dir(out, fresh=False)
    holder.kill()
    holder.wait()
    holder.stdout.close()
    assert claim_run_dir(out, fresh=False) == out
    assert (out / LOCK_FILE).read_text().strip() == str(os.getpid())
    release_run_dir(out)


def test_processes_the_script_leaves_in_other_sessions_end_with_the_job_and_the_guardian_with_torchrepro(tmp_path):
    script = _script(tmp_path, "leaves.py", LEAVES)
    doctor = _torchrepro(tmp_path, "doctor", "--out", "run", str(script), "--", str(tmp_path / "pids"), "5", "1")
    left = _left_behind(tmp_path, 1, doctor)
    guardian = _guardian_of(doctor.pid)
    started = _start_time(guardian)
    out, err = doctor.communicate(timeout=240)
    assert doctor.returncode == 0, err  # the job's own run is as without a guardian
    assert "HEALTHY" in out
    for pid, start in left.items():
        assert _gone_within(pid, 2, start), f"process {pid} outlived the job"
    assert _gone_within(guardian, 5, started), "the guardian outlived torchrepro"


def test_a_daemon_the_job_double_forks_ends_with_the_job_while_torchrepro_runs_on(tmp_path):
    # the daemon's parent (a subshell) exits at once: the job's first process adopts it (a child
    # subreaper), so the launcher sees it and ends it with the job, not only the guardian at the end
    pid_file = tmp_path / "daemon.pid"
    cmd = ["sh", "-c", '(setsid sh -c \'echo $$ > "$0"; exec sleep 600\' "$0" &); sleep 1', str(pid_file)]
    assert run_child(cmd, tmp_path / "logs", quiet=True).exit_code == 0
    assert _gone_within(int(pid_file.read_text()), 2), "the double-forked daemon outlived its job"


def test_a_guardian_killed_is_replaced_at_the_next_job(tmp_path):
    # this process stands for torchrepro: its first job starts its guardian, which runs on between jobs
    assert run_child(["true"], tmp_path / "a", quiet=True).exit_code == 0
    first = _guardian_of(os.getpid())
    os.kill(first, signal.SIGKILL)
    assert _gone_within(first, 5)
    assert run_child(["true"], tmp_path / "b", quiet=True).exit_code == 0
    assert _guardian_of(os.getpid()) != first


@pytest.mark.parametrize("command", ["doctor", "check"])
def test_no_process_outlives_a_sigkilled_torchrepro(tmp_path, monkeypatch, command):
    monkeypatch.setenv("TORCHREPRO_CHECK_SIDE_BY_SIDE", "1")  # check's two runs at once, both leaving processes
    script = _script(tmp_path, "leaves.py", LEAVES)
    runs = 2 if command == "check" else 1
    torchrepro = _torchrepro(tmp_path, command, "--out", "run", str(script), "--", str(tmp_path / "pids"), "3", "600")
    left = _left_behind(tmp_path, runs, torchrepro)
    guardian = _guardian_of(torchrepro.pid)
    left[guardian] = _start_time(guardian)
    assert len(left) == 3 * runs + 1
    os.kill(torchrepro.pid, signal.SIGKILL)
    torchrepro.communicate()
    for pid, start in left.items():  # the runs, their two `sleep`s each, and the guardian once it ended them
        assert _gone_within(pid, 5, start), f"process {pid} outlived a SIGKILLed torchrepro {command}"


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_a_drift_cell_killed_without_a_record_runs_again_on_resume(tmp_path):
    script = _script(tmp_path, "killed_once.py", KILLED_ONCE)
    args = [
        "drift",
        "--vary",
        "init",
        "--runs",
        "2",
        "--jobs",
        "1",
        "--metric",
        "m",
        "--out",
        "exp",
        str(script),
        "--",
        str(tmp_path / "marker"),  # absolute: seen by every run (each starts in its own copy of the directory)
    ]
    first = subprocess.run([sys.executable, "-m", "torchrepro", *args], cwd=tmp_path, capture_output=True, text=True)
    assert first.returncode == 3, first.stderr  # one run was killed: the report says so
    killed = [
        json.loads(p.read_text()) for p in (tmp_path / "exp" / "runs").glob("*/drift-run.json")
    ]  # written by the surviving drift for both cells
    assert sorted(r["exit_code"] for r in killed) == [-signal.SIGKILL, 0]
    again = subprocess.run([sys.executable, "-m", "torchrepro", *args], cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    run = json.loads((tmp_path / "exp" / "report.json").read_text())["run"]
    assert (run["reused"], run["ran"], run["crashed"]) == (1, 1, 0)


def test_report_of_a_run_stopped_by_sigterm_exits_3_not_143(tmp_path):
    script = _script(tmp_path, "loop.py", LOOP)
    doctor = _torchrepro(tmp_path, "doctor", "--out", "run", str(script))
    _rank_pid_after_steps(tmp_path / "run", 2)
    doctor.send_signal(signal.SIGTERM)
    doctor.communicate(timeout=60)
    assert doctor.returncode == 128 + signal.SIGTERM  # the doctor itself was signalled
    report = subprocess.run(
        [sys.executable, "-m", "torchrepro", "report", "run"], cwd=tmp_path, capture_output=True, text=True
    )
    assert report.returncode == 3, report.stderr  # the stored run failed; `report` was not signalled
    assert "SIGTERM" in report.stdout


def test_check_resume_at_past_the_last_step_keeps_nothing(tmp_path):
    script = _script(tmp_path, "loop.py", LOOP)
    result = subprocess.run(
        [sys.executable, "-m", "torchrepro", "check-resume", "--at", "50", str(script), "--", "4"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("torchrepro: error: --at 50: the run has 4 step(s)")
    assert not any((tmp_path / "torchrepro-runs").glob("*")), "check-resume left its runs behind"


# torch.multiprocessing.spawn's two ranks loop (their own pids written to argv[1]-<rank>): they are not
# in the job's process group's reach once torchrepro is SIGKILLed, only the bootstrap's watch ends them
SPAWNED = """
import os, sys, time, torch
import torch.multiprocessing as mp

def work(rank, out):
    open(f"{out}-{rank}", "w").write(str(os.getpid()))
    time.sleep(300)

if __name__ == "__main__":
    mp.spawn(work, args=(sys.argv[1],), nprocs=2)
"""


def test_spawned_ranks_end_when_torchrepro_is_sigkilled(tmp_path):
    script = _script(tmp_path, "spawned.py", SPAWNED)
    doctor = _torchrepro(tmp_path, "doctor", "--out", "run", str(script), "--", str(tmp_path / "rank"))
    files = [tmp_path / f"rank-{r}" for r in (0, 1)]
    deadline = time.monotonic() + 240
    while not all(f.exists() and f.read_text() for f in files):
        assert time.monotonic() < deadline and doctor.poll() is None, doctor.communicate()
        time.sleep(0.2)
    ranks = [int(f.read_text()) for f in files]
    os.kill(doctor.pid, signal.SIGKILL)
    doctor.communicate()
    for pid in ranks:  # the watch polls every second; a process of ~1 GB takes seconds to exit on a busy machine
        assert _gone_within(pid, 15), "a spawned rank outlived torchrepro"
