"""``torchrepro check``: is it reproducible? Run K times (or against eager) and explain."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import options
from ...runtime.run_options import PROBE_REPEATS
from .._finish import Outcome


def add_parser(sub: Any) -> None:
    """Register ``check``."""
    p = sub.add_parser("check", help="is it reproducible? run K times (or against eager) and explain")
    p.add_argument("--runs", type=options.runs, metavar="K", help="runs of the script as written (default 2)")
    p.add_argument("--seed", type=options.seed, help="seed everything (and PYTHONHASHSEED) from this root in every run")
    p.add_argument(
        "--against",
        choices=("eager", "fallback-random"),
        help="compare with compilation disabled, or with inductor's fallback_random=True",
    )
    p.add_argument(
        "--out",
        type=options.directory,
        metavar="DIR",
        help="where the runs and report go (default torchrepro-runs/...)",
    )
    options.add_outputs(p)
    p.add_argument("--no-localize", action="store_true", help="skip the op-level replay of the divergent step")
    p.add_argument(
        "--fixes",
        action="store_true",
        help="after any divergence, try the candidate fixes (default: when the cause is one a fix can address)",
    )
    p.add_argument(
        "--only-fixes",
        metavar="NAMES",
        help="try only these fixes (comma list of threads_1, deterministic, fallback_random, aot_eager, eager)",
    )
    p.add_argument("--no-fixes", action="store_true", help="do not run the fix ladder")
    p.add_argument(
        "--probe-repeats",
        type=options.count,
        default=PROBE_REPEATS,
        metavar="K",
        help=f"in every run, call each compiled graph K more times on copies of its first call's inputs and "
        f"compare bit for bit, up to 8K where it adds atomically at several threads (default {PROBE_REPEATS}; 0: off)",
    )
    p.add_argument(
        "--disk-budget",
        type=options.size,
        metavar="SIZE",
        help="disk the runs need, e.g. 20G, in place of the estimate the free space is checked against "
        "(two parameter copies a run, 1 MB a snapshot step)",
    )
    options.add_ranks(p)
    options.add_otlp_option(p)
    options.add_tolerance(p)
    options.add_script(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> Outcome:
    """Run the script K times (or against a reference), compare and explain."""
    from ...eventlog.rundir import default_run_dir
    from ..api import cache_of, check

    out = Path(args.out) if args.out else default_run_dir(args.script, label="check")
    report = check(
        args.script,
        args.args,
        runs=args.runs,
        against=args.against,
        seed=args.seed,
        out=out,
        nproc=args.nproc,
        timeout=args.timeout,
        rtol=args.rtol,
        atol=args.atol,
        localize=not args.no_localize,
        fixes=False if args.no_fixes else (True if args.fixes else None),
        only_fixes=args.only_fixes,
        probe_repeats=args.probe_repeats,
        disk_budget=args.disk_budget,
        cache=cache_of(args),
        module=args.module,
    )
    return Outcome(report, out)
