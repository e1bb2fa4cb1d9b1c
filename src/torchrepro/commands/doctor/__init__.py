"""``torchrepro doctor``: compile health of a real run (recompiles, graph breaks, caches), or of
``TORCH_TRACE`` logs a job wrote without torchrepro."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import options
from ...errors import Stopped, UserError
from ...runtime.run_options import PROBE_REPEATS, RunOptions
from .._finish import Outcome
from ...analysis.compile_fixes import COMPILE_FIXES

if TYPE_CHECKING:
    from ...reports.doctor_report import DoctorReport


def _fix_names(value: str) -> list[str]:
    """``--only-fixes dynamic_shapes,recompile_limit`` → those names (checked)."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in COMPILE_FIXES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown fix {', '.join(unknown) or repr(value)} (choose from {', '.join(COMPILE_FIXES)})"
        )
    return names


def add_parser(sub: Any) -> None:
    """Register ``doctor``."""
    p = sub.add_parser("doctor", help="compile health of a real run: recompiles, graph breaks, caches")
    p.add_argument(
        "--out",
        type=options.directory,
        metavar="RUN_DIR",
        help="run directory (default torchrepro-runs/<time>-<script>)",
    )
    options.add_outputs(p)
    p.add_argument("--max-graph-breaks", type=options.count, metavar="N", help="fail (exit 1) above N graph breaks")
    p.add_argument("--max-recompiles", type=options.count, metavar="N", help="fail (exit 1) above N recompiles")
    p.add_argument("--min-cache-hit-rate", type=options.fraction, metavar="F", help="fail (exit 1) below this hit rate")
    p.add_argument("--seed", type=options.seed, help="seed everything from this root before the script starts")
    p.add_argument(
        "--fingerprint-every",
        type=options.positive_int,
        metavar="N",
        help="fingerprint parameters every N steps (default: every step if that costs < 1%%)",
    )
    p.add_argument("--trace", metavar="DIR", help="build the report from TORCH_TRACE logs instead of a run")
    p.add_argument(
        "--fixes",
        action="store_true",
        help="re-run the script once per mechanical compile fix (applied from outside it) and measure each; "
        "the same command on the same --out goes on where it stopped",
    )
    p.add_argument(
        "--only-fixes",
        type=_fix_names,
        metavar="NAMES",
        help="with --fixes, try only these (comma list of " + ", ".join(COMPILE_FIXES) + ")",
    )
    p.add_argument("--jobs", type=options.processes, default=1, metavar="J", help="with --fixes: fix runs side by side")
    p.add_argument(
        "--probe",
        action="store_true",
        help="call each compiled graph (forward and backward) again on copies of its first call's inputs, after "
        f"the step it ran in, and report any that is not bit for bit the same ({PROBE_REPEATS} times; "
        "--probe-repeats K)",
    )
    p.add_argument("--probe-repeats", type=options.count, metavar="K", help="with --probe: how many times")
    options.add_strict(p)
    options.add_ranks(p)
    options.add_otlp_option(p)
    options.add_script(p, required=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> Outcome:
    """Run the script under capture (or read ``--trace``) and analyse it."""
    from ...analysis.doctor import Budgets
    from .job import doctor_from_trace, doctor_script

    budgets = Budgets(args.max_graph_breaks, args.max_recompiles, args.min_cache_hit_rate, strict=args.strict)
    run_dir = Path(args.out) if args.out else None
    if args.probe_repeats is not None and not args.probe:
        raise UserError("--probe-repeats says how often --probe calls each graph: give --probe too")
    if args.probe and args.probe_repeats is None:
        args.probe_repeats = PROBE_REPEATS
    if (args.only_fixes or args.jobs != 1) and not args.fixes:
        raise UserError("--only-fixes and --jobs choose the fix runs of --fixes: give --fixes too")
    if (problem := options.over_process_limit(args.jobs * args.nproc)) is not None:  # fix runs side by side
        raise UserError(
            f"--jobs {args.jobs} x --nproc {args.nproc} = {args.jobs * args.nproc} processes at once: {problem}"
        )
    if args.trace:
        if args.fixes:
            raise UserError("--fixes re-runs the script: give a SCRIPT, not --trace")
        if args.script:
            raise UserError("give either --trace DIR or a SCRIPT, not both")
        report, run_dir = doctor_from_trace(Path(args.trace), run_dir, budgets)
    else:
        if not args.script:
            raise UserError("doctor needs a SCRIPT to run (or --trace DIR)")
        report, run_dir = doctor_script(
            Path(args.script),
            args.args,
            run_dir=run_dir,
            budgets=budgets,
            options=RunOptions.from_args(args, ranks_only=True),
            nproc=args.nproc,
            timeout=args.timeout,
            resume=args.fixes,
        )
        if args.fixes:
            _try_fixes(report, run_dir, args)
    return Outcome(report, run_dir)


def _try_fixes(report: DoctorReport, run_dir: Path, args: argparse.Namespace) -> None:
    """``--fixes``: the compile fixes tried on the script (:mod:`.fixes`), into the report."""
    from ...render.save import write_report
    from .fix_runs import FixRunner, try_fixes

    runner = FixRunner(
        run_dir, Path(args.script), args.args, RunOptions.from_args(args), nproc=args.nproc, timeout=args.timeout
    )
    try:
        try_fixes(report, runner, only=args.only_fixes, jobs=args.jobs)
    except Stopped:  # by a signal: the report says which fixes finished (marked partial)
        write_report(run_dir, report)
        raise
    write_report(run_dir, report)
