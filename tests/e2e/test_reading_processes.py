"""The report's reader keeps each rank's steps reduced (``analysis.kept_steps``) and, for large
runs, reads in one process per core (itself and a child process per other core): the same report as the events read whole in one
process; a reading process that dies leaves its share to the parent; none outlives the report.
Real files, real processes, real signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from synthetic_runs import keep_here_only, write_run
from torchrepro.analysis.doctor import analyse
from torchrepro.analysis.kept_steps import StepReducer
from torchrepro.eventlog.events import Step
from torchrepro.eventlog.rundir import load_run

TESTS = Path(__file__).parents[1]


def report_json(run) -> str:
    return json.dumps(analyse(run.meta, run.logs, run.problems).to_json(), sort_keys=True, default=str)


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """9 ranks: ranks 4 and 8 recompile alone (each its own way), rank 7 crashed, rank 8's log lost its
    header line (its timeline starts at its first event)."""
    root = write_run(tmp_path / "run", 9, odd=(4, 8), crashed=(7,), steps=600, recompiles=2)
    headless = root / "rank-8" / "events.jsonl"
    headless.write_text(headless.read_text().split("\n", 1)[1])
    return root


def test_the_report_is_the_same_read_whole_kept_or_in_processes(run_dir):
    whole = load_run(run_dir)
    here, spread = (load_run(run_dir, keep=StepReducer, jobs=jobs) for jobs in (1, 3))
    assert report_json(here) == report_json(whole) == report_json(spread)
    for run in (here, spread):
        assert [log.rank for log in run.logs] == [log.rank for log in whole.logs]
        assert not any(type(e) is Step for log in run.logs for e in log.events)
        assert [log.kept.count for log in run.logs] == [len(log.of(Step)) for log in whole.logs]
    report = analyse(spread.meta, spread.logs, spread.problems)
    assert {"RANK_CRASHED", "RANK_RECOMPILE_ASYMMETRY"} <= {f.code for f in report.findings}
    headless = next(t for t in report.compile["timeline"] if t["rank"] == 8)
    assert headless["compiles"][-1]["start_s"] > 0 and len(headless["steps"]) == 400  # 600 steps, thinned


def test_a_log_read_without_its_steps_does_not_pretend_to_have_none(run_dir):
    log = load_run(run_dir, keep=StepReducer).logs[0]
    with pytest.raises(TypeError, match="without its step events"):
        log.of(Step)


def test_the_command_reports_alike_with_one_and_with_several_readers(run_dir, tmp_path):
    """Several readers say so on stderr (one line); one (the default for small logs) says nothing."""
    outputs, said = [], []
    for jobs in ([], ["--jobs", "1"], ["--jobs", "2"]):
        out = tmp_path / f"report-{len(outputs)}.json"
        proc = subprocess.run(
            [sys.executable, "-m", "torchrepro", "report", str(run_dir), *jobs, "--json", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 3, proc.stderr  # a crashed rank fails the run (exit 3)
        outputs.append(json.loads(out.read_text()))
        said.append(proc.stderr)
    assert outputs[0] == outputs[1] == outputs[2]
    assert said[:2] == ["", ""] and re.fullmatch(
        r"torchrepro: reading 9 rank logs \(\d+ MB\) in 2 processes\n", said[2]
    )
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "report", str(run_dir), "--jobs", "0"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "torchrepro: error: argument --jobs: must be an integer >= 1, got '0' (see torchrepro report --help)"
    )


def test_a_share_whose_reading_process_dies_is_read_by_the_parent(run_dir, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    monkeypatch.setenv("TORCHREPRO_TEST_PARENT", str(os.getpid()))
    run = load_run(run_dir, keep=keep_here_only, jobs=2)
    assert report_json(run) == report_json(load_run(run_dir))


def test_a_keep_the_reading_processes_cannot_import_is_run_here(tmp_path):
    """A lambda (no importable name): each reading process fails before it reads its list of
    files, which for 3 000 ranks overflows the pipe (the parent's write meets a closed pipe)."""
    from torchrepro.eventlog.event_writer import write_all
    from torchrepro.eventlog.events import Header

    root = tmp_path / ("a-long-folder-name-" * 4)
    for rank in range(3000):
        write_all(root / f"rank-{rank}" / "events.jsonl", [Header(rank=rank, world_size=3000), Step(rank=rank)])
    run = load_run(root, keep=lambda: StepReducer(), jobs=2)  # noqa: PLW0108 -- the point
    assert [log.rank for log in run.logs] == list(range(3000)) and run.logs[-1].kept.count == 1
    assert report_json(run) == report_json(load_run(root))


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_reading_processes_do_not_outlive_a_killed_report(run_dir):
    """SIGKILL, which no handler sees: the reading processes end with their parent (3 jobs: the parent
    and 2 children)."""
    code = f"from torchrepro.eventlog.rundir import load_run; from synthetic_runs import keep_forever; load_run({str(run_dir)!r}, keep=keep_forever, jobs=3)"
    path = os.pathsep.join(filter(None, (str(TESTS), os.environ.get("PYTHONPATH"))))  # (a checkout's src/ too)
    parent = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": path})
    try:
        deadline = time.monotonic() + 60
        while len(readers := _children(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(readers) == 2 and all(map(_alive, readers))
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 30
    while any(map(_alive, readers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, readers))
