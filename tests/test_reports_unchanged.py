"""The reshaping of issue 12 changed no report: the repository's examples analysed by the code of
BASELINE (the last commit before the reshaping, extracted from git) and by this checkout give the
same report.json, modulo what differs between any two runs (times, paths, process ids).

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

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "c82e1ce"  # main before issue 12 (typed reports, commands/, _dist/_state/_compat)
SCRIPT = ROOT / "examples" / "train_digits.py"

# Keys whose values differ between two runs of one version: clocks, durations, paths, stderr.
VOLATILE_KEYS = {"provenance", "command", "cwd", "git", "started", "ended", "stderr_tail", "rank_stderr_tails",
                 "run_dirs", "timings_s", "path", "note", "steps_timing", "pid", "host", "schema"}
VOLATILE_SUFFIXES = ("_s", "_share", "_ms")
TIME_FINDINGS = {"COMPILE_TIME_SHARE"}  # present or not depending on how fast this machine compiled
TIME_TEXT = re.compile(r"\d+(?:\.\d+)?\s?(?:s|ms|µs|%)(?![\w])")
FINDING_COUNT = re.compile(r"^(\w+) \(\d+\)")  # "WARNINGS (4)": counts the timing finding too


def normalise(value: Any, key: str = "") -> Any:
    """Drop what varies from run to run; keep everything the analysis decided."""
    if isinstance(value, dict):
        return {k: normalise(v, k) for k, v in value.items()
                if k not in VOLATILE_KEYS and not k.endswith(VOLATILE_SUFFIXES) and k != "share"}
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
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", BASELINE, "src"], capture_output=True,
                                 check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"the baseline commit {BASELINE} is not in this clone's history (shallow clone?)")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(tmp, filter="data")
    return tmp / "src"


def _report(src: Path, out: Path, *argv: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, "-m", "torchrepro", *argv[:1], "--seed", "0", "--out", str(out), *argv[1:]],
                   env=env, cwd=out.parent, capture_output=True, timeout=600)
    return json.loads((out / "report.json").read_text())


CASES = {
    "doctor": ("doctor", str(SCRIPT), "--", "--pitfalls", "--epochs", "1"),
    "check": ("check", str(SCRIPT), "--", "--epochs", "1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reports_equal_to_the_baselines(tmp_path, case):
    old = _report(_baseline_src(tmp_path / "baseline"), tmp_path / "old", *CASES[case])
    new = _report(ROOT / "src", tmp_path / "new", *CASES[case])
    assert normalise(new) == normalise(old)


def test_normalise_keeps_what_analysis_decided():
    report = {"verdict": "WARNINGS (1): 2 compile(s), 2.5 s compiling", "compile": {"compile_time_s": 2.5,
              "recompiles": 1}, "findings": [{"code": "COMPILE_TIME_SHARE"}, {"code": "RECOMPILE_SHAPE"}]}
    other = json.loads(json.dumps(report).replace("2.5", "3.1").replace('"recompiles": 1', '"recompiles": 2'))
    assert normalise(report)["findings"] == [{"code": "RECOMPILE_SHAPE"}]
    assert normalise(report)["verdict"] == normalise(other)["verdict"]
    assert normalise(report) != normalise(other)  # a changed count is a changed report
