"""``torchrepro drift``: is a difference between runs real, and which factor causes it.

Exit codes: 0 analysed; 1 a binary factor makes a real difference (p < 0.05); 2 usage or input
error; 3 a run failed (it is reported and excluded from every statistic); 130 interrupted (rerun
the same command: finished runs are reused).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path
from .. import options
from ...errors import UserError
from .._finish import Outcome

MAX_RUNS = 10_000  # the largest design (cells x runs) run without --allow-large

EPILOG = """\
factors: init (the global RNG the model is initialised from), order (DataLoader shuffling and samplers),
augment (DataLoader workers and torchrepro.worker_rng), compile (eager vs as written), backend (aot_eager vs
inductor), fallback-random (inductor's fallback_random), threads (1 vs default), deterministic
(torchrepro.deterministic() on). Random factors (init, order, augment) get N seeds each, fully crossed;
binary factors run on the same seeds as the script as written (paired).
scheduler: drift --plan --out DIR SCRIPT writes DIR/plan.json; run each cell anywhere with
drift --out DIR --run-one I; then drift --collect DIR.
size: a design of more than {max_runs:,} runs (cells x runs) is refused unless --allow-large is given.
exit codes: 0 analysed, 1 a binary factor makes a real difference, 2 usage error, 3 a run failed, 130 interrupted.
"""


def add_parser(sub) -> None:
    """Register ``drift``."""
    p = sub.add_parser(
        "drift",
        help="run N seeds per factor: is a difference real, which factor causes it",
        epilog=EPILOG.format(max_runs=MAX_RUNS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--vary",
        type=options.factors,
        default=None,
        metavar="FACTORS",
        help="comma-separated factors (default init,order,compile)",
    )
    p.add_argument(
        "--runs",
        type=options.runs,
        default=None,
        metavar="N",
        help="seeds per random factor (default 4, at least 2); binary factors are paired over every seed cell",
    )
    p.add_argument(
        "--allow-large",
        action="store_true",
        help=f"run a design of more than {MAX_RUNS:,} runs (refused without it)",
    )
    p.add_argument(
        "--jobs",
        type=options.positive_int,
        default=os.cpu_count() or 1,
        metavar="J",
        help="runs in parallel (default: the number of cores)",
    )
    metric = p.add_mutually_exclusive_group()
    metric.add_argument("--metric", metavar="NAME", help="the last value logged with torchrepro.log_metric(NAME, v)")
    metric.add_argument(
        "--metric-regex",
        metavar="REGEX",
        help="one group (...) matched against the script's stdout, last match (default: final loss)",
    )
    p.add_argument(
        "--observed", type=options.finite, metavar="X", help="place a difference you saw against the measured noise"
    )
    p.add_argument(
        "--target-effect",
        type=options.positive_float,
        metavar="E",
        help="report the pairs needed to detect this difference",
    )
    p.add_argument(
        "--launcher",
        choices=("local", "ray"),
        default="local",
        help="local child processes (default), or Ray tasks on $RAY_ADDRESS (else a local Ray cluster)",
    )
    p.add_argument(
        "--seed", type=options.seed, default=0, help="root of the seed tree every stream derives from (default 0)"
    )
    p.add_argument("--out", metavar="DIR", help="experiment directory; the same DIR again reuses finished runs")
    options.add_outputs(p)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--plan", action="store_true", help="only write DIR/plan.json (the run matrix)")
    mode.add_argument("--run-one", type=options.count, metavar="INDEX", help="run one cell of DIR/plan.json")
    mode.add_argument("--collect", metavar="DIR", help="analyse the runs in DIR")
    p.add_argument("script", nargs="?", metavar="SCRIPT", help="the training script")
    options.add_otlp_option(p)
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments (after --)")
    p.set_defaults(func=run)


def _metric(args: argparse.Namespace, plan: dict | None = None):
    from .experiment import MetricSpec

    if args.metric or args.metric_regex or plan is None:
        return MetricSpec(args.metric, args.metric_regex)
    return MetricSpec(**plan["metric"])


def run(args: argparse.Namespace) -> Outcome | int:
    """Plan, run (or one cell), collect and report, as the flags say."""
    from ...eventlog.rundir import claim_run_dir
    from .experiment import Runner, cells_of, load_plan, read_record, unfinished

    if args.collect:
        if args.script:
            raise UserError("--collect DIR analyses stored runs: give no SCRIPT")
        out = Path(args.collect)
        plan = load_plan(out)
        claim_run_dir(out, fresh=False)  # one writer of the report at a time
        return _report(out, plan, args, None, None)
    if args.run_one is not None:
        if not args.out:
            raise UserError("--run-one INDEX needs --out DIR (the directory holding plan.json)")
        out = Path(args.out)
        plan = load_plan(out)
        cells = cells_of(plan)
        if args.run_one >= len(cells):
            raise UserError(f"--run-one {args.run_one}: the plan has cells 0..{len(cells) - 1}")
        cell = cells[args.run_one]
        record = Runner(out, plan).run(cell) if unfinished(out, cell) else read_record(out, cell)  # not rerun
        print(f"run {args.run_one}: exit {record['exit_code']} in {record['wall_s']:.1f} s ({out / cell.dir})")
        return 3 if record["exit_code"] else 0
    return _plan_and_run(args)


def _plan_and_run(args: argparse.Namespace) -> Outcome | int:
    from rich.console import Console

    from ...analysis.drift import DEFAULT_FACTORS
    from .experiment import check_out, make_plan, prepare_out, run_all
    from ..launcher import validate_script
    from ...eventlog.rundir import claim_run_dir, default_run_dir

    if not args.script:
        raise UserError("drift needs a SCRIPT (or --collect DIR, or --run-one INDEX --out DIR)")
    script = validate_script(args.script)
    factors = args.vary or DEFAULT_FACTORS.split(",")
    plan = make_plan(
        script, args.args, factors, args.runs or 4, args.seed, _metric(args), None if args.allow_large else MAX_RUNS
    )
    out = Path(args.out) if args.out else default_run_dir(script, label="drift")
    check_out(out, plan)  # before anything is created in it
    claim_run_dir(out, fresh=False)  # one drift writes it at a time (--run-one: cells)
    prepare_out(out, plan)  # under the lock: an empty directory, or this experiment's
    if args.plan:
        n = len(plan["cells"])
        print(
            f"{n} runs planned in {out / 'plan.json'}\nrun each cell: torchrepro drift --out {out} --run-one I "
            f"(I = 0..{n - 1})\nthen: torchrepro drift --collect {out}"
        )
        return 0
    console = Console(stderr=True)
    t0 = time.perf_counter()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        counts = run_all(out, plan, args.jobs, console, args.launcher)
    except KeyboardInterrupt:
        console.print(
            f"drift interrupted: finished runs are kept in {out}; run the same command again to continue",
            markup=False,
            highlight=False,
        )
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return _report(out, plan, args, counts, round(time.perf_counter() - t0, 3))


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _report(out: Path, plan: dict, args: argparse.Namespace, counts: dict | None, wall_s: float | None) -> Outcome:
    """Collect and analyse the runs (``report.json``, ``report.html`` and the plots are written);
    a :class:`UserError` when no run produced the metric and none crashed."""
    from .experiment import build_report, collect

    metric = _metric(args, plan)
    runs = collect(out, plan, metric)
    report = build_report(
        out, plan, runs, metric, observed=args.observed, target_effect=args.target_effect, counts=counts, wall_s=wall_s
    )
    drift = report.drift
    if report.exit_code != 3 and not drift.summary["n"] and drift.excluded:
        raise UserError(f"no run produced the metric: {drift.excluded[0].error}")
    return Outcome(report, out)
