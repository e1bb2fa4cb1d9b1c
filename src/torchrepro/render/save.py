"""The one place reports are saved: ``report.json`` and, beside it, ``report.html``."""

from __future__ import annotations

import sys
from pathlib import Path

from ..eventlog.rundir import HTML_FILE, REPORT_FILE, disk_use, size_text, write_json
from .html import write_html
from .paths import stored
from ..reports.loader import Report


def write_report(directory: Path, report: Report) -> None:
    """Write ``report.json`` and ``report.html`` into ``directory`` (atomically, each), the end of
    a run (doctor, check, drift), with paths as :func:`~torchrepro.render.paths.stored` writes them:
    then say on stderr what the run directory holds on disk, so a log that grows more than it
    should is seen (docs/evidence/performance.md, "The event log on disk")."""
    shown = stored(report)
    write_json(directory / REPORT_FILE, shown.to_json())
    write_html(shown, directory / HTML_FILE)
    total, logs = disk_use(directory)
    print(
        f"torchrepro: {directory} holds {size_text(total)} ({size_text(logs)} of event logs)",
        file=sys.stderr,
        flush=True,
    )
