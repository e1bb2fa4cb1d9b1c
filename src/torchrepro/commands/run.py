"""``torchrepro run [options] SCRIPT``: run a script with capture in this process (what each
torchrun rank runs; :mod:`torchrepro.runtime.runner`). Launched by torchrepro, it takes its :class:`~torchrepro.runtime.run_options.RunOptions`
from the environment; called directly (e.g. under the user's own torchrun), from its flags."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import options
from ..errors import UserError
from ..runtime.run_options import OPTIONS_VAR, RunOptions


def add_parser(sub: Any) -> None:
    """Register ``run``."""
    p = sub.add_parser("run", help="run a script with capture in this process (what each torchrun rank runs)")
    p.add_argument(
        "--out", dest="run_dir", type=options.directory, metavar="RUN_DIR", help="run directory shared by all ranks"
    )
    p.add_argument("--seed", type=options.seed, help="seed everything from this root before the script starts")
    p.add_argument(
        "--fingerprint-every",
        type=options.positive_int,
        metavar="N",
        help="fingerprint parameters every N steps (default: as often as costs at most 1%% of the step time)",
    )
    p.add_argument("--grads", action="store_true", help="also fingerprint gradients before each step")
    p.add_argument(
        "--compile-mode",
        choices=("eager", "fallback-random"),
        help="run what the script compiles eagerly (compilation off), or with inductor's fallback_random=True: what "
        "check --against compares with",
    )
    p.add_argument(
        "--snapshots",
        action="store_true",
        help="save parameter sketches (rank-<r>/snapshots, at most 1 MB a step) at steps 0-15, powers of two "
        "and the last, and the first and last ones' values whole",
    )
    p.add_argument("--replay-step", type=options.count, metavar="K", help="record every op of step K, then exit")
    p.add_argument(
        "--replay-out", metavar="FILE", help="where --replay-step writes its op trace (default rank-<r>/replay.json)"
    )
    p.add_argument(
        "--replay-graphs",
        action="store_true",
        help="with --replay-step: compare each inductor graph with its eager FX graph instead",
    )
    p.add_argument(
        "--replay-kernels",
        action="store_true",
        help="with --replay-step: repeat each inductor graph (forward and backward) on identical inputs",
    )
    p.add_argument(
        "--probe-repeats",
        type=options.count,
        metavar="K",
        help="call each inductor graph (forward and backward) K more times after the step it first ran in, on "
        "copies of its inputs, and record any output that is not bit for bit the same, and any unlike the same graph "
        "run eagerly",
    )
    p.add_argument("--stop-after-step", type=options.count, metavar="K", help="end the script cleanly after step K")
    p.add_argument(
        "--fix",
        metavar="NAME",
        help="apply a candidate fix first (threads_1, deterministic, fallback_random, aot_eager[:FRAMES]; compile "
        "fixes: capture_scalar_outputs, recompile_limit:N, dynamic_sources:L['x']:0 ...; several joined by +)",
    )
    options.add_otlp_option(p, in_process=True)
    options.add_script(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the script under capture; its exit code. Started by torchrepro (its options in the
    environment), it dies with the process that started it (:func:`~torchrepro.runtime.runner.die_with_parent`),
    which holds the run directory; started by hand, it holds its rank's folder for the run
    (:func:`~torchrepro.eventlog.rundir.claim_run_dir`)."""
    from .._dist import rank
    from ..eventlog.events import EVENTS_FILE
    from ..eventlog.rundir import claim_run_dir
    from ..runtime.runner import die_with_parent, run_in_process
    from .launcher import validate_script

    given = RunOptions.from_args(
        args, probe_against_eager=bool(args.probe_repeats)
    )  # a probing run compares with eager too
    handed = RunOptions.from_env()
    if handed is not None and given != RunOptions():
        raise UserError(f"{OPTIONS_VAR} holds this run's options: give torchrepro run no options as well")
    if handed is not None:
        die_with_parent()  # here, in the main thread: the kernel's signal follows the thread that started us
    chosen = handed or given
    script = validate_script(args.script)
    run_dir = Path(chosen.run_dir) if chosen.run_dir else _shared_run_dir(script)
    folder = run_dir / f"rank-{rank()}"
    for held in (False, True):  # refused before the folder is touched, and again once it is ours
        if (folder / EVENTS_FILE).exists():
            raise UserError(
                f"{run_dir} already holds a run ({folder / EVENTS_FILE} exists): choose another --out, or delete it"
            )
        if handed is None and not held:
            claim_run_dir(folder, fresh=False)
    return run_in_process(script, args.args, replace(chosen, run_dir=run_dir))


def _shared_run_dir(script: Path) -> Path:
    """Under torchrun every rank must agree on the directory: key it by the job's run id."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or time.strftime("%Y%m%d-%H%M%S")
    return Path("torchrepro-runs") / f"{script.stem}-{run_id}"
