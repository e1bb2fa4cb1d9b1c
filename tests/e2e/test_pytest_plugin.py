"""The pytest plugin in a fresh pytest process (no conftest: the entry point loads it) against real
scripts and golden directories recorded with the real tool: a run that matches its golden passes,
one that drifts fails with the verdict line and the first divergence (no traceback), and a golden
recorded under another torch is NOT COMPARABLE. The other torch is simulated: the golden is recorded
here and its manifest's ``torch_version`` (the field a golden check compares) edited afterwards;
installing a second torch would take minutes (``make compat`` builds torch 2.6.0 and 2.14.1 for the
compat tier)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import torchrepro

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "scripts"

TESTS = """
import pytest


@pytest.mark.torchrepro("deterministic.py", golden="golden-ok")
def test_matches_its_golden(torchrepro_run):
    assert torchrepro_run.report.verdict.value == "bit_exact"


@pytest.mark.torchrepro("tiny_noise.py", golden="golden-noise", localize=False)
def test_drifts_from_its_golden():
    pass


@pytest.mark.torchrepro("deterministic.py", golden="golden-other-torch")
def test_recorded_under_another_torch():
    pass


@pytest.mark.torchrepro("deterministic.py", golden="golden-other-torch", on_not_comparable="skip")
def test_skipped_where_not_comparable():
    pass


@pytest.mark.torchrepro("missing.py")
def test_a_missing_script():
    pass
"""


def pytest_in(where: Path, *args: str) -> subprocess.CompletedProcess:
    """A fresh pytest in ``where``, with no conftest and this repository's plugins left out but the
    entry point's."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs", *args],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_plugin_passes_fails_and_says_not_comparable_in_a_fresh_pytest(tmp_path):
    for name in ("deterministic.py", "tiny_noise.py"):
        shutil.copy(SCRIPTS / name, tmp_path / name)
    torchrepro.record_golden(tmp_path / "deterministic.py", out=tmp_path / "golden-ok")
    torchrepro.record_golden(tmp_path / "tiny_noise.py", out=tmp_path / "golden-noise")
    shutil.copytree(tmp_path / "golden-ok", tmp_path / "golden-other-torch")
    manifest = tmp_path / "golden-other-torch" / "golden.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "torch_version": "2.6.0+cpu"}))
    (tmp_path / "test_training.py").write_text(TESTS)

    proc = pytest_in(tmp_path, "--junitxml=junit.xml", "-p", "no:randomly")
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "3 failed, 1 passed, 1 skipped" in out, out
    assert "torchrepro: error: no such script: " in out and "missing.py" in out, out
    assert "DIVERGED from golden" in out and re.search(r"^E?\s*first divergence: step \d+, rank 0, ", out, re.M), out
    assert "NOT COMPARABLE with golden" in out and "recorded with torch 2.6.0+cpu" in out, out
    assert "Traceback" not in out and "api.py:" not in out, out  # the verdict, not torchrepro's frames

    cases = {case.get("name"): case for case in ET.parse(tmp_path / "junit.xml").getroot().iter("testcase")}
    verdicts = {
        name: {p.get("name"): p.get("value") for p in case.iter("property")}.get("torchrepro_verdict")
        for name, case in cases.items()
    }
    assert verdicts == {
        "test_matches_its_golden": "bit_exact",
        "test_drifts_from_its_golden": "diverged",
        "test_recorded_under_another_torch": "not_comparable",
        "test_skipped_where_not_comparable": "not_comparable",
        "test_a_missing_script": None,
    }
    failure = cases["test_drifts_from_its_golden"].find("failure")
    assert failure is not None and failure.get("message", "").startswith("Failed: DIVERGED from golden")


@pytest.mark.slow  # five runs of a compiled script, and as many again: make test-slow
def test_the_example_records_its_goldens_again_then_passes(tmp_path):
    example = tmp_path / "golden"
    shutil.copytree(REPO / "examples" / "golden", example)
    shutil.rmtree(example / "golden-train")  # recorded on another machine: recorded again here
    missing = pytest_in(example)
    assert (
        missing.returncode == 1
        and "no golden run in" in missing.stdout
        and "--torchrepro-update-golden" in missing.stdout
    )
    updated = pytest_in(example, "--torchrepro-update-golden")
    assert updated.returncode == 0 and "golden recorded again:" in updated.stdout, updated.stdout
    assert (example / "golden-train" / "golden.json").is_file()
    checked = pytest_in(example)
    assert checked.returncode == 0 and "3 passed" in checked.stdout, checked.stdout
