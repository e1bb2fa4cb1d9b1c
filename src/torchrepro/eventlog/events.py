"""The event log: typed events, an append-only writer, and a tolerant reader.

Per rank, ``RUN_DIR/rank-<r>/events.jsonl``: the first line is a :class:`Header` carrying
``"schema": "torchrepro.events/2"``; every line is one JSON object with a ``kind``. Step events,
one a step, go to ``steps.bin`` beside it as compact binary records (:mod:`.stepstream`, ~50
bytes a step instead of ~400); the reader puts them back among the lines in writing order, and
reads logs of ``torchrepro.events/1`` (every step a JSON line) too.
The writer hands each event to the kernel with one ``write``, so a crash keeps everything before it. The reader skips
garbled lines, lines over :data:`MAX_LINE` bytes, a truncated last line and damaged step records and says so in
``EventLog.problems``; events of kinds it does not know are counted, not fatal. It reads a chunk at
a time (memory holds the events, not the file) and only regular files (:func:`open_regular`: a FIFO
or a device would block or never end). Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO, ClassVar, TypeVar, cast

from ..errors import InputError
from . import stepstream
from .payloads import CaptureSettings, JsonObject
from .jsoncheck import MAX_INT, MAX_RANK, json_type, loads, schema_problem, type_names
from .stepstream import STEPS_FILE

_orjson: ModuleType | None
_msgspec: ModuleType | None
try:
    import orjson as _orjson
except ImportError:  # optional: the standard library reads and writes the same lines
    _orjson = None
try:
    import msgspec as _msgspec
except ImportError:  # optional: step lines are then read through orjson or json, the same events
    _msgspec = None

SCHEMA = "torchrepro.events/2"
READABLE = (SCHEMA, "torchrepro.events/1")  # /1: steps as JSON lines, no steps.bin (read the same way)
EVENTS_FILE = "events.jsonl"
MAX_LINE = 64 << 20  # a longer line is damage (a sparse or garbled file), skipped unread: memory stays bounded
_CHUNK = 4 << 20  # what the reader holds of the file at once, besides one line
OVERSIZED = b"\0 a line over MAX_LINE bytes"  # what LineReader gives for such a line (never valid JSON)
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
        return {"kind": self.kind, **{name: getattr(self, name) for name in _names(type(self))}}


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


@dataclass(slots=True)
class CacheLookup(Event):
    """One FX-graph or AOTAutograd cache lookup, with the key's components where recorded."""

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
    ``fully_shard``) sharded them: fingerprints by name, ``"meta"`` for meta tensors."""

    kind: ClassVar[str] = "init_params"
    source: str = ""
    module: str = ""
    names: list[str] = field(default_factory=list)
    fps: list[str] = field(default_factory=list)


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
    what failed in the probe itself (never the user's run)."""

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
    time_s: float | None = None
    error: str | None = None


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
    """Last line of a log: how the script ended."""

    kind: ClassVar[str] = "end"
    exit_code: int | None = 0
    status: str = "ok"
    error: str | None = None
    duration_s: float | None = None


def _names(cls: type) -> tuple[str, ...]:
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
        Step,
        Capability,
        GraphProbe,
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


E = TypeVar("E", bound=Event)  # EventLog.of: the events of the type asked for

_LEAF_TYPES = frozenset(KINDS.values())  # no event type derives from another: of() may look them up by type
# str(): the annotations are strings already (``from __future__ import annotations``)
_FIELD_TYPES = {kind: {f.name: _accepted(str(f.type)) for f in dataclasses.fields(cls)} for kind, cls in KINDS.items()}


def from_json(data: JsonObject) -> Event | None:
    """The event a JSON object describes; unknown fields are ignored, unknown kinds give None, a
    field of the wrong JSON type raises ``TypeError``, one that breaks its kind's schema or bounds
    ``ValueError`` (:func:`check_event`; the reader skips that line)."""
    kind = data.pop("kind", "")
    build = _BUILDERS.get(kind)
    if build is None:
        data["kind"] = kind
        return None
    if kind != "step":
        check_event(kind, data)
    return build(data)


def _checked(kind: str, data: JsonObject) -> Event:
    """The event of ``kind`` from ``data``, every field's JSON type checked one by one (lines with
    missing, extra or mistyped fields; the builders take this path for them)."""
    types = _FIELD_TYPES[kind]
    fields: dict[str, Any] = {}  # each value's JSON type checked against its field's
    for name, value in data.items():
        accepted = types.get(name)
        if accepted is not None:
            if not isinstance(value, accepted):
                raise TypeError(f"{kind}: field {name!r} is {json_type(value)}, not {type_names(accepted)}")
            fields[name] = value
    return KINDS[kind](**fields)


# Step fields that agree across data-parallel replicas: a reader given a :class:`Shared` keeps one
# object per step index and value for all ranks (memory for thousands of ranks).
_REPLICATED = ("params_fp", "grads_fp", "rng_fp", "param_fps", "rng_fps")


def _builder(kind: str, cls: type[Event], positional: bool = False) -> Callable[..., Event]:
    """A function compiled for one kind that builds its event from a line holding exactly its
    fields in the writer's order, checking each value's exact JSON type in line, and falls back
    to :func:`_checked` for anything else: the reader's hot path, same result. ``positional``:
    from the values alone, in field order (a step record whose fields are this torchrepro's)."""
    names = _names(cls)
    scope: dict[str, Any] = {"_cls": cls, "_names": names, "_checked": _checked, "_kind": kind}
    checks, types = [], []
    for i, name in enumerate(names):
        exact = _exact(_FIELD_TYPES[kind][name])
        if exact is not None:
            scope[f"_T{i}"] = exact
            checks.append(f"_type({name}) not in _T{i}")
            types.append(f"_T{i}=_T{i}")
    data = "dict(zip(_names, data))" if positional else "data"
    slow = f"        return {f'_share_step(_checked(_kind, {data}), shared)' if cls is Step else f'_checked(_kind, {data})'}"
    lines = [f"def build(data, shared=None, _type=type, {', '.join(types)}):"]
    if not positional:
        lines += ["    if tuple(data) != _names:", slow]
    lines += [
        f"    {', '.join(names)}, = {'data' if positional else 'data.values()'}",
        f"    if {' or '.join(checks) or 'False'}:",
        slow,
    ]
    made = f"_cls({', '.join(names)})"
    if cls is Step:
        scope["_share_step"] = _share_step
        made = f"_share_step({made}, shared)"
    lines.append(f"    return {made}")
    exec("\n".join(lines), scope)  # noqa: S102 -- source built above from the dataclasses' own field names
    build: Callable[..., Event] = scope["build"]
    return build


@dataclass(slots=True)
class Shared:
    """What repeats across the ranks of one run, kept once while reading them: the replicated
    step fields by step index (the first rank's), and rank numbers (ints above 256 are objects
    of their own in every event)."""

    steps: dict[int, tuple[object, ...]] = field(default_factory=dict)
    ranks: dict[int, int] = field(default_factory=dict)


def _step_sharer() -> Callable[[Step, Shared | None], Step]:
    """The function that makes a step read hold the objects of ``shared`` where its fields equal
    them (its step equal to its index is that object too, ``rng_at`` interned), compiled for the
    fields of :class:`Step`: every path of the reader ends a step with it."""
    lines = [
        "def share(s, shared, _intern=_intern):",
        "    if type(s.rng_at) is str: s.rng_at = _intern(s.rng_at)",
        "    if s.step == s.index and type(s.step) is type(s.index): s.step = s.index",
        "    if shared is None: return s",
        "    if type(s.rank) is int: s.rank = shared.ranks.setdefault(s.rank, s.rank)",
        "    ref = shared.steps.get(s.index)",
        "    if ref is None:",
        f"        shared.steps[s.index] = ({', '.join(f's.{n}' for n in _REPLICATED)})",
        "        return s",
        f"    {', '.join(f'r_{n}' for n in _REPLICATED)} = ref",
        *(f"    if s.{n} == r_{n}: s.{n} = r_{n}" for n in _REPLICATED),
        "    return s",
    ]
    scope: dict[str, Any] = {"_intern": sys.intern}
    exec("\n".join(lines), scope)  # noqa: S102 -- source built above from Step's own field names
    share: Callable[[Step, Shared | None], Step] = scope["share"]
    return share


_STEP_PREFIX = b'{"kind":"step",'  # how the writer starts every step line
_share_step = _step_sharer()
_BUILDERS = {kind: _builder(kind, cls) for kind, cls in KINDS.items()}
_step_from_values = _builder(Step.kind, Step, positional=True)
_decode_step = _msgspec.json.Decoder(Step).decode if _msgspec is not None else None

STEP_FIELDS = _names(Step)  # the order of a step's values in a row, and of the columns (read_events's reduce)
_step_row = attrgetter(*STEP_FIELDS)  # a Step's values in that order (a tuple)
_STEP_TYPES = tuple(_exact(_FIELD_TYPES[Step.kind][name]) for name in STEP_FIELDS)
StepColumns = Sequence[Sequence[Any]]  # steps field by field: a sequence per field of STEP_FIELDS, in that order
StepReduce = Callable[[Iterator[StepColumns]], Any]  # what read_events(reduce=...) makes of a log's steps


def step_columns(steps: Iterable[Step]) -> StepColumns:
    """The values of ``steps`` field by field (:data:`STEP_FIELDS` order), each in the order of ``steps``.

    >>> step_columns([Step(index=0, loss=2.0), Step(index=1, loss=1.5)])[STEP_FIELDS.index("loss")]
    (2.0, 1.5)
    """
    return _columns(list(map(_step_row, steps)))


def _columns(rows: list[Sequence[Any]]) -> StepColumns:
    return list(zip(*rows)) or [()] * len(STEP_FIELDS)


def _line(event: Event) -> bytes:
    """One event as a JSON line, UTF-8. Step events (the hot path) go through orjson when it is
    installed and their numbers are finite (orjson serializes the dataclass itself, fields in
    order, after ``kind``); the rest, and NaN/inf (orjson would write null), through json."""
    if (
        _step_line is not None
        and type(event) is Step
        and _finite(event.loss)
        and _finite(event.loss_last)
        and _finite(event.grad_norm)
        and _finite(event.time_s)
        and _finite(event.t)
    ):
        return _step_line(event)
    return (json.dumps(event.to_json(), separators=(",", ":"), default=str) + "\n").encode()


def _step_line_writer() -> Callable[[Step], bytes] | None:
    """A Step's line through orjson from a dict built in line from its fields, in order: in a
    training step (caches cold) half the time orjson takes to serialize the dataclass itself."""
    if _orjson is None:
        return None
    fields = ", ".join(f'"{name}": e.{name}' for name in _names(Step))
    source = f'def step_line(e):\n    return _dumps({{"kind": "step", {fields}}}, default=str, option=_NEWLINE)'
    scope: dict[str, Any] = {"_dumps": _orjson.dumps, "_NEWLINE": _orjson.OPT_APPEND_NEWLINE}
    exec(source, scope)  # noqa: S102 -- source built above from Step's own field names
    step_line: Callable[[Step], bytes] = scope["step_line"]
    return step_line


_step_line = _step_line_writer()


def _finite(v: Any) -> bool:
    """None, an int, or a finite float: what orjson writes as json would."""
    return v is None or type(v) is float and math.isfinite(v) or type(v) is int


def _write(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    while written < len(data):  # a regular file takes it whole, unless interrupted
        written += os.write(fd, data[written:])


def _count_lines(path: Path) -> int:
    with open(path, "rb") as fp:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: fp.read(_CHUNK), b""))


def _step_getter() -> Callable[[Step], tuple[Any, ...]]:
    """A Step's field values in order, compiled for its fields (the writer's hot path)."""
    scope: dict[str, Any] = {}
    source = f"def values(e):\n    return ({''.join(f'e.{name}, ' for name in _names(Step))})"
    exec(source, scope)  # noqa: S102 -- source built above from Step's own field names
    values: Callable[[Step], tuple[Any, ...]] = scope["values"]
    return values


_step_values = _step_getter()

# The fields a common step gives (``EventWriter.write_step``): ``step`` is ``index``, every other field
# is at its default (no digests, one backward() or none, no gradient norm).
COMMON_STEP = ("t", "rank", "index", "loss", "backward_calls", "time_s", "compiles")


def _common_step_getter() -> Callable[..., tuple[Any, ...]]:
    """A step record's values (``_lines`` first) from :data:`COMMON_STEP`'s, each other field at its
    default: what ``_step_values`` gives for the ``Step`` built from them, without building it."""
    given = {**{name: name for name in COMMON_STEP}, "step": "index"}
    defaults = {f.name: f.default for f in dataclasses.fields(Step) if f.name not in given}
    assert all(type(d) in (type(None), int) for d in defaults.values()), defaults  # written out as literals
    values = "".join(f"{given.get(name, repr(defaults.get(name)))}, " for name in _names(Step))
    source = f"def values(lines, {', '.join(COMMON_STEP)}):\n    return (lines, {values})"
    scope: dict[str, Any] = {}
    exec(source, scope)  # noqa: S102 -- source built above from Step's own field names and literal defaults
    common: Callable[..., tuple[Any, ...]] = scope["values"]
    return common


_common_step_values = _common_step_getter()


class EventWriter:
    """Appends events to a JSONL file (steps to ``steps.bin`` beside it), one ``write`` system call per event, nothing buffered in
    the process: once ``write`` returns, the line is the kernel's, and survives the process
    being killed (SIGKILL) at any later point; only an operating-system crash or power loss can
    take it (no ``fsync``). Each of ``listeners`` (e.g. the OpenTelemetry exporter) is called
    with every event right after its line is written; a listener must return quickly and never
    raise.

    >>> with EventWriter(Path("run/rank-0/events.jsonl")) as w:  # doctest: +SKIP
    ...     w.write(Step(index=0, loss=1.5))
    """

    def __init__(self, path: str | os.PathLike[str], compact_steps: bool = True):
        """``compact_steps``: step events go to ``steps.bin`` beside ``path`` (:mod:`.stepstream`);
        they are JSON lines in ``path`` without it, and whenever ``steps.bin`` already holds
        another writer's records (a second session of one process) or a step has a value that is
        no JSON type."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        self.listeners: list[Callable[[Event], None]] = []
        self.lines = _count_lines(self.path) if os.fstat(self._fd).st_size else 0  # what the reader counts
        self._steps: tuple[int, stepstream.Encoder] | None = None
        self._steps_pid = 0
        self._compact = compact_steps
        # steps.bin is opened at the first step, in the folder this log is in then (it may have been
        # renamed: a launched process's log moves to launcher/ while it writes, runtime.follow.claim)
        self._dir: int | None = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY) if compact_steps else None

    def write(self, event: Event) -> None:
        if self._fd is None:
            return
        if type(event) is Step and self._compact and self._write_step(event):
            pass
        else:
            _write(self._fd, _line(event))
            self.lines += 1
        for listener in self.listeners:
            listener(event)

    def write_step(
        self, t: float, rank: int, index: int, loss: float | None, backward_calls: int, time_s: float, compiles: int
    ) -> bool:
        """A common step (:data:`COMMON_STEP`'s fields given, every other at its default) written
        from its values, without building its :class:`Step`: the same bytes as ``write(Step(...))``
        (the step hook's fast path, docs/performance.md). False, with nothing written, where
        :meth:`write` must take the ``Step``: listeners to call, ``steps.bin`` not open yet (its
        first step) or not used, a value the record cannot hold."""
        steps = self._steps
        if steps is None or self.listeners:
            return False
        fd, encoder = steps
        try:
            record = encoder.encode(
                _common_step_values(self.lines, t, rank, index, loss, backward_calls, time_s, compiles)
            )
        except TypeError:
            return False
        written = os.write(fd, record)  # (_write's first call, inline: one function less, run cold once a step)
        if written < len(record):
            _write(fd, record[written:])
        return True

    def _write_step(self, step: Step) -> bool:
        """``step`` as a record of ``steps.bin``; False when it must be a JSON line instead."""
        if self._steps is None:
            fd = os.open(STEPS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666, dir_fd=self._dir)
            if os.fstat(fd).st_size:  # another writer's stream: its records' state is not ours
                os.close(fd)
                self._compact = False
                return False
            encoder = stepstream.Encoder(_names(Step))
            _write(fd, encoder.header())
            self._steps = (fd, encoder)
            self._steps_pid = os.getpid()  # the process whose records they are (a fork's close adds no seal)
        fd, encoder = self._steps
        try:
            record = encoder.encode([self.lines, *_step_values(step)])
        except TypeError:
            return False
        _write(fd, record)
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._steps is not None:
            fd, encoder = self._steps
            self._steps = None
            try:
                if os.getpid() == self._steps_pid:
                    _write(fd, encoder.seal())  # (the last records are checked as a block is)
            except OSError:
                pass  # (a log that cannot take its seal reads as one whose writer was killed)
            finally:
                os.close(fd)
        if self._dir is not None:
            os.close(self._dir)
            self._dir = None

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(slots=True)
class EventLog:
    """The events of one rank, and what could not be read: ``bad_lines`` skipped (a
    ``truncated`` last line among them), and ``unreadable``, the reason the file is not a log
    this torchrepro can read at all (no header, another schema), or None. ``kept``: what a reader
    that keeps no step events kept of them instead (``analysis.kept_steps.KeptSteps``), or None."""

    path: Path
    events: list[Event] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    unknown_kinds: dict[str, int] = field(default_factory=dict)
    bad_lines: int = 0
    truncated: bool = False
    unreadable: str | None = None
    kept: Any = None
    _by_type: tuple[list[Event], int, dict[type, list[Event]]] | None = field(default=None, repr=False, compare=False)

    @property
    def header(self) -> Header | None:
        return next((e for e in self.events if isinstance(e, Header)), None)

    @property
    def end(self) -> End | None:
        return next((e for e in reversed(self.events) if isinstance(e, End)), None)

    @property
    def damage(self) -> list[str]:
        """The ``problems`` that are damage: all but the note that a step log of an older format
        carries no checks (its records read as written; nothing in them is known to be wrong)."""
        return [p for p in self.problems if not p.endswith(stepstream.UNCHECKED)]

    @property
    def rank(self) -> int:
        header = self.header
        return header.rank if header else _rank_from_dir(self.path.parent.name)

    def of(self, cls: type[E]) -> list[E]:
        """The events of one type, in order (a new list; the reader groups the events by type as it
        reads them, this again when ``events`` changes, so the analyses' many calls cost little).
        The steps of a log read without them (``kept``) are a programming error to ask for."""
        if cls is Step and self.kept is not None:
            raise TypeError(f"{self.path}: read without its step events (kept: {type(self.kept).__name__})")
        if cls not in _LEAF_TYPES:
            return [e for e in self.events if isinstance(e, cls)]
        cached = self._by_type
        if cached is None or cached[0] is not self.events or cached[1] != len(self.events):
            by_type: dict[type, list[Event]] = {}
            for event in self.events:
                kind = type(event)
                if kind in by_type:
                    by_type[kind].append(event)
                else:
                    by_type[kind] = [event]
            cached = self._by_type = (self.events, len(self.events), by_type)
        return cast("list[E]", list(cached[2].get(cls, ())))  # the list under cls holds only cls's events

    def keep_instead_of_steps(self, kept: Any) -> None:
        """Hold ``kept`` (made from this log's step events) instead of the step events."""
        self.events = [e for e in self.events if type(e) is not Step]
        self._by_type = None  # it holds the steps too
        self.kept = kept


def _rank_from_dir(name: str) -> int:
    try:
        return int(name.split("-", 1)[1])
    except (IndexError, ValueError):
        return 0


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading in binary; :class:`InputError` unless it is a regular file: a FIFO
    would block the reader (it is opened non-blocking, then checked), a device would never end.
    ``OSError`` when it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{path}: not a regular file (a FIFO, a device or a directory)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class LineReader:
    """The lines of a binary file (without their newline), read :data:`_CHUNK` bytes at a time, so
    memory holds one chunk and one line at most: a line over ``limit`` bytes comes out as
    :data:`OVERSIZED`, never held whole. ``final`` turns True when the file's last line comes out
    without a newline (a file cut while written)."""

    def __init__(self, fp: BinaryIO, limit: int = MAX_LINE):
        self.fp, self.limit, self.final = fp, limit, False

    def __iter__(self) -> Iterator[bytes]:
        pieces: list[bytes] = []  # the line read so far, when it spans chunks
        size, skipping, limit, read = 0, False, self.limit, self.fp.read
        while chunk := read(_CHUNK):
            lines = chunk.split(b"\n")
            tail = lines.pop()
            if lines:  # the line that spanned chunks ends here
                if skipping:
                    lines[0], skipping = OVERSIZED, False
                elif pieces:
                    size += len(lines[0])
                    lines[0] = OVERSIZED if size > limit else b"".join([*pieces, lines[0]])
                    pieces, size = [], 0
                yield from lines
            if tail and not skipping:
                pieces.append(tail)
                size += len(tail)
                if size > limit:
                    pieces, size, skipping = [], 0, True
        if skipping or pieces:
            self.final = True
            yield OVERSIZED if skipping else b"".join(pieces)


def read_events(
    path: str | os.PathLike[str],
    shared: Shared | None = None,
    reduce: StepReduce | None = None,
) -> EventLog:
    """Read one rank's log, tolerating damage: see the module docstring. ``shared`` (one
    :class:`Shared` for every rank of a run) keeps what repeats across ranks once. ``reduce``:
    the log holds what ``reduce(batches)`` makes of its step events (``EventLog.kept``) instead of
    them: ``batches`` gives their values in log order, a few hundred steps at a time, field by
    field (:func:`step_columns`), each batch as soon as it is read, while it is in the processor's
    caches; a record of ``steps.bin`` then becomes no :class:`Step` (a report over many ranks).

    >>> read_events("run/rank-0/events.jsonl", reduce=lambda batches: sum(len(b[0]) for b in batches)).kept  # doctest: +SKIP
    300
    """
    path = Path(path)
    if reduce is None:
        return _read(path, shared)
    try:
        return _read(path, None, reduce)
    except _ReadWhole:  # the steps read as events, then reduced
        log = _read(path, None)
        log.keep_instead_of_steps(reduce(iter([step_columns(log.of(Step))])))
        return log


class _ReadWhole(Exception):
    """A log whose steps cannot be reduced as they are read: a record with a value of the wrong JSON
    type (damage, found by checking each record alone), or steps in both files (to be put in order)."""


def _read(path: Path, shared: Shared | None, reduce: StepReduce | None = None) -> EventLog:
    """:func:`read_events`; with ``reduce``, the steps reduced as they are read (steps.bin's first),
    :class:`_ReadWhole` where they cannot be."""
    log = EventLog(path)
    stream = path.with_name(STEPS_FILE)
    records: list[tuple[int, Step]] = []  # without reduce
    streamed = 0  # with reduce: the records of steps.bin reduced
    kept = None
    if reduce is None:
        records = _read_steps(log, stream, shared)
        with open_regular(path) as fp:
            for _ in _read_lines(log, LineReader(fp), shared, records):
                pass
    else:
        with _StepRecords(log, stream) as stepped, open_regular(path) as fp:  # (steps.bin opened first, as above)
            steps = chain(stepped, stepped.alone(_read_lines(log, LineReader(fp), None, [], rows=True)))
            kept = reduce(steps)
            for _ in steps:  # what reduce left unread: the lines' events, the damage counted at the end
                pass
        streamed = stepped.count
    if log.bad_lines > 5:
        log.problems.append(f"{path}: {log.bad_lines} unreadable lines skipped in all")
    header = log.header
    if header is None:
        log.unreadable = "no header line: not a torchrepro event log"
        ids = {id(step) for _, step in records}
        if (ids and all(id(e) in ids for e in log.events)) or (streamed and not log.events):
            # a step stream beside a log of no event at all (garbage, not a torchrepro log) means nothing;
            # beside a log that only lost its header line it is that log's steps, read as its lines are
            log.events = []
            log._by_type = None
            kept = None if reduce is None else reduce(iter(()))
    elif header.schema not in READABLE:
        by = f"torchrepro {header.torchrepro_version}" if header.torchrepro_version else "another torchrepro"
        log.unreadable = (
            f"schema {header.schema!r} written by {by}; this is torchrepro {_version()}, which reads {SCHEMA!r}"
        )
        log.events = [header]  # nothing else is trusted: field meanings may have changed
        kept = None if reduce is None else reduce(iter(()))
    log.kept = kept
    if log.unreadable:
        log.problems.append(f"{path}: {log.unreadable}")
    return log


_PIECE = 16 << 10  # what of steps.bin is decoded and reduced at once (a few hundred records)
_BATCH = 256  # step lines reduced at once


class _StepRecords:
    """The step records of ``path`` (``steps.bin``, opened here; none if there is no such file) as
    batches of columns (:func:`step_columns`), decoded :data:`_PIECE` bytes at a time, their
    values' JSON types checked a column at a time (:class:`_ReadWhole` for a wrong one). ``count``:
    the records given so far. Damage is counted in ``log`` as for a line, once all are read."""

    def __init__(self, log: EventLog, path: Path):
        self.log, self.path, self.count = log, path, 0
        try:
            self.fp: BinaryIO | None = open_regular(path)
        except FileNotFoundError:
            self.fp = None

    def __enter__(self) -> _StepRecords:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fp is not None:
            self.fp.close()

    def __iter__(self) -> Iterator[StepColumns]:
        if self.fp is None:
            return
        decoder, types, read = _row_decoder(), _STEP_TYPES, self.fp.read
        while True:
            piece = read(_PIECE)
            records = decoder.feed(piece) if piece else decoder.finish()
            if records:
                self.count += len(records)
                columns = list(zip(*[row for _, row in records]))
                for values, accepted in zip(columns, types):
                    if accepted is not None and not set(map(type, values)) <= accepted:
                        raise _ReadWhole("a step record with a value of the wrong JSON type")
                yield columns
            if not piece:
                break
        _count_damage(self.log, self.path, decoder)

    def alone(self, batches: Iterator[StepColumns]) -> Iterator[StepColumns]:
        """``batches`` (the steps of events.jsonl), which must be none where records were given."""
        for batch in batches:
            if self.count:
                raise _ReadWhole("steps in events.jsonl and in steps.bin")
            yield batch


def step_decoder(shared: Shared | None = None) -> stepstream.Decoder:
    """A decoder of ``steps.bin`` that makes :class:`Step` events (each field's JSON type checked,
    as for a line; a field a step no longer has is ignored, one the stream lacks is its default)."""
    build, from_values = _BUILDERS[Step.kind], _step_from_values
    return stepstream.Decoder(
        lambda fields: build(fields, shared), STEP_FIELDS, lambda values: from_values(values, shared)
    )


def _row_decoder() -> stepstream.Decoder:
    """A decoder of ``steps.bin`` that makes each record a tuple of the step's values
    (:data:`STEP_FIELDS` order): as decoded, their JSON types unchecked (:class:`_StepRecords`
    checks them), where the stream's fields are this torchrepro's; else those of the :class:`Step`
    that :func:`step_decoder` makes."""
    build, row = _BUILDERS[Step.kind], _step_row
    return stepstream.Decoder(lambda fields: row(build(fields)), STEP_FIELDS, tuple)


def _read_steps(log: EventLog, path: Path, shared: Shared | None) -> list[tuple[int, Step]]:
    """The step records of ``path`` (``steps.bin``) as ``(lines before it in events.jsonl, step)``;
    none if there is no such file. Damage is counted in ``log`` as for a line."""
    try:
        fp = open_regular(path)
    except FileNotFoundError:
        return []
    decoder = step_decoder(shared)
    out: list[tuple[int, Step]] = []
    with fp:
        while chunk := fp.read(_CHUNK):
            out += decoder.feed(chunk)
    out += decoder.finish()
    _count_damage(log, path, decoder)
    return out


def _count_damage(log: EventLog, path: Path, decoder: stepstream.Decoder) -> None:
    if decoder.fields and not decoder.checked:
        log.problems.append(f"{path}: {stepstream.UNCHECKED}")
    if decoder.damaged:
        log.bad_lines += decoder.damaged
        log.truncated = decoder.truncated
        log.problems += (f"{path}: {why}" for why in decoder.problems)


def _read_lines(
    log: EventLog, lines: LineReader, shared: Shared | None, records: list[tuple[int, Step]], rows: bool = False
) -> Iterator[StepColumns]:
    """Each line of ``lines`` into ``log`` as it is iterated: its event, or counted as skipped (see
    :func:`read_events`); the step ``records`` of ``steps.bin`` each after the line it follows.
    ``rows``: the step events are not kept in ``log`` but given out, :data:`_BATCH` at a time, as
    columns of their values (:func:`step_columns`)."""
    loads, builders, events = _orjson.loads if _orjson is not None else json.loads, _BUILDERS, log.events
    fast, share_step, step_prefix, row = _decode_step, _share_step, _STEP_PREFIX, _step_row
    by_type: dict[type, list[Event]] = {Step: []}  # the events grouped by type as they are read (EventLog.of)
    steps = by_type[Step]
    given: list[Sequence[Any]] = []  # rows: the steps not given out yet
    decode_error = _msgspec.MsgspecError if _msgspec is not None else ()  # what `fast` raises
    pending = iter(records)
    record = next(pending, None)  # the next record and the line it follows
    for number, raw in enumerate(lines, 1):
        while record is not None and record[0] < number:
            events.append(record[1])
            steps.append(record[1])
            record = next(pending, None)
        if len(given) >= _BATCH:
            yield _columns(given)
            given = []
        if fast is not None and raw.startswith(step_prefix):
            try:  # a step line straight into its event, JSON types checked by msgspec
                step = share_step(fast(raw), shared)
            except decode_error:
                pass  # NaN, a truncated line, other types: the general path below decides
            else:
                if rows:
                    given.append(row(step))
                else:
                    events.append(step)
                    steps.append(step)
                continue
        if not raw.strip():
            continue
        try:
            try:
                data = loads(raw)
            except ValueError:  # orjson refuses NaN and Infinity, which the writer keeps
                data = json.loads(raw)
            if type(data) is not dict:
                raise ValueError("not an object")
            kind = data.pop("kind", "")
            build = builders.get(kind)
            if build is None:
                kind = str(kind)
                log.unknown_kinds[kind] = log.unknown_kinds.get(kind, 0) + 1
                continue
            if kind != "step":  # (steps: their values' JSON types, as the builder checks them)
                check_event(kind, data)
            event = build(data, shared)
            if rows and type(event) is Step:
                given.append(row(event))
                continue
            events.append(event)
            by_type.setdefault(type(event), []).append(event)
        except (ValueError, TypeError, UnicodeDecodeError, RecursionError) as exc:
            log.bad_lines += 1
            log.truncated = lines.final
            if log.bad_lines <= 5:
                what = f"unreadable line {number} ({_why(exc)})"
                if raw is OVERSIZED:
                    what = f"line {number} (over {MAX_LINE >> 20} MiB)"
                elif log.truncated:
                    what = "truncated last line"
                log.problems.append(f"{log.path}: {what} skipped")
    if record is not None:  # records after the last line (events.jsonl cut short, or steps alone)
        rest = [record[1], *(r for _, r in pending)]
        events += rest
        steps += rest
    log._by_type = (events, len(events), by_type)
    if given:
        yield _columns(given)


def _why(exc: BaseException) -> str:
    """What was wrong with a line, in a few words (its first line, at most 200 characters)."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _version() -> str:
    from .. import __version__

    return __version__


def read_header(path: str | os.PathLike[str]) -> Header | None:
    """Only the header (first line) of a rank's log, without reading the rest."""
    try:
        with open_regular(path) as fp:
            event = from_json(loads(fp.readline(MAX_LINE)))
    except (OSError, InputError, ValueError, TypeError, AttributeError):
        return None
    return event if isinstance(event, Header) else None


def rank_logs(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Every ``rank-<r>/events.jsonl`` under a run directory, by rank."""
    found = Path(run_dir).glob(f"rank-*/{EVENTS_FILE}")
    return sorted(found, key=lambda p: _rank_from_dir(p.parent.name))


def write_all(path: str | os.PathLike[str], events: Iterable[Event], compact_steps: bool = True) -> None:
    """Write a whole log at once (used by trace import and tests); ``compact_steps``: as for
    :class:`EventWriter` (False writes a log as torchrepro.events/1 did, every step a line)."""
    with EventWriter(path, compact_steps) as writer:
        for event in events:
            writer.write(event)
