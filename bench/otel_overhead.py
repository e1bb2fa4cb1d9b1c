"""What live OpenTelemetry export costs a training step, side by side in one process.

Run: `python bench/otel_overhead.py [--rounds 5] [--steps 40] [--width 1024]`. Printed, never asserted.

The compiled MLP of bench/overhead.py trains under a CaptureSession in three configurations that
take turns (order rotated every round):

    capture      capture only (no export)
    otlp         capture + export to a collector that answers (an OTLP/HTTP receiver in another process)
    otlp-down    capture + export to a port where nothing listens (connection refused)

By default exports are made pessimistically frequent (--export-every 200: OTEL_BSP_SCHEDULE_DELAY and
OTEL_METRIC_EXPORT_INTERVAL 200 ms), so the SDK's background threads encode and send during the timed
steps; --export-every 0 keeps the defaults (5 s, 10 s). Two measures:

- end to end: median whole-step time per configuration, its ratio to "capture", and the median over
  rounds of the ratio within a round (noisy on a shared machine);
- direct: the time the exporter's listener takes per step event (it records the step-time
  histogram; compile events, which make spans, happen before the timed steps), median and mean
  (the mean includes the rare moments the interpreter hands the GIL to the SDK's threads there).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from overhead import build, make_step  # the same model and step as bench/overhead.py

CONFIGS = ("capture", "otlp", "otlp-down")

_RECEIVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
server = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Timed:
    """Wraps the exporter's listener: the seconds each step event spends in it."""

    def __init__(self, listener):
        self.listener, self.samples = listener, []

    def __call__(self, event) -> None:
        t0 = time.perf_counter()
        self.listener(event)
        if event.kind == "step":
            self.samples.append(time.perf_counter() - t0)


def run(args: argparse.Namespace) -> None:
    import torch

    from torchrepro.capture.session import CaptureConfig, CaptureSession
    from torchrepro.telemetry.otlp import ENDPOINT_VAR

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.export_every:
        os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", str(args.export_every))
        os.environ.setdefault("OTEL_METRIC_EXPORT_INTERVAL", str(args.export_every))
    receiver = subprocess.Popen([sys.executable, "-c", _RECEIVER], stdout=subprocess.PIPE, text=True)
    endpoints = {
        "capture": None,
        "otlp": f"http://127.0.0.1:{receiver.stdout.readline().strip()}",
        "otlp-down": f"http://127.0.0.1:{_free_port()}",
    }
    model, compiled, optimizer, batches = build(args)
    step = make_step(compiled, optimizer, batches)
    for _ in range(3):  # compile and warm up, uncaptured
        step()
    times: dict[str, list[list[float]]] = {c: [] for c in CONFIGS}
    direct: dict[str, list[float]] = {c: [] for c in CONFIGS}
    try:
        with tempfile.TemporaryDirectory(prefix="torchrepro-bench-otel-") as tmp:
            for r in range(args.rounds):
                for config in CONFIGS[r % 3 :] + CONFIGS[: r % 3]:
                    os.environ.pop(ENDPOINT_VAR, None)
                    if endpoints[config]:
                        os.environ[ENDPOINT_VAR] = endpoints[config]
                    session = CaptureSession(CaptureConfig(run_dir=Path(tmp) / f"{config}-{r}"))
                    session.start()
                    timed = [_Timed(listener) for listener in session.writer.listeners]
                    session.writer.listeners[:] = timed
                    kept = [step()[0] for _ in range(args.warmup + args.steps)][args.warmup :]
                    session.stop(0)
                    times[config].append(kept)
                    direct[config] += [x for t in timed for x in t.samples[args.warmup :]]
                print(
                    f"  round {r + 1}/{args.rounds}: "
                    + ", ".join(f"{c} {statistics.median(times[c][-1]) * 1e3:.2f} ms" for c in CONFIGS),
                    flush=True,
                )
    finally:
        os.environ.pop(ENDPOINT_VAR, None)
        receiver.kill()
        receiver.wait()
    base = statistics.median(t for turn in times["capture"] for t in turn)
    print(
        f"\n{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, {torch.get_num_threads()} "
        f"thread(s), {args.rounds} rounds x {args.steps} steps, backend {args.backend}, exports every "
        f"{args.export_every or 'default'} ms"
    )
    print(
        f"{'config':<10} {'median step':>12} {'ratio':>7} {'ratio (median per round)':>25} {'listener/step med/mean':>22}"
    )
    for config in CONFIGS:
        median = statistics.median(t for turn in times[config] for t in turn)
        per_round = statistics.median(
            statistics.median(a) / statistics.median(b) for a, b in zip(times[config], times["capture"])
        )
        d = direct[config]
        listener = f"{statistics.median(d) * 1e6:.1f} / {statistics.mean(d) * 1e6:.1f} us" if d else "-"
        print(f"{config:<10} {median * 1e3:>9.2f} ms {median / base:>7.3f} {per_round:>25.3f} {listener:>22}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=40, help="kept steps per configuration per round")
    p.add_argument("--warmup", type=int, default=8, help="steps dropped at the start of every turn")
    p.add_argument("--backend", default="aot_eager")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=4, help="hidden layers")
    p.add_argument("--in-features", type=int, default=512)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (0: torch's default)")
    p.add_argument(
        "--export-every",
        type=int,
        default=200,
        metavar="MS",
        help="OTEL_BSP_SCHEDULE_DELAY and OTEL_METRIC_EXPORT_INTERVAL (0: the defaults, 5 s and 10 s)",
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    run(parse_args())
