"""The drift report (``torchrepro drift``): the experiment's settings, every run, the effects of
the factors and the statistics they rest on."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypedDict, Union

from ..eventlog.payloads import JsonObject
from .findings import Finding, Verdict, from_fields
from .schema import SCHEMAS


class Summary(TypedDict):
    """Values summarised: count, mean, sample std and the Student-t 95 % interval of the mean (None
    where too few values)."""

    n: int
    mean: float | None
    std: float | None
    ci95: list[float] | None


class LevelSummary(Summary):
    """The summary of the runs at one level of a factor (a seed level, or a binary factor's label)."""

    level: int | str


class _VarianceComponent(TypedDict):
    name: str
    levels: int | None
    variance: float
    std: float
    variance_share: float | None
    ci95: list[float] | None


class VarianceComponent(_VarianceComponent, total=False):
    """A random factor's variance and share of the total (:func:`torchrepro.analysis.drift.variance_components`),
    with its levels' summaries; ``not_separable`` when it could not be varied apart from another."""

    not_separable: bool
    per_level: list[LevelSummary]


class NotSeparable(TypedDict):
    """Factors the experiment could not vary apart, and why."""

    factors: list[str]
    reason: str


class _Observed(TypedDict):
    observed: float
    sigma: float | None


class Observed(_Observed, total=False):
    """A difference the user saw, placed against the run-to-run noise (only ``observed`` and a None
    ``sigma`` with fewer than two runs)."""

    runs: int
    sigmas: float | None
    pair_fraction: float
    pair_fraction_normal: float | None
    method: str


class _PairedEffect(TypedDict):
    n: int
    difference: float | None
    std: float | None
    ci95: list[float] | None
    p_value: float | None
    test: str
    mde: float | None
    mde_method: str
    alpha: float


class PairedEffect(_PairedEffect, total=False):
    """A paired difference of two levels (:func:`torchrepro.analysis.drift.paired_effect`); with a
    target effect, the pairs needed to detect it."""

    target_effect: float
    pairs_needed: int | None


class EffectRow(PairedEffect):
    """A binary factor's effect, as analysis writes it (read back as :class:`Effect`)."""

    factor: str
    levels: list[str]
    per_level: list[LevelSummary]


class ExcludedRun(TypedDict):
    """A run left out of every statistic (as written; read back as :class:`Excluded`)."""

    index: int
    status: str
    dir: str
    error: str | None


class BinaryPlan(TypedDict):
    """What a binary factor needs (:func:`torchrepro.analysis.sequential.planning`): the MDE at its
    pairs, and the pairs (runs) a fixed design and the sequential rule need to detect ``effect``."""

    factor: str
    kind: Literal["binary"]
    effect: float
    basis: str  # target effect | observed difference | difference measured
    pairs: int
    std: float
    mde: float | None
    fixed_pairs: int | None  # None: out of reach
    fixed_runs: int | None
    sequential_pairs: int | None
    sequential_runs: int | None


class RandomPlan(TypedDict):
    """What a random factor needs: the levels (runs) at which its share of the variance is detected."""

    factor: str
    kind: Literal["random"]
    effect: float
    basis: str  # target effect | std measured
    levels: int | None
    levels_needed: int | None  # None: out of reach of any affordable design
    runs_needed: int | None


FactorPlan = Union[BinaryPlan, RandomPlan]


class _Look(TypedDict):
    estimate: float | None
    interval: list[float] | None


class Look(_Look, total=False):
    """One look of a factor's sequential path: the levels (runs) so far, the estimate and its interval;
    a binary factor's pairs ``n`` and betting ``wealth``, a random factor's F test ``p_value`` at the
    α spent at this look."""

    n: int
    wealth: float
    levels: int
    runs: int
    p_value: float
    alpha_spent: float


class _SequentialFactor(TypedDict):
    factor: str
    kind: str  # binary | random
    decision: str  # difference | smaller | real | out_of_reach | undecided
    path: list[Look]
    test: str
    decided_at_runs: int | None


class SequentialFactor(_SequentialFactor, total=False):
    """A factor's path and decision under ``--until-clear`` (a binary factor's two ``labels``)."""

    labels: list[str]


class Sequential(TypedDict):
    """The ``sequential`` section (:func:`torchrepro.analysis.sequential.sequential_section`): the looks
    (levels per factor), the runs used of the budget, each factor's path, and why it stopped."""

    looks: list[int]
    runs_used: int
    max_runs: int
    target_effect: float | None
    factors: list[SequentialFactor]
    stop: str  # decided | out_of_reach | budget | continue


class _DriftAnalysis(TypedDict):
    summary: Summary
    factors: list[VarianceComponent]
    effects: list[EffectRow]
    not_separable: list[NotSeparable]
    notes: list[str]
    observed: Observed | None
    excluded: list[ExcludedRun]
    verdict: str


class DriftAnalysis(_DriftAnalysis, total=False):
    """What :func:`torchrepro.analysis.drift.analyse` concludes from the runs: the body of the
    ``drift`` section; the command adds what it planned and, under ``--until-clear``, each factor's
    sequential path and decision."""

    planning: list[FactorPlan]
    sequential: Sequential


@dataclass
class DriftMetric:
    """What was measured: its label, where it comes from (``log_metric`` name, stdout regex, or the final loss)."""

    name: str
    source: str
    log_metric: str | None = None
    regex: str | None = None


@dataclass
class DriftRunResult:
    """One run of the experiment: its factor levels, seeds, metric and outcome (``ok``, ``crashed``,
    ``missing``, ``no_metric``)."""

    index: int
    levels: JsonObject
    seed: dict[str, int]
    metric: float | None
    status: str
    error: str | None = None
    dir: str = ""
    wall_s: float | None = None
    attempts: int = 1  # > 1: earlier attempts ended without finishing (their worker died); counted once


@dataclass
class Excluded:
    """A run left out of every statistic, and why."""

    index: int
    status: str
    dir: str = ""
    error: str | None = None


@dataclass
class Effect:
    """A binary factor's paired difference (:func:`torchrepro.analysis.drift.paired_effect`): real
    when ``p_value`` is below ``alpha``. ``per_level``: each level's summary (for the plots)."""

    factor: str
    levels: list[str]
    n: int
    p_value: float | None
    alpha: float
    difference: float | None = None
    std: float | None = None
    ci95: list[float] | None = None
    test: str = ""
    mde: float | None = None
    mde_method: str = ""
    target_effect: float | None = None  # with --target-effect: the pairs needed to detect it
    pairs_needed: int | None = None
    per_level: list[LevelSummary] = field(default_factory=list)

    @property
    def real(self) -> bool:
        return self.p_value is not None and self.p_value < self.alpha

    def to_json(self) -> JsonObject:
        out = dataclasses.asdict(self)
        if self.target_effect is None:  # written only when asked for
            del out["target_effect"], out["pairs_needed"]
        return out


@dataclass
class DriftSection:
    """The ``drift`` section (:func:`torchrepro.analysis.drift.analyse`): the metric, the design, every
    run, the effects of binary factors and the runs excluded (what the verdict rests on, typed); the
    summary, variance components (``factors``), what could not be separated and the placed
    ``observed`` difference stay JSON objects (they are only shown: TypedDicts)."""

    metric: DriftMetric
    design: str
    runs: list[DriftRunResult]
    effects: list[Effect]
    excluded: list[Excluded]
    verdict: str
    summary: Summary
    factors: list[VarianceComponent] = field(default_factory=list)
    not_separable: list[NotSeparable] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    observed: Observed | None = None
    plots: list[str] | None = None  # plot-<factor>.svg files, once written
    planning: list[FactorPlan] = field(default_factory=list)  # runs each factor needs
    sequential: Sequential | None = None  # --until-clear: each factor's path and decision

    def to_json(self) -> JsonObject:
        out = {
            **dataclasses.asdict(self),
            "runs": [dataclasses.asdict(r) for r in self.runs],
            "effects": [e.to_json() for e in self.effects],
        }
        for name in ("plots", "sequential"):
            if out[name] is None:
                del out[name]
        return out

    def real_difference(self) -> bool:
        """A binary factor makes a real difference: by its sequential decision under ``--until-clear``
        (a fixed-N p-value is not valid after stopping on the data), else by its p-value."""
        if self.sequential is not None:
            return any(f["decision"] == "difference" for f in self.sequential["factors"])
        return any(e.real for e in self.effects)

    @classmethod
    def from_json(cls, data: JsonObject) -> DriftSection:
        return from_fields(
            cls,
            data,
            metric=from_fields(DriftMetric, data["metric"]),
            runs=[from_fields(DriftRunResult, r) for r in data["runs"]],
            effects=[from_fields(Effect, e) for e in data["effects"]],
            excluded=[from_fields(Excluded, e) for e in data["excluded"]],
        )


@dataclass
class DriftSettings:
    """The ``run`` section of a drift experiment: the script and its arguments, the directory, the
    root seed, the factors varied and levels per factor; ``counts`` (``planned``, ``reused``,
    ``ran``, ``crashed``) when the runs were launched by this command (not ``--collect``)."""

    script: str
    args: list[str]
    out: str
    seed: int
    vary: list[str]
    levels_per_factor: int | None = None
    compile_cache: str | None = None
    wall_s: float | None = None
    counts: dict[str, int] = field(default_factory=dict)
    allow_partial: bool = False  # --allow-partial: runs missing from the experiment do not make it incomplete

    def to_json(self) -> JsonObject:
        out = {**dataclasses.asdict(self), **self.counts}
        del out["counts"]
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> DriftSettings:
        return from_fields(cls, data, counts={k: data[k] for k in ("planned", "reused", "ran", "crashed") if k in data})


@dataclass
class DriftReport:
    """``torchrepro drift``: ``run`` (the experiment's settings) and ``drift`` (metric, design,
    runs, effects, variance shares, excluded runs: :func:`torchrepro.analysis.drift.analyse`)."""

    kind: ClassVar[str] = "drift"
    run: DriftSettings
    drift: DriftSection
    provenance: JsonObject = field(default_factory=dict)
    findings: ClassVar[tuple[Finding, ...]] = ()  # drift reports state effects, not findings

    @property
    def missing(self) -> list[int]:
        """The runs of the plan that were not run (or were interrupted): none of their results is known."""
        return [r.index for r in self.drift.excluded if r.status == "missing"]

    @property
    def verdict_line(self) -> str:
        if self.verdict is Verdict.INCOMPLETE:
            missing, planned = self.missing, len(self.drift.runs)
            shown = ", ".join(map(str, missing[:10])) + (" …" if len(missing) > 10 else "")
            return (
                f"INCOMPLETE: {len(missing)} of {planned} runs of the plan not run or interrupted (run {shown}); "
                f"from the {planned - len(missing)} that finished: {self.drift.verdict}"
            )
        return self.drift.verdict

    @property
    def verdict(self) -> Verdict:
        """``run_failed`` when a run crashed, ``incomplete`` when runs of the plan are missing (unless
        ``--allow-partial``), ``real_difference`` when a binary factor makes one
        (:meth:`DriftSection.real_difference`), else ``noise``."""
        if any(r.status == "crashed" for r in self.drift.excluded):
            return Verdict.RUN_FAILED
        if self.missing and not self.run.allow_partial:
            return Verdict.INCOMPLETE
        return Verdict.REAL_DIFFERENCE if self.drift.real_difference() else Verdict.NOISE

    @property
    def exit_code(self) -> int:
        """3 when a run crashed or runs are missing (``incomplete``), 1 when a binary factor makes a
        real difference, else 0."""
        return {Verdict.RUN_FAILED: 3, Verdict.INCOMPLETE: 3, Verdict.REAL_DIFFERENCE: 1}.get(self.verdict, 0)

    def to_json(self) -> JsonObject:
        """The ``report.json`` document."""
        return {
            "schema": SCHEMAS["drift"],
            "kind": "drift",
            "verdict": self.verdict_line,
            "exit_code": self.exit_code,
            "run": self.run.to_json(),
            "drift": self.drift.to_json(),
            "provenance": self.provenance,
        }

    @classmethod
    def from_json(cls, data: JsonObject) -> DriftReport:
        """Read a ``report.json`` document of this kind (:func:`load_report` checks the schema)."""
        return cls(
            run=DriftSettings.from_json(data["run"]),
            drift=DriftSection.from_json(data["drift"]),
            provenance=data.get("provenance", {}),
        )
