"""The commands as Python functions (docs/library.md, "The commands from Python"): the document's
block run as shown in a fresh interpreter, and usage errors raised before anything is created."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import torchrepro
from torchrepro.reports.check_report import CheckReport

LIBRARY_DOC = Path(__file__).resolve().parents[2] / "docs" / "library.md"
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "deterministic.py"


@pytest.mark.slow  # moved out of `make test` for its time (the other pages' examples run there too); `make test-slow` runs it
def test_commands_block_runs_as_shown(tmp_path):
    block = re.search(r"## The commands from Python\n.*?```python\n(.*?)```", LIBRARY_DOC.read_text(), re.S).group(1)
    proc = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("BIT-EXACT: 2 runs agree bit for bit over 5 step(s)")
    assert lines[1:] == ["healthy", "5", "5 True", "2 no such script: missing.py"]
    assert (tmp_path / "golden" / "golden.json").is_file()
    assert (tmp_path / "runs" / "check" / "report.json").is_file()  # stored as the command stores it
    assert (tmp_path / "runs" / "doctor" / "report.json").is_file()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda out: torchrepro.check(SCRIPT, runs=1, out=out), "runs must be at least 2"),
        (lambda out: torchrepro.check(SCRIPT, runs=3, against="eager", out=out), "--runs counts runs"),
        (lambda out: torchrepro.check(SCRIPT, against="inductor", out=out), "--against must be eager or"),
        (lambda out: torchrepro.check(SCRIPT, only_fixes=["nope"], out=out), "unknown name nope"),
        (lambda out: torchrepro.check(SCRIPT, rtol=-1, out=out), "rtol must be a number >= 0"),
        (lambda out: torchrepro.check(SCRIPT, seed=-3, out=out), "seed must be an integer >= 0"),
        (lambda out: torchrepro.check(SCRIPT, nproc=0, out=out), "nproc must be at least 1"),
        (lambda out: torchrepro.check(SCRIPT, out=out, cache=torchrepro.CompileCache("everywhere")), "cache policy"),
        (lambda out: torchrepro.check("missing.py", out=out), "no such script: missing.py"),
        (lambda out: torchrepro.doctor(out=out), "doctor needs a SCRIPT"),
        (lambda out: torchrepro.doctor(SCRIPT, jobs=2, out=out), "give --fixes too"),
        (lambda out: torchrepro.doctor(SCRIPT, trace=out, fixes=True, out=out), "--fixes re-runs the script"),
        (lambda out: torchrepro.compare(SCRIPT, "missing.py", out=out), "no such script: missing.py"),
        (lambda out: torchrepro.compare(SCRIPT, SCRIPT, nproc_b=0, out=out), "nproc_b must be at least 1"),
        (lambda out: torchrepro.diff(out, out), "no such run directory"),
        (lambda out: torchrepro.drift(SCRIPT, vary=["init", "weather"], out=out), "--vary init,weather: give each of"),
        (lambda out: torchrepro.drift(SCRIPT, metric="acc", metric_regex="acc=(.*)", out=out), "not both"),
        (lambda out: torchrepro.drift(SCRIPT, max_runs=10, out=out), "--max-runs is the budget of --until-clear"),
        (lambda out: torchrepro.check_resume(SCRIPT, at=0, out=out), "--at must be at least 1"),
        (lambda out: torchrepro.record_golden(SCRIPT, out=out, nproc=0), "nproc must be at least 1"),
        (lambda out: torchrepro.record_golden("missing.py", out=out), "no such script: missing.py"),
        (lambda out: torchrepro.check_golden(out, SCRIPT), "no such golden directory"),
    ],
)
def test_usage_errors_raise_before_anything_is_created(tmp_path, call, message):
    out = tmp_path / "out"
    with pytest.raises(torchrepro.UserError, match=re.escape(message)) as raised:
        call(out)
    assert raised.value.exit_code == 2
    assert not out.exists()


def test_every_command_function_is_public_and_typed():
    for name in ("doctor", "check", "check_resume", "compare", "diff", "drift", "record_golden", "check_golden"):
        assert name in torchrepro.__all__ and callable(getattr(torchrepro, name))
    assert torchrepro.diff.__annotations__["return"] in ("CheckReport", CheckReport)


def test_a_command_lets_go_of_its_run_directory_when_it_returns(tmp_path):
    """The caller's process lives on after ``torchrepro.doctor`` returns: another process reads the run
    directory (it is no longer being written), and the same ``out`` again is refused before anything runs
    (it was run again into the finished run's directory, its report replaced by one of refused runs)."""
    out = tmp_path / "out"
    first = torchrepro.doctor(SCRIPT, out=out)
    stored = (out / "report.json").read_bytes()
    shown = subprocess.run(
        [sys.executable, "-m", "torchrepro", "report", str(out)], capture_output=True, text=True, timeout=300
    )
    assert shown.returncode == first.exit_code == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == first.verdict_line
    with pytest.raises(torchrepro.UserError, match="already exists and is not empty"):
        torchrepro.doctor(SCRIPT, out=out)
    assert (out / "report.json").read_bytes() == stored
