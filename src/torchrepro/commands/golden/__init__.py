"""``torchrepro golden``: golden runs. ``golden record SCRIPT [ARGS] --out DIR`` keeps a run as the
reference (:mod:`.record`); ``golden check DIR SCRIPT [ARGS]`` runs the script again and judges the
new run against it: BIT-EXACT, WITHIN BAND, DIVERGED or NOT COMPARABLE (:mod:`.verify`; docs/golden.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import options
from .._finish import Outcome

_EPILOG = (
    "Exit codes: 0 recorded, or BIT-EXACT / WITHIN BAND; 1 DIVERGED or NOT COMPARABLE; 2 usage or input error "
    "(a damaged golden directory included); 3 the script failed"
)


def add_parser(sub: Any) -> None:
    """Register ``torchrepro golden`` and its sub-commands ``record`` and ``check``."""
    golden = sub.add_parser(
        "golden",
        help="golden runs: keep a run as the reference, judge a new run against it",
        description="Golden runs: record a run of a script as the reference (fingerprints of every step, losses, "
        "gradient norms, the environment), then judge new runs against it, bit for bit or within its run-to-run band.",
        epilog=_EPILOG,
    )
    commands = golden.add_subparsers(
        dest="golden_command",
        required=True,
        metavar="SUBCOMMAND",
        help="record a golden run, or check a run against one",
    )

    record = commands.add_parser("record", help="run the script and keep the run as a golden directory", epilog=_EPILOG)
    record.add_argument("--out", type=options.directory, required=True, metavar="DIR", help="the golden directory")
    record.add_argument(
        "--band",
        action="store_true",
        help="run twice and keep both: the run-to-run band a later run that is not bit for bit is held to",
    )
    record.add_argument(
        "--snapshot-budget",
        type=options.size,
        metavar="SIZE",
        help="keep parameter snapshots up to SIZE (e.g. 2M; default none: the fingerprints decide bit for bit)",
    )
    record.add_argument("--seed", type=options.seed, help="seed everything from this root (golden check uses it too)")
    record.add_argument("--force", action="store_true", help="replace DIR if it holds a golden run")
    options.add_ranks(record)
    options.add_script(record)
    record.set_defaults(func=_record)

    check = commands.add_parser(
        "check", help="run the script again and judge the run against a golden directory", epilog=_EPILOG
    )
    check.add_argument("golden", metavar="GOLDEN", help="the golden directory (golden record --out)")
    check.add_argument("--out", type=options.directory, metavar="RUN_DIR", help="where the new run and report go")
    check.add_argument("--no-localize", action="store_true", help="skip the op-level replay of a divergent step")
    options.add_outputs(check, html=True)
    options.add_ranks(check)
    check.set_defaults(nproc=None)  # the golden's own number of ranks
    options.add_script(check)
    check.set_defaults(func=_check)


def run(args: argparse.Namespace) -> Outcome | int:
    """Run the golden sub-command the arguments name."""
    result: Outcome | int = args.func(args)
    return result


def _record(args: argparse.Namespace) -> int:
    from ...render.golden_text import recorded_line
    from ..api import cache_of, record_golden

    manifest = record_golden(
        args.script,
        args.args,
        out=args.out,
        band=args.band,
        seed=args.seed,
        nproc=args.nproc,
        timeout=args.timeout,
        snapshot_budget=args.snapshot_budget or 0,
        force=args.force,
        cache=cache_of(args),
        module=args.module,
    )
    print(recorded_line(manifest, args.out))
    return 0


def _check(args: argparse.Namespace) -> Outcome:
    from ..api import cache_of, check_golden

    report = check_golden(
        args.golden,
        args.script,
        args.args,
        out=args.out,
        nproc=args.nproc,
        timeout=args.timeout,
        localize=not args.no_localize,
        cache=cache_of(args),
        module=args.module,
    )
    return Outcome(report, Path(report.run_dir) if report.run_dir else None)
