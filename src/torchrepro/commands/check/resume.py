"""``torchrepro check-resume``: stop after step K, resume in a fresh process: bit-exact?"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import options
from .._finish import Outcome


def add_parser(sub: Any) -> None:
    """Register ``check-resume``."""
    p = sub.add_parser("check-resume", help="stop after step K, resume in a fresh process: bit-exact?")
    p.add_argument(
        "--at", type=options.positive_int, required=True, metavar="K", help="stop after step K and resume from there"
    )
    p.add_argument("--seed", type=options.seed, help="seed everything (and PYTHONHASHSEED) from this root in every run")
    p.add_argument("--out", type=options.directory, metavar="DIR", help="where the runs, checkpoint and report go")
    options.add_outputs(p)
    options.add_ranks(p)
    options.add_otlp_option(p)
    options.add_script(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> Outcome:
    """Run to the end, stop after ``--at`` with a checkpoint, resume, compare."""
    from ...eventlog.rundir import default_run_dir
    from ..api import cache_of, check_resume

    out = Path(args.out) if args.out else default_run_dir(args.script, label="resume")
    report = check_resume(
        args.script,
        args.args,
        at=args.at,
        seed=args.seed,
        out=out,
        nproc=args.nproc,
        timeout=args.timeout,
        cache=cache_of(args),
        module=args.module,
    )
    return Outcome(report, out)
