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
    """How far two runs' parameters are apart: the largest absolute difference and, relative to the
    largest magnitude of the same tensor, its relative size (both None where only sketches were kept
    and a differing tensor was sketched), and where (the largest absolute difference; without it,
    the largest L2 difference); the L2 norm of the whole difference and relative to the second run's
    parameters' (``estimated``: from sketches, each tensor projected to at least ``sketch_dims``
    dims; docs/fingerprint.md, "Snapshots")."""

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
    accumulates: bool
    time_s: float | None
    error: str | None
    not_saved: str | None


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
        endings = [from_fields(RunEnding, e) for e in data["endings"]]
        return from_fields(
            cls, data, verdict=Verdict(data["verdict"]), endings=endings, more=extra_keys(cls, data, "exit_code")
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
