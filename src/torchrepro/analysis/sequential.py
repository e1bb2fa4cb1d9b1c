"""Sequential statistics of ``drift --until-clear`` and the run counts of ``drift --plan``: decide
each factor as soon as the answer is clear, with tests that stay valid however often they are
looked at. Pure numpy + scipy, no torch.

**Binary factors (paired differences d₁, d₂, …): a sign-flip betting e-process.** Under the null
"the factor makes no difference" the two runs of a pair are exchangeable, so each difference is
symmetric about 0: given every magnitude ``|dᵢ|``, the signs are fair coins. For a bet size η the
wealth ``Wₙ(η) = Πᵢ (1 + tanh(η |dᵢ| / sᵢ) · sign(dᵢ))`` (``sᵢ``: the root mean square of
``|d₁|…|dᵢ|``, a function of magnitudes only) is then a nonnegative martingale with mean 1 — it is
the likelihood ratio of the signs given the magnitudes under a normal shift ``θ = η / sᵢ``
(Ramdas, Grünwald, Vovk & Shafer 2023, "Game-theoretic statistics and safe anytime-valid
inference"; the sign test by betting of Shafer & Vovk 2019). The mixture over η ∈ {0.5, 1, 2, 4}
and both signs is one too, and by Ville's inequality ``P(supₙ Wₙ ≥ 1/α) ≤ α``: a difference is
declared when the wealth reaches 1/α = 20, after any batch, however many batches are looked at
(exact for any symmetric noise, heavy tails included; the wealth after any pair counts, also
between looks, since Ville's bound holds for the supremum). The same test of ``d − μ₀`` for every μ₀ on a
grid, inverted, gives a **confidence sequence** (Howard, Ramdas, McAuliffe & Sekhon 2021): an
interval that holds at every look at once (running intersection). With ``--target-effect E`` a
factor is also decided when that interval lies inside (−E, E): "smaller than E".

**Random factors (variance shares): the ANOVA F test with α spent over looks.** For a main effect
of a crossed design (one run per cell) ``F = MS_f / MS_error``: two factors, the exact F test
against the interaction; three, the quasi-F ``MS_f / (MS_fg + MS_fh − MS_fgh)`` with Satterthwaite
degrees of freedom (Satterthwaite 1946). The look at n levels spends ``α / (n(n − 1))``; those sum
to α over n = 2, 3, … (a Bonferroni bound over looks: valid however the looks are chosen).

**Out of reach.** A factor that is not decided when the budget ends is reported as such; the
run stops early when no factor can be decided within the budget: for a binary factor, when a
difference one standard error above the estimate would still lie inside the noise band of the
budget's last look (the half width of the normal-mixture confidence sequence of Robbins 1970 at the
measured std, a closed form standing in for the betting sequence's), and with a target the
"smaller than E" side cannot be reached either; for a random factor, when the F test at the
budget's last look would have power below 0.5 at the upper confidence bound of the factor's
variance ratio. Stopping for that never declares a difference, so it cannot add false positives.

**Planning.** Runs needed for a fixed design (the paired t-test at 80 % power,
:func:`torchrepro.analysis.drift.pairs_needed`), and for the sequential rule the median number of
pairs it stops after, from :func:`simulate_paired` at the measured std (normal noise).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypedDict

import numpy as np
from scipy import stats

from ..reports.drift_report import DriftAnalysis, FactorPlan, Look, Sequential, SequentialFactor
from .drift import RESIDUAL, BinaryFactor, DriftRun, mean_squares, pairs_needed, variance_components

ALPHA = 0.05
ETAS = np.array([0.5, 1.0, 2.0, 4.0])  # bet sizes, in units of 1 / (rms magnitude)
THRESHOLD = 1 / ALPHA
CS_GRID = 801  # points of the μ₀ grid a confidence sequence is inverted on


# --- binary factors: the betting e-process and its confidence sequence --------------------------


def wealth(d: np.ndarray, mu0: float | np.ndarray = 0.0) -> np.ndarray:
    """The mixture wealth after each pair (last axis) for the null "symmetric about ``mu0``";
    leading axes are independent experiments (``mu0`` broadcasts against them)."""
    x = np.asarray(d, dtype=float) - np.asarray(mu0, dtype=float)[..., None]
    a = np.abs(x)
    scale = np.sqrt(np.cumsum(a * a, axis=-1) / np.arange(1, x.shape[-1] + 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(scale > 0, a / np.where(scale > 0, scale, 1.0), 0.0)
    bet = np.tanh(ETAS.reshape((-1,) + (1,) * x.ndim) * r) * np.sign(x)
    with np.errstate(divide="ignore"):
        up = np.exp(np.cumsum(np.log1p(bet), axis=-1))
        down = np.exp(np.cumsum(np.log1p(-bet), axis=-1))
    result: np.ndarray = 0.5 * (up.mean(axis=0) + down.mean(axis=0))
    return result


def confidence_sequence(d: np.ndarray, looks: list[int]) -> list[list[float] | None]:
    """The running-intersection confidence sequence (level 1 − α) of the mean difference at each
    look (number of pairs); None while it is still unbounded (too few pairs to exclude anything)."""
    d = np.asarray(d, dtype=float)
    if not len(d):
        return [None for _ in looks]
    spread = float(np.ptp(d)) or float(np.abs(d).max()) or 1.0
    grid = np.linspace(d.min() - 2 * spread, d.max() + 2 * spread, CS_GRID)
    kept = wealth(np.broadcast_to(d, (CS_GRID, len(d))), grid) < THRESHOLD  # (grid, pairs)
    alive = np.logical_and.accumulate(kept, axis=1)  # running intersection
    out: list[list[float] | None] = []
    for n in looks:
        inside = np.flatnonzero(alive[:, n - 1]) if n else np.arange(CS_GRID)
        if not len(inside) or inside[0] == 0 or inside[-1] == CS_GRID - 1:
            out.append(None)
        else:
            out.append([float(grid[inside[0]]), float(grid[inside[-1]])])
    return out


def mixture_halfwidth(sd: float, n: int, alpha: float = ALPHA) -> float:
    """Half width of the normal-mixture confidence sequence for a mean after n observations of std
    ``sd`` (Robbins 1970, mixing variance = sd²): ``sd √((n+1)/n² · log((n+1)/α²))``."""
    return sd * math.sqrt((n + 1) / n**2 * math.log((n + 1) / alpha**2)) if n else math.inf


class PairedPath(TypedDict):
    """A binary factor's sequential analysis (:func:`paired_path`)."""

    decision: str
    decided_at: int | None  # pairs
    path: list[Look]
    test: str


class ShareDecision(TypedDict):
    """A random factor's F test at one look (:func:`share_decisions`)."""

    p_value: float
    alpha_spent: float
    decision: str  # real | out_of_reach | undecided
    levels: int


class Simulated(TypedDict):
    """Simulated sequential experiments (:func:`simulate_paired`): the rates of declared and of
    correct differences, the pairs used, and the fixed design of the same power."""

    effect: float
    declared: float
    correct: float
    mean_pairs: float
    median_pairs: float
    fixed_pairs: int | None


def paired_path(d: list[float], looks: list[int], target_effect: float | None, budget_pairs: int | None) -> PairedPath:
    """The sequential analysis of a binary factor's paired differences ``d`` (in the order they were
    added) at each look (``looks``: pairs seen, each between 1 and ``len(d)``): estimate, confidence sequence, wealth, and the decision at the last look —
    ``difference`` (the wealth reached 1/α), ``smaller`` (the interval lies inside ±target),
    ``out_of_reach`` (see the module docstring), or ``undecided``."""
    arr = np.asarray(d, dtype=float)
    w = wealth(arr) if len(arr) else np.ones(0)
    reached = np.maximum.accumulate(w) if len(w) else w  # Ville: the wealth at any pair so far counts
    intervals = confidence_sequence(arr, looks)
    path: list[Look] = []
    decision, decided_at = "undecided", None
    estimate = 0.0
    for n, ci in zip(looks, intervals):
        estimate = float(arr[:n].mean())
        path.append({"n": n, "estimate": estimate, "interval": ci, "wealth": float(w[n - 1])})
        if decision != "undecided":
            continue
        if reached[n - 1] >= THRESHOLD:
            decision, decided_at = "difference", n
        elif target_effect is not None and ci is not None and -target_effect < ci[0] and ci[1] < target_effect:
            decision, decided_at = "smaller", n
    n = looks[-1] if looks else 0
    if decision == "undecided" and budget_pairs is not None and budget_pairs > n >= 2:
        sd = float(arr[:n].std(ddof=1))
        if not _reachable(abs(estimate), sd, n, budget_pairs, target_effect):
            decision = "out_of_reach"
    return {"decision": decision, "decided_at": decided_at, "path": path, "test": PAIRED_TEST}


PAIRED_TEST = (
    "sign-flip betting e-process (mixture over bet sizes 0.5, 1, 2, 4, both signs), difference declared "
    f"when the wealth reaches 1/alpha = {THRESHOLD:g}; interval: its running-intersection confidence sequence"
)


def _reachable(est: float, sd: float, n: int, budget: int, target: float | None) -> bool:
    if sd == 0:  # identical differences: a nonzero one grows the wealth, a zero one only bounds the interval
        return est != 0 or target is not None
    upper = est + sd / math.sqrt(n)  # an optimistic difference: one standard error above the estimate
    end = mixture_halfwidth(sd, budget)
    return upper > end or (target is not None and est + end < target)


# --- random factors: F tests with α spent over looks --------------------------------------------


def spent_alpha(levels: int, alpha: float = ALPHA) -> float:
    """The α of the look at ``levels`` levels: α / (n(n − 1)), summing to α over n ≥ 2."""
    return alpha / (levels * (levels - 1))


def main_effect_f(y: np.ndarray, k: int) -> list[tuple[Any, float, Any]]:
    """``(F, df1, df2)`` of each main effect of a crossed grid (factor axes last, one run per cell):
    k = 2 exact, k = 3 the Satterthwaite quasi-F. Leading axes are independent designs."""
    if k not in (2, 3):
        raise ValueError("an F test of a main effect needs 2 or 3 crossed factors")
    ms = mean_squares(y, k)
    sizes = y.shape[-k:]
    out = []
    for f in range(k):
        df1 = sizes[f] - 1
        if k == 2:
            g = 1 - f
            denom, df2 = ms[(0, 1)], np.full(np.shape(ms[(0, 1)]), (sizes[0] - 1) * (sizes[1] - 1), float)
        else:
            g, h = (x for x in range(3) if x != f)
            pair_fg, pair_fh = tuple(sorted((f, g))), tuple(sorted((f, h)))
            parts = [(ms[pair_fg], df1 * (sizes[g] - 1)), (ms[pair_fh], df1 * (sizes[h] - 1))]
            triple = (ms[(0, 1, 2)], df1 * (sizes[g] - 1) * (sizes[h] - 1))
            denom = np.maximum(parts[0][0] + parts[1][0] - triple[0], 1e-300)
            df2 = denom**2 / (sum(m**2 / df for m, df in parts) + triple[0] ** 2 / triple[1])
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append((ms[(f,)] / denom, float(df1), df2))
    return out


def share_decisions(
    y: np.ndarray, names: list[str], budget_levels: int | None, alpha: float = ALPHA
) -> dict[str, ShareDecision]:
    """Per random factor of the grid ``y`` at this look: the F test's p-value, the α spent here,
    and the decision: ``real`` (p below the spent α), ``out_of_reach`` or ``undecided``."""
    k = len(names)
    n = min(y.shape)
    a = spent_alpha(n, alpha)
    result: dict[str, ShareDecision] = {}
    for name, (f, df1, df2) in zip(names, main_effect_f(y, k)):
        f, df2 = float(f), float(df2)
        p = float(stats.f.sf(f, df1, df2)) if math.isfinite(f) else 1.0
        decision = "real" if p < a else "undecided"
        if decision == "undecided" and budget_levels is not None and budget_levels > n:
            # the upper (1 - α spent) bound of the ratio σ²_f / σ²_error, then the power at the last look
            others = math.prod(y.shape) / y.shape[names.index(name)]
            ratio = max(f / stats.f.ppf(a, df1, df2) - 1, 0.0) / others if math.isfinite(f) else 0.0
            if share_power(budget_levels, k, ratio, alpha) < 0.5:
                decision = "out_of_reach"
        result[name] = {"p_value": p, "alpha_spent": a, "decision": decision, "levels": n}
    return result


def share_power(levels: int, k: int, ratio: float, alpha: float = ALPHA) -> float:
    """Power of the (k = 2) F test of a main effect at ``levels`` levels per factor and the look's
    spent α, when σ²_f / σ²_error = ``ratio`` (F/(1 + n^{k-1}·ratio) is F-distributed); the quasi-F
    of k = 3 is taken with the same degrees of freedom as k = 2 (an approximation)."""
    df1, df2 = levels - 1, (levels - 1) ** 2
    crit = stats.f.isf(spent_alpha(levels, alpha), df1, df2)
    return float(stats.f.sf(crit / (1 + levels ** (k - 1) * ratio), df1, df2))


def levels_needed(k: int, ratio: float, power: float = 0.8, alpha: float = ALPHA, limit: int = 1000) -> int | None:
    """The fewest levels per random factor whose look detects ``ratio`` with ``power``."""
    if ratio <= 0:
        return None
    for n in range(2, limit + 1):
        if share_power(n, k, ratio, alpha) >= power:
            return n
    return None


# --- simulation: the rule against the fixed design -------------------------------------------


def stopping_pairs(d: np.ndarray, batch: int = 1) -> tuple[Any, Any]:
    """For experiments ``d`` (experiments × max pairs), looked at after every ``batch`` pairs: whether
    the rule declared a difference, and the pairs used (the maximum when it never did)."""
    n_max = d.shape[-1]
    looks = np.arange(batch, n_max + 1, batch)
    hit = np.maximum.accumulate(wealth(d), axis=1)[:, looks - 1] >= THRESHOLD
    declared = hit.any(axis=1)
    used = np.where(declared, looks[hit.argmax(axis=1)], n_max)
    return declared, used


def simulate_paired(
    effect: float,
    sd: float,
    *,
    max_pairs: int,
    batch: int = 1,
    experiments: int = 2000,
    noise: str = "normal",
    seed: int = 0,
) -> Simulated:
    """``experiments`` simulated sequential experiments of paired differences ``effect + noise``
    (``normal``, or ``t3``: Student t with 3 degrees of freedom, scaled to std ``sd``), monitored
    after every ``batch`` pairs up to ``max_pairs``: the rate of declared differences with the
    right sign, the mean and median pairs used, and the fixed design of the same power (the
    fewest pairs at which the paired t-test at α reaches that rate on the same streams)."""
    rng = np.random.default_rng(seed)
    if noise == "normal":
        e = rng.normal(size=(experiments, max_pairs))
    elif noise == "t3":
        e = rng.standard_t(3, size=(experiments, max_pairs)) / math.sqrt(3)
    else:
        raise ValueError(f"unknown noise {noise!r}")
    d = effect + sd * e
    declared, used = stopping_pairs(d, batch)
    sums = np.cumsum(d, axis=1)
    right_sign = np.sign(sums[np.arange(experiments), used - 1]) == (np.sign(effect) if effect else 0)
    decided = declared if effect == 0 else declared & right_sign
    rate = float(decided.mean())
    return {
        "effect": effect,
        "declared": float(declared.mean()),
        "correct": rate,
        "mean_pairs": float(used.mean()),
        "median_pairs": float(np.median(used)),
        "fixed_pairs": fixed_pairs_for(d, rate) if effect else None,
    }


def fixed_pairs_for(d: np.ndarray, power: float, alpha: float = ALPHA) -> int | None:
    """The fewest pairs at which the two-sided paired t-test on the first n differences of each
    experiment rejects, with the right sign, in at least ``power`` of them (None: not within the
    streams' length). A power of 1 is taken as 1 − 1/(2·experiments)."""
    experiments, n_max = d.shape
    power = min(power, 1 - 0.5 / experiments)
    n = np.arange(1, n_max + 1)
    mean = np.cumsum(d, axis=1) / n
    var = (np.cumsum(d * d, axis=1) - n * mean**2) / np.maximum(n - 1, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = mean / np.sqrt(var / n)
    crit = stats.t.isf(alpha / 2, np.maximum(n - 1, 1))
    right = np.sign(t) == np.sign(d.mean())
    rates = ((np.abs(t) > crit) & right & (n > 1)).mean(axis=0)
    above = np.flatnonzero(rates >= power)
    return int(n[above[0]]) if len(above) else None


def predicted_pairs(effect: float, sd: float, batch: int = 1, max_pairs: int = 10_000) -> int | None:
    """The median number of pairs the sequential rule uses to declare a true difference ``effect``
    with differences of std ``sd`` (normal noise, up to 1000 simulated experiments); None above ``max_pairs``."""
    if effect == 0 or not math.isfinite(sd):
        return None
    if sd == 0:
        return 1
    horizon = min(max_pairs, max(64, int(40 * (sd / abs(effect)) ** 2) + batch))
    experiments = max(200, min(1000, 2_000_000 // horizon))  # bounded memory for tiny effects
    sim = simulate_paired(abs(effect), sd, max_pairs=horizon, batch=batch, experiments=experiments, seed=1)
    if sim["correct"] < 0.5:
        return None
    return int(sim["median_pairs"])


def simulate_shares(
    ratio: float,
    *,
    max_levels: int,
    experiments: int = 2000,
    noise: str = "normal",
    seed: int = 0,
) -> dict[str, float | None]:
    """``experiments`` simulated two-factor crossed designs (factor A with σ²_A = ``ratio``, factor B
    and the error with variance 1) grown one level of each factor at a time from 2 to
    ``max_levels`` and looked at after each: the rate at which A is declared real, the mean runs
    (levels²) used, and the fixed design of the same power (the fewest levels at which the F test
    at α declares it as often, on the same grids)."""
    rng = np.random.default_rng(seed)
    shape = (experiments, max_levels, max_levels)
    if noise not in ("normal", "t3"):
        raise ValueError(f"unknown noise {noise!r}")

    def draw(size: tuple[int, ...]) -> np.ndarray:
        return rng.normal(size=size) if noise == "normal" else rng.standard_t(3, size=size) / math.sqrt(3)

    y = math.sqrt(ratio) * draw(size=shape[:2])[:, :, None] + draw(size=shape[:2])[:, None, :] + draw(size=shape)
    declared = np.zeros(experiments, bool)
    used = np.full(experiments, max_levels**2)
    fixed_rate = {}
    for n in range(3, max_levels + 1):
        f, df1, df2 = main_effect_f(y[:, :n, :n], 2)[0]
        p = stats.f.sf(f, df1, df2)
        new = ~declared & (p < spent_alpha(n))
        used[new] = n * n
        declared |= new
        fixed_rate[n] = float((p < ALPHA).mean())
    rate = float(declared.mean())
    fixed = next((n * n for n, r in fixed_rate.items() if r >= min(rate, 1 - 0.5 / experiments)), None)
    return {"ratio": ratio, "declared": rate, "mean_runs": float(used.mean()), "fixed_runs": fixed if ratio else None}


# --- a drift experiment: its looks and its plan --------------------------------------------------


def _shell(levels: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """The order pairs are added in as levels grow: every cell below n levels before any at n."""
    return (max(levels, default=0), levels)


def ordered_differences(runs: list[DriftRun], factor: BinaryFactor) -> list[tuple[tuple[int, ...], float]]:
    """The factor's paired differences ``(levels, level[1] − level[0])`` of the complete pairs, in the
    order a growing experiment adds them (:func:`_shell`)."""
    sides = [
        {
            tuple(v for _, v in sorted(r.seeds.items())): r.metric
            for r in runs
            if r.settings == s and r.status == "ok" and r.metric is not None
        }
        for s in factor.settings
    ]
    common = sorted(set(sides[0]) & set(sides[1]), key=_shell)
    return [(key, sides[1][key] - sides[0][key]) for key in common]


def _ok(run: DriftRun) -> bool:
    return run.status == "ok" and run.metric is not None


def _grid(runs: list[DriftRun], random_factors: list[str], n: int) -> np.ndarray | None:
    y = np.full((n,) * len(random_factors), np.nan)
    for r in runs:
        if not r.settings and _ok(r) and all(r.seeds[f] < n for f in random_factors):
            y[tuple(r.seeds[f] for f in random_factors)] = r.metric
    return None if np.isnan(y).any() else y


def sequential_section(
    runs: list[DriftRun],
    random_factors: list[str],
    binary: list[BinaryFactor],
    looks: list[int],
    runs_at: Callable[[int], int],
    *,
    max_runs: int,
    target_effect: float | None = None,
    blocked: frozenset[str] = frozenset(),
) -> Sequential:
    """The ``sequential`` section of an ``--until-clear`` report: for every factor to decide, its path
    (estimate and interval at each look, ``looks`` = levels per factor) and its decision; ``stop``
    says why the experiment ended (``decided``, ``out_of_reach``, ``budget``) or ``continue``.
    ``runs_at(n)``: the runs of the design at n levels; ``max_runs``: the budget."""
    affordable = max((n for n in range(2, 100_000) if runs_at(n) <= max_runs), default=1)
    k = len(random_factors)
    factors: list[SequentialFactor] = []
    for factor in binary:
        ordered = ordered_differences(runs, factor)
        seen = [(n, sum(1 for key, _ in ordered if max(key, default=0) < n)) for n in looks]
        seen = [(n, c) for n, c in seen if c]
        result = paired_path([d for _, d in ordered], [c for _, c in seen], target_effect, affordable ** max(k, 1))
        for step, (n, _) in zip(result["path"], seen):
            step["levels"], step["runs"] = n, runs_at(n)
        at = result["decided_at"]
        decided_runs = next((runs_at(n) for n, c in seen if c == at), None) if at else None
        factors.append(
            {
                "factor": factor.name,
                "kind": "binary",
                "labels": list(factor.labels),
                "decision": result["decision"],
                "path": result["path"],
                "test": result["test"],
                "decided_at_runs": decided_runs,
            }
        )
    if k in (2, 3):
        names = list(random_factors)
        paths: dict[str, list[Look]] = {f: [] for f in names if f not in blocked}
        last: dict[str, tuple[str, int | None]] = {}  # name -> the decision at its last look, the levels it was made at
        for n in looks:
            y = _grid(runs, random_factors, n)
            if y is None or n < 3:
                continue
            shares = {c["name"]: c for c in variance_components(y, names, resamples=500)}
            for name, dec in share_decisions(y, names, affordable).items():
                if name not in paths:
                    continue
                paths[name].append(
                    {
                        "levels": n,
                        "runs": runs_at(n),
                        "estimate": shares[name]["variance_share"],
                        "interval": shares[name]["ci95"],
                        "p_value": dec["p_value"],
                        "alpha_spent": dec["alpha_spent"],
                    }
                )
                if last.get(name, ("",))[0] != "real":
                    last[name] = (dec["decision"], n if dec["decision"] == "real" else None)
        for name, path in paths.items():
            decision, at = last.get(name, ("undecided", None))
            factors.append(
                {
                    "factor": name,
                    "kind": "random",
                    "decision": decision,
                    "decided_at_runs": runs_at(at) if at else None,
                    "path": path,
                    "test": SHARE_TEST,
                }
            )
    decisions = [f["decision"] for f in factors]
    next_look = looks[-1] + 1 if looks else 2
    if decisions and all(d in DECIDED for d in decisions):
        stop = "decided"
    elif runs_at(next_look) > max_runs:
        stop = "budget"
    elif decisions and all(d in DECIDED or d == "out_of_reach" for d in decisions):
        stop = "out_of_reach"
    else:
        stop = "continue"
    return {
        "looks": looks,
        "runs_used": runs_at(looks[-1]) if looks else 0,
        "max_runs": max_runs,
        "target_effect": target_effect,
        "factors": factors,
        "stop": stop,
    }


DECIDED = ("difference", "smaller", "real")
SHARE_TEST = (
    "ANOVA F test of the main effect (k = 2 exact, k = 3 quasi-F), alpha / (n(n - 1)) spent at the look at n levels"
)


def planning(
    section: DriftAnalysis,
    runs: list[DriftRun],
    random_factors: list[str],
    binary: list[BinaryFactor],
    runs_at: Callable[[int], int],
    *,
    step: int = 1,
    target_effect: float | None = None,
    observed: float | None = None,
) -> list[FactorPlan]:
    """How many runs each factor needs (``--plan`` and the end of every report): for a binary
    factor, the MDE at its current pairs, the pairs a fixed design needs to detect the effect
    (``--target-effect``, else ``--observed``, else the difference measured) at 80 % power and the
    median pairs the sequential rule stops after, as runs of this design; for a random factor
    (two or three crossed), the levels at which the F test (at the look's spent α) detects its
    measured variance ratio (or a std of ``--target-effect``) with 80 % power."""
    k = len(random_factors)
    per_level = max(k, 1)
    plans: list[FactorPlan] = []
    for factor, effect in zip(binary, section["effects"]):
        if effect["n"] < 2 or effect["std"] is None or effect["difference"] is None:  # (set from one pair on)
            continue
        size, basis = (
            (target_effect, "target effect")
            if target_effect is not None
            else (abs(observed), "observed difference")
            if observed is not None
            else (abs(effect["difference"]), "difference measured")
        )
        fixed = pairs_needed(effect["std"], size) if size else None
        seq = predicted_pairs(size, effect["std"], batch=step) if size else None
        plans.append(
            {
                "factor": factor.name,
                "kind": "binary",
                "effect": size,
                "basis": basis,
                "pairs": effect["n"],
                "std": effect["std"],
                "mde": effect["mde"],
                "fixed_pairs": fixed,
                "fixed_runs": runs_at(_levels_for(fixed, per_level)) if fixed else None,
                "sequential_pairs": seq,
                "sequential_runs": runs_at(_levels_for(seq, per_level)) if seq else None,
            }
        )
    residual = next((f for f in section["factors"] if f["name"] == RESIDUAL), None)
    if k in (2, 3) and residual and residual["variance"] > 0:
        for f in section["factors"]:
            if f["name"] == RESIDUAL or f.get("not_separable"):
                continue
            std = target_effect if target_effect is not None else f["std"]
            ratio = std**2 / residual["variance"]
            levels = levels_needed(k, ratio)
            plans.append(
                {
                    "factor": f["name"],
                    "kind": "random",
                    "effect": std,
                    "basis": "target effect" if target_effect is not None else "std measured",
                    "levels": f["levels"],
                    "levels_needed": levels,
                    "runs_needed": runs_at(levels) if levels else None,
                }
            )
    return plans


def _levels_for(pairs: int, axes: int) -> int:
    """Levels per axis whose design holds at least ``pairs`` pairs."""
    return max(2, int(math.ceil(pairs ** (1 / axes) - 1e-9)))


def plan_sentence(p: FactorPlan, fmt: Callable[[float | None], str]) -> str:
    """``compile: about 20 more pairs (40 runs) would detect a difference of 0.5 (80 % power) ...``"""
    name, effect = p["factor"], fmt(p["effect"])
    if p["kind"] == "random":
        if p["levels_needed"] is None:
            return f"{name}: a std of {effect} is out of reach of any affordable design"
        more = max(p["levels_needed"] - (p["levels"] or 0), 0)
        if not more:
            return f"{name}: {p['levels']} levels already detect a std of {effect} (80 % power)"
        return f"{name}: about {more} more level{'s' * (more != 1)} ({p['runs_needed']} runs in all) would detect a std of {effect} (80 % power)"
    mde = f"at N = {p['pairs']} the smallest detectable difference is {fmt(p['mde'])}"
    if p["fixed_pairs"] is None:
        return f"{name}: {mde}; a difference of {effect} is out of reach"
    more = p["fixed_pairs"] - p["pairs"]
    head = (
        f"{name}: about {more} more pair{'s' * (more != 1)} ({p['fixed_runs']} runs in all) would detect a difference of {effect} "
        "(80 % power)"
        if more > 0
        else f"{name}: N = {p['pairs']} already detects a difference of {effect} (80 % power)"
    )
    pairs = p["sequential_pairs"]
    seq = f"; --until-clear would stop after about {pairs} pair{'s' * (pairs != 1)}" if pairs else ""
    return f"{head}{seq}; {mde}"


STOPS = {
    "decided": "every factor decided",
    "out_of_reach": "the remaining budget cannot decide the rest",
    "budget": "the budget is spent",
    "continue": "interrupted before a decision",
}


def sequential_sentence(
    entry: SequentialFactor, fmt: Callable[[float | None], str], target: float | None = None
) -> str:
    """``compile: a real difference, decided after 24 runs (+0.84, interval [0.21, 1.5])``."""
    last = entry["path"][-1] if entry["path"] else None
    what = {
        "difference": "a real difference",
        "real": "a real share of the variance",
        "smaller": f"smaller than {fmt(target)}",
        "out_of_reach": "out of reach of the budget",
        "undecided": "undecided",
    }[entry["decision"]]
    text = f"{entry['factor']}: {what}"
    if entry["decided_at_runs"]:
        text += f", decided after {entry['decided_at_runs']} runs"
    if last is not None and last["estimate"] is not None:
        ci = last["interval"]
        if entry["kind"] == "binary":
            est = ("+" if last["estimate"] > 0 else "") + fmt(last["estimate"])
            text += f" ({est}, interval " + (f"[{fmt(ci[0])}, {fmt(ci[1])}])" if ci else "unbounded)")
        else:
            text += f" (share {100 * last['estimate']:.0f} %)"
    return text


def sequential_verdict(seq: Sequential, fmt: Callable[[float | None], str]) -> str:
    """The sequential part of the verdict: one sentence per factor, then runs used and why it stopped."""
    parts = [sequential_sentence(f, fmt, seq.get("target_effect")) for f in seq["factors"]]
    parts.append(f"--until-clear used {seq['runs_used']} runs of at most {seq['max_runs']} ({STOPS[seq['stop']]})")
    return "; ".join(parts)
