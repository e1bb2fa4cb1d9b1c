"""What capture costs a compiled training loop: step time and compile time, with and without it.

Run: `python bench/overhead.py [--rounds 5] [--steps 30] [--compile-rounds 3] [--threads 1]
[--backend aot_eager|inductor]`. Timings are printed, never asserted.

Steady state (one process): one compiled MLP (1024-2048x4-1000, 16.7 M parameters) trained with
AdamW on batch-32 batches from a DataLoader. Three configurations take turns, in an order rotated
every round:

    none        no capture
    doctor      what `torchrepro doctor` records: StepConfig(ranks_only=True) (in one process no RNG
                or batch digests; automatic fingerprint interval)
    default     CaptureSession with default settings, what `torchrepro run` records (automatic
                fingerprint interval)
    every-1     CaptureSession with StepConfig(fingerprint_every=1)

Each turn starts a session, runs --warmup + --steps steps and stops it; the first --warmup steps
of every turn are dropped (each session's first step, which names the parameters once, and the
automatic mode's 5 measuring steps, which fingerprint every step). Two measures:

- end to end: this script times every whole step (data, forward, backward, optimizer step, and
  the capture hooks inside them); median per configuration, its ratio to "none", and the median
  over rounds of the ratio within a round. On a shared machine this is noisy (see the p10-p90
  column): it cannot resolve 1 %.
- direct: capture's own time per step. Its optimizer post-step hook (parameter fingerprints, RNG
  state, event write) is bracketed by two hooks of ours (global post-step hooks run in
  registration order); the mean over kept steps amortizes the fingerprint interval. Plus the
  extra median time of fetching a batch (batch fingerprint). Divided by the "none" step time.

Compile time (fresh processes): "none" and "default" each compile the same model from a cold
state --compile-rounds times, alternated, each in a new interpreter with an empty
TORCHINDUCTOR_CACHE_DIR: compile time (Dynamo frames + AOT backward, from
torch._dynamo.utils.get_compilation_metrics), the first step's wall time (compile + run), the
structured-trace logging time torch itself measures (payloads + capture's handler), and
CaptureSession.start(). "every-1" compiles exactly like "default" and is not repeated.

Backend: aot_eager by default. Capture's per-step work runs outside the compiled graph, so it
does not depend on the backend; on CPU this Linear-dominated MLP spends its step in the same GEMMs
under either backend, and aot_eager compiles in about a second, so cold compiles can be repeated
enough times to compare. --backend inductor measures inductor's heavier compile (more trace records,
~10-15 s a cold compile here).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = ("none", "doctor", "default", "every-1")


def build(args: argparse.Namespace):
    """Model, compiled model, optimizer and an endless batch iterator (seeded: same every run)."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(args.in_features, args.width), nn.ReLU()]
    for _ in range(args.depth - 1):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    layers.append(nn.Linear(args.width, args.classes))
    model = nn.Sequential(*layers)
    if torch.distributed.is_initialized():  # --nproc: data parallel, gradients all-reduced over gloo
        compiled = nn.parallel.DistributedDataParallel(torch.compile(model, backend=args.backend))
    else:
        compiled = torch.compile(model, backend=args.backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    n = args.batch_size * 16
    data = TensorDataset(torch.randn(n, args.in_features), torch.randint(0, args.classes, (n,)))
    loader = DataLoader(
        data, batch_size=args.batch_size, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(0)
    )

    def batches():
        while True:  # a new iterator per epoch, as in a real loop
            yield from loader

    return model, compiled, optimizer, batches()


def make_step(compiled, optimizer, batches):
    import torch.nn.functional as F

    def step() -> tuple[float, float]:
        """(seconds for the whole step, seconds for fetching its batch)."""
        start = time.perf_counter()
        x, y = next(batches)
        fetched = time.perf_counter()
        loss = F.cross_entropy(compiled(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return time.perf_counter() - start, fetched - start

    return step


def session_for(config: str, run_dir: Path):
    from torchrepro.capture.session import CaptureConfig, CaptureSession
    from torchrepro.capture.steps import StepConfig

    if config == "none":
        return None
    every = 1 if config == "every-1" else None
    steps = StepConfig(fingerprint_every=every, ranks_only=config == "doctor")
    return CaptureSession(CaptureConfig(run_dir=run_dir, steps=steps))


def compile_seconds() -> tuple[float, float]:
    """(compile time, structured-logging overhead) summed over this process's compilation metrics."""
    from torch._dynamo.utils import get_compilation_metrics

    total = overhead = 0.0
    for m in get_compilation_metrics():
        total += (m.entire_frame_compile_time_s or 0.0) + (m.backward_cumulative_compile_time_us or 0) / 1e6
        overhead += m.structured_logging_overhead_s or 0.0
    return total, overhead


# --- steady state -----------------------------------------------------------------------------
class HookTimer:
    """Brackets capture's optimizer post-step hook between two of ours (global post-step hooks run
    in registration order): the time capture spends there each step, fingerprints included."""

    def __init__(self):
        self.t0 = 0.0
        self.samples: list[float] = []
        self._handles: list = []

    def before_start(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handles.append(register_optimizer_step_post_hook(self._enter))

    def after_start(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handles.append(register_optimizer_step_post_hook(self._leave))

    def _enter(self, *_):
        self.t0 = time.perf_counter()

    def _leave(self, *_):
        self.samples.append(time.perf_counter() - self.t0)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def steady_state(args: argparse.Namespace) -> dict:
    import torch

    import torchrepro.capture.session  # noqa: F401 - imported once, outside the timed turns

    model, compiled, optimizer, batches = build(args)
    step = make_step(compiled, optimizer, batches)
    params = sum(p.numel() for p in model.parameters())
    for _ in range(3):  # compile (forward and backward) and warm the allocator, uncaptured
        step()
    # per configuration, per round: kept (step, data) seconds; hook seconds; (start, first step, stop)
    times: dict[str, list[list[tuple[float, float]]]] = {c: [] for c in CONFIGS}
    hooks: dict[str, list[float]] = {c: [] for c in CONFIGS}
    one_time: dict[str, list[tuple[float, float, float]]] = {c: [] for c in CONFIGS}
    chosen: list[int] = []
    with tempfile.TemporaryDirectory(prefix="torchrepro-bench-") as tmp:
        for r in range(args.rounds):
            order = CONFIGS[r % len(CONFIGS) :] + CONFIGS[: r % len(CONFIGS)]
            for config in order:
                timer = HookTimer()
                timer.before_start()
                t0 = time.perf_counter()
                session = session_for(config, Path(tmp) / f"{config}-{r}")
                if session is not None:
                    session.start()
                started = time.perf_counter() - t0
                timer.after_start()
                kept = [step() for _ in range(args.warmup + args.steps)]
                timer.remove()
                t0 = time.perf_counter()
                if session is not None:
                    if config != "every-1" and session.steps is not None and session.steps.every is not None:
                        chosen.append(session.steps.every)
                    session.stop(0)
                stopped = time.perf_counter() - t0
                times[config].append(kept[args.warmup :])
                hooks[config] += timer.samples[args.warmup :]
                one_time[config].append((started, kept[0][0], stopped))
            print(
                f"  round {r + 1}/{args.rounds}: "
                + ", ".join(f"{c} {_median(w for w, _ in times[c][-1]) * 1e3:.1f} ms" for c in CONFIGS),
                flush=True,
            )
    return {
        "params": params,
        "times": times,
        "hooks": hooks,
        "one_time": one_time,
        "chosen": chosen,
        "threads": torch.get_num_threads(),
    }


def _median(values) -> float:
    return statistics.median(list(values))


def print_steady(result: dict, args: argparse.Namespace) -> None:
    times = result["times"]

    def flat(config: str, i: int) -> list[float]:
        return sorted(t[i] for rnd in times[config] for t in rnd)

    def per_round(config: str) -> float:
        return _median(
            _median(t[0] for t in a) / _median(t[0] for t in b) for a, b in zip(times[config], times["none"])
        )

    base, base_data = _median(flat("none", 0)), _median(flat("none", 1))
    print(
        f"\nsteady state: {result['params'] / 1e6:.1f} M parameters, batch {args.batch_size}, backend "
        f"{args.backend}, {result['threads']} thread(s); {args.rounds} rounds x {args.steps} kept steps per "
        f"configuration (first {args.warmup} of each turn dropped)"
    )
    print(
        f"{'config':<9} {'step ms':>8} {'p10-p90 ms':>11} {'ratio':>7} {'rounds':>7} {'hook ms':>8} "
        f"{'data ms':>8} {'direct':>7} {'start/stop ms':>14} {'1st step ms':>11}"
    )
    timer = statistics.fmean(result["hooks"]["none"])  # our two hooks with nothing between them
    for config in CONFIGS:
        wall = flat(config, 0)
        hook = statistics.fmean(result["hooks"][config]) - timer
        data = _median(flat(config, 1)) - base_data
        starts, firsts, stops = zip(*result["one_time"][config])
        p10, p90 = wall[len(wall) // 10], wall[(len(wall) * 9) // 10]
        print(
            f"{config:<9} {_median(wall) * 1e3:>8.2f} {f'{p10 * 1e3:.3g}-{p90 * 1e3:.3g}':>11} "
            f"{_median(wall) / base:>7.4f} {per_round(config):>7.4f} {hook * 1e3:>8.3f} {data * 1e3:>+8.3f} "
            f"{1 + (hook + data) / base:>7.4f} {_median(starts) * 1e3:>6.1f}/{_median(stops) * 1e3:<7.1f} "
            f"{_median(firsts) * 1e3:>11.1f}"
        )
    chosen = result["chosen"]
    print(
        f"automatic fingerprint interval (doctor, default): every {sorted(set(chosen))} step(s), over {len(chosen)} sessions"
        if chosen
        else "automatic fingerprint interval: not chosen (fewer than 6 steps per turn?)"
    )
    print(
        "ratio: median step time over that of 'none'; rounds: median over rounds of that ratio within the round.\n"
        "hook: mean time per step inside capture's optimizer post-step hook (parameter fingerprints, RNG state,\n"
        "event write), less the bracket's own time; data: extra median time to fetch a batch (batch fingerprint,\n"
        "RNG state); direct: 1 + (hook + data) / median 'none' step: capture's own time per step, measured\n"
        "directly, far less noisy than ratio. 1st step: a session's first step (it names the parameters once);\n"
        "it and the automatic mode's measuring steps are not in the other columns."
    )


# --- compile time ---------------------------------------------------------------------------
def compile_child(args: argparse.Namespace) -> None:
    """In a fresh process: (start capture,) build, run 3 steps; print one JSON line."""
    import torch
    import torch._dynamo  # noqa: F401 - start() imports it (~1.5 s), torch.compile would anyway: imported

    import torchrepro.capture.session  # noqa: F401 - here, it counts for neither configuration

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="torchrepro-bench-") as tmp:
        t0 = time.perf_counter()
        session = session_for(args.compile_child, Path(tmp))
        if session is not None:
            session.start()
        started = time.perf_counter() - t0
        model, compiled, optimizer, batches = build(args)
        step = make_step(compiled, optimizer, batches)
        first = step()[0]
        step(), step()
        if session is not None:
            session.stop(0)
    compile_s, logging_s = compile_seconds()
    print(
        json.dumps(
            {
                "config": args.compile_child,
                "compile_s": compile_s,
                "logging_s": logging_s,
                "first_step_s": first,
                "start_s": started,
            }
        )
    )


def compile_time(args: argparse.Namespace) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"none": [], "default": []}
    forwarded = [
        f"--{k.replace('_', '-')}={v}"
        for k, v in vars(args).items()
        if k in ("width", "depth", "in_features", "classes", "batch_size", "backend", "threads") and v
    ]
    for r in range(args.compile_rounds):
        for config in ("none", "default") if r % 2 == 0 else ("default", "none"):
            with tempfile.TemporaryDirectory(prefix="torchrepro-bench-cache-") as cache:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
                proc = subprocess.run(
                    [sys.executable, __file__, "--compile-child", config, *forwarded],
                    capture_output=True,
                    text=True,
                    env=env,
                )
            if proc.returncode != 0:
                sys.exit(f"compile child ({config}) failed:\n{proc.stderr[-3000:]}")
            out[config].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(
            f"  compile round {r + 1}/{args.compile_rounds}: "
            + ", ".join(f"{c} {out[c][-1]['compile_s']:.2f} s" for c in out),
            flush=True,
        )
    return out


def print_compile(result: dict[str, list[dict]], args: argparse.Namespace) -> None:
    def med(config: str, key: str) -> float:
        return statistics.median(x[key] for x in result[config])

    print(
        f"\ncompile time: cold, fresh process and empty inductor cache each, {args.compile_rounds} per "
        f"configuration, alternated; backend {args.backend}"
    )
    print(
        f"{'config':<10} {'compile s':>10} {'ratio':>7} {'1st step s':>11} {'ratio':>7} "
        f"{'trace logging s':>16} {'session start s':>16}"
    )
    for config in result:
        print(
            f"{config:<10} {med(config, 'compile_s'):>10.3f} {med(config, 'compile_s') / med('none', 'compile_s'):>7.3f}"
            f" {med(config, 'first_step_s'):>11.3f} {med(config, 'first_step_s') / med('none', 'first_step_s'):>7.3f}"
            f" {med(config, 'logging_s'):>16.4f} {med(config, 'start_s'):>16.3f}"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="steady-state rounds, each runs every configuration (0: skip)")
    p.add_argument("--steps", type=int, default=30, help="kept steps per configuration per round")
    p.add_argument("--warmup", type=int, default=8, help="steps dropped at the start of every turn")
    p.add_argument("--compile-rounds", type=int, default=3, help="cold compiles per configuration (0: skip)")
    p.add_argument("--backend", default="aot_eager", help="aot_eager (default) or inductor")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--depth", type=int, default=4, help="hidden layers")
    p.add_argument("--in-features", type=int, default=1024)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--nproc", type=int, default=1, help="ranks (DDP over gloo, launched with torchrun); rank 0 reports")
    p.add_argument("--compile-child", choices=("none", "default"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    if argv is None and "OVERHEAD_ARGV" in os.environ:  # a rank of --nproc (torchrun would parse --nproc itself)
        argv = json.loads(os.environ["OVERHEAD_ARGV"])
    args = parse_args(argv)
    if args.compile_child:
        compile_child(args)
        return
    if args.nproc > 1 and "RANK" not in os.environ:  # relaunch this script on every rank
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(args.nproc),
            __file__,
        ]
        env = {**os.environ, "OVERHEAD_ARGV": json.dumps(argv if argv is not None else sys.argv[1:])}
        raise SystemExit(subprocess.run(cmd, env=env).returncode)
    import torch

    if args.nproc > 1:
        torch.distributed.init_process_group("gloo")
        args.compile_rounds = 0  # cold compiles are measured single-process
        if torch.distributed.get_rank() != 0:
            sys.stdout = open(os.devnull, "w")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{platform.processor() or platform.machine()}, {args.nproc} rank(s)"
    )
    steady = steady_state(args) if args.rounds else None
    compiled = compile_time(args) if args.compile_rounds else None
    if steady:
        print_steady(steady, args)
    if compiled:
        print_compile(compiled, args)
    if args.nproc > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
