"""The sequential statistics of `drift --until-clear` and the run counts of `--plan`, on simulated
metric streams (no training, numpy-vectorised: seconds): the betting test keeps its false-positive
rate under continuous monitoring (normal and heavy-tailed noise), decides medium and large effects
with fewer runs than the fixed design of the same power, its confidence sequence covers the truth
at every look at once; the variance-share rule does the same for random factors; the path, the
decisions and the planning sentences follow from the numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from torchrepro.analysis import drift as d
from torchrepro.analysis import sequential as s


EXPERIMENTS = 2000


BUDGET = 60  # pairs: 6 x the fixed design's 80 % power at 1 sd


def _margin(p: float, n: int) -> float:
    return 3 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("noise", ["normal", "t3"])
@pytest.mark.parametrize("batch", [1, 4])
def test_nulls_declare_a_difference_in_at_most_5_percent_of_2000_monitored_experiments(noise, batch):
    result = s.simulate_paired(0.0, 1.0, max_pairs=BUDGET, batch=batch, noise=noise, experiments=EXPERIMENTS)
    assert result["declared"] <= 0.05, result
    assert result["mean_pairs"] > 0.9 * BUDGET  # a null runs to the budget (it is never "decided" as real)


@pytest.mark.parametrize("noise", ["normal", "t3"])
@pytest.mark.parametrize("effect", [1.0, 2.0])
@pytest.mark.parametrize("batch", [1, 4])
def test_effects_of_1_and_2_sd_are_decided_with_fewer_runs_than_the_fixed_design_of_the_same_power(
    noise, effect, batch
):
    r = s.simulate_paired(effect, 1.0, max_pairs=BUDGET, batch=batch, noise=noise, experiments=EXPERIMENTS)
    assert r["correct"] >= 0.95, r  # the right sign, declared
    fixed = r["fixed_pairs"] or BUDGET + 1  # None: the t-test does not reach that power within the budget
    assert r["mean_pairs"] < fixed, r


def test_the_wealth_is_a_martingale_under_a_skewed_paired_null():
    # exchangeable pairs of a skewed metric: their differences are symmetric, all the test assumes
    rng = np.random.default_rng(5)
    a, b = rng.exponential(size=(2, 40000, 12))
    w = s.wealth(b - a)
    for n in (1, 4, 12):
        mean, se = w[:, n - 1].mean(), w[:, n - 1].std() / math.sqrt(len(w))
        assert abs(mean - 1) < 4 * se + 1e-3, (n, mean, se)


def test_the_confidence_sequence_covers_the_mean_at_every_look_at_once():
    rng = np.random.default_rng(6)
    looks = list(range(2, 31))
    missed, bounded = 0, 0
    for _ in range(200):
        diffs = 0.7 + rng.standard_t(3, size=30)
        intervals = s.confidence_sequence(diffs, looks)
        missed += any(ci is not None and not ci[0] <= 0.7 <= ci[1] for ci in intervals)
        bounded += intervals[-1] is not None
    assert missed / 200 <= 0.05 + _margin(0.05, 200), missed
    assert bounded > 175  # after 30 pairs the interval is finite in nearly every experiment


def test_the_share_rule_keeps_its_false_positives_and_beats_the_fixed_design_at_a_real_share():
    for noise in ("normal", "t3"):
        null = s.simulate_shares(0.0, max_levels=12, noise=noise, experiments=EXPERIMENTS)
        assert null["declared"] <= 0.05, null
    real = s.simulate_shares(1.0, max_levels=12, experiments=EXPERIMENTS)
    assert real["declared"] >= 0.95 and real["mean_runs"] < real["fixed_runs"], real


def test_the_plan_predicts_the_pairs_the_sequential_rule_uses():
    for effect in (1.0, 2.0):
        predicted = s.predicted_pairs(effect, 1.0)
        used = s.simulate_paired(effect, 1.0, max_pairs=BUDGET, experiments=EXPERIMENTS, seed=9)["median_pairs"]
        assert predicted / 2 <= used <= 2 * predicted, (effect, predicted, used)
    assert s.predicted_pairs(0.0, 1.0) is None and s.predicted_pairs(1.0, 0.0) == 1


def _runs(diffs: list[float], base: float = 10.0) -> list[d.DriftRun]:
    """A --vary compile experiment: per seed level, the script as written and eager."""
    runs = []
    for level, diff in enumerate(diffs):
        runs.append(d.DriftRun(2 * level, {"seeds": level}, {}, base + diff, "ok"))
        runs.append(d.DriftRun(2 * level + 1, {"seeds": level}, {"compile": "eager"}, base, "ok"))
    return runs


def test_a_clear_difference_is_decided_and_its_path_is_reported():
    rng = np.random.default_rng(7)
    runs = _runs(list(2.0 + rng.normal(size=20)))
    looks = list(range(3, 21))
    seq = s.sequential_section(runs, [], [d.BINARY_FACTORS["compile"]], looks, lambda n: 2 * n, max_runs=40)
    (entry,) = seq["factors"]
    assert entry["decision"] == "difference" and seq["stop"] == "decided"
    path = entry["path"]
    assert [p["levels"] for p in path] == looks and [p["runs"] for p in path] == [2 * n for n in looks]
    decided = next(p for p in path if p["runs"] == entry["decided_at_runs"])
    assert decided["interval"][0] > 0 and all(
        p["interval"] is None or p["interval"][0] <= 0 for p in path[: path.index(decided)]
    )
    assert "a real difference, decided after" in s.sequential_verdict(seq, d.fmt_number)


def test_a_null_within_a_target_is_decided_smaller_and_a_small_budget_is_out_of_reach():
    rng = np.random.default_rng(9)
    diffs = list(0.05 * rng.normal(size=40))
    looks = list(range(2, 41, 2))
    small = s.sequential_section(
        _runs(diffs), [], [d.BINARY_FACTORS["compile"]], looks, lambda n: 2 * n, max_runs=80, target_effect=0.2
    )
    assert small["factors"][0]["decision"] == "smaller" and small["stop"] == "decided"
    # no target, 20 pairs measured: a budget of 44 runs (22 pairs) can resolve nothing more
    reach = s.sequential_section(
        _runs(diffs[:20]), [], [d.BINARY_FACTORS["compile"]], [20], lambda n: 2 * n, max_runs=44
    )
    assert reach["factors"][0]["decision"] == "out_of_reach" and reach["stop"] == "out_of_reach"
    budget = s.sequential_section(_runs(diffs[:4]), [], [d.BINARY_FACTORS["compile"]], [4], lambda n: 2 * n, max_runs=9)
    assert budget["stop"] == "budget"


def test_a_real_share_is_decided_on_a_crossed_grid():
    rng = np.random.default_rng(10)
    n = 8
    y = 2.0 * rng.normal(size=(n, 1)) + 0.2 * rng.normal(size=(1, n)) + 0.3 * rng.normal(size=(n, n))
    runs = [
        d.DriftRun(i * n + j, {"init": i, "order": j}, {}, float(y[i, j]), "ok") for i in range(n) for j in range(n)
    ]
    seq = s.sequential_section(runs, ["init", "order"], [], list(range(3, n + 1)), lambda k: k * k, max_runs=64)
    decisions = {f["factor"]: f["decision"] for f in seq["factors"]}
    assert decisions["init"] == "real", seq
    init = next(f for f in seq["factors"] if f["factor"] == "init")
    assert all(p["p_value"] >= p["alpha_spent"] for p in init["path"] if p["runs"] < init["decided_at_runs"])


def test_planning_sentences_say_how_many_more_pairs_detect_the_effect():
    rng = np.random.default_rng(11)
    diffs = list(0.3 + rng.normal(size=6))
    runs = _runs(diffs)
    factor = d.BINARY_FACTORS["compile"]
    section = d.analyse(runs, [], [factor], 6, target_effect=0.5)
    (plan,) = s.planning(section, runs, [], [factor], lambda n: 2 * n, target_effect=0.5)
    sd = section["effects"][0]["std"]
    assert plan["fixed_pairs"] == d.pairs_needed(sd, 0.5) and plan["fixed_runs"] == 2 * plan["fixed_pairs"]
    assert plan["mde"] == section["effects"][0]["mde"] and plan["basis"] == "target effect"
    sentence = s.plan_sentence(plan, d.fmt_number)
    assert sentence.startswith(f"compile: about {plan['fixed_pairs'] - 6} more pairs ({2 * plan['fixed_pairs']} runs")
    assert (
        "would detect a difference of 0.50 (80 % power)" in sentence and "at N = 6 the smallest detectable" in sentence
    )


def test_identical_pairs_are_out_of_reach_without_a_target_and_smaller_than_one():
    runs = _runs([0.0] * 10)  # compiled and eager bit-identical in every pair
    compile_factor = [d.BINARY_FACTORS["compile"]]
    alone = s.sequential_section(runs, [], compile_factor, [4, 6, 8, 10], lambda n: 2 * n, max_runs=100)
    assert alone["factors"][0]["decision"] == "out_of_reach" and alone["stop"] == "out_of_reach"
    target = s.sequential_section(
        runs, [], compile_factor, [4, 6, 8, 10], lambda n: 2 * n, max_runs=100, target_effect=0.5
    )
    (entry,) = target["factors"]
    assert entry["decision"] == "smaller" and target["stop"] == "decided" and entry["decided_at_runs"] <= 20
