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
from pathlib import Path
from typing import Any

from .. import options
from ...errors import UserError
from .._finish import Outcome
from .conduct import DEFAULT_BUDGET, MAX_RUNS

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


def run(args: argparse.Namespace) -> Outcome | int:
    """Plan, run (or one cell), collect and report, as the flags say."""
    if args.run_one is not None:
        return _run_one(args)
    from .conduct import DriftRequest, experiment

    request = DriftRequest.from_args(args)  # what torchrepro.drift builds from its arguments
    found = experiment(request)
    return 0 if found is None else Outcome(*found)


def _run_one(args: argparse.Namespace) -> int:
    """``--run-one INDEX --out DIR``: one cell of ``DIR/plan.json``, for a scheduler."""
    from .experiment import Runner, cells_of, load_plan, read_record, unfinished

    if not args.out:
        raise UserError("--run-one INDEX needs --out DIR (the directory holding plan.json)")
    run_dir = Path(args.out)
    plan = load_plan(run_dir)
    cells = cells_of(plan)
    if args.run_one >= len(cells):
        raise UserError(f"--run-one {args.run_one}: the plan has cells 0..{len(cells) - 1}")
    cell = cells[args.run_one]
    record = Runner(run_dir, plan).run(cell) if unfinished(run_dir, cell) else read_record(run_dir, cell)  # not rerun
    assert record is not None  # a record was read, or the run ended (it stops only on an interrupt, raised)
    print(f"run {args.run_one}: exit {record['exit_code']} in {record['wall_s']:.1f} s ({run_dir / cell.dir})")
    return 3 if record["exit_code"] else 0
