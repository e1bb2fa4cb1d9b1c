"""``torchrepro report RUN_DIR``: a doctor run analysed again from its events; a check, check-resume,
diff or drift directory: its stored report re-rendered (typed reports are rendered, never recomputed:
the comparison they hold needed the runs as they were launched)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from . import options
from ..errors import InputError
from ..telemetry.otlp import export_stored_run
from ._finish import Outcome


def add_parser(sub: Any) -> None:
    """Register ``report``."""
    p = sub.add_parser("report", help="re-render a stored run")
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="a run directory (doctor: analysed again from its event logs), or a check, compare, diff or drift "
        "directory (its stored report)",
    )
    options.add_outputs(p, html=True)
    options.add_strict(p)
    options.add_otlp_option(p)
    p.add_argument(
        "--jobs",
        type=options.positive_int,
        default=None,
        metavar="J",
        help="processes reading the rank logs (default: one per core for logs over 128 MB, else 1)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> Outcome:
    """The stored run analysed again (nothing is written into it)."""
    from ..analysis.doctor import Budgets
    from .doctor.job import analyse_run_dir

    run_dir = Path(args.run_dir)
    if (stored := stored_report(run_dir, args)) is not None:
        return stored
    report = analyse_run_dir(run_dir, Budgets(strict=args.strict), store=False, jobs=args.jobs)
    export_stored_run(run_dir)
    return Outcome(report)


def stored_report(directory: Path, args: argparse.Namespace) -> Outcome | None:
    """A check, check-resume, diff or drift directory's stored report, to re-render (the terminal view,
    ``--html``/``--json``: nothing is written into the stored directory); None for a doctor run (its
    ``run.json`` beside the report: analysed again from its events) or a directory with no report."""
    from ..eventlog.rundir import REPORT_FILE, RUN_FILE, read_json_file
    from ..reports.loader import load_report, report_kind

    if (directory / RUN_FILE).exists() or not (directory / REPORT_FILE).exists():
        return None
    try:
        data = read_json_file(directory / REPORT_FILE)
    except OSError as exc:
        raise InputError(f"{directory / REPORT_FILE}: unreadable ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise InputError(f"{directory / REPORT_FILE}: not JSON ({exc})") from None
    kind = report_kind(data)
    if kind in (None, "doctor"):
        return None
    return Outcome(load_report(data, str(directory / REPORT_FILE)), directory)
