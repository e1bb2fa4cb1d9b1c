"""The event log's contract: the typed events, their kinds and JSON Schemas, what a reader of the
format needs.

Per rank, ``RUN_DIR/rank-<r>/events.jsonl``: the first line is a :class:`Header` carrying
``"schema": "torchrepro.events/2"``; every line is one JSON object with a ``kind``
(:data:`KINDS`), its fields those of the kind's dataclass here (:data:`EVENT_SCHEMAS`). Step
events, one a step, go to ``steps.bin`` beside it as compact binary records (:mod:`.stepstream`,
~50 bytes a step instead of ~400, :data:`STEP_FIELDS` in order); a reader puts them back among the
lines in writing order, and reads logs of ``torchrepro.events/1`` (every step a JSON line) too.
How events become bytes and back is :mod:`.event_codec`; the writer is :mod:`.event_writer`, the
tolerant reader :mod:`.event_reader`. Nothing here imports torch.
"""

from __future__ import annotations

import math
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .jsoncheck import MAX_INT, MAX_RANK, schema_problem
from .payloads import CaptureSettings, JsonObject

SCHEMA = "torchrepro.events/2"
READABLE = (SCHEMA, "torchrepro.events/1")  # /1: steps as JSON lines, no steps.bin (read the same way)
EVENTS_FILE = "events.jsonl"
END_FILE = "end.json"  # beside it while its writer runs: room kept for an end record the log cannot take (a full disk)
WRITE_FAILED = "write_failed"  # an end record's status: the log could not be written (see End)
RESERVED_END = 512  # that file's size, written when the log is opened (its block allocated then)
NOT_AVAILABLE = "not available"  # a version or capability of the environment (Header.env) this machine lacks


@dataclass(slots=True)
class Event:
    """Base of every event: ``t`` is wall-clock seconds, ``step`` the optimizer steps
    completed when it happened (``None`` before any step clock exists)."""

    kind: ClassVar[str] = "event"
    t: float = field(default_factory=time.time)
    rank: int = 0
    step: int | None = None

    def to_json(self) -> JsonObject:
        return {"kind": self.kind, **{name: getattr(self, name) for name in field_names(type(self))}}


@dataclass(slots=True)
class Header(Event):
    """First line of every log: who wrote it, with what."""

    kind: ClassVar[str] = "header"
    schema: str = SCHEMA
    torchrepro_version: str = ""
    world_size: int = 1
    local_rank: int = 0
    pid: int = 0
    host: str = ""
    argv: list[str] = field(default_factory=list)
    torch_version: str = ""
    python_version: str = ""
    env: JsonObject = field(default_factory=dict)  # capture.environment.collect(): read back as written
    env_fingerprint: str = ""
    config: CaptureSettings = field(default_factory=CaptureSettings)


@dataclass(slots=True)
class World(Event):
    """The process group this process joined, once initialised: its rank there (``group_rank``;
    ``rank`` is the log's), the world size, and the local rank and node where the launcher's
    environment gives them (``LOCAL_RANK``; ``GROUP_RANK``/``NODE_RANK``)."""

    kind: ClassVar[str] = "world"
    group_rank: int = 0
    world_size: int = 1
    local_rank: int | None = None
    node: int | None = None
    host: str = ""
    backend: str | None = None


@dataclass(slots=True)
class Compile(Event):
    """One Dynamo compile of a frame (``compile_id`` = ``frame/attempt`` as Dynamo numbers it)."""

    kind: ClassVar[str] = "compile"
    compile_id: str = ""
    function: str | None = None
    file: str | None = None
    line: int | None = None
    call_site: str | None = None
    dynamo_s: float | None = None
    backend_s: float | None = None
    inductor_s: float | None = None
    build_s: float | None = None
    backward_s: float | None = None
    guards: int | None = None
    graph_ops: int | None = None
    cache: dict[str, dict[str, int]] = field(default_factory=dict)
    recompile_reasons: list[str] = field(default_factory=list)  # as Dynamo said them (no category: analysis's)
    # ids in recompile_reasons that stand for a Python constant, not an object (torch 2.6 guards bools and None by
    # identity: ``___check_obj_id(L['flag'], 9412...)``): id -> the constant (``True``), or ``bool``/``value``
    # where a TORCH_TRACE log's own guards showed it
    constant_ids: dict[str, str] = field(default_factory=dict)
    fail_type: str | None = None
    fail_reason: str | None = None
    limit_hit: str | None = None
    logging_overhead_s: float | None = None

    @property
    def is_recompile(self) -> bool:
        return bool(self.recompile_reasons)

    @property
    def seconds(self) -> float:
        """The time this compile cost, forward and backward: a time not measured, or not finite in a
        damaged log, counts as none."""
        return sum(t for t in (self.dynamo_s, self.backward_s) if t is not None and math.isfinite(t))


@dataclass(slots=True)
class GraphBreak(Event):
    """A graph break (also data-dependent branching, which Dynamo counts as unimplemented)."""

    kind: ClassVar[str] = "graph_break"
    compile_id: str = ""
    reason: str = ""
    explanation: str = ""
    hints: list[str] = field(default_factory=list)
    gb_id: str | None = None
    file: str | None = None
    line: int | None = None
    source: str | None = None


# CacheLookup.reason of an AOTAutograd lookup that torchrepro's graph probe made a miss: the entry was there,
# but the probe kept no copy of its FX graph, so the graph was compiled again to be probed (capture/graph_probe.py)
PROBE_MISS = "made a miss by torchrepro's graph probe (no copy of this entry's FX graph kept to probe it)"


@dataclass(slots=True)
class CacheLookup(Event):
    """One FX-graph or AOTAutograd cache lookup, with the key's components where recorded
    (``reason``: why it bypassed the cache, or :data:`PROBE_MISS`)."""

    kind: ClassVar[str] = "cache"
    compile_id: str = ""
    cache: str = ""
    status: str = ""
    key: str | None = None
    reason: str | None = None
    components: list[dict[str, str]] = field(default_factory=list)


@dataclass(slots=True)
class Params(Event):
    """Names, shapes and dtypes of the parameters that ``Step.param_fps`` lists, in order."""

    kind: ClassVar[str] = "params"
    names: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # "tensor", or "dtensor:<placements>"


@dataclass(slots=True)
class InitParams(Event):
    """A module's full parameters as this rank built them, just before ``source`` (e.g.
    ``fully_shard``) sharded them, or as training starts (``first_forward``): fingerprints by name,
    ``"meta"`` for meta tensors. At the first forward, ``unwritten`` names the parameters that
    ``Module.to_empty()`` materialised and nothing wrote since (uninitialised memory)."""

    kind: ClassVar[str] = "init_params"
    source: str = ""
    module: str = ""
    names: list[str] = field(default_factory=list)
    fps: list[str] = field(default_factory=list)
    unwritten: list[str] = field(default_factory=list)


@dataclass(slots=True)
class NonFinite(Event):
    """Tensors that hold NaN or an infinity, written the first time capture sees them:
    ``what`` is ``parameters`` (as training starts, at the first forward) or ``gradients`` (at
    the first step whose gradient norm is not finite); ``names`` the first of them, in the
    parameters' order, ``count`` how many of ``of``."""

    kind: ClassVar[str] = "nonfinite"
    what: str = ""
    names: list[str] = field(default_factory=list)
    count: int = 0
    of: int = 0


@dataclass(slots=True)
class Step(Event):
    """One optimizer step: loss, host time, and fingerprints of what the step saw and made."""

    kind: ClassVar[str] = "step"
    index: int = 0
    loss: float | None = None
    backward_calls: int = 0
    time_s: float | None = None
    params_fp: str | None = None
    param_fps: list[str] | None = None
    grads_fp: str | None = None
    grad_norm: float | None = None
    batch_fp: str | None = None
    batches: int = 0
    rng_fp: str | None = None
    rng_fps: dict[str, str] | None = None
    rng_at: str | None = None  # where the step's RNG state was read: batch | backward | step_end | start
    compiles: int = 0
    loss_last: float | None = None  # several backward() calls: the last value (docs/commands.md)


@dataclass(slots=True)
class Capability(Event):
    """Something capture could or could not observe on this torch version."""

    kind: ClassVar[str] = "capability"
    name: str = ""
    available: bool = False
    note: str = ""


@dataclass(slots=True)
class GraphProbe(Event):
    """One compiled graph (forward or backward) called again ``repeats`` times, in the run's own
    process and thread count, on copies of the inputs of its first call: ``differing`` lists the
    outputs (by index) that were not bit for bit the same every time, ``explained`` what the first
    of them is (compile id, graph, parameter, FX node, op, kernel, source line);
    ``eager_differing`` and ``eager_explained`` the same against the graph run eagerly; ``error``
    what failed in the probe itself (never the user's run); ``not_saved`` why a probed graph was
    not saved for ``torchrepro repro``."""

    kind: ClassVar[str] = "graph_probe"
    compile_id: str = ""
    graph: str = ""  # "forward" | "backward"
    repeats: int = 0
    runs_differing: int = 0  # repeats whose outputs differed from the first call's
    threads: int = 0
    differing: list[int] = field(default_factory=list)
    max_abs: float | None = None
    explained: dict[str, Any] = field(default_factory=dict)
    eager_differing: list[int] = field(default_factory=list)  # outputs unlike the FX graph's run eagerly
    eager_explained: dict[str, Any] = field(default_factory=dict)  # the first of them in the graph's order
    one_thread: str | None = None  # a graph that differs, at one thread: "differs" | "repeats bit for bit"
    accumulates: bool = False  # it adds atomically at several threads: probed longer where it repeats
    time_s: float | None = None
    error: str | None = None
    not_saved: str | None = None


@dataclass(slots=True)
class GraphsRan(Event):
    """The compiled graphs step ``step`` called, each ``compile_id/forward`` or ``compile_id/backward``
    (as :class:`GraphProbe` names them), in the order first called; written by the graph probe at the
    end of a step whose graphs are not those of the step before, so a step without one ran the graphs
    of the last one before it (none before the first). A forward whose backward ran in the same step
    is a training graph; one without (evaluation under ``no_grad``) made no gradient in that step."""

    kind: ClassVar[str] = "graphs_ran"
    graphs: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Setting(Event):
    """A switch that changes what a step computes, as it was when the first step ended (after
    the script's own set-up): ``deterministic_algorithms``, ``num_threads``, ..."""

    kind: ClassVar[str] = "setting"
    name: str = ""
    value: Any = None


@dataclass(slots=True)
class Counters(Event):
    """Dynamo's own counters at the end of the run (a cross-check for the events)."""

    kind: ClassVar[str] = "counters"
    counters: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass(slots=True)
class Metric(Event):
    """A value the script reported with ``torchrepro.log_metric(name, value)``."""

    kind: ClassVar[str] = "metric"
    name: str = ""
    value: float | None = None


@dataclass(slots=True)
class End(Event):
    """Last line of a log: how the script ended. ``status`` :data:`WRITE_FAILED`: capture could not
    write the log (``error``: the error's name and the file, ``ENOSPC rank-0/events.jsonl``; ``step``:
    the last step recorded; ``exit_code`` None: the script ran on, its end unrecorded)."""

    kind: ClassVar[str] = "end"
    exit_code: int | None = 0
    status: str = "ok"
    error: str | None = None
    duration_s: float | None = None


def field_names(cls: type) -> tuple[str, ...]:
    """The fields of an event type, in order (what its line and its record hold)."""
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


_NAMES: dict[type, tuple[str, ...]] = {}

KINDS: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        Header,
        World,
        Compile,
        GraphBreak,
        CacheLookup,
        Params,
        InitParams,
        NonFinite,
        Step,
        Capability,
        GraphProbe,
        GraphsRan,
        Setting,
        Counters,
        Metric,
        End,
    )
}


_TYPES = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "list": (list,),
    "dict": (dict,),
    "JsonObject": (dict,),  # the names of dict types that fields are annotated with (eventlog.payloads)
    "CaptureSettings": (dict,),
    "None": (type(None),),
    "Any": (object,),
}


def _accepted(annotation: str) -> tuple[type, ...]:
    """The JSON types a field annotated ``float | None`` (``list[str]``, ...) accepts."""
    return tuple(t for part in annotation.split("|") for t in _TYPES[part.strip().split("[", 1)[0]])


def _exact(accepted: tuple[type, ...]) -> frozenset[type] | None:
    """The exact types of the values a field accepting ``accepted`` takes (json gives exact types;
    bool is an int to isinstance); None when it takes any."""
    return None if object in accepted else frozenset(accepted + ((bool,) if int in accepted else ()))


_SCHEMA_TYPES = {"int": "integer", "float": "number", "str": "string", "bool": "boolean", "None": "null"}
_RANKS = {"minimum": 0, "maximum": MAX_RANK}  # the bounds of a rank or a world size
_NAMED = {"type": "object", "required": ["name", "value"], "properties": {"name": {"type": "string"}}}
# what analysis reads of a header's environment (capture.environment.collect(); the rest is kept as written)
_ENV = {
    "type": "object",
    "properties": {
        **dict.fromkeys(("versions", "hardware", "threads"), {"type": "object"}),
        "determinism": {"type": "array", "items": _NAMED},
        "env_vars": {"type": "array", "items": _NAMED},
    },
}
_FIELD_SCHEMAS: dict[str, JsonObject] = {  # what a field's schema says beyond its annotation
    **dict.fromkeys(("rank", "group_rank", "local_rank", "node"), _RANKS),
    "world_size": {**_RANKS, "minimum": 1},
    "env": _ENV,
}


def _annotation_schema(annotation: str) -> JsonObject:
    """The JSON Schema of a field annotated ``annotation`` (``dict[str, dict[str, int]] | None``, ...)."""
    types: list[str] = []
    out: JsonObject = {}
    for part in _split(annotation, "|"):
        head, _, args = part.partition("[")
        if head in ("Any", "JsonObject", "CaptureSettings"):
            return {} if head == "Any" else {"type": ["object", *types]}
        if head == "list":
            types.append("array")
            out["items"] = _annotation_schema(args[:-1])
        elif head == "dict":
            types.append("object")
            out["additionalProperties"] = _annotation_schema(_split(args[:-1], ",")[1])
        else:
            types.append(_SCHEMA_TYPES[head])
    return {"type": types, **out}


def _split(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside brackets, each part stripped."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c == "[") - (c == "]")
        if c == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()]


# each kind's schema: its fields' JSON types, nested ones included, and the bounds of ranks and world sizes
EVENT_SCHEMAS: dict[str, JsonObject] = {
    kind: {
        "type": "object",
        "properties": {
            f.name: {**_annotation_schema(str(f.type)), **_FIELD_SCHEMAS.get(f.name, {})}
            for f in dataclasses.fields(cls)
        },
    }
    for kind, cls in KINDS.items()
}


# per kind, the fields whose schema says more than a JSON type the builder checks (nested values, bounds)
_DEEP = {
    kind: {
        name: sub
        for name, sub in schema["properties"].items()
        if set(sub) - {"type"} or {"array", "object"} & set(sub.get("type", ["any"])) or not sub
    }
    for kind, schema in EVENT_SCHEMAS.items()
}


def check_event(kind: str, data: JsonObject) -> None:
    """``ValueError`` naming the field of an event of ``kind`` (its JSON object, ``kind`` left out)
    that breaks the kind's schema (:data:`EVENT_SCHEMAS`) or the bounds of every value read back;
    each field's own JSON type is the builder's to check (``TypeError``)."""
    deep = _DEEP[kind]
    for name, value in data.items():
        sub = deep.get(name)
        if sub is not None:
            problem = schema_problem(value, sub, where=name)
        elif type(value) is int and not -MAX_INT < value < MAX_INT:
            problem = f"field {name!r} is an integer out of range"
        else:
            continue
        if problem is not None:
            raise ValueError(f"{kind}: {problem}")


# str(): the annotations are strings already (``from __future__ import annotations``)
FIELD_TYPES = {kind: {f.name: _accepted(str(f.type)) for f in dataclasses.fields(cls)} for kind, cls in KINDS.items()}
STEP_FIELDS = field_names(
    Step
)  # the order of a step's values in a record, a row and the columns (read_events's reduce)
