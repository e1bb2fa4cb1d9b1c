"""Run directories written with the event-log writer, for report tests and benchmarks: many ranks
that behave alike, and a few that do not; a run whose texts are long and whose losses are not finite."""

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


LONG_GUARD = (
    "tensor 'L['self']._modules['encoder']._modules['layers'][11]._parameters['weight']' stride mismatch at "
    "index 1. expected 4096, actual 1 (capture_scalar_outputs=False, expected 16, actual 3)"
)
LONG_REASON = "Unsupported Tensor.item() call with capture_scalar_outputs=False and a reason long enough to wrap twice"
NONFINITE_LOSSES = [2.0, 1.5, float("nan"), float("inf"), float("nan"), 0.5]


def long_text_run(root: Path, script: Path) -> Path:
    """A one-rank run directory of a compiled ``script``: ``Classifier.forward`` compiled, a graph
    break at line 72 (:data:`LONG_REASON`), the code Dynamo resumes after it recompiled on
    :data:`LONG_GUARD`; losses (:data:`NONFINITE_LOSSES`) and step times that turn NaN and infinite."""
    from torchrepro.eventlog.events import Compile, End, GraphBreak, Header
    from torchrepro.eventlog.rundir import RUN_FILE, write_json

    file = str(script)
    resumed = "torch_dynamo_resume_in_forward_at_72"
    times = [0.1, float("nan"), float("inf"), None]
    events = [
        Header(t=1000.0, rank=0, world_size=1, argv=[file]),
        Compile(t=1001.0, step=0, compile_id="0/0", function="Classifier.forward", file=file, line=60, dynamo_s=0.2),
        GraphBreak(t=1001.0, step=0, compile_id="0/0", reason=LONG_REASON, gb_id="GB0124", file=file, line=72),
        Compile(t=1001.5, step=0, compile_id="1/0", function=resumed, file=file, line=72, dynamo_s=0.2),
        Compile(
            t=1002.0,
            step=3,
            compile_id="1/1",
            function=resumed,
            file=file,
            line=72,
            dynamo_s=0.2,
            recompile_reasons=[LONG_GUARD],
        ),
        *(
            Step(t=1003.0 + i, step=i, index=i, loss=loss, time_s=times[i % len(times)])
            for i, loss in enumerate(NONFINITE_LOSSES)
        ),
        End(t=1010.0, duration_s=10.0),
    ]
    write_all(root / "rank-0" / "events.jsonl", events)
    write_json(root / RUN_FILE, {"script": file, "args": []})
    return root


def loss_config(root: Path, label: str, losses: list[float]):
    """One configuration of ``compare`` (:class:`~torchrepro.analysis.equivalence.Config`): one rank,
    ``losses`` (and the same gradient norms) per step, its log in memory under ``root / label``."""
    from torchrepro.analysis.equivalence import Config
    from torchrepro.analysis.verdict import Ending
    from torchrepro.eventlog.event_reader import EventLog
    from torchrepro.eventlog.events import End, Header

    steps = [Step(step=i, index=i, loss=x, grad_norm=x, params_fp="p", batch_fp=f"b{i}") for i, x in enumerate(losses)]
    log = EventLog(root / label / "rank-0" / "events.jsonl", events=[Header(world_size=1), *steps, End()])
    return Config(label, [log], Ending(label))
