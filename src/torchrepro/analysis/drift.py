"""Statistics of a drift experiment: is a difference between runs real, and which factor causes it.

Pure numpy + scipy, no torch. Every number says how it was computed:

- **Per level** (:func:`summarize`): mean, sample standard deviation (``ddof=1``) and the 95 %
  Student-t interval of the mean, ``mean ± t(0.975, n-1) · std / √n``.
- **Random factors** (seeds of ``init``, ``order``, ``augment``), fully crossed with one run per
  cell (:func:`variance_components`): the balanced random-effects ANOVA. For every set S of
  factors the mean square MS_S is computed from the inclusion–exclusion effect of S; its
  expectation is ``Σ_{T ⊇ S} (Π_{f ∉ T} n_f) σ²_T``, which is inverted exactly
  (method of moments, Möbius inversion over the subsets): ``σ²_S = Σ_{T ⊇ S} (-1)^{|T|-|S|}
  MS_T / Π_{f ∉ S} n_f``. The highest interaction is confounded with run-to-run noise (one run per
  cell) and is reported with the other interactions as ``interaction/residual``. Estimates below
  zero are truncated at 0; a share is a component over the sum of the truncated components.
  Its 95 % interval is the percentile interval of the same estimate on 2000 *pigeonhole* bootstrap
  resamples: the levels of each factor resampled independently with replacement (Owen 2007).
- **Binary factors** (``compile``, ``backend`` ...), paired by seeds (:func:`paired_effect`): the
  difference ``level[1] - level[0]`` per seed cell; its mean and 95 % paired-t interval; the
  p-value of the two-sided **sign-flip permutation test** of the mean difference (exact over all
  ``2^n`` sign vectors for n ≤ 16, else 20 000 Monte-Carlo sign vectors, p = (1 + hits) / (1 + M));
  the minimal detectable effect at this n (the difference a two-sided paired t-test at α = 0.05
  detects with power 0.8, from the noncentral t distribution and the measured std of the
  differences — the sign-flip test's power converges to the t-test's) and the n that detects a
  given effect with that power. With a crossed seed grid the pairs share init or order levels; the
  test treats the seed cells as exchangeable pairs (exact when the factor does not interact with
  the seeds).
- **An observed difference** (:func:`place_observed`): in units of the run-to-run std σ, and how
  often two runs differ at least that much — the fraction of all pairs of measured runs, and
  ``2(1 - Φ(|x| / (σ√2)))`` for normal noise.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

from ..eventlog.payloads import JsonObject
from ..reports.drift_report import (
    DriftAnalysis,
    EffectRow,
    ExcludedRun,
    NotSeparable,
    Observed,
    PairedEffect,
    Summary,
    VarianceComponent,
)

ALPHA = 0.05
POWER = 0.8
BOOTSTRAP = 2000
EXACT_FLIPS_UP_TO = 16
MONTE_CARLO_FLIPS = 20000
RESIDUAL = "interaction/residual"


def _ci_t(mean: float, std: float, n: int, level: float = 0.95) -> list[float] | None:
    if n < 2 or not math.isfinite(std):
        return None
    half = stats.t.ppf(0.5 + level / 2, n - 1) * std / math.sqrt(n)
    return [float(mean - half), float(mean + half)]


def summarize(values: Iterable[float]) -> Summary:
    """``{n, mean, std, ci95}`` of the values (sample std, Student-t interval of the mean).

    >>> summarize([1.0, 2.0, 3.0])["ci95"]  # doctest: +ELLIPSIS
    [-0.48..., 4.48...]
    """
    x = np.asarray(list(values), dtype=float)
    n = len(x)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "ci95": None}
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if n > 1 else None
    return {"n": n, "mean": mean, "std": std, "ci95": _ci_t(mean, std, n) if std is not None else None}


# --- variance components of a crossed random design ------------------------------------------


def _subsets(items: Iterable[int]) -> list[tuple[int, ...]]:
    items = tuple(items)
    return [s for r in range(len(items) + 1) for s in itertools.combinations(items, r)]


def mean_squares(y: np.ndarray, k: int) -> dict[tuple[int, ...], np.ndarray]:
    """Mean squares of every non-empty factor set of a fully crossed design with one value per cell.

    ``y`` has the k factor axes last (any leading axes are independent designs, computed at
    once). Keys are tuples of factor indices; values have the leading shape of ``y``.
    """
    sizes = y.shape[-k:]
    lead = y.ndim - k
    marginal = {}
    for kept in _subsets(range(k)):
        drop = tuple(lead + f for f in range(k) if f not in kept)
        marginal[kept] = y.mean(axis=drop, keepdims=True) if drop else y
    factor_axes = tuple(range(lead, y.ndim))
    result = {}
    for s in _subsets(range(k))[1:]:
        effect = sum((-1) ** (len(s) - len(t)) * marginal[t] for t in _subsets(s))
        others = math.prod(sizes[f] for f in range(k) if f not in s)
        df = math.prod(sizes[f] - 1 for f in s)
        result[s] = others * (effect**2).sum(axis=factor_axes) / df
    return result


def component_estimates(y: np.ndarray, k: int) -> dict[tuple[int, ...], np.ndarray]:
    """Method-of-moments variance components (not truncated) of every factor set; the full set is
    the highest interaction plus run-to-run noise. See the module docstring for the formula."""
    sizes = y.shape[-k:]
    ms = mean_squares(y, k)
    full = tuple(range(k))
    result = {}
    for s in ms:
        if s == full:
            result[s] = ms[s]
            continue
        supersets = [t for t in ms if set(s) <= set(t)]
        total = sum((-1) ** (len(t) - len(s)) * ms[t] for t in supersets)
        result[s] = total / math.prod(sizes[f] for f in range(k) if f not in s)
    return result


def _shares(y: np.ndarray, k: int) -> np.ndarray:
    """Shares (main effects of the k factors, then interaction/residual) along a last axis."""
    comps = {s: np.maximum(v, 0.0) for s, v in component_estimates(y, k).items()}
    mains = [comps[(f,)] for f in range(k)]
    rest = sum((v for s, v in comps.items() if len(s) > 1), np.zeros_like(mains[0]))
    parts = np.stack([*mains, rest], axis=-1)
    total = parts.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, parts / np.where(total > 0, total, 1.0), np.nan)


def _pigeonhole(y: np.ndarray, k: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """``resamples`` copies of ``y`` with the levels of each factor resampled independently."""
    index = []
    for f, n in enumerate(y.shape):
        shape = [resamples] + [1] * k
        shape[1 + f] = n
        index.append(rng.integers(0, n, size=(resamples, n)).reshape(shape))
    return y[tuple(index)]


def variance_components(
    y: np.ndarray, names: list[str], *, resamples: int = BOOTSTRAP, seed: int = 0
) -> list[VarianceComponent]:
    """Variance components and shares of a fully crossed grid ``y`` (axis f = levels of
    ``names[f]``), each share with its pigeonhole-bootstrap 95 % interval; a last entry
    ``interaction/residual`` holds everything the main effects do not explain.

    >>> rng = np.random.default_rng(0)
    >>> y = rng.normal(size=(8, 1)) * 2 + rng.normal(size=(1, 8)) + 0.1 * rng.normal(size=(8, 8))
    >>> [round(c["variance_share"], 1) for c in variance_components(y, ["init", "order"])]  # doctest: +SKIP
    [0.8, 0.2, 0.0]
    """
    y = np.asarray(y, dtype=float)
    k = y.ndim
    if k != len(names) or any(n < 2 for n in y.shape):
        raise ValueError("need one axis per factor and at least 2 levels on each")
    comps = {s: max(float(v), 0.0) for s, v in component_estimates(y, k).items()}
    shares = _shares(y, k)
    boot = _shares(_pigeonhole(y, k, resamples, np.random.default_rng(seed)), k)
    lo, hi = np.nanpercentile(boot, [2.5, 97.5], axis=0) if np.isfinite(boot).any() else ([np.nan] * (k + 1),) * 2
    rest = sum(v for s, v in comps.items() if len(s) > 1)
    variances = [comps[(f,)] for f in range(k)] + [rest]
    out: list[VarianceComponent] = []
    for i, name in enumerate([*names, RESIDUAL]):
        if name == RESIDUAL and k == 1:
            break  # one factor, one run per level: no replicate measures residual noise
        share = float(shares[i]) if np.isfinite(shares[i]) else None
        ci = [float(lo[i]), float(hi[i])] if share is not None and np.isfinite(lo[i]) else None
        out.append(
            {
                "name": name,
                "levels": int(y.shape[i]) if i < k else None,
                "variance": variances[i],
                "std": math.sqrt(variances[i]),
                "variance_share": share,
                "ci95": ci,
            }
        )
    return out


# --- paired comparisons of binary factors -------------------------------------------------------


def sign_flip_p(d: np.ndarray, *, seed: int = 0) -> np.ndarray | float:
    """Two-sided sign-flip permutation p-value of the mean of paired differences ``d`` (last
    axis; leading axes are independent experiments): exact over all ``2^n`` sign vectors for
    n ≤ 16, else 20 000 Monte-Carlo sign vectors with p = (1 + hits) / (1 + M)."""
    d = np.asarray(d, dtype=float)
    n = d.shape[-1]
    if n <= EXACT_FLIPS_UP_TO:
        signs = 1.0 - 2.0 * ((np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1)
        exact = True
    else:
        signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(MONTE_CARLO_FLIPS, n))
        exact = False
    observed = np.abs(d.sum(axis=-1))
    flipped = np.abs(d @ signs.T)
    tol = 1e-9 * np.maximum(np.abs(d).sum(axis=-1), 1e-300)  # identical sums up to rounding count as ties
    hits = (flipped >= (observed - tol)[..., None]).sum(axis=-1)
    p = hits / len(signs) if exact else (1 + hits) / (1 + len(signs))
    p = np.minimum(p, 1.0)
    return float(p) if np.ndim(p) == 0 else p


def _power_nc(n: int, nc: float, alpha: float) -> float:
    df = n - 1
    crit = stats.t.ppf(1 - alpha / 2, df)
    upper, lower = stats.nct.sf(crit, df, nc), stats.nct.cdf(-crit, df, nc)  # NaN far in the tails: 1 and 0
    return float(np.nan_to_num(upper, nan=1.0) + np.nan_to_num(lower, nan=0.0))


def paired_power(n: int, effect: float, sd: float, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test with n pairs for a true mean difference ``effect``
    when the differences have standard deviation ``sd`` (noncentral t, noncentrality
    ``|effect| √n / sd``)."""
    if n < 2:
        return float("nan")
    if sd == 0:
        return 1.0 if effect else alpha
    return _power_nc(n, abs(effect) * math.sqrt(n) / sd, alpha)


def minimal_detectable_effect(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The smallest true difference detected with ``power`` at n pairs (paired t, two-sided).

    >>> round(minimal_detectable_effect(1.0, 10), 3)
    0.996
    """
    if n < 2 or not math.isfinite(sd):
        return None
    if sd == 0:
        return 0.0
    nc = optimize.brentq(lambda x: _power_nc(n, x, alpha) - power, 0.0, 40.0)
    return float(nc * sd / math.sqrt(n))


def pairs_needed(
    sd: float, effect: float, alpha: float = ALPHA, power: float = POWER, limit: int = 10**7
) -> int | None:
    """The smallest number of pairs that detects ``effect`` with ``power`` (None above ``limit``)."""
    if effect == 0 or not math.isfinite(sd):
        return None
    if sd == 0:
        return 2
    lo, hi = 2, 2
    while paired_power(hi, effect, sd, alpha) < power:
        lo, hi = hi, hi * 2
        if hi > limit:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if paired_power(mid, effect, sd, alpha) >= power:
            hi = mid
        else:
            lo = mid + 1
    return hi


def paired_effect(
    a: Iterable[float],
    b: Iterable[float],
    *,
    target_effect: float | None = None,
    alpha: float = ALPHA,
    power: float = POWER,
) -> PairedEffect:
    """The paired difference ``b - a``: mean, 95 % paired-t interval, sign-flip p-value, minimal
    detectable effect and (with ``target_effect``) the pairs needed to detect it.

    >>> paired_effect([1.0, 2.0, 3.0, 4.0], [1.5, 2.4, 3.6, 4.5])["p_value"]
    0.125
    """
    a, b = np.asarray(list(a), dtype=float), np.asarray(list(b), dtype=float)
    d = b - a
    n = len(d)
    mean = float(d.mean()) if n else None
    sd = float(d.std(ddof=1)) if n > 1 else float("nan")
    exact = n <= EXACT_FLIPS_UP_TO
    result: PairedEffect = {
        "n": n,
        "difference": mean,
        "std": sd if n > 1 else None,
        "ci95": _ci_t(mean, sd, n) if mean is not None and n > 1 else None,
        "p_value": float(sign_flip_p(d)) if n else None,
        "test": f"sign-flip permutation of the mean paired difference ({'exact, 2^n sign vectors' if exact else f'Monte-Carlo, {MONTE_CARLO_FLIPS} sign vectors'})",
        "mde": minimal_detectable_effect(sd, n, alpha, power),
        "mde_method": f"paired t, two-sided, alpha {alpha}, power {power}, std of the differences",
        "alpha": alpha,
    }
    if target_effect is not None:
        result["target_effect"] = target_effect
        result["pairs_needed"] = pairs_needed(sd, target_effect, alpha, power)
    return result


def place_observed(x: float, values: Iterable[float]) -> Observed:
    """A difference ``x`` the user saw, against the run-to-run noise of ``values``."""
    v = np.asarray(list(values), dtype=float)
    if len(v) < 2:
        return {"observed": x, "sigma": None}
    sigma = float(v.std(ddof=1))
    i, j = np.triu_indices(len(v), 1)
    diffs = np.abs(v[i] - v[j])
    return {
        "observed": x,
        "sigma": sigma,
        "runs": len(v),
        "sigmas": abs(x) / sigma if sigma > 0 else None,
        "pair_fraction": float((diffs >= abs(x)).mean()),
        "pair_fraction_normal": float(2 * stats.norm.sf(abs(x) / (sigma * math.sqrt(2)))) if sigma > 0 else None,
        "method": "σ = std of the runs with every seed varied; pairs: all pairs of those runs; normal: 2(1-Φ(|x|/(σ√2)))",
    }


# --- the experiment ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BinaryFactor:
    """A two-level factor: ``labels[i]`` is reached by the run settings ``settings[i]`` (``{}``:
    the script as written)."""

    name: str
    labels: tuple[str, str]
    settings: tuple[dict[str, str], dict[str, str]]


RANDOM_FACTORS = ("init", "order", "augment")
BINARY_FACTORS = {
    f.name: f
    for f in (
        BinaryFactor("compile", ("eager", "compiled"), ({"compile": "eager"}, {})),
        BinaryFactor("backend", ("aot_eager", "inductor"), ({"backend": "aot_eager"}, {"backend": "inductor"})),
        BinaryFactor("fallback-random", ("as written", "fallback_random"), ({}, {"fallback-random": "on"})),
        BinaryFactor("threads", ("1 thread", "default"), ({"threads": "1"}, {})),
        BinaryFactor("deterministic", ("as written", "deterministic"), ({}, {"deterministic": "on"})),
    )
}
DEFAULT_FACTORS = "init,order,compile"


@dataclass
class DriftRun:
    """One run as analysed: its seed levels, settings, outcome and what capture observed."""

    index: int
    seeds: dict[str, int]
    settings: dict[str, str]
    metric: float | None
    status: str  # ok | crashed | missing | no_metric
    dir: str = ""
    rng0: str | None = None  # torch CPU RNG state fingerprint at the first step
    batches: tuple[str, ...] | None = None  # batch fingerprints, one per step
    error: str | None = None
    extra: JsonObject = field(default_factory=dict)  # what the command recorded about the run (wall_s, attempts)


def _complete_grid(runs: list[DriftRun], factors: list[str], n: int) -> tuple[np.ndarray, list[str]]:
    """The baseline grid of metrics; levels with a missing cell are dropped (greedy, most missing first)."""
    y = np.full((n,) * len(factors), np.nan)
    for run in runs:
        if run.status == "ok" and run.metric is not None:
            y[tuple(run.seeds[f] for f in factors)] = run.metric
    keep = [list(range(n)) for _ in factors]
    dropped: list[str] = []
    while True:
        missing = np.isnan(y[np.ix_(*keep)])
        if not missing.any():
            return y[np.ix_(*keep)], dropped
        _, f, i = max((missing.take(i, axis=f).mean(), f, i) for f in range(len(keep)) for i in range(len(keep[f])))
        dropped.append(f"{factors[f]} level {keep[f][i]}")
        del keep[f][i]
        if len(keep[f]) < 2:
            return np.empty((0,)), dropped


def separability(runs: list[DriftRun], random_factors: list[str]) -> tuple[list[NotSeparable], list[str]]:
    """Which factors could not be varied apart, measured from what capture recorded: the torch RNG
    state at the first step (``init`` must change it) and the batch fingerprints (they must not
    change with ``init`` while the order and augmentation seeds are fixed). Returns
    ``(not_separable, notes)``."""
    base = [r for r in runs if not r.settings and r.status in ("ok", "no_metric")]
    not_separable: list[NotSeparable] = []
    notes: list[str] = []

    def groups(varied: str, key: Callable[[DriftRun], object]) -> list[set[object]]:
        by: dict[tuple[tuple[str, int], ...], set[tuple[int | None, object]]] = {}
        for r in base:
            value = key(r)
            if value is None:
                continue
            rest = tuple(sorted((f, lvl) for f, lvl in r.seeds.items() if f != varied))
            by.setdefault(rest, set()).add((r.seeds.get(varied), value))
        return [{v for _, v in g} for g in by.values() if len({lvl for lvl, _ in g}) > 1]

    if "init" in random_factors:
        rng_groups = groups("init", lambda r: r.rng0)
        if rng_groups and all(len(g) == 1 for g in rng_groups):
            not_separable.append(
                {
                    "factors": ["init"],
                    "reason": (
                        "the torch RNG state at the first step is the same for every init seed: the script seeds the global "
                        "generator itself (e.g. torch.manual_seed with a constant), which overrides the seed tree"
                    ),
                }
            )
        batch_groups = groups("init", lambda r: r.batches or None)
        if any(len(g) > 1 for g in batch_groups):
            not_separable.append(
                {
                    "factors": ["init", "order"],
                    "reason": (
                        "the batches change with the init seed while the order and augment seeds are fixed: the script draws "
                        "its data order or batch content from the global RNG (e.g. torch.randperm, or a custom sampler "
                        "without a generator), which torchrepro cannot give its own stream; that effect counts under init"
                    ),
                }
            )
    for name in ("order", "augment"):
        if name not in random_factors:
            continue
        if not any(r.batches for r in base):
            not_separable.append(
                {
                    "factors": [name],
                    "reason": (
                        "no DataLoader batches were observed: the script builds its batches itself, so torchrepro cannot "
                        f"give {name} its own stream"
                    ),
                }
            )
            continue
        batch_groups = groups(name, lambda r: r.batches or None)
        if batch_groups and all(len(g) == 1 for g in batch_groups):
            what = (
                "a single unshuffled batch order, or a sampler torchrepro does not reach"
                if name == "order"
                else "no DataLoader workers, or no randomness in them"
            )
            notes.append(f"{name}: every {name} seed gave the same batches ({what}); its share measures nothing")
    return not_separable, notes


def fmt_number(x: float | None, ref: float | None = None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    ref = abs(ref) if ref else abs(x)
    if ref and not 1e-3 <= ref < 1e5:
        text = f"{x:.2g}"
    else:
        text = f"{x:.{max(0, 1 - math.floor(math.log10(ref))) if ref > 0 else 2}f}"
    return "−" + text[1:] if text.startswith("-") else text


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def effect_sentence(e: EffectRow) -> str:
    """``compile (compiled − eager): −0.04 [−0.21, 0.13], p = 0.62 — not distinguishable ...``"""
    ci = e.get("ci95")
    ref = (ci[1] - ci[0]) / 2 if ci else None
    head = f"{e['factor']} ({e['levels'][1]} − {e['levels'][0]}): "
    p, difference = e["p_value"], e["difference"]
    if e["n"] < 2 or p is None or difference is None:  # both are set from one pair on
        return head + f"only {e['n']} complete pair(s): no test"
    interval = f" [{fmt_number(ci[0], ref)}, {fmt_number(ci[1], ref)}]" if ci else ""
    text = f"{head}{'+' if difference > 0 else ''}{fmt_number(difference, ref)}{interval}, p = {p:.2g}"
    if e["std"] == 0:
        return text + f" — identical in all {e['n']} pairs"
    if p < e["alpha"]:
        return text + f" — a real difference at N = {e['n']}"
    tail = f" — not distinguishable from noise at N = {e['n']} (MDE {fmt_number(e['mde'], ref)})"
    if e.get("pairs_needed"):
        tail += f"; N = {e['pairs_needed']} detects {fmt_number(e['target_effect'], ref)}"
    return text + tail


def verdict(
    effects: list[EffectRow],
    factors: list[VarianceComponent],
    not_separable: list[NotSeparable],
    observed: Observed | None,
) -> str:
    """The sentence that answers the user's question (see :func:`effect_sentence`)."""
    parts = [effect_sentence(e) for e in effects]
    shared = [f for f in factors if f["name"] != RESIDUAL and f["variance_share"] is not None]
    if shared:
        first, *rest = shared
        ci = first["ci95"]
        text = f"{first['name']} explains {_pct(first['variance_share'])}"
        if ci:
            text += f" [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]"
        text += " of the variance" + "".join(f", {f['name']} {_pct(f['variance_share'])}" for f in rest)
        parts.append(text)
    for item in not_separable:
        parts.append(
            " and ".join(item["factors"])
            + (" could not be separated" if len(item["factors"]) > 1 else " could not be varied")
            + " (see not_separable)"
        )
    if observed and observed.get("sigmas") is not None:
        parts.append(
            f"a difference of {observed['observed']:g} is {observed['sigmas']:.1f} σ of run-to-run noise; "
            f"two runs differ that much in {100 * observed['pair_fraction']:.0f} % of pairs"
        )
    return "; ".join(parts) if parts else "nothing to compare"


def analyse(
    runs: list[DriftRun],
    random_factors: list[str],
    binary: list[BinaryFactor],
    levels: int,
    *,
    observed: float | None = None,
    target_effect: float | None = None,
) -> DriftAnalysis:
    """The ``drift`` section of a report from the runs of a drift experiment."""
    ok = [r for r in runs if r.status == "ok" and r.metric is not None]
    base = [r for r in ok if not r.settings]
    not_separable, notes = separability(runs, random_factors)
    blocked = {f for item in not_separable for f in item["factors"]}

    factors: list[VarianceComponent] = []
    if random_factors:
        grid, dropped = _complete_grid(base, random_factors, levels)
        if dropped:
            notes.append("levels dropped for an incomplete grid (failed runs): " + ", ".join(dropped))
        components = variance_components(grid, random_factors) if grid.size and min(grid.shape) >= 2 else []
        for comp in components:
            if comp["name"] in blocked:
                comp["variance_share"], comp["ci95"], comp["not_separable"] = None, None, True
            if comp["name"] != RESIDUAL:
                comp["per_level"] = [
                    {"level": lvl, **summarize(_metrics(r for r in base if r.seeds[comp["name"]] == lvl))}
                    for lvl in range(levels)
                ]
            factors.append(comp)
        if not components:
            notes.append("too few complete runs for variance components")
        elif min(grid.shape) < 5:
            notes.append(
                f"{min(grid.shape)} levels per random factor: the bootstrap intervals of the shares are "
                "wide (--runs 8 narrows them)"
            )

    effects: list[EffectRow] = []
    for factor in binary:
        sides = [
            {_seed_key(r): r.metric for r in ok if r.settings == s and r.metric is not None} for s in factor.settings
        ]
        common = sorted(set(sides[0]) & set(sides[1]))
        a, b = [sides[0][k] for k in common], [sides[1][k] for k in common]
        effect: EffectRow = {
            "factor": factor.name,
            "levels": list(factor.labels),
            **paired_effect(a, b, target_effect=target_effect),
            "per_level": [{"level": lbl, **summarize(v)} for lbl, v in zip(factor.labels, (a, b))],
        }
        effects.append(effect)

    placed = place_observed(observed, _metrics(base)) if observed is not None else None
    excluded: list[ExcludedRun] = [
        {"index": r.index, "status": r.status, "dir": r.dir, "error": r.error} for r in runs if r not in ok
    ]
    return {
        "summary": summarize(_metrics(base)),
        "factors": factors,
        "effects": effects,
        "not_separable": not_separable,
        "notes": notes,
        "observed": placed,
        "excluded": excluded,
        "verdict": verdict(effects, factors, not_separable, placed),
    }


def _metrics(runs: Iterable[DriftRun]) -> list[float]:
    """The metrics of those of ``runs`` that have one (the runs analysed all do)."""
    return [r.metric for r in runs if r.metric is not None]


def _seed_key(run: DriftRun) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(run.seeds.items()))
