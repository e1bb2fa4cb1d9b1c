"""JSON read from a file someone else wrote (a run directory, a stored report, a cache pack's
manifest), checked against its schema and bounds before anything uses it.

A schema is the subset of JSON Schema that the shipped ``*.schema.json`` files (``torchrepro/reports/schemas/``, ``torchrepro/eventlog/schemas/``) use:
``type``, ``properties``, ``required``, ``items``, ``additionalProperties`` (a schema for the
values of keys not in ``properties``), ``propertyNames`` (a ``pattern``), ``$ref`` into ``$defs``, ``enum``, ``const``, ``anyOf``, and
the bounds ``minimum``, ``maximum``, ``minItems``, ``maxItems``, ``maxLength``, ``maxProperties``. Whatever a
schema leaves open is bounded all the same: nested no deeper than :data:`MAX_DEPTH`, integers
within :data:`MAX_INT`. :func:`loads` parses without ever raising anything but ``ValueError``
(``RecursionError`` of a deeply nested document included). Nothing here imports torch.

>>> print(schema_problem({"world_size": 2**70}, {"properties": {"world_size": {"type": "integer", "maximum": 2**31}}}))
field 'world_size' is 1180591620717411303424, above its maximum 2147483648
"""

from __future__ import annotations

import json
import re
from typing import Any

from .payloads import JsonObject

MAX_DEPTH = 64  # nesting of any JSON value read back (torchrepro writes at most ~8)
MAX_INT = 2**63  # |an integer| read back: a 64-bit value (a larger one is damage, never a count or a rank)
MAX_RANK = 2**31  # ranks and world sizes (torch.distributed's are 32-bit)

_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}

_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number", bool: "a boolean"}


def python_types(names: list[str]) -> tuple[type, ...]:
    """The Python types of JSON Schema ``type`` names, null left out: ``["number", "null"]`` -> ``(int, float)``."""
    out: list[type] = []
    for name in names:
        kind = _JSON_TYPES[name]
        out += [k for k in (kind if isinstance(kind, tuple) else (kind,)) if k is not type(None)]
    return tuple(out)


def type_names(accepted: tuple[type, ...]) -> str:
    """``an integer or null``: the JSON types of ``accepted`` (Python types), in words."""
    return " or ".join(dict.fromkeys("null" if t is type(None) else _NAMES.get(t, "a value") for t in accepted))


def json_type(value: object) -> str:
    """``an integer``, ``a string``... : what a value read from JSON is, in words."""
    return "null" if value is None else _NAMES.get(type(value), "a value")


def loads(data: str | bytes) -> Any:
    """``json.loads``, whose only error is ``ValueError`` (a document nested too deeply for the
    parser is one too)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep") from None


def bounded(value: object, depth: int = 0) -> str | None:
    """Where ``value`` (any JSON value) breaks the bounds every value read back keeps (nesting
    depth, integer size), or None."""
    if depth > MAX_DEPTH:
        return f"nested more than {MAX_DEPTH} levels deep"
    kind = type(value)
    if kind is int:
        return None if -MAX_INT < value < MAX_INT else f"integer {_short(value)} out of range"  # type: ignore[operator]
    if kind is dict:
        for item in value.values():  # type: ignore[attr-defined]
            if type(item) in (dict, list, int) and (problem := bounded(item, depth + 1)):
                return problem
    elif kind is list:
        for item in value:  # type: ignore[attr-defined]
            if type(item) in (dict, list, int) and (problem := bounded(item, depth + 1)):
                return problem
    return None


def _short(value: object) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, int) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def schema_problem(data: Any, schema: JsonObject, root: JsonObject | None = None, where: str = "") -> str | None:
    """The first place ``data`` breaks ``schema`` (``root``: where its ``$ref`` point; ``schema``
    itself by default), as ``field 'a.b' is ...``, or None (see the module docstring)."""
    return _problem(data, schema, schema if root is None else root, where, 0)


def _problem(data: Any, schema: JsonObject, root: JsonObject, where: str, depth: int) -> str | None:
    if depth > MAX_DEPTH:
        return f"field {where!r} is nested more than {MAX_DEPTH} levels deep"
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rpartition("/")[2]]
    name = f"field {where!r}" if where else "the document"
    if "anyOf" in schema and all(_problem(data, s, root, where, depth) for s in schema["anyOf"]):
        return f"{name} matches none of its allowed forms"
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        fits = any(isinstance(data, _JSON_TYPES[n]) for n in names)
        if not fits or (isinstance(data, bool) and "boolean" not in names):
            return f"{name} is {type(data).__name__} {_short(data)}, not {' or '.join(names)}"
    if ("enum" in schema and data not in schema["enum"]) or ("const" in schema and data != schema["const"]):
        return f"{name} is {_short(data)}, not one of {schema.get('enum', [schema.get('const')])}"
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        if "minimum" in schema and not data >= schema["minimum"]:
            return f"{name} is {_short(data)}, below its minimum {schema['minimum']}"
        if "maximum" in schema and not data <= schema["maximum"]:
            return f"{name} is {_short(data)}, above its maximum {schema['maximum']}"
        if type(data) is int and not -MAX_INT < data < MAX_INT:
            return f"{name} is {_short(data)}, an integer out of range"
    elif isinstance(data, str):
        if len(data) > schema.get("maxLength", len(data)):
            return f"{name} is a string of {len(data)} characters, over its limit of {schema['maxLength']}"
    elif isinstance(data, dict):
        if len(data) > schema.get("maxProperties", len(data)):
            return f"{name} has {len(data)} keys, over its limit of {schema['maxProperties']}"
        if missing := [k for k in schema.get("required", ()) if k not in data]:
            return f"{name} lacks {missing[0]!r}"
        if (pattern := schema.get("propertyNames", {}).get("pattern")) is not None:
            if bad := next((k for k in data if not re.fullmatch(pattern, k)), None):
                return f"{name} has the key {_short(bad)}, not one matching {pattern}"
        properties, rest = schema.get("properties", {}), schema.get("additionalProperties")
        for key, value in data.items():
            sub = properties.get(key, rest if isinstance(rest, dict) else None)
            path = f"{where}.{key}".lstrip(".")
            if sub is not None:
                if problem := _problem(value, sub, root, path, depth + 1):
                    return problem
            elif type(value) in (dict, list, int) and (problem := bounded(value, depth + 1)):
                return f"field {path!r}: {problem}"
    elif isinstance(data, list):
        if len(data) > schema.get("maxItems", len(data)):
            return f"{name} has {len(data)} items, over its limit of {schema['maxItems']}"
        if len(data) < schema.get("minItems", 0):
            return f"{name} has {len(data)} items, fewer than its {schema['minItems']}"
        items = schema.get("items")
        for i, item in enumerate(data):
            if items is not None:
                if problem := _problem(item, items, root, f"{where}[{i}]", depth + 1):
                    return problem
            elif type(item) in (dict, list, int) and (problem := bounded(item, depth + 1)):
                return f"field '{where}[{i}]': {problem}"
    return None
