"""`check --against`: what it may claim of compiled code against eager."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent / "scripts"


def test_against_eager_of_a_script_that_compiles_nothing_says_so_and_claims_no_match(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchrepro",
            "check",
            "--out",
            "c",
            "--against",
            "eager",
            str(SCRIPTS / "deterministic.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads((tmp_path / "c" / "report.json").read_text())
    det = report["determinism"]
    assert proc.returncode == 1, proc.stderr
    assert det["verdict"] == "nothing_compared" and det["steps_compared"] == 5
    assert det["nothing_compared_because"].startswith("nothing was compiled in the run as written")
    first = " ".join(proc.stdout.split())
    assert first.startswith("NOTHING COMPARED: nothing was compiled") and "BIT-EXACT" not in proc.stdout
