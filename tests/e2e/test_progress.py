"""Progress of long phases (torchrepro.render.progress): which run, its step of how many, and the
time, read from a real run's event log while it is written; in a log, a line every N seconds."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest
from pathlib import Path

from support import run_torchrepro
from rich.console import Console

from torchrepro.render.progress import Progress

SCRIPTS = Path(__file__).parents[1] / "scripts"


def test_a_log_gets_a_line_every_period_with_the_step_reached(tmp_path):
    sink = io.StringIO()
    progress = Progress(Console(file=sink, force_terminal=False, width=200), every_s=0.5)
    run_dir = tmp_path / "run"
    with progress.phase("run-1", run_dir, total=40):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torchrepro",
                "run",
                "--out",
                str(run_dir),
                "--",
                str(SCRIPTS / "long_train.py"),
                "--steps",
                "40",
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
    lines = sink.getvalue().splitlines()
    steps = [int(m.group(1)) for line in lines for m in [re.match(r"· run-1: step (\d+) of 40, \d+ s$", line)] if m]
    assert len(steps) >= 3 and steps == sorted(steps) and steps[-1] > 0, lines
    assert all(re.match(r"· run-1: (step \d+ of 40, )?\d+ s$", line) for line in lines), lines


def test_no_phase_no_line_and_period_zero_none(tmp_path, monkeypatch):
    sink = io.StringIO()
    monkeypatch.setenv("TORCHREPRO_PROGRESS_S", "0")
    progress = Progress(Console(file=sink, force_terminal=False))
    with progress.phase("run-1", total=3):
        pass
    assert progress.console is None and sink.getvalue() == ""


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_check_says_each_run_step_and_time_in_a_log(tmp_path):
    proc = run_torchrepro(
        "check",
        "--out",
        "c",
        "--no-localize",
        str(SCRIPTS / "long_train.py"),
        "--steps",
        "40",
        cwd=tmp_path,
        env={"TORCHREPRO_PROGRESS_S": "1", "TORCHREPRO_CHECK_SIDE_BY_SIDE": "0"},
    )
    assert proc.returncode in (0, 1), proc.stderr  # (the script is unseeded: it may diverge)
    assert re.search(r"^· run-1: step \d+, \d+ s$", proc.stderr, re.M), proc.stderr  # how many: not known yet
    assert re.search(r"^· run-2: step \d+ of 40, \d+ s$", proc.stderr, re.M), proc.stderr  # known from run 1
