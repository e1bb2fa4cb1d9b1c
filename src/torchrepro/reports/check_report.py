"""The check report (``torchrepro check``, ``check-resume`` and ``diff``): is the run reproducible,
and why not."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypedDict

from ..eventlog.payloads import JsonObject
from .findings import Finding, Verdict, comparison_exit_code, extra_keys, from_fields, load_findings
from .schema import SCHEMAS


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


Strength = Literal["shown", "measured", "inferred", "unexplained"]
STRENGTHS: dict[str, str] = {  # what each strength of evidence rests on
    "shown": "the two runs' own records show it (their batches, RNG states, environments, graphs or files differ)",
    "measured": "a replay or probe measured it on identical inputs (an op, graph or kernel named)",
    "inferred": "decided from whole runs compared (eager, compiled, fallback_random) without naming an op",
    "unexplained": "no evidence points to one cause",
}
# what the localisation named, said at the top of ``first_divergence`` as well as in its evidence
LOCALISATION_KEYS = ("compile_id", "graph", "parameter", "output", "node", "kernel", "kernel_fuses")
WHERE_KEYS = ("module", "op", "source", "phase")  # said at the top of ``first_divergence`` only


@dataclass(frozen=True)
class Evidence:
    """What shows the cause of a divergence, and where it starts: built once by the analysis
    (:mod:`torchrepro.analysis.nondeterminism`), read as it is by every renderer. ``quantity``: what
    it explains (``loss``, ``grads``, ``params``, ``batch``, ``rng``, ``init_params``, or a
    ``compiled_graph`` that differed from itself); ``strength``: what it rests on (:data:`STRENGTHS`);
    ``because``: why, in a sentence; ``scope``: which compiled graphs could explain the quantity
    (those that ran in the step with a backward, for a gradient) and which were left out;
    ``localisation``: how it was localised (``compiled_graph``, ``backward_graph``,
    ``compiled_kernel``, an op replay's finding, ``not_localised``...), ``named_by`` what named it
    (``graph_probe``, ``replay_pair``...); ``run``, ``compile_id`` and ``graph``: the compiled graph
    (``forward`` or ``backward``) and the run it is saved in; ``op``, ``module``, ``source``,
    ``phase``, ``node``, ``output``, ``parameter``, ``kernel``, ``kernel_fuses``: where in it;
    ``localisation_note``: what failed in the localisation itself; ``facts``: what only some causes
    add (``differences``, ``files``, ``streams``, ``probe``, ``thread_dependence``, ``run_to_run``,
    ``against_eager``...), as JSON."""

    because: str | None = None
    quantity: str | None = None
    strength: Strength | None = None
    scope: str | None = None
    localisation: str | None = None
    named_by: str | None = None
    run: str | None = None
    compile_id: str | None = None
    graph: str | None = None
    op: str | None = None
    module: str | None = None
    source: str | None = None
    phase: str | None = None
    node: str | None = None
    output: str | None = None
    parameter: str | None = None
    kernel: str | None = None
    kernel_fuses: list[str] | None = None
    kernel_atomic_add: bool | None = None
    localisation_note: str | None = None
    facts: JsonObject = field(default_factory=dict)

    def but(self, other: Evidence) -> Evidence:
        """This evidence with what ``other`` says in place of what this says (its facts added)."""
        said = {f.name: getattr(other, f.name) for f in dataclasses.fields(other) if f.name != "facts"}
        return dataclasses.replace(
            self, **{k: v for k, v in said.items() if v is not None}, facts={**self.facts, **other.facts}
        )

    def where(self) -> JsonObject:
        """What names the place, as JSON: graph, op, module, source line and the rest that is set."""
        return {k: getattr(self, k) for k in (*LOCALISATION_KEYS, *WHERE_KEYS) if getattr(self, k) is not None}

    def noted(self, note: str) -> Evidence:
        """This evidence with ``note`` added to its ``localisation_note``."""
        return dataclasses.replace(self, localisation_note="; ".join(filter(None, [self.localisation_note, note])))

    def to_json(self) -> JsonObject:
        """Every field that is set, the facts beside them (``report.json``'s ``evidence``)."""
        out = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "facts" and getattr(self, f.name) is not None
        }
        return {**out, **{k: v for k, v in self.facts.items() if k not in out}}

    @classmethod
    def from_json(cls, data: JsonObject) -> Evidence:
        """Read back what :meth:`to_json` wrote (a key without a field is a fact)."""
        return from_fields(cls, data, facts=extra_keys(cls, data))


@dataclass
class FirstDivergence:
    """``determinism.first_divergence``: where two runs first differ (``step``, ``rank``, ``what``
    differed first, with its ``detail``: by how much), the ``cause`` and the :class:`Evidence` of it
    (:func:`torchrepro.analysis.nondeterminism.determinism_section`); ``before_step`` 0 when the
    initial parameters already differ. As JSON, what names the place (the evidence's module, op,
    source, phase and what the localisation named) is said at its top as well."""

    step: int
    rank: int
    what: str
    cause: str | None
    evidence: Evidence = field(default_factory=Evidence)
    detail: JsonObject = field(default_factory=dict)
    before_step: int | None = None

    def to_json(self) -> JsonObject:
        ev = self.evidence
        out: JsonObject = {
            "step": self.step,
            "rank": self.rank,
            "what": self.what,
            **{k: getattr(ev, k) for k in WHERE_KEYS},
            "cause": self.cause,
            "detail": self.detail,
            "evidence": {k: v for k, v in ev.to_json().items() if k not in WHERE_KEYS},
        }
        out.update((k, getattr(ev, k)) for k in LOCALISATION_KEYS if getattr(ev, k) is not None)
        if self.before_step is not None:
            out["before_step"] = self.before_step
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> FirstDivergence:
        said = {k: data[k] for k in (*WHERE_KEYS, *LOCALISATION_KEYS) if data.get(k) is not None}
        return cls(
            data["step"],
            data["rank"],
            data["what"],
            data.get("cause"),
            Evidence.from_json({**(data.get("evidence") or {}), **said}),
            data.get("detail") or {},
            data.get("before_step"),
        )


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
    accumulates: bool
    time_s: float | None
    error: str | None
    not_saved: str | None


@dataclass
class Determinism:
    """The ``determinism`` section: what was compared, how every run ended, the first divergence
    (:class:`FirstDivergence`, its cause and :class:`Evidence`). ``more``: what only some checks add
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
            "first_divergence": self.first_divergence.to_json() if self.first_divergence else None,
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
        endings = [from_fields(RunEnding, e) for e in data["endings"]]
        first = data.get("first_divergence")
        return from_fields(
            cls,
            data,
            verdict=Verdict(data["verdict"]),
            endings=endings,
            first_divergence=FirstDivergence.from_json(first) if first else None,
            more=extra_keys(cls, data, "exit_code"),
        )


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
        return cls(run.get("run_dirs", {}), run.get("timings_s", {}), extra_keys(cls, run))


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
            findings=load_findings(data["findings"]),
            verdict_line=data["verdict"],
            provenance=data.get("provenance"),
            sides=data.get("sides"),
            step_comparison=data.get("step_comparison"),
        )
