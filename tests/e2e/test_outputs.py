"""Every file a command writes for the user goes through one guard (:mod:`torchrepro.commands.outputs`):
never onto an input (the script, a file of a run being read, a plan, a cache being packed), however
the path is spelled (a symlink, ``..``, a hard link), ``--force`` or not; a full disk is one line,
with no partial file left and the previous file intact. Real files, real processes, a real tmpfs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_faults import LOOP
from test_hostile_input import SMALL, fake_run, one_line_error, snapshot, torchrepro


def _cases(tmp: Path) -> dict[str, list]:
    """Commands whose output is one of their inputs, each spelled another way; all with --force."""
    from synthetic_runs import drift_experiment
    from test_cache import fake_cache

    run, other = fake_run(tmp / "run"), fake_run(tmp / "other")
    script = tmp / "train.py"
    shutil.copy(SMALL, script)
    drift_experiment(tmp / "exp", "m")
    (tmp / "exp" / "plan.json").write_text('{"schema": "a plan"}')
    (tmp / "link.json").symlink_to(run / "run.json")
    os.link(run / "rank-0" / "events.jsonl", tmp / "hard.json")
    cache = fake_cache(tmp / "cache")
    (tmp / "data.txt").write_text("the script's data")
    meta = json.loads((run / "run.json").read_text())  # the run's script and argument, as a doctor records them
    (run / "run.json").write_text(json.dumps({**meta, "cwd": str(tmp), "args": ["--data", "data.txt"]}))
    return {
        "--json onto the run's own script, through RUN/..": ["report", run, "--json", run / ".." / "train.py"],
        "--html onto a file the run's arguments name": ["report", run, "--html", tmp / "data.txt"],
        "--html onto the event log read": ["report", run, "--html", run / "rank-0" / "events.jsonl"],
        "--json onto run.json": ["report", run, "--json", run / "run.json"],
        "--junit onto report.json": ["report", run, "--junit", run / "report.json"],
        "--json onto the script": ["doctor", "--json", script, script],
        "--html onto the drift plan": ["report", tmp / "exp", "--html", tmp / "exp" / "plan.json"],
        "diff --html onto run B": ["diff", run, other, "--html", other / "run.json"],
        "a symlink to run.json": ["report", run, "--json", tmp / "link.json"],
        "a path through ..": ["report", run, "--json", tmp / "other" / ".." / "run" / "run.json"],
        "a hard link to the event log": ["report", run, "--json", tmp / "hard.json"],
        "a new file inside the run": ["report", run, "--json", run / "rank-0" / "new.json"],
        "a pack inside the cache": ["cache", "pack", cache / "ab" / "x.tar", "--from", cache, "--no-headers"],
    }


@pytest.mark.parametrize(
    "case",
    [
        "--json onto the run's own script, through RUN/..",
        "--html onto a file the run's arguments name",
        "--html onto the event log read",
        "--json onto run.json",
        "--junit onto report.json",
        "--json onto the script",
        "--html onto the drift plan",
        "diff --html onto run B",
        "a symlink to run.json",
        "a path through ..",
        "a hard link to the event log",
        "a new file inside the run",
        "a pack inside the cache",
    ],
)
def test_an_output_is_never_an_input_even_with_force(tmp_path, case):
    args = _cases(tmp_path)[case]
    (tmp_path / "run" / "report.json").write_text('{"stored": true}')
    before = snapshot(tmp_path)
    at = next((i for i, a in enumerate(args) if a in ("--json", "--html", "--junit")), len(args))
    line = one_line_error(torchrepro(*args[:at], "--force", *args[at:], cwd=tmp_path))  # before any script
    assert "input" in line
    assert snapshot(tmp_path) == before  # every input byte-identical, nothing new


def test_force_still_replaces_an_earlier_output(tmp_path):
    run = fake_run(tmp_path / "run")
    earlier = tmp_path / "r.html"
    earlier.write_text("my notes")
    earlier.chmod(0o600)
    assert "--force" in one_line_error(torchrepro("report", run, "--html", earlier, cwd=tmp_path))
    proc = torchrepro("report", run, "--html", earlier, "--force", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert 'content="torchrepro' in earlier.read_text() and stat.S_IMODE(earlier.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("target", ["a file of the user's", "nothing yet"])
def test_an_output_that_is_a_link_is_refused_even_with_force(tmp_path, capsys, target):
    from test_hostile_input import cli

    run = fake_run(tmp_path / "run")
    victim = tmp_path / "bashrc"
    if target != "nothing yet":
        victim.write_text("the user's own file")
    (tmp_path / "r.json").symlink_to(victim)
    code, _, err = cli(capsys, "report", run, "--json", tmp_path / "r.json", "--force")
    assert code == 2 and "r.json is a symbolic link: torchrepro writes no file through a link" in one_line_error(err)
    assert os.readlink(tmp_path / "r.json") == str(victim)  # the link as it was
    assert (victim.read_text() if victim.exists() else None) == (
        None if target == "nothing yet" else "the user's own file"
    )


def test_report_writes_nothing_into_the_stored_run(tmp_path):
    from synthetic_runs import drift_experiment

    drift_experiment(tmp_path / "exp", "m")
    for run in (fake_run(tmp_path / "run"), tmp_path / "exp"):
        before = snapshot(run)
        proc = torchrepro("report", run, cwd=tmp_path)
        assert proc.returncode in (0, 1, 3), proc.stderr  # the stored run's own verdict
        assert snapshot(run) == before  # not even report.html
        page = tmp_path / f"{run.name}.html"
        assert torchrepro("report", run, "--html", page, cwd=tmp_path).returncode == proc.returncode
        assert 'content="torchrepro' in page.read_text() and snapshot(run) == before


def test_two_outputs_naming_one_file_are_refused(tmp_path):
    run = fake_run(tmp_path / "run")
    line = one_line_error(torchrepro("report", run, "--json", "x", "--html", "./x", cwd=tmp_path))
    assert "different files" in line and not (tmp_path / "x").exists()


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` while the block runs (root only: the test is skipped otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", where], capture_output=True, text=True
    )
    if mount.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", where], check=True)


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs holding ``earlier.json``, filled to the last block."""
    with _tmpfs(tmp_path / "disk", "1m") as disk:
        (disk / "earlier.json").write_text('{"earlier": true}')
        with open(disk / "filler", "wb", buffering=0) as fp:  # fill it: the rest of the 1 MiB, to the last block
            try:
                while True:
                    fp.write(b"\0" * 4096)
            except OSError:
                pass
        yield disk


def test_report_json_onto_a_full_disk(tmp_path, full_disk):
    run = fake_run(tmp_path / "run")
    before = snapshot(full_disk)
    line = one_line_error(torchrepro("report", run, "--json", full_disk / "earlier.json", "--force", cwd=tmp_path))
    assert "No space left on device" in line and "earlier.json" in line
    assert snapshot(full_disk) == before  # the previous file intact, no temporary file left
    line = one_line_error(torchrepro("report", run, "--json", full_disk / "new.json", cwd=tmp_path))
    assert "new.json" in line and snapshot(full_disk) == before


@pytest.mark.parametrize("free", [0, 16 << 10])  # nothing; room for run.json but not the rest of the run
def test_doctor_out_onto_a_full_disk(tmp_path, full_disk, free):
    filler = full_disk / "filler"
    os.truncate(filler, filler.stat().st_size - free)
    proc = torchrepro("doctor", "--out", full_disk / "run", SMALL, "--", "--epochs", "1", cwd=tmp_path)
    # capture in the script's process may run out of room first: it stops with one warning, the run goes on
    warnings = [w for w in proc.stderr.splitlines() if w.startswith("torchrepro: warning: capture stopped")]
    assert all("No space left on device" in w for w in warnings)
    line = one_line_error(proc.stderr.replace("".join(w + "\n" for w in warnings), ""))
    assert proc.returncode == 2
    assert "No space left on device" in line and str(full_disk / "run") in line
    assert json.loads((full_disk / "earlier.json").read_text()) == {"earlier": True}
    assert not [p for p in full_disk.rglob("*.tmp")]  # no temporary file of an atomic write left


# test_faults' training loop (argv[1] steps), then it fills the disk argv[2] is on: torchrepro's
# supervisor cannot record the end of the job
FILLS_THE_DISK = (
    LOOP
    + """
with open(sys.argv[2], "wb", buffering=0) as fp:
    try:
        while True:
            fp.write(bytes(4096))
    except OSError:
        pass
"""
)


def test_a_run_whose_supervisor_met_a_full_disk_says_so_not_the_oom_killer(tmp_path):
    script = tmp_path / "fills.py"
    script.write_text(FILLS_THE_DISK)
    with _tmpfs(tmp_path / "disk", "4m") as disk:
        proc = torchrepro("doctor", "--out", disk / "run", script, "--", "3", disk / "filler", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        said = f"cannot write {disk / 'run' / 'run.json'}: No space left on device: free some space and run again"
        assert proc.stderr.strip().splitlines()[-1] == f"torchrepro: error: {said}"
        report = torchrepro("report", disk / "run", "--json", tmp_path / "r.json", cwd=tmp_path)
    assert report.returncode == 3, report.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["verdict"].startswith("INTERRUPTED")
    finding = next(f for f in data["findings"] if f["code"] == "RUN_INTERRUPTED")
    assert finding["title"].startswith(
        "interrupted: the disk was full (ENOSPC) while writing run.json: torchrepro's supervisor (pid "
    )
    assert "OOM" not in json.dumps(data) and "SIGKILL" not in finding["hint"]
    assert finding["evidence"]["write_error"] == {"errno": "ENOSPC", "file": "run.json"}
