"""``torchrepro doctor``: compile health of a real run (recompiles, graph breaks, caches), or of
``TORCH_TRACE`` logs a job wrote without torchrepro."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import options
from ...errors import UserError
from ...runtime.run_options import PROBE_REPEATS
from .._finish import Outcome
from ...analysis.compile_fixes import COMPILE_FIXES


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
        help="fingerprint parameters every N steps (default: not in one process; on several ranks, as often as costs "
        "at most 1%% of the step time)",
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
    from ...eventlog.rundir import default_run_dir
    from ..api import cache_of, doctor

    if args.probe_repeats is not None and not args.probe:
        raise UserError("--probe-repeats says how often --probe calls each graph: give --probe too")
    if args.out:
        out = Path(args.out)
    else:
        out = (
            default_run_dir(Path(args.trace).name, label="trace") if args.trace else default_run_dir(args.script or "")
        )
    report = doctor(
        args.script,
        args.args,
        trace=args.trace,
        out=out,
        seed=args.seed,
        nproc=args.nproc,
        timeout=args.timeout,
        max_graph_breaks=args.max_graph_breaks,
        max_recompiles=args.max_recompiles,
        min_cache_hit_rate=args.min_cache_hit_rate,
        strict=args.strict,
        fingerprint_every=args.fingerprint_every,
        probe_repeats=(args.probe_repeats if args.probe_repeats is not None else PROBE_REPEATS) if args.probe else None,
        fixes=args.fixes,
        only_fixes=args.only_fixes,
        jobs=args.jobs,
        cache=cache_of(args),
        module=args.module,
    )
    return Outcome(report, out)
