"""The schema ids of ``report.json`` documents and the JSON Schema of each report kind, shipped
in ``torchrepro/reports/schemas/<kind>.schema.json``."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from ..eventlog.payloads import JsonObject


LEGACY_SCHEMA = "torchrepro.report/1"  # shared by every kind before the schemas were split (still read)
SCHEMAS = {
    "doctor": "torchrepro.doctor/1",
    "check": "torchrepro.check/1",
    "drift": "torchrepro.drift/1",
    "compare": "torchrepro.compare/1",
    "golden": "torchrepro.golden/1",
}


@functools.lru_cache(maxsize=None)
def schema_of(kind: str) -> JsonObject:
    """The JSON Schema of ``kind``'s ``report.json``, parsed (once)."""
    schema: JsonObject = json.loads(schema_path(kind).read_text())
    return schema


def schema_path(kind: str) -> Path:
    """The JSON Schema of ``kind``'s ``report.json`` (shipped in the package)."""
    return Path(__file__).resolve().parent / "schemas" / f"{kind}.schema.json"
