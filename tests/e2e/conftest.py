"""Fixtures of the end-to-end tier (tests/e2e/): they start processes. Shared setup of both
tiers (the inductor cache, no process outliving its test, reports checked against their schemas)
is in tests/conftest.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from support import schema_problems

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_python(tmp_path):
    """Run a Python snippet in a fresh interpreter; returns the CompletedProcess."""
    import subprocess

    def run(code: str, *, env: dict[str, str] | None = None, check: bool = True, timeout: float = 300):
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, cwd=tmp_path, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return proc

    return run


def _check_of(script: str, root: Path):
    """`torchrepro check` of tests/scripts/SCRIPT into ``root``/check: its process and output directory.
    Its reports are checked against their schemas here, as a test's are."""
    import subprocess

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchrepro",
            "check",
            "--out",
            str(root / "check"),
            str(REPO / "tests" / "scripts" / script),
        ],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=600,
    )
    problems = [f"{path}: {problem}" for path in sorted(root.rglob("*.json")) for problem in schema_problems(path)]
    assert not problems, "reports that break their schema:\n" + "\n".join(problems)
    return proc, root / "check"


@pytest.fixture(scope="session")
def noise_check(tmp_path_factory):
    """`torchrepro check` of tests/scripts/noise_module.py (an unseeded generator: the runs
    diverge, and replays localise the op). Read by test_check.py's verdict test and
    test_html_browser.py's check page (xdist_group NOISE_CHECK_GROUP)."""
    return _check_of("noise_module.py", tmp_path_factory.mktemp("noise-check"))


@pytest.fixture(scope="session")
def bit_exact_check(tmp_path_factory):
    """`torchrepro check` of tests/scripts/deterministic.py (the runs agree bit for bit). Read by
    test_check.py's bit-exact test and test_report_model.py's typed reports (xdist_group
    BIT_EXACT_CHECK_GROUP)."""
    return _check_of("deterministic.py", tmp_path_factory.mktemp("bit-exact-check"))
