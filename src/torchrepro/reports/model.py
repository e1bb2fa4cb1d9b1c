"""Typed reports: what ``doctor``, ``check`` (``check-resume``, ``diff``) and ``drift`` conclude,
as data. Analysis builds them, :mod:`torchrepro.eventlog.rundir` saves them as ``report.json``, and the
renderers (terminal, JUnit, HTML, OpenTelemetry) read them; none of those computes a verdict or an
exit code of its own: both are derived here, from the report's content.

``to_json()`` gives the ``report.json`` document and ``from_json()`` (or :func:`load_report`, which
picks the kind) reads one back, including reports written before the schemas were per kind
(``torchrepro.report/1``). The top level and the sections a verdict rests on (the run and how it
ended, steps, findings, the comparison) are dataclasses; sections only shown are plain JSON objects,
typed where their shape is fixed (the compile details, rank groups, the drift statistics:
TypedDicts, dicts at run time) and :data:`JsonObject` where it is open (evidence, provenance,
a run's settings). Each kind has a JSON Schema in
``torchrepro/schemas/<kind>.schema.json`` (:func:`schema_path`). Nothing here imports torch.

>>> Verdict.BIT_EXACT.tone, Verdict("warnings").tone
('ok', 'warn')
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Literal, TypedDict, TypeVar, Union

from ..errors import InputError, stop_exit_code
from ..eventlog.jsoncheck import schema_problem
from ..eventlog.payloads import (
    JsonObject as JsonObject,
)  # re-exported; also: a whole report.json document, a finding's evidence (per code)

LEGACY_SCHEMA = "torchrepro.report/1"  # shared by every kind before the schemas were split (still read)
SCHEMAS = {
    "doctor": "torchrepro.doctor/1",
    "check": "torchrepro.check/1",
    "drift": "torchrepro.drift/1",
    "compare": "torchrepro.compare/1",
}


SEVERITIES = ("error", "warning", "info")


@dataclass
class Finding:
    """One conclusion. ``code`` is stable (tests and CI match on it), ``evidence`` says where
    (ranks, steps, compile ids, source locations), ``hint`` what to change."""

    code: str
    severity: str
    title: str
    hint: str = ""
    evidence: JsonObject = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        return asdict(self)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then by code, keeping the original order within a code."""
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), f.code))


class Verdict(str, Enum):
    """Every verdict a report can reach. Doctor: ``healthy``, ``warnings``, ``problems``,
    ``fails_budget``; a comparison of runs (:mod:`torchrepro.analysis.verdict`): ``bit_exact``,
    ``within_tolerance``, ``diverged``, ``incomplete``, ``nothing_compared``; drift:
    ``noise`` (no factor makes a real difference), ``real_difference``, ``run_failed``; any run:
    ``interrupted`` (torchrepro's supervisor ended without recording the end of the job: killed by
    SIGKILL or the OOM killer; how the job ended is unknown, so it is never healthy)."""

    HEALTHY = "healthy"
    WARNINGS = "warnings"
    PROBLEMS = "problems"
    FAILS_BUDGET = "fails_budget"
    BIT_EXACT = "bit_exact"
    WITHIN_TOLERANCE = "within_tolerance"
    DIVERGED = "diverged"
    INCOMPLETE = "incomplete"
    NOTHING_COMPARED = "nothing_compared"
    NOISE = "noise"
    REAL_DIFFERENCE = "real_difference"
    RUN_FAILED = "run_failed"
    INTERRUPTED = "interrupted"
    EQUIVALENT = "equivalent"  # compare: B within A's run-to-run band
    DIFFERENT = "different"  # compare: B leaves the band
    ABSTAIN = "abstain"  # compare: the evidence is too weak to say

    @property
    def passing(self) -> bool:
        """Whether a comparison with this verdict passes (exit 0 when every run ended normally)."""
        return self in (Verdict.BIT_EXACT, Verdict.WITHIN_TOLERANCE, Verdict.EQUIVALENT)

    @property
    def tone(self) -> str:
        """``ok``, ``warn`` or ``bad``: how a renderer colours it."""
        if self in (Verdict.HEALTHY, Verdict.BIT_EXACT, Verdict.WITHIN_TOLERANCE, Verdict.NOISE, Verdict.EQUIVALENT):
            return "ok"
        return "warn" if self in (Verdict.WARNINGS, Verdict.ABSTAIN) else "bad"

    @classmethod
    def of_doctor(cls, findings: list[Finding], budget_failures: list[str], interrupted: bool = False) -> Verdict:
        """A doctor report's verdict: an interrupted job, a failed budget, then error findings, then warnings."""
        if interrupted:
            return cls.INTERRUPTED
        if budget_failures:
            return cls.FAILS_BUDGET
        severities = {f.severity for f in findings}
        return cls.PROBLEMS if "error" in severities else cls.WARNINGS if "warning" in severities else cls.HEALTHY


def comparison_exit_code(verdict: Verdict, ended_normally: bool, unreadable: bool, unreadable_exit: int) -> int:
    """A comparison's exit code: ``unreadable_exit`` when a log cannot be read (2 for stored runs
    given as input, 3 for runs a check launched), 3 when a run did not end normally or the
    comparison is ``incomplete``, else 0 for a passing verdict and 1 otherwise.

    >>> comparison_exit_code(Verdict.DIVERGED, True, False, 3)
    1
    """
    if unreadable:
        return unreadable_exit
    if not ended_normally or verdict is Verdict.INCOMPLETE:
        return 3
    return 0 if verdict.passing else 1


T = TypeVar("T")


def _build(cls: type[T], data: JsonObject, **overrides: Any) -> T:
    """``cls`` from the keys of ``data`` it has fields for (missing ones take their defaults)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names and k not in overrides}, **overrides)


def _rest(cls: type, data: JsonObject, *also: str) -> JsonObject:
    """The keys of ``data`` that ``cls`` has no field for (kept, as they were, in ``meta``/``more``)."""
    names = {f.name for f in dataclasses.fields(cls)} | set(also)
    return {k: v for k, v in data.items() if k not in names}


def _findings(items: list[JsonObject]) -> list[Finding]:
    return [_build(Finding, f) for f in items]


# --- doctor: the compile section (analysis.compile, completed by analysis.doctor) -----------------


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


# --- cache status (cache.inventory.status, rendered by report.cache) ---------------------------


class Build(TypedDict):
    """What compiled code is tied to: :func:`current_build`'s keys, a pack manifest's ``build``."""

    torch: str
    torch_git: str
    cuda: str | None
    triton: str | None
    python: str
    system: str
    machine: str
    torch_dir: str  # this and the next three: part of every C++ kernel's key (its compile command)
    python_include: str | None
    cpu_capability: str | None
    compiler: str | None


class _CategoryRowBase(TypedDict):
    what: str
    files: int
    bytes: int
    oldest: str | None
    newest: str | None
    oldest_age_s: int
    newest_age_s: int
    unreachable: int


class CategoryRow(_CategoryRowBase, total=False):
    """One kind of entry in a cache: files, bytes, ages, how many are unreachable (and for the FX-graph
    and AOTAutograd entries, how many keys: one key can hold several entries whose guards differ)."""

    keys: int


class UnreachableGroup(TypedDict):
    """The entries of one kind that can never be hit for one reason."""

    category: str
    why: str
    files: int
    bytes: int
    examples: list[str]


class Permissions(TypedDict):
    """Who owns a cache directory and who else could put code into it (``risks``)."""

    owner: str
    mode: str
    precompiled_headers: str | None
    risks: list[str]
    entries_writable_by_others: list[str]
    entries_owned_by_others: list[str]


class CacheTotals(TypedDict):
    files: int
    bytes: int
    unreachable_files: int


class CacheStatus(TypedDict):
    """``torchrepro cache status`` (:func:`torchrepro.cache.inventory.status`, schema
    ``torchrepro.cache-status/1``): counts, sizes and ages by kind, who wrote the entries (what ->
    value -> files), what can never be hit, who can write to the directory, and the findings."""

    schema: str
    path: str
    source: str
    triton_cache_dir: str
    this_build: Build
    totals: CacheTotals
    categories: dict[str, CategoryRow]
    written_by: dict[str, dict[str, int]]
    unreachable: list[UnreachableGroup]
    permissions: Permissions
    findings: list[JsonObject]  # Finding.to_json()


# --- watch: a running job as read so far (analysis.live, rendered by report.live) ----------------


class LiveRank(TypedDict):
    """One rank of a running job: how far it got, how fast, what it compiled, how long it has been quiet."""

    status: str
    steps: int
    last_step: int | None
    steps_per_s: float | None
    last_event_age_s: float | None
    compiles: int
    recompiles: int
    graph_breaks: int


class LatestBreak(TypedDict):
    """The graph break read last, where it happened and why."""

    rank: int
    step: int | None
    file: str | None
    line: int | None
    source: str | None
    reason: str
    gb_id: str | None


class FindingLine(TypedDict):
    """A finding, as the live view lists it."""

    code: str
    severity: str
    title: str


class LiveSnapshot(TypedDict):
    """What a running job looks like now (:func:`torchrepro.analysis.live.snapshot`; ``watch --json``)."""

    schema: str
    finished: bool
    world_size: int
    ranks_seen: int
    ranks: dict[str, LiveRank]
    lagging_ranks: list[int]
    compiles: int
    recompiles: int
    recompiles_by_category: dict[str | None, int]
    graph_breaks: int
    latest_graph_break: LatestBreak | None
    findings: list[FindingLine]
    unreadable_lines: int


class WatchSnapshot(LiveSnapshot):
    """A :class:`LiveSnapshot` of the run directory ``run_dir``."""

    run_dir: str


# --- doctor -------------------------------------------------------------------------------------


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
        ranks = {r: _build(RankOutcome, o) for r, o in data["ranks"].items()}
        return _build(cls, data, ranks=ranks, meta=_rest(cls, data))


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
    """The ``steps`` section: the most steps any rank recorded, and per rank."""

    steps: int
    per_rank: dict[str, RankSteps]

    def to_json(self) -> JsonObject:
        return {"steps": self.steps, "per_rank": {r: dataclasses.asdict(s) for r, s in self.per_rank.items()}}

    @classmethod
    def from_json(cls, data: JsonObject) -> StepsSummary:
        return cls(data["steps"], {r: _build(RankSteps, s) for r, s in data["per_rank"].items()})


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
        findings = _findings(data["findings"])
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


FIX_COLUMNS = ("fix", "applied to", "compiles", "recompiles", "breaks", "compile s", "ms/step", "numerics", "status")


FixFigure = Literal["compiles", "recompiles", "graph_breaks", "compile_time_s", "step_time_s"]  # FixMeasure's, shown


def fix_cells(row: CompileFixRow) -> list[str]:
    """One ``compile_fixes`` row as the text of the fix table's cells (:data:`FIX_COLUMNS`), the
    same in the terminal and the HTML report: each figure as ``before → after``; a fix not run
    (a code change, an expected recompile) shows its note instead."""
    if row["before"] is None:
        status = row["status"].replace("_", " ")
        return [row["name"], row.get("applied_to") or "", row.get("note") or "", "", "", "", "", "", status]
    before, after = row["before"], row["after"]

    def figure(key: FixFigure, scale: float = 1.0, digits: int = 0) -> str:
        def one(m: FixMeasure | None) -> str:
            value = None if m is None else m.get(key)
            return "?" if value is None else f"{value * scale:.{digits}f}"

        return f"{one(before)} → {one(after)}"

    return [
        row["name"],
        row.get("applied_to") or "",
        figure("compiles"),
        figure("recompiles"),
        figure("graph_breaks"),
        figure("compile_time_s", digits=2),
        figure("step_time_s", 1e3, 1),
        (row.get("numerics") or "not compared").replace("_", " "),
        row["status"].replace("_", " "),
    ]


def fix_recommendation(recommended: FixRecommendation | None) -> str:
    """The recommendation under the fix table: the fix and the exact line for the script, and how
    the recommended set did tried together."""
    if recommended is None:
        return (
            "no fix recommended: none removed recompiles or graph breaks without changing the numbers or the step time"
        )
    text = (
        f"recommended: {recommended['name']} ({recommended['applied_to']}), {recommended['removed']} "
        f"recompile(s)/break(s) fewer: put `{recommended['line']}` in the script before the first compiled call"
    )
    together = recommended.get("combined")
    if together:
        after = together["after"]
        text += (
            f"; together ({' + '.join(recommended['set'])}): recompiles {together['before']['recompiles']} → "
            f"{after.get('recompiles', '?') if after else '?'}, breaks {together['before']['graph_breaks']} → "
            f"{after.get('graph_breaks', '?') if after else '?'}, {together['status'].replace('_', ' ')}, "
            f"numerics {(together['numerics'] or 'not compared').replace('_', ' ')}"
        )
    return text


# --- check, check-resume, diff ----------------------------------------------------------------


@dataclass
class RunEnding:
    """How one compared run ended (:class:`torchrepro.analysis.verdict.Ending`, as reported)."""

    run: str
    ended_normally: bool
    problems: list[str] = field(default_factory=list)
    unreadable: bool = False
    steps: dict[str, int] = field(default_factory=dict)  # rank -> steps recorded


class ParamDifference(TypedDict):
    """How far two runs' parameters are apart: the largest absolute and relative difference (None
    where only sketches were kept and a differing tensor was sketched), and where (the largest
    absolute difference; without it, the largest L2 difference); the L2 norm of the whole
    difference and relative to the second run's parameters' (``estimated``: from sketches, each
    tensor projected to at least ``sketch_dims`` dims; docs/fingerprint.md, "Snapshots")."""

    max_abs: float | None
    max_rel: float | None
    parameter: str | None
    l2: float
    l2_rel: float
    estimated: bool
    sketch_dims: int | None


class CurvePoint(ParamDifference):
    """One snapshot step of the divergence curve (:func:`torchrepro.analysis.divergence.divergence_curve`):
    the parameter difference there and the loss difference (None: a run recorded no loss)."""

    step: int
    loss_diff: float | None


LocalisationKey = Literal["compile_id", "graph", "parameter", "output", "node", "kernel", "kernel_fuses"]


class _FirstDivergence(TypedDict):
    step: int
    rank: int
    what: str  # the aspect that differed first: loss, params, grads, rng, init_params ...
    module: str | None
    op: str | None
    source: str | None
    phase: str | None
    cause: str | None
    detail: JsonObject  # per aspect (what differs, by how much)
    evidence: JsonObject  # per cause (what the localisation found)


class FirstDivergence(_FirstDivergence, total=False):
    """``determinism.first_divergence``: where two runs first differ and why (:func:`torchrepro.analysis.
    determinism.determinism_section`), with what the localisation named (:data:`LocalisationKey`);
    ``before_step`` 0 when the initial parameters already differ."""

    compile_id: str
    graph: str
    parameter: str
    output: str
    node: str
    kernel: str
    kernel_fuses: list[str]
    before_step: int


class GraphProbeRecord(TypedDict):
    """One compiled graph a run probed (``determinism.graph_probes``, from its ``graph_probe``
    event): called again ``repeats`` times on copies of its first call's inputs, in the run's own
    process; ``differing`` the outputs not bit for bit the same, ``explained`` the first of them."""

    run: str
    rank: int
    step: int | None
    compile_id: str
    graph: str
    repeats: int
    runs_differing: int
    threads: int
    differing: list[int]
    max_abs: float | None
    explained: JsonObject
    eager_differing: list[int]
    eager_explained: JsonObject
    one_thread: str | None
    time_s: float | None
    error: str | None


@dataclass
class Determinism:
    """The ``determinism`` section: what was compared, how every run ended, the first divergence
    (a JSON object: step, rank, what, cause, evidence...). ``more``: what only some checks add
    (``decomposition``, ``fixes``, ``fix_recommended``, ``backend_stages``, ``against``,
    ``resume_at``, ``largest_difference``, ``nothing_compared_because``, ``graph_probes``: each compiled graph a run called again on
    identical inputs, :class:`GraphProbeRecord`; every comparison:
    ``evidence_compared``, steps compared per kind of evidence, ``not_compared`` and
    ``incomplete_because``, what keeps it from covering both runs)."""

    verdict: Verdict
    runs: list[str]
    steps_compared: int
    endings: list[RunEnding]
    first_divergence: FirstDivergence | None = None
    curve: list[CurvePoint] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rtol: float = 0.0
    atol: float = 0.0
    environment_differences: list[str] = field(default_factory=list)
    step_clock: str | None = None
    more: JsonObject = field(default_factory=dict)

    @property
    def evidence_line(self) -> str | None:
        """``params 5, grads 0, loss 60, rng 60, batch 60``: the steps at which each kind of evidence
        was compared (None in a report written before it was said)."""
        compared = self.more.get("evidence_compared")
        return ", ".join(f"{kind} {n}" for kind, n in compared.items()) if isinstance(compared, dict) else None

    def exit_code(self, unreadable_exit: int) -> int:
        """See :func:`comparison_exit_code`."""
        return comparison_exit_code(
            self.verdict,
            all(e.ended_normally for e in self.endings),
            any(e.unreadable for e in self.endings),
            unreadable_exit,
        )

    def to_json(self, unreadable_exit: int) -> JsonObject:
        return {
            "verdict": self.verdict.value,
            "exit_code": self.exit_code(unreadable_exit),
            "runs": self.runs,
            "first_divergence": self.first_divergence,
            "curve": self.curve,
            "notes": self.notes,
            "rtol": self.rtol,
            "atol": self.atol,
            "steps_compared": self.steps_compared,
            "endings": [dataclasses.asdict(e) for e in self.endings],
            "environment_differences": self.environment_differences,
            "step_clock": self.step_clock,
            **self.more,
        }

    @classmethod
    def from_json(cls, data: JsonObject) -> Determinism:
        endings = [_build(RunEnding, e) for e in data["endings"]]
        return _build(cls, data, verdict=Verdict(data["verdict"]), endings=endings, more=_rest(cls, data, "exit_code"))


class RunSide(TypedDict):
    """One compared run, for the page that shows two side by side (:func:`torchrepro.analysis.sides.side`)."""

    label: str
    path: str
    provenance: JsonObject
    compile_mode: str | None
    exit_code: int | None
    ranks: list[int]
    steps: int
    status: dict[str, str]  # rank -> how it ended
    first_loss: float | None
    last_loss: float | None


class StepRow(TypedDict):
    """A step both compared runs recorded (:func:`torchrepro.analysis.sides.step_comparison`)."""

    step: int
    loss_a: float | None
    loss_b: float | None
    loss_diff: float | None
    same_params: bool | None  # None: a run did not fingerprint its parameters


@dataclass
class CheckRun:
    """The ``run`` section of a comparison: the command's settings (``meta``: script, arguments,
    seed, runs...; ``diff`` for a diff of stored runs), each run's directory and wall time."""

    run_dirs: dict[str, str]
    timings_s: dict[str, float] = field(default_factory=dict)
    meta: JsonObject = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        return {**self.meta, "run_dirs": self.run_dirs, "timings_s": self.timings_s}

    @classmethod
    def from_json(cls, run: JsonObject) -> CheckRun:
        return cls(run.get("run_dirs", {}), run.get("timings_s", {}), _rest(cls, run))


@dataclass
class CheckReport:
    """``torchrepro check``, ``check-resume`` and ``diff``: is the run reproducible, and why not.
    ``sides`` and ``step_comparison``: the two compared runs side by side (JSON, for the HTML page)."""

    kind: ClassVar[str] = "check"
    run: CheckRun
    determinism: Determinism
    findings: list[Finding]
    verdict_line: str
    provenance: JsonObject | None = None
    sides: list[RunSide] | None = None
    step_comparison: list[StepRow] | None = None

    @property
    def verdict(self) -> Verdict:
        return self.determinism.verdict

    @property
    def unreadable_exit(self) -> int:
        """The exit code for an unreadable log: 2 when it was an input (``diff``), 3 when launched."""
        return 2 if "diff" in self.run.meta else 3

    @property
    def exit_code(self) -> int:
        """See :func:`comparison_exit_code`."""
        return self.determinism.exit_code(self.unreadable_exit)

    def to_json(self) -> JsonObject:
        """The ``report.json`` document."""
        out = {
            "schema": SCHEMAS["check"],
            "kind": "check",
            "run": self.run.to_json(),
            "determinism": self.determinism.to_json(self.unreadable_exit),
            "findings": [f.to_json() for f in self.findings],
            "verdict": self.verdict_line,
            "exit_code": self.exit_code,
        }
        for name in ("provenance", "sides", "step_comparison"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> CheckReport:
        """Read a ``report.json`` document of this kind (:func:`load_report` checks the schema)."""
        return cls(
            run=CheckRun.from_json(data["run"]),
            determinism=Determinism.from_json(data["determinism"]),
            findings=_findings(data["findings"]),
            verdict_line=data["verdict"],
            provenance=data.get("provenance"),
            sides=data.get("sides"),
            step_comparison=data.get("step_comparison"),
        )


# --- compare: configuration B against configuration A's run-to-run band ----------------------------


@dataclass
class CompareReport:
    """``torchrepro compare``: ``compare`` is the section :func:`torchrepro.analysis.equivalence.judge`
    builds (verdict ``equivalent``/``different``/``abstain``, the tolerance and band, the first point
    out of the band, each rank's first divergence, repeated batches)."""

    kind: ClassVar[str] = "compare"
    run: CheckRun
    compare: JsonObject
    findings: list[Finding]
    verdict_line: str
    provenance: JsonObject | None = None

    @property
    def verdict(self) -> Verdict:
        return Verdict(self.compare["verdict"])

    @property
    def exit_code(self) -> int:
        """0 equivalent, 1 different or abstain, 3 when a run did not end normally (as a check's
        ``incomplete``; :func:`comparison_exit_code`)."""
        return comparison_exit_code(
            self.verdict, bool(self.compare.get("ended_normally")), bool(self.compare.get("unreadable")), 3
        )

    def to_json(self) -> JsonObject:
        """The ``report.json`` document."""
        out = {
            "schema": SCHEMAS["compare"],
            "kind": "compare",
            "run": self.run.to_json(),
            "compare": self.compare,
            "findings": [f.to_json() for f in self.findings],
            "verdict": self.verdict_line,
            "exit_code": self.exit_code,
        }
        if self.provenance is not None:
            out["provenance"] = self.provenance
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> CompareReport:
        """Read a ``report.json`` document of this kind (:func:`load_report` checks the schema)."""
        report = cls(CheckRun.from_json(data["run"]), data["compare"], _findings(data["findings"]), data["verdict"])
        report.provenance = data.get("provenance")
        return report


# --- drift --------------------------------------------------------------------------------------


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
        return _build(
            cls,
            data,
            metric=_build(DriftMetric, data["metric"]),
            runs=[_build(DriftRunResult, r) for r in data["runs"]],
            effects=[_build(Effect, e) for e in data["effects"]],
            excluded=[_build(Excluded, e) for e in data["excluded"]],
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

    def to_json(self) -> JsonObject:
        out = {**dataclasses.asdict(self), **self.counts}
        del out["counts"]
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> DriftSettings:
        return _build(cls, data, counts={k: data[k] for k in ("planned", "reused", "ran", "crashed") if k in data})


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
    def verdict_line(self) -> str:
        return self.drift.verdict

    @property
    def verdict(self) -> Verdict:
        """``run_failed`` when a run crashed, ``real_difference`` when a binary factor makes one
        (:meth:`DriftSection.real_difference`), else ``noise``."""
        if any(r.status == "crashed" for r in self.drift.excluded):
            return Verdict.RUN_FAILED
        return Verdict.REAL_DIFFERENCE if self.drift.real_difference() else Verdict.NOISE

    @property
    def exit_code(self) -> int:
        """3 when a run crashed, 1 when a binary factor makes a real difference, else 0."""
        return {Verdict.RUN_FAILED: 3, Verdict.REAL_DIFFERENCE: 1}.get(self.verdict, 0)

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


Report = Union[DoctorReport, CheckReport, DriftReport, CompareReport]
_KINDS: dict[str, type[DoctorReport] | type[CheckReport] | type[DriftReport] | type[CompareReport]] = {
    "doctor": DoctorReport,
    "check": CheckReport,
    "drift": DriftReport,
    "compare": CompareReport,
}


def report_kind(data: Any) -> str | None:
    """The kind of a ``report.json`` document (``doctor``, ``check``, ``drift``), or None when it
    is not one: per-kind schemas, and the shared ``torchrepro.report/1`` with its ``kind`` key."""
    if not isinstance(data, dict):
        return None
    schema = data.get("schema")
    if schema == LEGACY_SCHEMA:
        return data.get("kind", "doctor") if data.get("kind", "doctor") in _KINDS else None
    return next((kind for kind, name in SCHEMAS.items() if name == schema), None)


def load_report(data: Any, source: str = "report") -> Report:
    """The typed report of a ``report.json`` document; :class:`InputError` when it is not one."""
    kind = report_kind(data)
    if kind is None:
        schema = data.get("schema") if isinstance(data, dict) else None
        raise InputError(f"{source} is not a torchrepro report (schema {schema!r})")
    if (problem := schema_problem(data, schema_of(kind))) is not None:
        raise InputError(f"{source}: a damaged {kind} report: {problem}")
    try:
        return _KINDS[kind].from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"{source}: a damaged {kind} report ({type(exc).__name__}: {exc})") from None


@functools.lru_cache(maxsize=None)
def schema_of(kind: str) -> JsonObject:
    """The JSON Schema of ``kind``'s ``report.json``, parsed (once)."""
    schema: JsonObject = json.loads(schema_path(kind).read_text())
    return schema


def schema_path(kind: str) -> Path:
    """The JSON Schema of ``kind``'s ``report.json`` (shipped in the package)."""
    return Path(__file__).resolve().parent.parent / "schemas" / f"{kind}.schema.json"
