"""How events become bytes and bytes events: JSON lines through orjson or json (msgspec reads step
lines where installed), each kind's builder compiled from its dataclass's fields (the reader's hot
path: exact JSON types checked in line, anything else through the checked path), a step's values
in field order for ``steps.bin``'s records (:mod:`.stepstream`), and what repeats across the ranks
of a run kept once (:class:`Shared`). The contract these follow is :mod:`.events`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from types import ModuleType
from typing import Any

from . import stepstream
from .events import FIELD_TYPES, KINDS, STEP_FIELDS, Event, Step, check_event, field_names
from .jsoncheck import json_type, type_names
from .payloads import JsonObject

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

json_loads: Callable[[bytes], Any] = _orjson.loads if _orjson is not None else json.loads  # a line's JSON
DECODE_ERRORS = _msgspec.MsgspecError if _msgspec is not None else ()  # what decode_step_line raises


def _exact(accepted: tuple[type, ...]) -> frozenset[type] | None:
    """The exact types of the values a field accepting ``accepted`` takes (json gives exact types;
    bool is an int to isinstance); None when it takes any."""
    return None if object in accepted else frozenset(accepted + ((bool,) if int in accepted else ()))


def from_json(data: JsonObject) -> Event | None:
    """The event a JSON object describes; unknown fields are ignored, unknown kinds give None, a
    field of the wrong JSON type raises ``TypeError``, one that breaks its kind's schema or bounds
    ``ValueError`` (:func:`check_event`; the reader skips that line)."""
    kind = data.pop("kind", "")
    build = BUILDERS.get(kind)
    if build is None:
        data["kind"] = kind
        return None
    check_event(kind, data)
    return build(data)


def _checked(kind: str, data: JsonObject) -> Event:
    """The event of ``kind`` from ``data``, every field's JSON type checked one by one (lines with
    missing, extra or mistyped fields; the builders take this path for them)."""
    types = FIELD_TYPES[kind]
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
    names = field_names(cls)
    scope: dict[str, Any] = {"_cls": cls, "_names": names, "_checked": _checked, "_kind": kind}
    checks, types = [], []
    for i, name in enumerate(names):
        exact = _exact(FIELD_TYPES[kind][name])
        if exact is not None:
            scope[f"_T{i}"] = exact
            checks.append(f"_type({name}) not in _T{i}")
            types.append(f"_T{i}=_T{i}")
    data = "dict(zip(_names, data))" if positional else "data"
    slow = f"        return {f'share_step(_checked(_kind, {data}), shared)' if cls is Step else f'_checked(_kind, {data})'}"
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
        scope["share_step"] = share_step
        made = f"share_step({made}, shared)"
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


STEP_PREFIX = b'{"kind":"step",'  # how the writer starts every step line
share_step = _step_sharer()
BUILDERS = {kind: _builder(kind, cls) for kind, cls in KINDS.items()}
step_from_values = _builder(Step.kind, Step, positional=True)
decode_step_line = _msgspec.json.Decoder(Step).decode if _msgspec is not None else None
step_row = attrgetter(*STEP_FIELDS)  # a Step's values in STEP_FIELDS order (a tuple)
STEP_TYPES = tuple(_exact(FIELD_TYPES[Step.kind][name]) for name in STEP_FIELDS)


def encode_line(event: Event) -> bytes:
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
    fields = ", ".join(f'"{name}": e.{name}' for name in field_names(Step))
    source = f'def step_line(e):\n    return _dumps({{"kind": "step", {fields}}}, default=str, option=_NEWLINE)'
    scope: dict[str, Any] = {"_dumps": _orjson.dumps, "_NEWLINE": _orjson.OPT_APPEND_NEWLINE}
    exec(source, scope)  # noqa: S102 -- source built above from Step's own field names
    step_line: Callable[[Step], bytes] = scope["step_line"]
    return step_line


_step_line = _step_line_writer()


def _finite(v: Any) -> bool:
    """None, an int, or a finite float: what orjson writes as json would."""
    return v is None or type(v) is float and math.isfinite(v) or type(v) is int


def _step_getter() -> Callable[[Step], tuple[Any, ...]]:
    """A Step's field values in order, compiled for its fields (the writer's hot path)."""
    scope: dict[str, Any] = {}
    source = f"def values(e):\n    return ({''.join(f'e.{name}, ' for name in field_names(Step))})"
    exec(source, scope)  # noqa: S102 -- source built above from Step's own field names
    values: Callable[[Step], tuple[Any, ...]] = scope["values"]
    return values


step_values = _step_getter()

# The fields a common step gives (``EventWriter.write_step``): ``step`` is ``index``, every other field
# is at its default (no digests, one backward() or none, no gradient norm).
COMMON_STEP = ("t", "rank", "index", "loss", "backward_calls", "time_s", "compiles")


def _common_step_getter() -> Callable[..., tuple[Any, ...]]:
    """A step record's values (``_lines`` first) from :data:`COMMON_STEP`'s, each other field at its
    default: what ``step_values`` gives for the ``Step`` built from them, without building it."""
    given = {**{name: name for name in COMMON_STEP}, "step": "index"}
    defaults = {f.name: f.default for f in dataclasses.fields(Step) if f.name not in given}
    assert all(type(d) in (type(None), int) for d in defaults.values()), defaults  # written out as literals
    values = "".join(f"{given.get(name, repr(defaults.get(name)))}, " for name in field_names(Step))
    source = f"def values(lines, {', '.join(COMMON_STEP)}):\n    return (lines, {values})"
    scope: dict[str, Any] = {}
    exec(source, scope)  # noqa: S102 -- source built above from Step's own field names and literal defaults
    common: Callable[..., tuple[Any, ...]] = scope["values"]
    return common


common_step_values = _common_step_getter()


def step_decoder(shared: Shared | None = None) -> stepstream.Decoder:
    """A decoder of ``steps.bin`` that makes :class:`Step` events (each field's JSON type checked,
    as for a line; a field a step no longer has is ignored, one the stream lacks is its default)."""
    build, from_values = BUILDERS[Step.kind], step_from_values
    return stepstream.Decoder(
        lambda fields: build(fields, shared), STEP_FIELDS, lambda values: from_values(values, shared)
    )


def row_decoder() -> stepstream.Decoder:
    """A decoder of ``steps.bin`` that makes each record a tuple of the step's values
    (:data:`STEP_FIELDS` order): as decoded, their JSON types unchecked (:class:`_StepRecords`
    checks them), where the stream's fields are this torchrepro's; else those of the :class:`Step`
    that :func:`step_decoder` makes."""
    build, row = BUILDERS[Step.kind], step_row
    return stepstream.Decoder(lambda fields: row(build(fields)), STEP_FIELDS, tuple)
