"""The doctor report (``torchrepro doctor`` and ``report``): how the run ended, its compile health
(the compile section :mod:`torchrepro.analysis.compile` builds and :mod:`torchrepro.analysis.doctor`
completes), steps, budgets and the compile fixes ``doctor --fixes`` tried."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, TypedDict, Union

from ..errors import stop_exit_code
from ..eventlog.payloads import JsonObject
from .findings import Finding, Verdict, extra_keys, from_fields, load_findings
from .schema import SCHEMAS


class CacheCounts(TypedDict):
    """One cache's lookups by outcome; ``hit_rate`` over hits and misses (None: none looked up)."""

    hit: int
    miss: int
    bypass: int
    hit_rate: float | None


class LimitHit(TypedDict):
    """A compile that hit the recompile limit (the frame runs eagerly from then on)."""

    rank: int
    compile_id: str
    function: str
    file: str | None
    line: int | None
    step: int | None
    limit: str | None
    last_reason: str | None


class _RecompileEventHead(TypedDict):
    rank: int
    compile_id: str
    function: str
    code: str | None
    file: str | None
    line: int | None
    step: int | None
    reason: str
    guard: str
    category: str | None
    evaluation: bool


class RecompileEvent(_RecompileEventHead, total=False):
    """One recompile on one rank: the guard that failed, its category, whether evaluation needs it;
    ``after_step``: it happened after ``step``, the rank's last, had ended (a final evaluation)."""

    after_step: bool


class GraphBreakEvent(TypedDict):
    """The graph breaks of one rank at one location, for one reason."""

    rank: int
    reason: str
    gb_id: str | None
    file: str | None
    line: int | None
    source: str | None
    count: int
    first_step: int | None
    hint: str


class RankCompiles(TypedDict):
    """One rank's compile counts and time."""

    compiles: int
    recompiles: int
    graph_breaks: int
    limit_hits: int
    compile_time_s: float


class RecompileGroup(TypedDict):
    """Recompiles merged over ranks (:func:`torchrepro.analysis.rank_groups.recompile_groups`)."""

    function: str
    category: str | None
    guard: str
    location: str | None
    count: int
    ranks: int
    ranks_text: str
    steps: list[int | None]
    compile_ids: list[str]


class GraphBreakGroup(TypedDict):
    """Graph breaks merged over ranks (:func:`torchrepro.analysis.rank_groups.graph_break_groups`)."""

    file: str | None
    line: int | None
    reason: str
    gb_id: str | None
    source: str | None
    hint: str
    first_step: int | None
    count: int
    ranks: int
    ranks_text: str


class TimelineCompile(TypedDict):
    """One compile on the timeline: when (seconds from the rank's start), how long, what happened."""

    compile_id: str
    function: str
    step: int | None
    start_s: float
    duration_s: float
    backward_s: float | None
    cache: str | None
    recompile: str | None
    limit_hit: str | None
    failed: str | None


class StepSpread(TypedDict):
    """The spread of a rank group's median times of the steps that did not compile."""

    min_s: float
    median_s: float
    max_s: float
    slowest_rank: int


class TimelineRow(TypedDict):
    """A rank group on the timeline: its representative rank's compiles and steps."""

    ranks_text: str
    rank: int
    compiles: list[TimelineCompile]
    steps: list[list[float]]  # [index, host time, compiles]
    median_step: StepSpread | None


class _CompileSection(TypedDict):
    compiles: int
    recompiles: int
    graph_breaks: int
    unique_graphs: int
    compile_time_s: float
    cache: dict[str, CacheCounts]
    recompile_events: list[RecompileEvent]
    graph_break_events: list[GraphBreakEvent]
    per_rank: dict[str, RankCompiles]


class CompileSection(_CompileSection, total=False):
    """The doctor report's ``compile`` section: :func:`torchrepro.analysis.compile.summarize` writes
    the counts and events; :func:`torchrepro.analysis.doctor.analyse` adds the share of the run's
    time, the timeline and the events merged over ranks (which the schema requires of a report, not
    of :func:`~torchrepro.analysis.compile.summarize`). Keys the schema does not require may be absent
    from a report written by an older torchrepro."""

    build_time_s: float
    capture_overhead_s: float
    graph_breaks_relogged: int  # break records that repeat a break (a restart or frame skip): counted once
    recompile_limit_hits: list[LimitHit]
    recompiles_by_category: dict[str | None, int]
    compile_time_share: float
    timeline: list[TimelineRow]
    recompile_groups: list[RecompileGroup]
    graph_break_groups: list[GraphBreakGroup]


class RankGroup(TypedDict):
    """Ranks that behaved alike: their ranges as text, a representative, what differs from the largest group."""

    ranks: list[int]
    ranks_text: str
    representative: int
    size: int
    difference: str | None


class RankGroups(TypedDict, total=False):
    """The doctor report's ``rank_groups`` section (:func:`torchrepro.analysis.rank_groups.rank_groups`);
    empty in a report written before ranks were grouped."""

    groups: list[RankGroup]
    summary: str


class CapabilityNote(TypedDict):
    """Something capture could or could not observe (the first rank's word on it)."""

    name: str
    available: bool
    note: str


@dataclass
class RankOutcome:
    """How one rank ended, and where it ran."""

    exit_code: int | None = None
    status: str = "incomplete"  # ok, imported, failed, incomplete, ...
    error: str | None = None
    last_step: int | None = None
    duration_s: float | None = None
    host: str | None = None
    node: int | None = None
    local_rank: int | None = None


@dataclass
class DoctorRun:
    """The ``run`` section: ``meta`` is the run's ``run.json`` (script, arguments, how the job
    ended: ``stopped_by``, ``stall``, ``launcher``...); the rest is judged from the event logs."""

    failed: bool
    ranks: dict[str, RankOutcome]
    torch_version: str | None = None
    world_size: int = 1
    env_fingerprint: str | None = None
    ranks_present: list[int] = field(default_factory=list)
    ranks_missing: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    meta: JsonObject = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        return {
            **self.meta,
            "failed": self.failed,
            "torch_version": self.torch_version,
            "world_size": self.world_size,
            "env_fingerprint": self.env_fingerprint,
            "ranks_present": self.ranks_present,
            "ranks_missing": self.ranks_missing,
            "ranks": {r: dataclasses.asdict(o) for r, o in self.ranks.items()},
            "problems": self.problems,
        }

    @classmethod
    def from_json(cls, data: JsonObject) -> DoctorRun:
        ranks = {r: from_fields(RankOutcome, o) for r, o in data["ranks"].items()}
        return from_fields(cls, data, ranks=ranks, meta=extra_keys(cls, data))


@dataclass
class RankSteps:
    """One rank's steps: count, first and last loss, times, which steps compiled."""

    steps: int
    first_loss: float | None = None
    last_loss: float | None = None
    total_time_s: float = 0.0
    median_step_s: float | None = None
    compile_steps: list[int] = field(default_factory=list)
    fingerprinted_steps: int = 0


@dataclass
class StepsSummary:
    """The ``steps`` section: the most steps any rank recorded, and per rank; ``losses``: the loss
    curve (``[step, loss]``, NaN and infinities as recorded) of each of the first ranks that
    recorded a loss, thinned (:func:`torchrepro.analysis.doctor.steps_summary`)."""

    steps: int
    per_rank: dict[str, RankSteps]
    losses: dict[str, list[list[float]]] = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        return {
            "steps": self.steps,
            "per_rank": {r: dataclasses.asdict(s) for r, s in self.per_rank.items()},
            "losses": self.losses,
        }

    @classmethod
    def from_json(cls, data: JsonObject) -> StepsSummary:
        per_rank = {r: from_fields(RankSteps, s) for r, s in data["per_rank"].items()}
        return cls(data["steps"], per_rank, data.get("losses", {}))


class FixMeasure(TypedDict):
    """A run's compile health (:func:`torchrepro.analysis.compile_fixes.measure`): what a fix is
    judged by, before and after."""

    compiles: int
    recompiles: int
    graph_breaks: int
    limit_hits: int
    compile_time_s: float
    step_time_s: float | None  # median after warm-up, rank 0
    step_time_tail_s: float | None  # 90th percentile
    steps: int


class TriedFix(TypedDict):
    """A ``compile_fixes`` row of a fix that was run (:func:`torchrepro.analysis.compile_fixes.judge`):
    the baseline's measure and the fix run's (None: the run did not end normally), its numerics
    against the baseline, and how many recompiles and breaks it removed."""

    name: str
    applied_to: str
    line: str
    spec: str
    before: FixMeasure
    after: FixMeasure | None
    numerics: str | None  # same | within_tolerance | changed; None: not compared
    expected_removed: int
    status: str  # fixed | partly | no_effect | worse | not_a_cure | failed
    removed: int | None


class _ListedFix(TypedDict):
    name: str
    applied_to: str
    before: None
    after: None
    numerics: None
    status: str  # not_tried | expected
    note: str


class ListedFix(_ListedFix, total=False):
    """A ``compile_fixes`` row of a fix not run (:func:`torchrepro.analysis.compile_fixes.listed`):
    a code change (with its ``line``), or recompiles that are expected."""

    line: str


CompileFixRow = Union[TriedFix, ListedFix]


class FixRecommendation(TypedDict):
    """``compile_fix_recommended``: the best fix, the recommended set, and how the set did tried
    together (None: one fix, or not run)."""

    name: str
    applied_to: str
    line: str
    removed: int | None
    set: list[str]
    lines: list[str]
    combined: TriedFix | None


@dataclass
class DoctorReport:
    """``torchrepro doctor`` (and ``report``): compile health, steps, how the run ended, budgets.
    ``compile``, ``rank_groups`` and ``provenance`` are the analysis' JSON sections as they are."""

    kind: ClassVar[str] = "doctor"
    run: DoctorRun
    compile: CompileSection
    steps: StepsSummary
    findings: list[Finding]
    verdict: Verdict
    verdict_line: str
    capabilities: list[CapabilityNote] = field(default_factory=list)
    budget_failures: list[str] = field(default_factory=list)
    failing_findings: list[str] = field(default_factory=list)  # codes of findings that fail the run
    rank_groups: RankGroups = field(default_factory=RankGroups)
    provenance: JsonObject = field(default_factory=dict)
    reread: bool = False  # a stored run analysed again (torchrepro report), not a job this command ran
    # doctor --fixes (None: not asked for): each fix's row, the recommendation, what was run
    compile_fixes: list[CompileFixRow] | None = None
    compile_fix_recommended: FixRecommendation | None = None
    compile_fix_note: str | None = None

    @property
    def exit_code(self) -> int:
        """128+N when a signal N stopped the job this command ran, 3 when the script failed, the
        job was interrupted, or (:attr:`reread`) a stored run had been stopped by a signal; 1 when
        it fails a budget or a failing finding, else 0."""
        if self.run.meta.get("stopped_by") and not self.reread:
            return stop_exit_code(self.run.meta["stopped_by"])
        if self.run.failed:  # judged per rank by its last event: a teardown abort is not a failure
            return 3
        return 1 if self.budget_failures or self.failing_findings else 0

    def to_json(self) -> JsonObject:
        """The ``report.json`` document."""
        return {
            "schema": SCHEMAS["doctor"],
            "run": self.run.to_json(),
            "compile": self.compile,
            "steps": self.steps.to_json(),
            "findings": [f.to_json() for f in self.findings],
            "capabilities": self.capabilities,
            "budget_failures": self.budget_failures,
            "failing_findings": self.failing_findings,
            "verdict": self.verdict_line,
            "rank_groups": self.rank_groups,
            "provenance": self.provenance,
            **(
                {
                    "compile_fixes": self.compile_fixes,
                    "compile_fix_recommended": self.compile_fix_recommended,
                    "compile_fix_note": self.compile_fix_note,
                }
                if self.compile_fixes is not None
                else {}
            ),
        }

    @classmethod
    def from_json(cls, data: JsonObject) -> DoctorReport:
        """Read a ``report.json`` document of this kind (:func:`load_report` checks the schema)."""
        findings = load_findings(data["findings"])
        budget_failures = data.get("budget_failures", [])
        return cls(
            run=DoctorRun.from_json(data["run"]),
            compile=data["compile"],
            steps=StepsSummary.from_json(data["steps"]),
            findings=findings,
            verdict=Verdict.of_doctor(findings, budget_failures, "interrupted" in data["run"]),
            verdict_line=data["verdict"],
            capabilities=data.get("capabilities", []),
            budget_failures=budget_failures,
            failing_findings=data.get("failing_findings", []),
            rank_groups=data.get("rank_groups", {}),
            provenance=data.get("provenance", {}),
            compile_fixes=data.get("compile_fixes"),
            compile_fix_recommended=data.get("compile_fix_recommended"),
            compile_fix_note=data.get("compile_fix_note"),
        )
