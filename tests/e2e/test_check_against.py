"""`check --against`: what it may claim of compiled code against eager."""

from __future__ import annotations

import json
from pathlib import Path

from support import run_torchrepro

SCRIPTS = Path(__file__).parents[1] / "scripts"


def test_against_eager_of_a_script_that_compiles_nothing_says_so_and_claims_no_match(tmp_path):
    proc = run_torchrepro("check", "--out", "c", "--against", "eager", str(SCRIPTS / "deterministic.py"), cwd=tmp_path)
    report = json.loads((tmp_path / "c" / "report.json").read_text())
    det = report["determinism"]
    assert proc.returncode == 1, proc.stderr
    assert det["verdict"] == "nothing_compared" and det["steps_compared"] == 5
    assert det["nothing_compared_because"].startswith("nothing was compiled in the run as written")
    first = " ".join(proc.stdout.split())
    assert first.startswith("NOTHING COMPARED: nothing was compiled") and "BIT-EXACT" not in proc.stdout


def test_an_rng_share_within_the_compiled_runs_own_noise_is_not_blamed_on_rng():
    from torchrepro.analysis.nondeterminism import cause_from_decomposition

    def part(a: str, b: str, diff: float) -> dict:
        return {"between": [a, b], "bit_exact": diff == 0, "final_max_abs": diff, "final_max_rel": diff}

    dec = {
        "rng": part("fallback-random", "compiled", 3e-3),
        "numerics": part("eager", "fallback-random", 1e-5),
        "total": part("eager", "compiled", 3e-3),
    }
    assert cause_from_decomposition(dec, "eager")[0] == "rng"  # with no run-to-run measure: RNG
    noisy = {**dec, "run_to_run": part("compiled", "compiled-again", 2e-3)}
    cause, evidence = cause_from_decomposition(noisy, "eager")
    assert cause == "nondeterministic_op" and evidence.facts["run_to_run"]["final_max_abs"] == 2e-3
    assert "not reproducible run to run" in evidence.because and "0.002" in evidence.because
    steady = {**dec, "run_to_run": part("compiled", "compiled-again", 0.0)}
    assert cause_from_decomposition(steady, "eager")[0] == "rng"  # reproducible: the share is RNG's
