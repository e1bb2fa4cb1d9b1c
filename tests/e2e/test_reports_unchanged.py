"""No report changes unless on purpose: the repository's example run by the code of BASELINE (the
last commit whose reports changed on purpose, extracted from git), and its runs analysed again
by this checkout, give the same report.json, modulo what differs between any two runs (times,
paths, process ids). The event log did change on purpose (recompile categories are computed by
analysis now, not written by capture; the torch APIs probed are recorded): reading the baseline's
logs shows this checkout still decides the same from them. That capture still observes the same is
the business of tests/e2e/test_doctor_scenarios.py (every category and break against Dynamo's own).

Both sides run here, on this machine, so nothing machine-specific is compared with a stored file.
Bump BASELINE only when a report's content changes on purpose (and say so in the commit).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASELINE = "f68c2fe"  # doctor keeps loss curves (steps.losses); the code after a graph break is named by its function: on purpose
SCRIPT = ROOT / "examples" / "train_digits.py"

# Keys whose values differ between two runs of one version: clocks, durations, paths, stderr.
VOLATILE_KEYS = {
    "provenance",
    "command",
    "cwd",
    "git",
    "started",
    "ended",
    "stderr_tail",
    "rank_stderr_tails",
    "run_dirs",
    "timings_s",
    "path",
    "note",
    "steps_timing",
    "pid",
    "host",
    "supervisor",  # the pid and start time of the torchrepro that ran the job
    "schema",
}
VOLATILE_SUFFIXES = ("_s", "_share", "_ms")
TIME_FINDINGS = {"COMPILE_TIME_SHARE"}  # present or not depending on how fast this machine compiled
TIME_TEXT = re.compile(r"\d+(?:\.\d+)?\s?(?:s|ms|µs|%)(?![\w])")
FINDING_COUNT = re.compile(r"^(\w+) \(\d+\)")  # "WARNINGS (4)": counts the timing finding too


def normalise(value: Any, key: str = "") -> Any:
    """Drop what varies from run to run; keep everything the analysis decided."""
    if isinstance(value, dict):
        return {
            k: normalise(v, k)
            for k, v in value.items()
            if k not in VOLATILE_KEYS and not k.endswith(VOLATILE_SUFFIXES) and k != "share"
        }
    if isinstance(value, list):
        if key == "findings":
            value = [f for f in value if f.get("code") not in TIME_FINDINGS]
        if key == "steps" and value and isinstance(value[0], list):  # the timeline's (step, seconds) pairs
            return [row[0] for row in value]
        return [normalise(v) for v in value]
    if isinstance(value, str):
        return TIME_TEXT.sub("<t>", FINDING_COUNT.sub(r"\1", value) if key == "verdict" else value)
    return value


def _baseline_src(tmp: Path) -> Path:
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", BASELINE, "src"], capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"the baseline commit {BASELINE} is not in this clone's history (shallow clone?)")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(tmp, filter="data")
    return tmp / "src"


def _torchrepro(src: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchrepro", *argv],
        env={**os.environ, "PYTHONPATH": str(src)},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow  # the baseline commit's doctor on the example: make test-slow
def test_doctor_report_equal_to_the_baselines(tmp_path):
    """The pitfalls example under the baseline's doctor; this checkout's ``report`` of the same run."""
    old_run = tmp_path / "doctor"
    _torchrepro(
        _baseline_src(tmp_path / "baseline"),
        tmp_path,
        "doctor",
        "--seed",
        "0",
        "--out",
        str(old_run),
        str(SCRIPT),
        "--",
        "--pitfalls",
        "--epochs",
        "1",
    )
    old = json.loads((old_run / "report.json").read_text())
    proc = _torchrepro(ROOT / "src", tmp_path, "report", str(old_run), "--json", str(tmp_path / "new.json"))
    assert (tmp_path / "new.json").exists(), proc.stdout + proc.stderr
    assert normalise(json.loads((tmp_path / "new.json").read_text())) == normalise(old)


@pytest.mark.slow  # the baseline commit's check (two runs) on the example: make test-slow
def test_check_report_equal_to_the_baselines(tmp_path):
    """Two runs of the example under the baseline's check; this checkout's ``diff`` of the same runs
    (a diff has no check run of its own: the comparison, its findings and verdict are compared)."""
    out = tmp_path / "check"
    _torchrepro(
        _baseline_src(tmp_path / "baseline"),
        tmp_path,
        "check",
        "--seed",
        "0",
        "--out",
        str(out),
        str(SCRIPT),
        "--",
        "--epochs",
        "1",
    )
    old = json.loads((out / "report.json").read_text())
    proc = _torchrepro(
        ROOT / "src",
        tmp_path,
        "diff",
        "--absolute-paths",  # as the baseline stored them: the runs by label once out's path is taken away
        str(out / "run-1"),
        str(out / "run-2"),
        "--json",
        str(tmp_path / "new.json"),
    )
    assert (tmp_path / "new.json").exists(), proc.stdout + proc.stderr
    new = json.loads((tmp_path / "new.json").read_text().replace(json.dumps(f"{out}/")[1:-1], ""))  # runs by label
    assert old["determinism"]["verdict"] == "bit_exact"
    del new["run"], old["run"], old["determinism"]["against"]  # what check was asked; a diff is asked nothing
    # how check ran its own runs (side by side or not) is a note a diff, which runs nothing, cannot make
    old["determinism"]["notes"] = [n for n in old["determinism"]["notes"] if not n.startswith("the runs ran side")]
    assert normalise(new) == normalise(old)


def test_normalise_keeps_what_analysis_decided():
    report = {
        "verdict": "WARNINGS (1): 2 compile(s), 2.5 s compiling",
        "compile": {"compile_time_s": 2.5, "recompiles": 1},
        "findings": [{"code": "COMPILE_TIME_SHARE"}, {"code": "RECOMPILE_SHAPE"}],
    }
    other = json.loads(json.dumps(report).replace("2.5", "3.1").replace('"recompiles": 1', '"recompiles": 2'))
    assert normalise(report)["findings"] == [{"code": "RECOMPILE_SHAPE"}]
    assert normalise(report)["verdict"] == normalise(other)["verdict"]
    assert normalise(report) != normalise(other)  # a changed count is a changed report
