"""``torchrepro report RUN_DIR``: re-render a stored run (a drift experiment: its stored report)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from . import options
from ..telemetry.otlp import export_stored_run
from ._finish import Outcome


def add_parser(sub: Any) -> None:
    """Register ``report``."""
    p = sub.add_parser("report", help="re-render a stored run")
    p.add_argument("run_dir", metavar="RUN_DIR")
    options.add_outputs(p, junit=True)
    options.add_strict(p)
    options.add_html(p)
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
    from .drift import stored_report

    run_dir = Path(args.run_dir)
    if (drift := stored_report(run_dir, args)) is not None:  # a drift experiment: its stored report
        return drift
    report = analyse_run_dir(run_dir, Budgets(strict=args.strict), store=False, jobs=args.jobs)
    export_stored_run(run_dir)
    return Outcome(report)
