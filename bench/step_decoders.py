"""Could msgspec or numpy structured arrays replace the hand-written C decoder of ``steps.bin``?
Each reads the same doctor-like steps (the steps the tests use) in one run, side by side: bytes a
step on disk and CPU µs a step to read them back as Step events (best of 9), with the ratios to the
C codec's.

    .venv/bin/python bench/step_decoders.py [--steps 3000] [--check]

- ``steps.bin C`` / ``steps.bin Py``: the log as written (eventlog/_stepcodec.c, stepstream.py).
- ``msgspec msgpack``: each step a msgpack array of its values (msgspec's own encoder and typed
  decoder straight into a tuple of the step's fields), then the same Step built from it. It holds no
  delta: every value of every step is written again.
- ``numpy struct``: a fixed-width record a step (np.frombuffer of a structured dtype: floats and
  ints as 8 bytes, fingerprints as 8 raw bytes, NaN for None), then the Steps built from its
  columns. It holds no lists or dicts (the parameter and RNG fingerprints left out: it reads less
  than the others) and no value of another type than its column's.
"""

from __future__ import annotations

import gc
import math

import msgspec
import numpy as np
from event_builders import best_us, steps_asked  # (the same timer, and the steps the tests use)

from torchrepro.eventlog import stepstream
from torchrepro.eventlog.event_codec import step_decoder, step_from_values, step_values
from torchrepro.eventlog.events import STEP_FIELDS, Step
from torchrepro.eventlog.stepstream import Encoder


FIXED = [("t", "f8"), ("index", "i8"), ("loss", "f8"), ("time_s", "f8"), ("batch_fp", "V8"), ("rng_fp", "V8")]


def main() -> None:
    made, check = steps_asked()
    n = len(made)
    encoder = Encoder(STEP_FIELDS)
    stream = encoder.header() + b"".join(encoder.encode([0, *step_values(s)]) for s in made)

    def c_or_py() -> None:
        decoder = step_decoder()
        decoder.feed(stream)

    packed = [msgspec.msgpack.encode([0, *step_values(s)]) for s in made]
    framed = b"".join(packed)
    row = msgspec.msgpack.Decoder(tuple)

    def msgpack() -> None:
        decode = row.decode
        for one in packed:
            values = decode(one)
            step_from_values(list(values[1:]), None)

    dtype = np.dtype(FIXED)
    table = np.zeros(n, dtype)
    for k, s in enumerate(made):
        table[k] = (
            s.t,
            s.index,
            math.nan if s.loss is None else s.loss,
            s.time_s,
            bytes.fromhex(s.batch_fp or "0" * 16),
            bytes.fromhex(s.rng_fp or "0" * 16),
        )
    raw = table.tobytes()

    def structured() -> None:
        rows = np.frombuffer(raw, dtype)
        ts, indices, losses, times = (rows[name].tolist() for name in ("t", "index", "loss", "time_s"))
        batch, rng = ([v.hex() for v in rows[name].tolist()] for name in ("batch_fp", "rng_fp"))
        for k in range(n):
            Step(t=ts[k], index=indices[k], loss=losses[k], time_s=times[k], batch_fp=batch[k], rng_fp=rng[k])

    gc.disable()
    results: dict[str, tuple[float, float]] = {}
    saved = stepstream._C
    if saved is not None:
        results["steps.bin C"] = (len(stream) / n, best_us(c_or_py, n))
    stepstream._C = None
    results["steps.bin Py"] = (len(stream) / n, best_us(c_or_py, n))
    stepstream._C = saved
    results["msgspec msgpack"] = (len(framed) / n, best_us(msgpack, n))
    results["numpy struct"] = (len(raw) / n, best_us(structured, n))
    base = results.get("steps.bin C", results["steps.bin Py"])
    print(f"{n} steps ({'check' if check else 'doctor'}-like): read back as Step events, CPU µs a step, best of 9")
    print(f"{'':>16} {'B/step':>7} {'x C':>6} {'read µs':>8} {'x C':>6}")
    for name, (size, us) in results.items():
        print(f"{name:>16} {size:>7.1f} {size / base[0]:>6.2f} {us:>8.2f} {us / base[1]:>6.2f}")


if __name__ == "__main__":
    main()
