"""The statistics of `torchrepro drift` on simulated metrics (no training): the paired test keeps
its false-positive rate under a null, its power matches theory, variance components recover
known components, and the verdict and separability follow from the numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from torchrepro.analysis import drift as d

ALPHA = 0.05


def _margin(p: float, n: int) -> float:
    """Three binomial standard errors of a rate p estimated from n experiments."""
    return 3 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("n_pairs, experiments", [(8, 4000), (10, 4000), (20, 1000)])  # exact, exact, Monte-Carlo
def test_false_positive_rate_under_the_null_stays_below_alpha(n_pairs, experiments):
    rng = np.random.default_rng(n_pairs)
    # a skewed null (symmetric differences are all the sign-flip test assumes): centred exponential differences
    diffs = rng.exponential(size=(experiments, n_pairs)) - rng.exponential(size=(experiments, n_pairs))
    p = d.sign_flip_p(diffs)
    rate = float((p <= ALPHA).mean())
    assert rate <= ALPHA + _margin(ALPHA, experiments), rate
    assert rate > 0.01  # the test is not trivially conservative either


def test_power_for_a_known_effect_matches_theory():
    n, experiments = 10, 4000
    rng = np.random.default_rng(1)
    for effect in (0.5, d.minimal_detectable_effect(1.0, n)):
        theory = d.paired_power(n, effect, 1.0)
        p = d.sign_flip_p(rng.normal(effect, 1.0, size=(experiments, n)))
        power = float((p <= ALPHA).mean())
        assert abs(power - theory) < 0.03 + _margin(theory, experiments), (effect, power, theory)


def test_mde_and_pairs_needed_invert_the_power_function():
    mde = d.minimal_detectable_effect(0.3, 8)
    assert d.paired_power(8, mde, 0.3) == pytest.approx(d.POWER, abs=1e-6)
    n = d.pairs_needed(0.3, 0.2)
    assert d.paired_power(n, 0.2, 0.3) >= d.POWER > d.paired_power(n - 1, 0.2, 0.3)
    assert d.minimal_detectable_effect(0.0, 8) == 0.0 and d.minimal_detectable_effect(1.0, 1) is None


def test_paired_effect_interval_and_p_value():
    a = np.arange(12.0)
    e = d.paired_effect(a, a + 0.1 + 0.01 * np.sin(a))
    assert e["difference"] == pytest.approx(0.1 + 0.01 * np.sin(a).mean())
    assert e["ci95"][0] < e["difference"] < e["ci95"][1]
    assert e["p_value"] == pytest.approx(2 / 2**12)  # every difference positive: only ± all-same signs tie
    same = d.paired_effect(a, a)
    assert same["p_value"] == 1.0 and same["std"] == 0.0


def test_variance_component_estimates_are_unbiased():
    rng = np.random.default_rng(2)
    reps, n = 3000, 6
    truth = {"init": 4.0, "order": 1.0, "noise": 0.25}
    y = rng.normal(0, 2.0, (reps, n, 1)) + rng.normal(0, 1.0, (reps, 1, n)) + rng.normal(0, 0.5, (reps, n, n))
    est = d.component_estimates(y, 2)
    for key, want in ((0,), truth["init"]), ((1,), truth["order"]), ((0, 1), truth["noise"]):
        values = est[key]
        se = values.std() / math.sqrt(reps)
        assert abs(values.mean() - want) < 4 * se, (key, values.mean(), want)


def test_three_way_components_are_unbiased():
    rng = np.random.default_rng(3)
    reps, n = 2000, 4
    y = (
        rng.normal(0, 1.0, (reps, n, 1, 1))
        + rng.normal(0, 0.5, (reps, 1, n, 1))
        + rng.normal(0, 1.5, (reps, 1, 1, n))
        + rng.normal(0, 0.7, (reps, n, n, 1))
        + rng.normal(0, 0.3, (reps, n, n, n))
    )
    est = d.component_estimates(y, 3)
    for key, want in (((0,), 1.0), ((1,), 0.25), ((2,), 2.25), ((0, 1), 0.49), ((0, 2), 0.0), ((0, 1, 2), 0.09)):
        values = est[key]
        assert abs(values.mean() - want) < 4 * values.std() / math.sqrt(reps) + 1e-12, (key, values.mean(), want)


def test_variance_shares_recover_known_components_with_intervals():
    rng = np.random.default_rng(4)
    n = 40
    y = rng.normal(0, 2.0, (n, 1)) + rng.normal(0, 1.0, (1, n)) + rng.normal(0, 0.5, (n, n))
    init, order, rest = d.variance_components(y, ["init", "order"])
    true = np.array([4.0, 1.0, 0.25]) / 5.25
    for comp, want in zip((init, order, rest), true):
        assert abs(comp["variance_share"] - want) < 0.12, (comp, want)
        lo, hi = comp["ci95"]
        assert lo <= comp["variance_share"] <= hi
    assert init["ci95"][0] <= true[0] <= init["ci95"][1]
    assert sum(c["variance_share"] for c in (init, order, rest)) == pytest.approx(1.0)
    # order exactly constant: its component truncates to zero
    flat = rng.normal(0, 1.0, (8, 1)) + np.zeros((1, 8))
    _, none, _ = d.variance_components(flat, ["init", "order"])
    assert none["variance"] == 0.0 and none["variance_share"] == 0.0


def _runs(metric, levels=6, binary=None, rng0=None, batches=None):
    """Simulated runs of an init x order grid, plus a `compile` setting on the same seeds."""
    runs, index = [], 0
    for settings in ({}, *(binary or [])):
        for i in range(levels):
            for j in range(levels):
                seeds = {"init": i, "order": j}
                runs.append(
                    d.DriftRun(
                        index,
                        seeds,
                        dict(settings),
                        metric(i, j, settings),
                        "ok",
                        rng0=rng0(i, j) if rng0 else f"r{i}",
                        batches=batches(i, j) if batches else (f"b{j}",),
                    )
                )
                index += 1
    return runs


COMPILE = d.BinaryFactor("compile", ("eager", "as written"), ({"compile": "eager"}, {}))


def test_analyse_finds_a_planted_effect_and_not_a_null():
    rng = np.random.default_rng(5)
    init, order = rng.normal(0, 1.0, 6), rng.normal(0, 0.5, 6)

    def metric(shift):
        return lambda i, j, s: init[i] + order[j] + (shift if s else 0) + 0.01 * rng.normal()

    real = d.analyse(_runs(metric(-0.3), binary=[{"compile": "eager"}]), ["init", "order"], [COMPILE], 6)
    (effect,) = real["effects"]
    assert effect["p_value"] < ALPHA and effect["difference"] == pytest.approx(0.3, abs=0.02)
    assert "real difference" in real["verdict"] and real["verdict"].startswith("compile (as written − eager): +0.29")
    shares = {f["name"]: f["variance_share"] for f in real["factors"]}
    assert shares["init"] > shares["order"] > shares[d.RESIDUAL]

    null = d.analyse(
        _runs(metric(0.0), binary=[{"compile": "eager"}]),
        ["init", "order"],
        [COMPILE],
        6,
        observed=0.8,
        target_effect=0.05,
    )
    (effect,) = null["effects"]
    assert effect["p_value"] > ALPHA and "not distinguishable from noise at N = 36 (MDE" in null["verdict"]
    assert effect["pairs_needed"] > 2 and null["observed"]["sigmas"] > 0
    assert "init explains" in null["verdict"] and "two runs differ that much" in null["verdict"]


def test_crashed_runs_are_excluded_and_listed():
    runs = _runs(lambda i, j, s: float(i + 0.1 * j), binary=[{"compile": "eager"}])
    runs[3].status, runs[3].metric, runs[3].error = "crashed", None, "exit 3"
    report = d.analyse(runs, ["init", "order"], [COMPILE], 6)
    assert report["excluded"] == [{"index": 3, "status": "crashed", "dir": "", "error": "exit 3"}]
    assert report["effects"][0]["n"] == 35  # the crashed cell's pair is dropped, not averaged
    assert any("levels dropped" in n for n in report["notes"])
    assert {f["name"]: f["levels"] for f in report["factors"]}["order"] == 5


def test_separability_is_measured_from_rng_and_batches():
    metric = lambda i, j, s: float(i)
    constant_seed = d.analyse(_runs(metric, rng0=lambda i, j: "same"), ["init", "order"], [], 6)
    assert [x["factors"] for x in constant_seed["not_separable"]] == [["init"]]
    assert {f["name"]: f["variance_share"] for f in constant_seed["factors"]}["init"] is None
    global_order = d.analyse(_runs(metric, batches=lambda i, j: (f"b{i}",)), ["init", "order"], [], 6)
    assert [x["factors"] for x in global_order["not_separable"]] == [["init", "order"]]
    assert "could not be separated" in global_order["verdict"]
    full_batch = d.analyse(_runs(metric, batches=lambda i, j: ("all",)), ["init", "order"], [], 6)
    assert not full_batch["not_separable"] and any("same batches" in n for n in full_batch["notes"])
    clean = d.analyse(_runs(metric), ["init", "order"], [], 6)
    assert not clean["not_separable"] and not clean["notes"]
    small = d.analyse(_runs(metric, levels=3), ["init", "order"], [], 3)
    assert any("intervals of the shares are wide" in n for n in small["notes"])


def test_observed_difference_against_noise():
    rng = np.random.default_rng(6)
    values = rng.normal(0, 0.5, 400)
    placed = d.place_observed(0.8, values)
    assert placed["sigmas"] == pytest.approx(0.8 / values.std(ddof=1))
    assert placed["pair_fraction"] == pytest.approx(placed["pair_fraction_normal"], abs=0.03)
    assert placed["pair_fraction_normal"] == pytest.approx(2 * stats.norm.sf(0.8 / (0.5 * math.sqrt(2))), abs=0.03)
