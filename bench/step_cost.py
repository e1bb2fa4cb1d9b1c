"""What capture costs a small training step: its parts in µs, and its share of samples.

    python bench/step_cost.py                       # ~10 ms and ~100 ms steps, 1 thread
    python bench/step_cost.py --width 256 --steps 300
    python bench/step_cost.py --width 2600 --baseline OTHER/src   # two trees, interleaved
    python bench/step_cost.py --model gpt --width 0 # the compiled GPT-style loop (~8-10 ms steps)
    python bench/step_cost.py --capture run         # what `torchrepro run` records instead
    python bench/step_cost.py --cold --rounds 5     # the writer's pieces with the caches evicted, and hot

A loop runs under a ``CaptureSession`` recording what ``torchrepro doctor`` records (``--capture
doctor``, the default: ``StepConfig(ranks_only=True)``, in one process no RNG or batch digests) or
what ``torchrepro run`` records (``--capture run``: default settings). ``--model mlp``: an MLP,
AdamW, DataLoader batches, eager, hidden width ``--width``; ``--model gpt``: a small GPT-style
model (token and position embeddings, two attention blocks, tied head, the loss computed inside
the compiled forward), ``torch.compile`` with ``--backend`` (inductor by default), AdamW, batches
drawn with ``torch.randint`` as nanoGPT's ``get_batch`` does (no DataLoader: capture fingerprints
the inputs of the outermost module call instead). Two measures, printed, never asserted:

- end to end: the loop's median step CPU time without and with capture, taking turns over
  --rounds rounds; the median over rounds of the ratio within a round.
- parts: capture's entry points (DataLoader batch, outermost module call, backward wrapper,
  optimizer post-step hook) and the pieces inside them (RNG digest, batch fingerprint, parameter
  fingerprints, read-back, event write) are timed with ``perf_counter`` in the same process,
  summed per step, and the median over steps taken (a shared, oversubscribed machine preempts
  the thread inside some intervals: the median drops those steps; ``thread_time`` would not
  see preemption, but it is a system call, whose own cost under load, 5-20 µs, swamped the
  parts); inclusive: a piece's time is also inside its entry point. Two passes: the entry
  points alone (``alone``: the median of their per-step sum, as a share of the loop's median
  step time, is capture's cost; less the parameter fingerprints, timed in the same pass, its
  fixed cost), then every part (``all timed``: each timer adds its own cost to the parts
  around it), then the instrument itself: the bodies of the entry points the ``alone`` pass called
  replaced by no-ops, timed the same way from the same places (inside a step a timer's own code is cold too: ~2-10 µs
  per entry point), which the last line subtracts. The wrappers that call the entry points
  (pass-through checks, torch's hook dispatch) are in no pass: the totals leave them out. The automatic interval of the parameter
  fingerprints budgets 1 % of the *wall* step time of steps 1-5: on a loaded machine it is
  shorter and their amortized cost larger. The first 10 steps are
  dropped (names, the automatic interval's measuring steps).
- share: the same loop in a child process under ``py-spy record`` (250 samples/s,
  raw format); the share of the loop's samples with a torchrepro frame on the stack. Needs
  py-spy (``pip install py-spy``); skipped without it.
- ``--baseline OTHER/src``: instead of the above, this tree's and another's fixed part, timers
  included (the ``alone`` pass) and less the timers (less the no-op pass), each in a fresh child process importing its
  tree, taking turns over --rounds rounds in an order swapped every round: this machine's speed
  drifts by 10-20 % between runs minutes apart, far more than one cut changes, so a before/after
  claim needs both sides measured in turn; printed per round and as the median of the per-round
  differences.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any


SETUP = {"model": "mlp", "capture": "doctor", "backend": "inductor"}  # set from the command line


def loop(width: int, steps: int, run_dir: Path | None, timers: dict[str, list[float]] | None = None) -> list[float]:
    """Train ``steps`` steps (under capture when ``run_dir``); the CPU time of each step (this
    thread's: with one intra-op thread it holds the compute, and a shared machine's other jobs
    do not inflate it as they do wall time)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    if SETUP["model"] == "gpt":
        return gpt_loop(steps, run_dir)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )
    data = TensorDataset(torch.randn(64 * 32, 256), torch.randint(0, 10, (64 * 32,)))
    session = None
    if run_dir is not None:
        session = start_session(run_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times: list[float] = []
    while len(times) < steps:
        for x, y in DataLoader(data, batch_size=64, shuffle=True):
            t0 = time.thread_time()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            times.append(time.thread_time() - t0)
            if len(times) == steps:
                break
    if session is not None:
        session.stop(0)
    return times


def setup_args() -> list[str]:
    """``SETUP`` as command-line options, for a child process."""
    return [f"--{key}={value}" for key, value in SETUP.items()]


def start_session(run_dir: Path):
    """A started session recording what ``--capture`` says."""
    from torchrepro.capture.session import CaptureConfig, CaptureSession
    from torchrepro.capture.steps import StepConfig

    session = CaptureSession(CaptureConfig(run_dir=run_dir, steps=StepConfig(ranks_only=SETUP["capture"] == "doctor")))
    session.start()
    return session


def gpt_loop(steps: int, run_dir: Path | None) -> list[float]:
    """``loop`` for ``--model gpt``: the compiled GPT-style training loop (compiled before the
    session starts, as a warm compile cache would; its first steps are dropped anyway)."""
    import torch
    import torch.nn.functional as F

    vocab, ctx, dim, heads = 96, 64, 64, 4

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
            self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
            self.mlp = torch.nn.Sequential(
                torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)
            )

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, c // heads).transpose(1, 3).unbind(2)
            x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c))
            return x + self.mlp(self.ln2(x))

    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(ctx, dim)
            self.blocks = torch.nn.Sequential(Block(), Block())
            self.ln, self.head = torch.nn.LayerNorm(dim), torch.nn.Linear(dim, vocab, bias=False)
            self.head.weight = self.tok.weight

        def forward(self, idx, targets):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            logits = self.head(self.ln(self.blocks(x)))
            return logits, F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    data = torch.randint(0, vocab, (100_000,))

    def get_batch():
        ix = torch.randint(len(data) - ctx - 1, (8,))
        return torch.stack([data[i : i + ctx] for i in ix]), torch.stack([data[i + 1 : i + 1 + ctx] for i in ix])

    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, backend=SETUP["backend"])

    def step() -> None:
        x, y = get_batch()
        _, loss = compiled(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def compile_first() -> None:  # forward and backward, outside the session (its samples are not the loop's)
        step()
        step()

    compile_first()
    session = start_session(run_dir) if run_dir is not None else None
    times: list[float] = []
    for _ in range(steps):
        t0 = time.thread_time()
        step()
        times.append(time.thread_time() - t0)
    if session is not None:
        session.stop(0)
    return times


PARTS = [  # (label, owner module, attribute, owner class or None); entry points first
    ("entry: DataLoader batch", "torchrepro.capture.steps", "_note_batch", "StepRecorder"),
    ("entry: module call", "torchrepro.capture.steps", "_note_module_call", "StepRecorder"),
    ("entry: backward wrapper", "torchrepro.capture.steps", "_note_backward", "StepRecorder"),
    ("entry: after backward", "torchrepro.capture.steps", "_after_backward", "StepRecorder"),
    ("entry: optimizer post-step", "torchrepro.capture.steps", "_on_step", "StepRecorder"),
    ("  RNG digest (live_fingerprints)", "torchrepro.capture.step_rng", "live_fingerprints", None),
    ("  RNG combine", "torchrepro.capture.step_rng", "combine", None),
    ("  batch fingerprint", "torchrepro.capture.step_inputs", "fingerprint", None),
    ("  parameter fingerprints (amortized)", "torchrepro.capture.step_params", "fingerprint_later", None),
    ("  read-back add (CPU: read, written)", "torchrepro.capture.readback", "add", "Readback"),
    ("  read-back poll (device values)", "torchrepro.capture.readback", "poll", "Readback"),
    ("  event write (record + write)", "torchrepro.eventlog.event_writer", "write", "EventWriter"),
    ("  common step write (record + write)", "torchrepro.eventlog.event_writer", "write_step", "EventWriter"),
    ("    record encoding (steps.bin)", "torchrepro.eventlog.stepstream", "encode", "Encoder"),
    ("    write system call (other events)", "torchrepro.eventlog.event_writer", "_write", None),
]


PARAMS = "  parameter fingerprints (amortized)"


@dataclass
class Timed:
    """µs per kept step: each part's median (parameter fingerprints: mean, they run every N
    steps), the median of the entry points' sum, and of that sum less the parameter fingerprints;
    the parts called at all."""

    parts: dict[str, float]
    total: float
    fixed: float
    step_ms: float
    called: set[str]


def timed_parts(
    width: int, steps: int, tmp: Path, parts: list[tuple[str, str, str, str | None]], null: bool = False
) -> Timed:
    """Time each of ``parts`` in place (restored after) under capture, step by step (steps counted
    by an optimizer hook of the benchmark's own). ``null``: each part's body replaced by a no-op,
    so what is timed is the timer itself, called from the same places (capture then records
    nothing: that pass measures the instrument, not capture)."""
    import importlib

    from torch.optim.optimizer import register_optimizer_step_post_hook

    per_step: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    clock = [0]

    def timer(label: str, fn):
        def timed(*args, **kwargs):
            if clock[0] < 10:
                return fn(*args, **kwargs)
            index, t0 = clock[0], time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                per_step[index][label] += time.perf_counter() - t0

        return timed

    def noop(*args, **kwargs):
        return None

    originals = []
    for label, module, attr, cls in parts:
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        originals.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, timer(label, noop if null else getattr(owner, attr)))
    counting = register_optimizer_step_post_hook(lambda *a: clock.__setitem__(0, clock[0] + 1))
    try:
        times = loop(width, steps, tmp / f"parts-{len(parts)}-{null}")
    finally:
        counting.remove()
        for owner, attr, fn in reversed(originals):
            setattr(owner, attr, fn)
    kept = [per_step[i] for i in sorted(per_step)[:-1]]  # the last: the session's stop, no step
    called = {label for s in kept for label in s}  # (before the medians: a lookup adds a label to its step)
    medians = {
        label: (statistics.mean if label == PARAMS else statistics.median)([s[label] for s in kept]) * 1e6
        for label, *_ in parts
    }
    totals = [sum(v for k, v in s.items() if k.startswith("entry")) for s in kept]
    fixed = [t - s[PARAMS] for t, s in zip(totals, kept)]
    return Timed(
        medians,
        statistics.median(totals) * 1e6,
        statistics.median(fixed) * 1e6,
        statistics.median(times[10:]) * 1e3,
        called,
    )


def spy_share(width: int, steps: int, tmp: Path, rate: int) -> tuple[float, float, int] | None:
    """Shares of the loop's py-spy samples in capture's own code (per step, and once per run at
    its first step), and the number of loop samples."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return None
    raw = tmp / "spy.txt"
    subprocess.run(
        [
            spy,
            "record",
            "-r",
            str(rate),
            "--format",
            "raw",
            "-o",
            str(raw),
            "--",
            sys.executable,
            __file__,
            "--child",
            "--width",
            str(width),
            "--steps",
            str(steps),
            "--out",
            str(tmp / "spy"),
            *setup_args(),
        ],
        check=True,
        capture_output=True,
    )
    in_loop = ours = once = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        start = next((i for i, f in enumerate(frames) if f.startswith("loop (")), None)
        if start is None:
            continue
        inner = frames[start + 1 :]
        if any(f.startswith("compile_first (") for f in inner):
            continue
        in_loop += int(count)
        if any(f.startswith(("CaptureSession.start (", "CaptureSession.stop (")) for f in inner):
            continue  # once per run, not per step
        if _in_capture(inner):
            if any(f.startswith(_ONCE) for f in inner):
                once += int(count)
            else:
                ours += int(count)
    return ours / max(in_loop, 1), once / max(in_loop, 1), in_loop


# once per run, at the first step: parameter names (a scan of live objects), capture's own lazy imports
_ONCE = ("_param_names (", "<module> (", "_calibrate (")


_PASSTHROUGH = ("._wrap.<locals>.wrapper (", "._wrap_module_call.<locals>.__call__ (", ".<locals>.exec_then_call (")


def _in_capture(frames: list[str]) -> bool:
    """A sample is capture's own work when its innermost torchrepro frame is capture code, not
    a wrapper calling through to the original (the user's forward, backward, batch fetch)."""
    ours = [i for i, f in enumerate(frames) if "torchrepro/" in f]
    if not ours:
        return False
    last = ours[-1]
    return last == len(frames) - 1 or not any(p in frames[last] for p in _PASSTHROUGH)


def end_to_end(width: int, steps: int, rounds: int, tmp: Path) -> tuple[float, float, list[float]]:
    """Median step CPU time without and with capture (ms), and the ratio of medians per round;
    the two take turns, in an order swapped every round."""
    plain: list[float] = []
    captured: list[float] = []
    ratios = []
    for r in range(rounds):
        pair = {}
        for config in ("none", "capture") if r % 2 == 0 else ("capture", "none"):
            times = loop(width, steps, tmp / f"e2e-{r}" if config == "capture" else None)[10:]
            pair[config] = statistics.median(times)
            (captured if config == "capture" else plain).extend(times)
        ratios.append(pair["capture"] / pair["none"])
    return statistics.median(plain) * 1e3, statistics.median(captured) * 1e3, ratios


def entry_passes(width: int, steps: int, tmp: Path) -> tuple[Timed, Timed]:
    """The entry points (and the parameter fingerprints) timed alone, then those of them that were
    called with no-op bodies: the timers' own cost (a no-op entry point records nothing, so
    capture would go on calling the ones its wrappers skip once there is nothing to observe)."""
    entries = [p for p in PARTS if p[0].startswith("entry") or p[0] == PARAMS]
    alone = timed_parts(width, steps, tmp, entries)
    return alone, timed_parts(width, steps, tmp, [p for p in entries if p[0] in alone.called - {PARAMS}], null=True)


def fixed_less_timers(width: int, steps: int, tmp: Path) -> dict[str, float]:
    """The fixed part, the timers alone (µs per step) and the plain step (ms) of this tree."""
    alone, instrument = entry_passes(width, steps, tmp)
    import torchrepro

    return {"fixed": alone.fixed, "timers": instrument.total, "step_ms": alone.step_ms, "src": torchrepro.__file__}


def side_by_side(width: int, steps: int, rounds: int, baseline: str) -> None:
    """This tree's and ``baseline``'s fixed part, timers included and less the timers, in turns
    (see the docstring)."""
    trees = {"this": str(Path(__file__).resolve().parents[1] / "src"), "baseline": baseline}
    found: dict[str, list[dict[str, float]]] = {"this": [], "baseline": []}
    print(f"\nwidth {width}: fixed part, timers included / less the timers, µs per step (plain step in ms)")
    for r in range(rounds):
        order = ("this", "baseline") if r % 2 == 0 else ("baseline", "this")
        for tree in order:
            with tempfile.TemporaryDirectory(prefix="torchrepro-stepcost-") as name:
                command = [sys.executable, __file__, "--fixed-child", "--width", str(width), "--steps", str(steps)]
                command += setup_args()
                out = subprocess.run(
                    command + ["--out", name],
                    env={**os.environ, "PYTHONPATH": trees[tree]},
                    capture_output=True,
                    text=True,
                    check=True,
                )
            found[tree].append(json.loads(out.stdout.splitlines()[-1]))
            assert found[tree][-1]["src"].startswith(trees[tree]), f"{tree} imported {found[tree][-1]['src']}"
        this, base = found["this"][-1], found["baseline"][-1]
        print(
            f"  round {r + 1}: this {this['fixed']:6.1f} / {this['fixed'] - this['timers']:6.1f} ({this['step_ms']:.1f} ms)"
            f"   baseline {base['fixed']:6.1f} / {base['fixed'] - base['timers']:6.1f} ({base['step_ms']:.1f} ms)",
            flush=True,
        )
    less = {tree: [x["fixed"] - x["timers"] for x in runs] for tree, runs in found.items()}
    step = statistics.median(x["step_ms"] for runs in found.values() for x in runs)
    differences = [a - b for a, b in zip(less["this"], less["baseline"])]
    timed = {tree: statistics.median(x["fixed"] for x in runs) for tree, runs in found.items()}
    print(
        f"  medians: this {timed['this']:.1f} / {statistics.median(less['this']):.1f}, "
        f"baseline {timed['baseline']:.1f} / {statistics.median(less['baseline']):.1f} µs; less the timers, "
        f"this - baseline per round {' '.join(f'{d:+.1f}' for d in differences)}, "
        f"median {statistics.median(differences):+.1f} µs = {statistics.median(differences) / 1e3 / step * 100:+.3f} % "
        f"of a {step:.1f} ms step"
    )


def cold_pieces(rounds: int, calls: int = 300) -> None:
    """``--cold``: the pieces of a doctor step's write, each timed with the caches evicted before
    every call (a 32 MB copy, as a training step's GEMMs evict them) and back to back (hot): µs,
    the median of ``calls`` calls per round, min/median/max over rounds. In a step the writer's
    code runs once, cold: its cost is mostly the memory it touches (code, objects, dicts), not
    the work it does (docs/evidence/performance.md, "What doctor costs a step")."""
    import torch

    from torchrepro.eventlog.event_writer import EventWriter
    from torchrepro.eventlog.events import Step, field_names
    from torchrepro.eventlog.stepstream import Encoder

    src, dst = torch.ones(4 << 20, dtype=torch.float64), torch.empty(4 << 20, dtype=torch.float64)
    t0, loss = time.time(), torch.tensor(0.5)

    def doctor_step(i: int) -> Step:  # what doctor's step event holds in one process
        return Step(t=t0 + i * 0.0173, step=i, index=i, loss=1 / (i + 1), time_s=round(0.02 + i % 7 * 1e-5, 6))

    def record(i: int, moving_only: bool = False) -> list[object]:  # the values the writer encodes
        step = doctor_step(i)
        if moving_only:
            step.t, step.loss, step.time_s = t0, 0.5, 0.02
        return [0, *(getattr(step, name) for name in field_names(Step))]

    with tempfile.TemporaryDirectory(prefix="torchrepro-cold-") as tmp:
        fd = os.open(Path(tmp) / "write.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        writers: list[EventWriter] = []

        def writer() -> EventWriter:
            writers.append(EventWriter(Path(tmp) / f"rank-{len(writers)}" / "events.jsonl"))
            return writers[-1]

        pieces: dict[str, tuple[Any, Any]] = {  # label: (the argument of call i, a fresh call)
            "an empty function (the harness)": (int, lambda: lambda i: None),
            "the Step event (dataclass)": (int, lambda: doctor_step),
            "loss read: tensor.item()": (int, lambda: lambda i: loss.item()),
            "encoding, only index/step move": (lambda i: record(i, True), lambda: Encoder(field_names(Step)).encode),
            "encoding, a doctor step": (record, lambda: Encoder(field_names(Step)).encode),
            "write system call (14 bytes)": (lambda i: b"\x0e" * 14, lambda: lambda data: os.write(fd, data)),
            "EventWriter.write (encode + write)": (doctor_step, lambda: writer().write),
        }
        found: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label in pieces}
        for _ in range(rounds):
            for label, (argument, make) in pieces.items():
                args, cold = [argument(i) for i in range(calls)], []
                call = make()
                for arg in args:
                    dst.copy_(src)
                    start = time.perf_counter()
                    call(arg)
                    cold.append(time.perf_counter() - start)
                args, call, hot = [argument(i) for i in range(calls)], make(), []
                for arg in args:
                    start = time.perf_counter()
                    call(arg)
                    hot.append(time.perf_counter() - start)
                found[label][0].append(statistics.median(cold[10:]) * 1e6)
                found[label][1].append(statistics.median(hot[10:]) * 1e6)  # medians: a gc pass is no piece's
        for w in writers:
            w.close()
        os.close(fd)
    print(f"{'':38s} {'cold µs min/median/max':>24s} {'hot µs':>8s}")
    for label, (cold, hot) in found.items():
        print(
            f"{label:38s} {min(cold):7.1f} {statistics.median(cold):7.1f} {max(cold):7.1f}  "
            f"{statistics.median(hot):8.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--width", type=int, nargs="+", default=[900, 2600], help="hidden width (~10 and ~100 ms steps)"
    )
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=6, help="end-to-end rounds (none and capture take turns)")
    parser.add_argument("--baseline", metavar="OTHER/src", help="another source tree: fixed parts side by side")
    parser.add_argument("--model", choices=("mlp", "gpt"), default="mlp")
    parser.add_argument("--capture", choices=("doctor", "run"), default="doctor", help="what capture records")
    parser.add_argument("--backend", default="inductor", help="--model gpt: torch.compile's backend")
    parser.add_argument("--cold", action="store_true", help="the pieces of a step's write, caches evicted, and hot")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fixed-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    SETUP.update(model=args.model, capture=args.capture, backend=args.backend)
    import torch

    torch.set_num_threads(args.threads)
    if args.cold:
        cold_pieces(args.rounds)
        return
    if args.child:
        loop(args.width[0], args.steps, args.out)
        return
    if args.fixed_child:
        print(json.dumps(fixed_less_timers(args.width[0], args.steps, args.out)))
        return
    if args.baseline:
        for width in args.width:
            side_by_side(width, args.steps, args.rounds, args.baseline)
        return
    for width in args.width:
        with tempfile.TemporaryDirectory(prefix="torchrepro-stepcost-") as name:
            tmp = Path(name)
            plain, captured, ratios = end_to_end(width, min(args.steps, 150), args.rounds, tmp)
            alone, instrument = entry_passes(width, args.steps, tmp)
            every = timed_parts(width, args.steps, tmp, PARTS)
            steps = max(100, min(args.steps * 2, int(20000 / max(every.step_ms, 1))))
            share = spy_share(width, steps, tmp, rate=250)
        print(
            f"\nwidth {width}: step {plain:.2f} ms CPU without capture, {captured:.2f} ms with (medians); "
            f"ratio per round {' '.join(f'{r:.3f}' for r in ratios)}, median {statistics.median(ratios):.4f}"
        )
        print(f"  {'':40s} {'alone':>8s} {'all timed':>11s}")
        for label, *_ in PARTS:
            mark = f"{alone.parts[label]:8.1f}" if label in alone.parts else " " * 8
            print(f"  {label:40s} {mark} {every.parts[label]:8.1f} µs")
        for name, value in (
            ("capture, all entry points", alone.total),
            ("  fixed part: all but parameter fps", alone.fixed),
            ("  the timers alone (no-op entry points)", instrument.total),
            ("  fixed part less the timers", alone.fixed - instrument.total),
        ):
            print(f"  {name:40s} {value:8.1f} µs = {value / 1e3 / plain * 100:.2f} % of a step")
        if share is not None:
            print(
                f"  py-spy: {share[0] * 100:.2f} % of {share[2]} loop samples in capture per step, "
                f"+{share[1] * 100:.2f} % once (first step: parameter names, lazy imports)",
                flush=True,
            )


if __name__ == "__main__":
    main()
