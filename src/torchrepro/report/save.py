"""The one place reports are saved: ``report.json`` and, beside it, ``report.html``."""

from __future__ import annotations

from pathlib import Path

from ..eventlog.rundir import HTML_FILE, REPORT_FILE, write_json
from .html import write_html
from .model import Report


def write_report(directory: Path, report: Report) -> None:
    """Write ``report.json`` and ``report.html`` into ``directory`` (atomically, each)."""
    write_json(directory / REPORT_FILE, report.to_json())
    write_html(report, directory / HTML_FILE)
