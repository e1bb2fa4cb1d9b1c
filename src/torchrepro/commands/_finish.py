"""What a command hands back when it produced a report, and the one place reports are finished:
written where ``--json``/``--junit``/``--html`` say, put on the telemetry span, rendered, and
turned into the exit code (which the typed report derives itself)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..telemetry.otlp import record_report
from ..render.paths import display_path

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
        render_drift(report, report_path=" · ".join(display_path(where / name) for name in (REPORT_FILE, HTML_FILE)))
        return report.exit_code
    shown = _report_paths(where) if where else _written_to(args)
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
    existing file only with ``--force``, or a torchrepro page for ``--html``; ``-``: stdout, written
    after every file), with paths as reports store them (:func:`~torchrepro.render.paths.stored`),
    and the report's verdict on the command's span."""
    from ..render.paths import stored
    from .options import STDOUT
    from .outputs import OUTPUT_ARGS, write_args

    shown = stored(report)
    wanted = [(name, path) for name in OUTPUT_ARGS if isinstance(path := getattr(args, name, None), str) and path]
    for name, path in sorted(wanted, key=lambda item: item[1] == STDOUT):  # stdout last, after every file
        write_args(args, path, _document(name, shown))
    record_report(report)


def _document(name: str, report: Report) -> bytes:
    """The ``--json``, ``--junit`` or ``--html`` document of ``report``."""
    if name == "junit":
        from ..render.junit import junit_xml

        return junit_xml(report)
    if name == "html":
        from ..render.html import render_html

        return render_html(report).encode()
    from ..eventlog.rundir import json_text

    return json_text(report.to_json()).encode()


def _written_to(args: argparse.Namespace) -> str | None:
    """The file the command wrote the report to (``--html``, else ``--json``; not stdout)."""
    from .options import STDOUT

    written = (v for v in (getattr(args, "html", None), getattr(args, "json", None)) if v and v != STDOUT)
    return next((display_path(v) for v in written), None)


def _report_paths(directory: Path) -> str:
    """Where the report went: ``report.json`` and, when it was written, ``report.html``."""
    from ..eventlog.rundir import HTML_FILE, REPORT_FILE

    written = [display_path(directory / name) for name in (REPORT_FILE, HTML_FILE) if (directory / name).exists()]
    return ", ".join(written) or display_path(directory / REPORT_FILE)
