"""`torchrepro watch RUN_DIR`: a live view of a run being written (here, or on a shared
filesystem by a cluster job).

The view (drawn by :mod:`torchrepro.render.live_text`): steps/s per rank, the ranks that lag, compiles
and recompiles so far by category, the latest graph break with its line, findings as they appear.
New rank directories are picked up as they appear; the view ends when the run ends. ``--once
--json FILE`` writes one snapshot (``-``, or ``--json`` alone: on stdout).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from . import options
from ..errors import InputError
from ..render.live_text import FollowedRun, render


def add_parser(sub: Any) -> None:
    """Register ``torchrepro watch``."""
    p = sub.add_parser("watch", help="live view of a run being written: steps/s, lagging ranks, recompiles")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory to follow (doctor --out, run --out)")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    options.add_json_output(p, "with --once: write the snapshot as JSON here")
    p.add_argument(
        "--interval",
        type=options.positive_float,
        default=1.0,
        metavar="S",
        help="seconds between refreshes (default 1)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Follow RUN_DIR until its run ends (or print one snapshot with ``--once``)."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise InputError(f"no such run directory: {run_dir}")
    if args.json and not args.once:
        raise InputError("--json needs --once (a live view is for a terminal)")
    from rich.live import Live

    from ..render.console import console

    followed = FollowedRun(run_dir)
    followed.poll()
    if args.once:
        snap = followed.snapshot()
        if args.json:
            from .outputs import write_args

            write_args(args, args.json, (json.dumps(snap, indent=2) + "\n").encode())
        else:
            console().print(render(snap))
        return 0
    with Live(render(followed.snapshot()), console=console(), refresh_per_second=4, transient=False) as live:
        while not followed.finished:
            time.sleep(args.interval)
            followed.poll()
            live.update(render(followed.snapshot()))
    return 0
