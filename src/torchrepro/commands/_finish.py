"""What a command hands back when it produced a report, and the one place reports are finished:
written where ``--json``/``--junit``/``--html`` say, put on the telemetry span, rendered, and
turned into the exit code (which the typed report derives itself)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError
from ..telemetry.otlp import record_report

if TYPE_CHECKING:  # imported once there is a report: a rank's `torchrepro run` hands back an int
    from ..reports.loader import Report


@dataclass(frozen=True)
class Outcome:
    """A report a command produced and the directory it was stored in (None: not stored)."""

    report: Report
    stored_in: Path | None = None


def finish(outcome: Outcome | int, args: argparse.Namespace) -> int:
    """A command's exit code; for a report, after writing, recording and rendering it."""
    if isinstance(outcome, int):
        return outcome
    from ..reports.check_report import CheckReport
    from ..reports.compare_report import CompareReport
    from ..reports.drift_report import DriftReport
    from ..reports.golden_report import GoldenReport

    report, where = outcome.report, outcome.stored_in
    _write_outputs(report, args)
    if isinstance(report, DriftReport):
        from ..render.drift_text import render_drift
        from ..eventlog.rundir import HTML_FILE, REPORT_FILE

        assert where is not None, "a drift report is always stored in its experiment's directory"
        render_drift(report, report_path=f"{where / REPORT_FILE} · {where / HTML_FILE}")
        return report.exit_code
    shown = _report_paths(where) if where else (getattr(args, "html", None) or getattr(args, "json", None))
    if isinstance(report, GoldenReport):
        from ..render.golden_text import render_golden

        render_golden(report, report_path=shown)
    elif isinstance(report, CompareReport):
        from ..render.terminal import render_compare

        render_compare(report, report_path=shown)
    elif isinstance(report, CheckReport):
        from ..render.terminal import render_check

        render_check(report, report_path=shown)
    else:
        from ..render.terminal import render_doctor

        render_doctor(report, report_path=shown)
    return report.exit_code


def _write_outputs(report: Report, args: argparse.Namespace) -> None:
    """``--json FILE``, ``--junit FILE``, ``--html FILE`` (:mod:`.outputs`: never onto an input; an
    existing file only with ``--force``, or a torchrepro page for ``--html``), and the report's
    verdict on the command's span."""
    from ..eventlog.rundir import json_text
    from ..reports.doctor_report import DoctorReport
    from .outputs import write_args

    if getattr(args, "junit", None) and not isinstance(report, DoctorReport):  # before any file is written
        raise UserError(f"--junit is written for doctor reports, not for a {report.to_json().get('kind')} report")
    if getattr(args, "json", None):
        write_args(args, args.json, json_text(report.to_json()).encode())
    if getattr(args, "junit", None) and isinstance(report, DoctorReport):
        from ..render.junit import junit_xml

        write_args(args, args.junit, junit_xml(report))
    if getattr(args, "html", None):
        from ..render.html import render_html

        write_args(args, args.html, render_html(report).encode())
    record_report(report)


def _report_paths(directory: Path) -> str:
    """Where the report went: ``report.json`` and, when it was written, ``report.html``."""
    from ..eventlog.rundir import HTML_FILE, REPORT_FILE

    written = [str(directory / name) for name in (REPORT_FILE, HTML_FILE) if (directory / name).exists()]
    return ", ".join(written) or str(directory / REPORT_FILE)
