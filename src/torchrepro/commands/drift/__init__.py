"""``torchrepro drift``: is a difference between runs real, and which factor causes it.

``--until-clear`` adds seed levels a batch at a time until each factor is decided (see
:mod:`torchrepro.analysis.sequential`); ``--plan`` on a directory with finished runs says how many
runs each factor needs.

Exit codes: 0 analysed; 1 a binary factor makes a real difference (p < 0.05; under
``--until-clear``, by its sequential decision); 2 usage or input
error; 3 a run failed (it is reported and excluded from every statistic), or ``--collect`` found runs of
the plan missing (INCOMPLETE; ``--allow-partial`` analyses the others); 128+N stopped by signal N
(130 SIGINT, 143 SIGTERM, 129 SIGHUP: the live runs are ended, a partial report of the finished ones is
written; rerun the same command: finished runs are reused).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import options
from ...errors import Stopped, UserError
from ...eventlog.rundir import REPORT_FILE
from .._finish import Outcome

if TYPE_CHECKING:
    from rich.console import Console

    from .experiment import MetricSpec, Plan, SequentialPlan

MAX_RUNS = 10_000  # the largest design (cells x runs) run without --allow-large
DEFAULT_BUDGET = 200  # drift --until-clear's --max-runs

EPILOG = """\
factors: init (the global RNG the model is initialised from), order (DataLoader shuffling and samplers),
augment (DataLoader workers and torchrepro.worker_rng), compile (eager vs as written), backend (aot_eager vs
inductor), fallback-random (inductor's fallback_random), threads (1 vs default), deterministic
(torchrepro.deterministic() on). Random factors (init, order, augment) get N seeds each, fully crossed;
binary factors run on the same seeds as the script as written (paired).
scheduler: drift --plan --out DIR SCRIPT writes DIR/plan.json; run each cell anywhere with
drift --out DIR --run-one I; then drift --collect DIR (runs of the plan still missing: INCOMPLETE, exit 3;
--allow-partial analyses the runs that finished). With finished runs in DIR (a pilot), --plan also
says how many runs each factor needs (--target-effect E, else --observed X, else the difference measured).
sequential: drift --until-clear [--max-runs M] adds seed levels a batch at a time and stops as soon as
each factor is decided (a test valid under continuous monitoring), or when the budget cannot decide it.
size: a design of more than {max_runs:,} runs (cells x runs) is refused unless --allow-large is given.
exit codes: 0 analysed, 1 a binary factor makes a real difference, 2 usage error, 3 a run failed or runs
are missing (INCOMPLETE), 128+N stopped by signal N (130 SIGINT, 143 SIGTERM, 129 SIGHUP; a partial report of the finished runs).
"""


def add_parser(sub: Any) -> None:
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
        default=None,
        metavar="J",
        help="runs in parallel (default: the number of usable cores; with --launcher local at most "
        f"{options.PROCESSES_PER_CORE} per core unless {options.PROCESS_LIMIT_VAR} says more)",
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
    p.add_argument(
        "--allow-partial",
        action="store_true",
        help="--collect: analyse the runs that finished when others of the plan are missing (else INCOMPLETE, exit 3)",
    )
    mode.add_argument(
        "--until-clear",
        action="store_true",
        help="start with --runs N levels, add levels a batch (--jobs runs) at a time, stop once each factor is decided",
    )
    p.add_argument(
        "--max-runs",
        type=options.positive_int,
        metavar="M",
        help=f"--until-clear: at most M runs in all (default {DEFAULT_BUDGET})",
    )
    options.add_otlp_option(p)
    options.add_script(p, required=False)
    p.set_defaults(func=run)


def _metric(args: argparse.Namespace, plan: Plan | None = None) -> MetricSpec:
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
        run_dir = Path(args.collect)
        plan = load_plan(run_dir)
        claim_run_dir(run_dir, fresh=False)  # one writer of the report at a time
        return _report(run_dir, plan, args, None, None)
    if args.run_one is not None:
        if not args.out:
            raise UserError("--run-one INDEX needs --out DIR (the directory holding plan.json)")
        run_dir = Path(args.out)
        plan = load_plan(run_dir)
        cells = cells_of(plan)
        if args.run_one >= len(cells):
            raise UserError(f"--run-one {args.run_one}: the plan has cells 0..{len(cells) - 1}")
        cell = cells[args.run_one]
        record = (
            Runner(run_dir, plan).run(cell) if unfinished(run_dir, cell) else read_record(run_dir, cell)
        )  # not rerun
        assert record is not None  # a record was read, or the run ended (it stops only on an interrupt, raised)
        print(f"run {args.run_one}: exit {record['exit_code']} in {record['wall_s']:.1f} s ({run_dir / cell.dir})")
        return 3 if record["exit_code"] else 0
    return _plan_and_run(args)


def _plan_and_run(args: argparse.Namespace) -> Outcome | int:
    from ...analysis.drift import DEFAULT_FACTORS
    from .experiment import check_run_dir, make_plan, plan_size, prepare_run_dir, sequential_stop
    from ..launcher import validate_script
    from ...eventlog.rundir import claim_run_dir, default_run_dir, usable_cores

    if not args.script:
        raise UserError("drift needs a SCRIPT (or --collect DIR, or --run-one INDEX --out DIR)")
    if args.max_runs is not None and not args.until_clear:
        raise UserError("--max-runs is the budget of --until-clear: give both, or --runs N for a fixed design")
    if args.jobs is None:
        args.jobs = usable_cores()
    elif args.launcher == "local" and (problem := options.over_process_limit(args.jobs)) is not None:
        raise UserError(f"argument --jobs: {problem}, got '{args.jobs}'")  # (Ray tasks run on its cluster)
    script = validate_script(args.script)
    factors = args.vary or DEFAULT_FACTORS.split(",")
    levels = args.runs or 4

    def planned(n: int, sequential: SequentialPlan | None = None) -> Plan:
        return make_plan(
            script,
            args.args,
            factors,
            n,
            args.seed,
            _metric(args),
            None if args.allow_large else MAX_RUNS,
            sequential,
            args.module,
        )

    plan = planned(levels)
    if args.until_clear:
        budget = args.max_runs or DEFAULT_BUDGET
        _check_sequential(plan, factors, budget)
    run_dir = Path(args.out) if args.out else default_run_dir(script, label="drift")
    check_run_dir(run_dir, plan)  # before anything is created in it
    claim_run_dir(run_dir, fresh=False)  # one drift writes it at a time (--run-one: cells)
    if args.plan:
        _print_plan(run_dir, plan, args)
        return 0
    from ...render.console import console as make_console

    console = make_console(stderr=True)
    t0 = time.perf_counter()
    if not args.until_clear:
        prepare_run_dir(run_dir, plan)  # under the lock: an empty directory, or this experiment's
        counts = _launch(run_dir, plan, args, console, t0)
        return _report(run_dir, plan, args, counts, round(time.perf_counter() - t0, 3))
    looks, total = [levels], {"planned": 0, "reused": 0, "ran": 0, "crashed": 0}
    while True:
        sequential: SequentialPlan = {"looks": looks, "max_runs": budget, "target_effect": args.target_effect}
        plan = planned(looks[-1], sequential)
        prepare_run_dir(run_dir, plan)
        counts = _launch(run_dir, plan, args, console, t0)
        ran, crashed = total["ran"] + counts["ran"], total["crashed"] + counts["crashed"]
        total = {"planned": counts["planned"], "reused": counts["planned"] - ran, "ran": ran, "crashed": crashed}
        stop = sequential_stop(run_dir, plan, _metric(args, plan), args.target_effect)
        if stop != "continue":
            break
        levels = next_levels(plan, looks[-1], args.jobs)
        while plan_size(plan, levels) > budget:  # a last batch cut to the budget (one more level fits: not "budget")
            levels -= 1
        looks = [*looks, levels]
    return _report(run_dir, plan, args, total, round(time.perf_counter() - t0, 3))


def _check_sequential(plan: Plan, factors: list[str], budget: int) -> None:
    """One-line errors for an ``--until-clear`` that could decide nothing or exceed its budget at once."""
    from .experiment import plan_size

    if not plan["binary"] and len(plan["random"]) not in (2, 3):
        raise UserError(
            f"--until-clear --vary {','.join(factors)}: nothing to decide; it needs a binary factor "
            "(compile, backend, ...) or two or three random factors (init,order,augment)"
        )
    first = plan_size(plan, plan["runs"])
    if budget < first:
        raise UserError(f"--max-runs {budget} is smaller than the first look ({first} runs at --runs {plan['runs']})")


def next_levels(plan: Plan, levels: int, jobs: int) -> int:
    """The levels of the next look: as many more as fit in one batch of ``jobs`` runs, at least one."""
    from .experiment import plan_size

    n = levels + 1
    while plan_size(plan, n + 1) - plan_size(plan, levels) <= jobs:
        n += 1
    return n


def _launch(run_dir: Path, plan: Plan, args: argparse.Namespace, console: Console, t0: float) -> dict[str, int]:
    """Run what ``plan`` still lacks. A stop signal (SIGINT, SIGTERM, SIGHUP) ends the live runs (they
    rerun next time); the report of the runs that finished is written, marked partial, and drift
    ends with :class:`Stopped` (exit 128 + N)."""
    from .experiment import run_all
    from ..launcher import stop_phase

    try:
        with stop_phase("drift"):
            return run_all(run_dir, plan, args.jobs, console, args.launcher)
    except Stopped as stopped:
        how = f"stopped by {stopped.signal_name}"
        _report(run_dir, plan, args, None, round(time.perf_counter() - t0, 3), partial=how)
        raise Stopped(
            f"drift: {how}; finished runs are kept in {run_dir} (partial report: {run_dir / REPORT_FILE}): "
            "run the same command again to go on",
            stopped.signal_name,
        ) from None


def _print_plan(run_dir: Path, plan: Plan, args: argparse.Namespace) -> None:
    """``--plan``: write the run matrix; with finished runs in ``run_dir`` (a pilot), say how many runs
    each factor needs."""
    from ...analysis.drift import fmt_number
    from ...analysis.sequential import plan_sentence
    from .experiment import pilot_planning, prepare_run_dir

    pilot = pilot_planning(run_dir, plan, _metric(args, plan), args.target_effect, args.observed, args.jobs)
    prepare_run_dir(run_dir, plan)  # under the lock: an empty directory, or this experiment's
    n = len(plan["cells"])
    print(
        f"{n} runs planned in {run_dir / 'plan.json'}\nrun each cell: torchrepro drift --out {run_dir} --run-one I "
        f"(I = 0..{n - 1})\nthen: torchrepro drift --collect {run_dir}"
    )
    if pilot is None:
        print("runs needed: no finished runs in this directory yet (run a pilot, e.g. --runs 4, then --plan again)")
    for item in pilot or []:
        print(plan_sentence(item, fmt_number))


def _report(
    run_dir: Path,
    plan: Plan,
    args: argparse.Namespace,
    counts: dict[str, int] | None,
    wall_s: float | None,
    partial: str | None = None,
) -> Outcome:
    """Collect and analyse the runs (``report.json``, ``report.html`` and the plots are written);
    a :class:`UserError` when no run produced the metric and none crashed. ``partial``: why the
    runs were cut short (the report says it is partial)."""
    from .experiment import build_report, collect

    metric = _metric(args, plan)
    runs = collect(run_dir, plan, metric)
    report = build_report(
        run_dir,
        plan,
        runs,
        metric,
        observed=args.observed,
        target_effect=args.target_effect,
        counts=counts,
        wall_s=wall_s,
        partial=partial,
        allow_partial=args.allow_partial,
    )
    drift = report.drift
    if partial is None and report.exit_code != 3 and not drift.summary["n"] and drift.excluded:
        raise UserError(f"no run produced the metric: {drift.excluded[0].error}")
    return Outcome(report, run_dir)
