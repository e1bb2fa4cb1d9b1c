"""The fix ladder's decisions: which candidate fixes apply to a divergence, what each re-run
showed (bit-exact, not, crashed, timed out) and what it costs, which one to recommend, and — for
``--against eager`` — at which backend stage results first change. Pure: recorded results in,
rows and a recommendation out; nothing here imports torch.

A fix is recommended only when it was tried and its runs were bit-exact: the cheapest such fix by
step time against the run as written (ties: the ladder's order). A fix that failed, timed out or was
not bit-exact is reported as such and never recommended.

What a fix costs is measured on comparable steps only (:func:`step_cost`): the same step indices in
the baseline and in each of the fix's runs, after :data:`WARMUP_STEPS` steps of warm-up (compilation,
a DataLoader's workers starting: the first batches wait for them), leaving out every step during
which either compiled; with the spread of the per-step ratios. With fewer than :data:`MIN_TIMED`
such steps no cost is shown, and the row says why.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

DOC = "docs/compiled-nondeterminism.md"
WARMUP_STEPS = 4  # steps 0-3 are warm-up: never in a cost
MIN_TIMED = 3  # comparable steps a cost needs
StepTimes = dict[int, float]  # step index -> seconds (rank 0), the steps during which nothing compiled
LADDER = ("threads_1", "deterministic", "fallback_random", "aot_eager", "eager")


@dataclass
class Candidate:
    """One candidate fix: its name, the exact line or variable a user sets, how the ladder's
    runs apply it (``torchrepro run --fix SPEC`` or a compile mode), and whether it applies."""

    name: str
    how: str
    spec: str | None = None
    compile_mode: str | None = None
    applicable: bool = True
    why_not: str | None = None


def candidates(
    *, compiled: bool, inductor: bool, random_ops: bool, frames: list[int] | None = None, function: str | None = None
) -> list[Candidate]:
    """The ladder for a divergence: one intra-op thread, ``torchrepro.deterministic()``, inductor's
    ``fallback_random`` (only when random ops are involved), the offending function (Dynamo
    ``frames``) compiled with ``aot_eager``, compilation off.

    >>> [c.name for c in candidates(compiled=True, inductor=True, random_ops=False) if c.applicable]
    ['threads_1', 'deterministic', 'aot_eager', 'eager']
    """
    target = function or "the compiled function"
    frame_spec = "aot_eager:" + ",".join(map(str, frames)) if frames else "aot_eager"
    out = [
        Candidate(
            "threads_1",
            "torch.set_num_threads(1) (instead of the script's own set_num_threads; "
            "OMP_NUM_THREADS=1 when the script sets none)",
            spec="threads_1",
        ),
        Candidate(
            "deterministic",
            "torchrepro.deterministic(compile='native') before compiling "
            "(torch.use_deterministic_algorithms(True) + torch._inductor.config.deterministic "
            "= True)",
            spec="deterministic",
        ),
        Candidate(
            "fallback_random",
            "torch._inductor.config.fallback_random = True",
            spec="fallback_random",
            applicable=inductor and random_ops,
            why_not=None
            if inductor and random_ops
            else "no random op in the compiled graphs"
            if inductor
            else "no inductor graph",
        ),
        Candidate(
            "aot_eager",
            f"torch.compile(..., backend='aot_eager') for {target}",
            spec=frame_spec,
            applicable=inductor,
            why_not=None if inductor else "no inductor graph",
        ),
        Candidate(
            "eager",
            "torch._dynamo.config.disable = True (compilation off), or drop torch.compile",
            compile_mode="eager",
            applicable=compiled,
            why_not=None if compiled else "nothing is compiled",
        ),
    ]
    return out


class _FixRowHead(TypedDict):
    name: str
    how: str
    bit_exact: bool | None  # None: the runs were not compared
    step_time_ratio: float | None


class FixRow(_FixRowHead, total=False):
    """One row of ``determinism.fixes`` (:func:`judge_fix`; every row it returns has a ``status``):
    why it did not apply, what its runs said when they failed, and the step times it was measured by."""

    step_time_s: float
    baseline_step_s: float
    step_time_spread: list[float]  # the per-step ratios' first and third quartiles
    steps_timed: list[int]  # the first and last step index timed, and how many
    cost_not_measured: str  # why no cost is shown
    steps_compared: int
    status: str  # bit_exact | not_bit_exact | failed | timed_out | nothing_compared | not_applicable
    why: str | None
    problems: list[str]


class _StageHead(TypedDict):
    name: str  # eager | aot_eager | fallback-random | inductor
    run: str
    bit_exact_with_previous: bool | None  # None: not compared


class Stage(_StageHead, total=False):
    """One backend stage of ``--against eager`` against the stage before it (the first step where
    they diverge, if they do)."""

    first_divergent_step: int


class StageChange(TypedDict):
    """The first stage whose results differ from the stage before it."""

    stage: str
    previous: str


class BackendStages(TypedDict):
    """``determinism.backend_stages``: every stage, and the first that changes the results."""

    stages: list[Stage]
    first_change: StageChange | None


@dataclass
class FixRun:
    """How one of a fix's runs ended and its step times by index."""

    ok: bool
    problems: list[str] = field(default_factory=list)
    timed_out: bool = False
    step_times: StepTimes = field(default_factory=dict)


class StepCost(TypedDict):
    """A fix's cost on comparable steps: the median of the per-step ratios (fix over baseline at
    the same index), their first and third quartiles, the medians divided, and the steps used."""

    ratio: float
    low: float
    high: float
    fix_s: float
    baseline_s: float
    first: int
    last: int
    steps: int


def step_cost(baseline: StepTimes, runs: Sequence[StepTimes]) -> StepCost | str:
    """The cost of a fix whose runs took ``runs`` against ``baseline``, on the step indices all of
    them timed after warm-up; or why it cannot be measured.

    >>> step_cost({i: 0.1 for i in range(10)}, [{i: 0.135 for i in range(10)}] * 2)["ratio"]
    1.35
    >>> step_cost({0: 9.0, 1: 4.0, 2: 4.0, 3: 4.0, 4: 0.1}, [{i: 0.1 for i in range(5)}])
    'cost not measured: 1 comparable step after warm-up (steps 4 and later, timed in the baseline and every run of the fix; 3 needed)'
    """
    common = sorted(i for i in baseline if i >= WARMUP_STEPS and baseline[i] > 0 and all(i in r for r in runs))
    if len(common) < MIN_TIMED or not runs:
        return (
            f"cost not measured: {len(common)} comparable step{'' if len(common) == 1 else 's'} after warm-up "
            f"(steps {WARMUP_STEPS} and later, timed in the baseline and every run of the fix; {MIN_TIMED} needed)"
        )
    ratios = sorted(r[i] / baseline[i] for r in runs for i in common)
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return {
        "ratio": round(median, 3),
        "low": round(q1, 3),
        "high": round(q3, 3),
        "fix_s": statistics.median(r[i] for r in runs for i in common),
        "baseline_s": statistics.median(baseline[i] for i in common),
        "first": common[0],
        "last": common[-1],
        "steps": len(common),
    }


def cost_text(row: FixRow) -> str:
    """A row's cost as said: ``1.35x the step time (1.30-1.41 over steps 4-9)``, or why none.

    >>> cost_text({"step_time_ratio": 1.35, "step_time_spread": [1.3, 1.41], "steps_timed": [4, 9, 6]})
    '1.35x the step time (1.30-1.41 over steps 4-9)'
    """
    ratio = row.get("step_time_ratio")
    if ratio is None:
        return row.get("cost_not_measured") or "cost not measured"
    low, high = row.get("step_time_spread") or (ratio, ratio)
    first, last, _ = row.get("steps_timed") or (None, None, None)
    return f"{ratio:.2f}x the step time ({low:.2f}-{high:.2f} over steps {first}-{last})"


def judge_fix(
    candidate: Candidate, runs: list[FixRun], diverged: bool | None, steps_compared: int, baseline: StepTimes | None
) -> FixRow:
    """One row of ``determinism.fixes``: ``{name, how, status, bit_exact, step_time_ratio, ...}``.
    ``status`` is ``bit_exact``, ``not_bit_exact``, ``failed`` (a run crashed or exited non-zero),
    ``timed_out``, ``nothing_compared`` or ``not_applicable``; ``bit_exact`` is True/False only when
    the runs were compared, else None. Its cost: :func:`step_cost` of its runs against ``baseline``
    (the step times of a run as written in the same configuration; None: none ran)."""
    row: FixRow = {"name": candidate.name, "how": candidate.how, "bit_exact": None, "step_time_ratio": None}
    if not candidate.applicable:
        return row | {"status": "not_applicable", "why": candidate.why_not}
    problems = [p for r in runs for p in r.problems]
    if any(r.timed_out for r in runs):
        return row | {"status": "timed_out", "problems": problems[:3]}
    if not runs or not all(r.ok for r in runs):
        return row | {"status": "failed", "problems": problems[:3] or ["the fix's runs did not start"]}
    cost = step_cost(baseline, [r.step_times for r in runs]) if baseline else "cost not measured: no baseline run"
    if isinstance(cost, str):
        row["cost_not_measured"] = cost
    else:  # with what it divides, so that a reader can check it
        row["step_time_s"], row["baseline_step_s"] = cost["fix_s"], cost["baseline_s"]
        row["step_time_ratio"] = cost["ratio"]
        row["step_time_spread"] = [cost["low"], cost["high"]]
        row["steps_timed"] = [cost["first"], cost["last"], cost["steps"]]
    if steps_compared == 0 or diverged is None:
        return row | {"status": "nothing_compared"}
    row["bit_exact"] = not diverged
    row["steps_compared"] = steps_compared
    return row | {"status": "bit_exact" if not diverged else "not_bit_exact"}


def recommend(rows: list[FixRow]) -> FixRow | None:
    """The cheapest fix that was tried and bit-exact (lowest step-time ratio; unknown cost last,
    then the ladder's order), or None."""
    exact = [r for r in rows if r.get("status") == "bit_exact" and r.get("bit_exact") is True]
    if not exact:
        return None
    order = {name: i for i, name in enumerate(LADDER)}
    return min(
        exact,
        key=lambda r: (r["step_time_ratio"] is None, r["step_time_ratio"] or 0.0, order.get(r["name"], len(order))),
    )


def fix_hint(rows: list[FixRow]) -> str | None:
    """The hint line: the recommended fix with its cost, and which tried fixes did not work."""
    if not rows:
        return None
    best = recommend(rows)
    failed = [r["name"] for r in rows if r.get("status") not in ("bit_exact", "not_applicable")]
    tail = f" Tried and not bit-exact or failed: {', '.join(failed)}." if failed else ""
    if best is None:
        return f"No candidate fix made the runs bit-exact.{tail} See {DOC}."
    return f"Measured fix: {best['how']} — bit-exact, {cost_text(best)}.{tail} See {DOC}."


def first_changing_stage(stages: list[Stage]) -> StageChange | None:
    """``stages`` in order (eager → aot_eager → fallback-random → inductor), each ``{name,
    bit_exact_with_previous}`` (None: not compared): the first stage whose results differ from the
    stage before it, or None when every compared stage agrees."""
    for prev, stage in zip(stages, stages[1:]):
        if stage.get("bit_exact_with_previous") is False:
            return {"stage": stage["name"], "previous": prev["name"]}
    return None
