"""``torchrepro diff RUN_A RUN_B``: compare two stored runs."""

from __future__ import annotations

import argparse
from typing import Any

from .. import options
from .._finish import Outcome


def add_parser(sub: Any) -> None:
    """Register ``diff``."""
    p = sub.add_parser("diff", help="compare two stored runs")
    p.add_argument("run_a", metavar="RUN_A", help="the first run directory (torchrepro run --out, or a check's run)")
    p.add_argument("run_b", metavar="RUN_B", help="the run directory compared with RUN_A")
    options.add_outputs(p, html=True)
    options.add_tolerance(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> Outcome:
    """Where the two runs diverge, and why."""
    from ..api import diff

    return Outcome(diff(args.run_a, args.run_b, rtol=args.rtol, atol=args.atol))
