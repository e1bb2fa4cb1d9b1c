"""How captured runs end: the runs ``check`` makes only to compare (and ``check-resume``'s,
``drift``'s, the replays and fix runs) skip the interpreter's final garbage collections at exit
(:func:`torchrepro.runtime.prepare._collect_then_freeze`); a run the user asked for (``doctor``,
``torchrepro run``) ends as Python ends it. Real processes, real finalizers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "exit_finalizers.py"


def _torchrepro(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchrepro", *args], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_runs_made_to_compare_skip_the_last_collections_and_keep_the_rest(tmp_path):
    noted = tmp_path / "noted.txt"
    proc = _torchrepro(tmp_path, "check", "--out", "c", str(SCRIPT), "--", str(noted))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "c" / "report.json").read_text())["verdict"].startswith("BIT-EXACT")
    # each run: the script's atexit call and its garbage finalized; the cycle a module kept to the end is not
    assert sorted(noted.read_text().split()) == ["atexit", "atexit", "garbage", "garbage"]
    noted.unlink()
    proc = _torchrepro(
        tmp_path, "drift", "--vary", "init", "--runs", "2", "--jobs", "2", "--out", "d", str(SCRIPT), "--", str(noted)
    )
    assert proc.returncode in (0, 1) and (tmp_path / "d" / "report.json").exists(), proc.stdout + proc.stderr
    assert sorted(noted.read_text().split()) == ["atexit", "atexit", "garbage", "garbage"]


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_a_run_the_user_asked_for_ends_as_python_ends_it(tmp_path):
    noted = tmp_path / "noted.txt"
    proc = _torchrepro(tmp_path, "doctor", "--out", "d", str(SCRIPT), "--", str(noted))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(noted.read_text().split()) == ["atexit", "garbage", "teardown"]
    plain = tmp_path / "plain.txt"
    subprocess.run([sys.executable, str(SCRIPT), str(plain)], check=True, timeout=300)
    assert sorted(plain.read_text().split()) == ["atexit", "garbage", "teardown"]
