"""A run directory another torchrepro is writing (its lock, eventlog/rundir.py) is not read as if it
were finished: ``report``, ``diff`` and ``repro`` refuse it in one line (exit 2), also a run inside a
directory being written (a check's runs); ``watch`` reads it and says it is being written, and by
whom. ``repro`` takes saved graphs from the runs' own rank folders only, never from a copy of the
working directory a run started in. Real processes holding real locks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import save_a_graph
from test_hostile_input import fake_run, one_line_error, torchrepro

HOLD = """
import sys, time
from pathlib import Path
from torchrepro.eventlog.rundir import claim_run_dir
claim_run_dir(Path(sys.argv[1]), fresh=False)
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def held(tmp_path) -> Iterator[tuple[Path, subprocess.Popen]]:
    """A check-like directory: ``check/run-1`` a stored run, ``check`` held by another process."""
    root = tmp_path / "check"
    fake_run(root / "run-1")
    (root / "run-1" / "run.json").write_text(json.dumps({"script": "train.py"}))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(root)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    try:
        yield root, holder
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


@pytest.mark.parametrize("command", [["report", "RUN"], ["diff", "RUN", "RUN"], ["repro", "RUN"]])
def test_a_run_being_written_is_refused_by_its_readers(tmp_path, held, command):
    root, holder = held
    for run in (root, root / "run-1"):
        line = one_line_error(torchrepro(*[str(run) if a == "RUN" else a for a in command], cwd=tmp_path))
        inside = f" (inside {root})" if run != root else ""
        assert line == (
            f"torchrepro: error: {run}{inside} is being written by torchrepro (pid {holder.pid}): wait for it to end, "
            f"or follow it with torchrepro watch {root}"
        )
    assert not (root / "repro").exists() and not (root / "run-1" / "repro").exists()


def test_watch_reads_a_run_being_written_and_says_so(tmp_path, held):
    root, holder = held
    log = root / "run-1" / "rank-0" / "events.jsonl"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:-1]))  # no end record yet: still running
    proc = torchrepro("watch", root / "run-1", "--once", "--json", cwd=tmp_path)
    snap = json.loads(proc.stdout)
    assert proc.returncode == 0 and snap["state"] == "being written" and snap["writer_pid"] == str(holder.pid)
    proc = torchrepro("watch", root / "run-1", "--once", cwd=tmp_path)
    assert f"being written by torchrepro (pid {holder.pid})" in " ".join(proc.stdout.split())


def test_once_the_writer_is_gone_the_run_reads_again(tmp_path, held):
    root, holder = held
    holder.kill()
    holder.wait()
    proc = torchrepro("report", root / "run-1", cwd=tmp_path)
    assert proc.returncode in (0, 1, 3) and "being written" not in proc.stderr, proc.stderr
    snap = json.loads(torchrepro("watch", root / "run-1", "--once", "--json", cwd=tmp_path).stdout)
    assert snap["writer_pid"] is None and snap["state"] != "being written"


def test_a_writer_claims_a_directory_a_reader_is_probing(tmp_path):
    """A reader's probe takes the lock for a moment: a writer claiming it then tries again."""
    from torchrepro.eventlog.rundir import claim_run_dir, release_run_dir, writer_of

    run = tmp_path / "run"
    probe = (
        "import sys; from pathlib import Path; from torchrepro.eventlog.rundir import writer_of\n"
        "while True: writer_of(Path(sys.argv[1]))"
    )
    run.mkdir()
    (run / ".torchrepro.lock").write_text("")
    reader = subprocess.Popen([sys.executable, "-c", probe, str(run)])
    try:
        time.sleep(1.0)  # (probing in a loop by now)
        for _ in range(20):
            claim_run_dir(run, fresh=False)
            assert writer_of(run) is None  # this process's own directory is no other writer's
            release_run_dir(run)
    finally:
        reader.kill()
        reader.wait()


def _graph(folder: Path, compile_id: str) -> None:
    save_a_graph(folder, compile_id, differing=True)


def test_repro_takes_graphs_from_the_runs_never_from_a_working_directory_copy(tmp_path):
    check = tmp_path / "check"
    _graph(check / "run-1" / "cwd" / "rank-0" / "graphs" / "0-0-forward", "9/9")  # a copy left by a killed check
    _graph(check / "run-1" / "cwd" / "old" / "rank-0" / "graphs" / "0-0-forward", "8/8")
    line = one_line_error(torchrepro("repro", check, cwd=tmp_path))
    assert "holds no saved compiled graph" in line
    _graph(check / "run-1" / "rank-0" / "graphs" / "0-0-forward", "0/0")
    proc = torchrepro("repro", check, cwd=tmp_path)
    assert proc.returncode == 0 and "compiled graph 0/0/forward" in proc.stdout, proc.stderr
