"""What a step event costs to write and read, as a JSON line and as a compact record of
``steps.bin`` (eventlog/stepstream.py), with ``orjson`` of the same line as the yardstick: CPU µs
per step (best of 9 passes over the same steps) and bytes per step, in one run; ``steps.bin`` with
the C codec (eventlog/_stepcodec.c) and with the Python one side by side.

    .venv/bin/python bench/event_builders.py [--steps 3000]

The steps are as ``doctor`` records them on a training loop (loss, step time, batch and RNG digests
every step, the parameters fingerprinted every 13th); ``--check`` makes them as ``check`` does
(every parameter and the gradients every step). Writing is the event's bytes only (the ``write``
system call is the same one either way); reading a record includes building its Step event.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from torchrepro.eventlog import stepstream
from torchrepro.eventlog.event_codec import common_step_values, encode_line, step_decoder, step_values
from torchrepro.eventlog.events import Step, field_names
from torchrepro.eventlog.stepstream import Encoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from synthetic_runs import training_steps  # noqa: E402  (the steps the tests use too)


def best_us(run: Callable[[], object], n: int) -> float:
    """Best of 9 of the CPU µs per step of ``run`` (which handles ``n`` steps)."""
    best = float("inf")
    for _ in range(9):
        t0 = time.process_time()
        run()
        best = min(best, time.process_time() - t0)
    return best / n * 1e6


def steps_asked() -> tuple[list[Step], bool]:
    """The steps the command line asks for (``--steps``, ``--check``), and whether as check's."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--check", action="store_true", help="steps as check records them")
    args = parser.parse_args()
    return training_steps(args.steps, check=args.check), args.check


def main() -> None:
    made, check = steps_asked()
    lines = [encode_line(s) for s in made]
    encoder = Encoder(field_names(Step))
    stream = encoder.header() + b"".join(encoder.encode([0, *step_values(s)]) for s in made)

    def encode_all() -> None:
        enc = Encoder(field_names(Step))
        for s in made:
            enc.encode([0, *step_values(s)])

    def decode_all() -> None:
        decoder = step_decoder()
        decoder.feed(stream)

    gc.disable()
    n = len(made)
    print(f"{n} steps ({'check' if check else 'doctor'}-like), CPU µs per step, best of 9")
    print(f"{'':>14} {'bytes':>7} {'write µs':>9} {'read µs':>8}")
    print(
        f"{'JSON line':>14} {sum(map(len, lines)) / n:>7.1f} {best_us(lambda: [encode_line(s) for s in made], n):>9.2f} "
        f"{best_us(lambda: [orjson.loads(line) for line in lines], n):>8.2f}  (read: orjson.loads alone)"
    )
    codecs = {"steps.bin C": stepstream._C, "steps.bin Py": None}
    for name, codec in codecs.items():
        if name == "steps.bin C" and codec is None:
            print(f"{name:>14}  (not built here: pip install -e .)")
            continue
        stepstream._C = codec
        print(f"{name:>14} {len(stream) / n:>7.1f} {best_us(encode_all, n):>9.2f} {best_us(decode_all, n):>8.2f}")
    # what doctor writes most steps as (EventWriter.write_step: no digest but the loss and times), with
    # the C codec where it was built; with and without the records' checks, taking turns
    stepstream._C = codecs["steps.bin C"]
    common = [common_step_values(0, s.t, 0, s.index, s.loss, 1, s.time_s, 0) for s in made]
    for checked in (True, False, True, False):
        encoder = Encoder(field_names(Step), checked)
        size = sum(len(encoder.encode(values)) for values in common)

        def encode_common(checked: bool = checked) -> None:
            encode = Encoder(field_names(Step), checked).encode
            for values in common:
                encode(values)

        print(
            f"{'common step':>14} {size / n:>7.1f} {best_us(encode_common, n):>9.2f}"
            f"  ({'with' if checked else 'without'} the records' checks)"
        )


if __name__ == "__main__":
    main()
