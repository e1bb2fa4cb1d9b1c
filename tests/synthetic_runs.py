"""Run directories written with the event-log writer, for report tests and benchmarks: many ranks
that behave alike, and a few that do not."""

from __future__ import annotations

import os
import random
import struct
import time
from pathlib import Path

from torchrepro.analysis.kept_steps import StepReducer

from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import CacheLookup, Compile, Counters, End, GraphBreak, Header, Step

GUARD = "tensor 'x' size mismatch at index 0. expected 32, actual 8"


def rank_events(
    rank: int,
    world: int,
    *,
    steps: int = 30,
    recompiles: int = 0,
    odd: bool = False,
    crash_at: int | None = None,
    t0: float = 1_000_000.0,
) -> list:
    """One rank's events: a compile at step 0, ``recompiles`` shape recompiles, a graph break, a
    cache lookup per compile and ``steps`` steps; ``odd`` adds a recompile at step 5 the others do
    not have, ``crash_at`` ends the log without an end record after that step."""
    events: list = [Header(t=t0, rank=rank, world_size=world, argv=["train.py"])]
    t = t0 + 1.0

    def compile_at(step: int, n: int, reason: str | None) -> None:
        nonlocal t
        t += 0.3
        events.append(
            Compile(
                t=t,
                rank=rank,
                step=step,
                compile_id=f"0/{n}",
                function="forward",
                file="train.py",
                line=10,
                dynamo_s=0.25,
                recompile_reasons=[reason] if reason else [],
            )
        )
        events.append(
            CacheLookup(
                t=t,
                rank=rank,
                step=step,
                compile_id=f"0/{n}",
                cache="fxgraph",
                status="miss" if n == 0 else "hit",
                key=f"k{n}",
            )
        )

    compile_at(0, 0, None)
    events.append(
        GraphBreak(
            t=t,
            rank=rank,
            step=0,
            compile_id="0/0",
            reason="Data-dependent branching",
            gb_id="GB0170",
            file="train.py",
            line=12,
            source="if x.sum() > 0:",
        )
    )
    n = 1
    for step in range(steps):
        if crash_at is not None and step > crash_at:
            return events
        if odd and step == 5:
            compile_at(step, n, f"tensor 'x' size mismatch at index 0. expected 32, actual {rank % 7 + 1}")
            n += 1
        if step < recompiles:
            compile_at(step, n, f"tensor 'x' size mismatch at index 0. expected 32, actual {step + 1}")
            n += 1
        t += 0.05
        events.append(
            Step(
                t=t,
                rank=rank,
                step=step,
                index=step,
                loss=1.0 / (step + 1),
                time_s=0.05 + 0.001 * rank,
                params_fp=f"{step:016x}",
                batch_fp=f"{rank:04x}{step:012x}",
            )
        )
    events += [
        Counters(rank=rank, counters={"stats": {"unique_graphs": n}}),
        End(t=t + 0.1, rank=rank, duration_s=t - t0),
    ]
    return events


def write_run(root: Path, ranks: int, *, odd: tuple[int, ...] = (), crashed: tuple[int, ...] = (), **options) -> Path:
    """A run directory of ``ranks`` ranks; the ``odd`` ones recompile at step 5, the ``crashed``
    ones stop after step 10."""
    for rank in range(ranks):
        write_all(
            root / f"rank-{rank}" / "events.jsonl",
            rank_events(rank, ranks, odd=rank in odd, crash_at=10 if rank in crashed else None, **options),
        )
    return root


def drift_experiment(root: Path, markup: str) -> dict:
    """A drift experiment analysed by the real drift code on metrics given here instead of trained:
    ``init``, ``order`` (3 seeds each, crossed) and ``compile``. The script seeds its global RNG itself
    (``init`` is not separable), compiling adds 0.05, and one eager run crashed with ``markup`` in its
    message; the script's argument and the metric's name carry ``markup`` too."""
    from torchrepro.analysis.drift import DriftRun
    from torchrepro.commands.drift.experiment import MetricSpec, build_report, cells_of, make_plan

    root.mkdir(parents=True)
    script = root / "<b onclick=x>train&.py"
    script.write_text("print('loss=1.0')\n")
    metric = MetricSpec(name=markup)
    plan = make_plan(script, [markup], ["init", "order", "compile"], 3, 0, metric)
    runs = []
    for cell in cells_of(plan):
        init, order = cell.seeds["init"], cell.seeds["order"]
        value = 1 + 0.1 * init + 0.02 * order + 0.001 * (cell.index * 7 % 5) + (0 if cell.settings else 0.05)
        run = DriftRun(
            cell.index,
            cell.seeds,
            cell.settings,
            value,
            "ok",
            dir=str(root / cell.dir),
            rng0="r",
            batches=(f"o{order}",),
        )
        if cell.settings and init == order == 0:
            run.metric, run.status, run.error = None, "crashed", f"exit 1: RuntimeError: {markup}"
        runs.append(run)
    return build_report(root, plan, runs, metric, observed=0.05, target_effect=0.01)


def keep_here_only() -> StepReducer:
    """A ``keep`` for ``load_run`` that kills any reading process it runs in but the one whose pid
    is ``TORCHREPRO_TEST_PARENT`` (a reading process that dies)."""
    if os.getpid() != int(os.environ["TORCHREPRO_TEST_PARENT"]):
        os._exit(9)
    return StepReducer()


def keep_forever() -> StepReducer:
    """A ``keep`` that never returns (reading processes still at work when their parent dies)."""
    while True:
        time.sleep(1)


def training_steps(n: int, *, check: bool = False, seed: int = 0) -> list[Step]:
    """Step events as capture records them on a training loop: loss, step time, batch and RNG digests
    every step, the parameters fingerprinted every 13th; ``check``: every parameter and the gradients
    every step, as ``check``'s runs record them."""
    rng = random.Random(seed)

    def fp() -> str:
        return "%016x" % rng.getrandbits(64)

    t, out = 1_796_305_729.193371, []
    for i in range(n):
        t += 0.0075 + rng.random() / 1000
        full = check or i % 13 == 0
        out.append(
            Step(
                t=t,
                step=i + 1,
                index=i,
                loss=struct.unpack("<f", struct.pack("<f", 3 / (i + 1) + rng.random() / 10))[0],
                backward_calls=1,
                time_s=round(0.0075 + rng.random() / 1000, 6),
                params_fp=fp() if full else None,
                param_fps=[fp() for _ in range(6)] if full else None,
                grads_fp=fp() if check else None,
                grad_norm=rng.random() if check else None,
                batch_fp=fp(),
                batches=1,
                rng_fp=fp(),
                rng_fps={"python": "2ba9ec2faa8fc04a", "numpy": "a30b678983c92d60", "torch_cpu": fp()},
                rng_at="batch",
            )
        )
    return out
