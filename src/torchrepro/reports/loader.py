"""Reading a ``report.json`` back: :func:`report_kind` says which kind a document is and
:func:`load_report` checks it against its kind's schema and gives the typed report, including
reports written before the schemas were per kind (``torchrepro.report/1``).

The reports are data: analysis builds them, :mod:`torchrepro.eventlog.rundir` saves them as
``report.json``, and the renderers (terminal, JUnit, HTML, OpenTelemetry) read them; none of those
computes a verdict or an exit code of its own: both are derived in the report, from its content.
The top level and the sections a verdict rests on (the run and how it ended, steps, findings, the
comparison) are dataclasses; sections only shown are plain JSON objects, typed where their shape is
fixed (the compile details, rank groups, the drift statistics: TypedDicts, dicts at run time) and
``JsonObject`` where it is open (evidence, provenance, a run's settings). Nothing here imports
torch."""

from __future__ import annotations

from typing import Any, Union

from ..errors import InputError
from ..eventlog.jsoncheck import schema_problem
from .check_report import CheckReport
from .compare_report import CompareReport
from .doctor_report import DoctorReport
from .drift_report import DriftReport
from .golden_report import GoldenReport
from .schema import LEGACY_SCHEMA, SCHEMAS, schema_of


Report = Union[DoctorReport, CheckReport, DriftReport, CompareReport, GoldenReport]
_KINDS: dict[
    str, type[DoctorReport] | type[CheckReport] | type[DriftReport] | type[CompareReport] | type[GoldenReport]
] = {
    "doctor": DoctorReport,
    "check": CheckReport,
    "drift": DriftReport,
    "compare": CompareReport,
    "golden": GoldenReport,
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
