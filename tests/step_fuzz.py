"""The fuzz of tests/e2e/test_step_damage_fuzz.py, run in a child process under a memory limit:

    python tests/step_fuzz.py SEED CASES

Mutates steps.bin streams (with checks and without, of doctor-like and check-like steps) CASES
times with a seeded RNG, reads each with the C reader and the Python one, and exits non-zero at the
first disagreement, crash, over-long read or problem without its byte; prints a JSON summary."""

from __future__ import annotations

import json
import random
import resource
import signal
import sys
import time
from typing import Any

from synthetic_runs import training_steps
from torchrepro.eventlog import stepstream
from torchrepro.eventlog.event_codec import step_values
from torchrepro.eventlog.events import STEP_FIELDS
from torchrepro.eventlog.stepstream import KEYFRAME, Decoder, Encoder

LIMIT = 3 << 29  # 1.5 GiB of address space
SLOW = 2.0  # seconds a read may take


def streams() -> list[bytes]:
    out = []
    for checked in (True, False):
        for check in (False, True):
            encoder = Encoder(STEP_FIELDS, checked)
            steps = training_steps(40, check=check, seed=3)
            records = b"".join(encoder.encode([k, *step_values(s)]) for k, s in enumerate(steps))
            out.append(encoder.header() + records + encoder.seal())
    return out


def varint(n: int) -> bytes:
    out = bytearray()
    stepstream._varint(n, out)
    return bytes(out)


def mutate(rng: random.Random, blob: bytes) -> bytes:
    b = bytearray(blob)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        at = rng.randrange(len(b) + 1)
        how = rng.randrange(9)
        if how == 0:
            del b[at:]
        elif how == 1 and at < len(b):
            b[at] ^= 1 << rng.randrange(8)
        elif how == 2 and at < len(b):
            b[at] = rng.randrange(256)
        elif how == 3:
            b[at:at] = varint(rng.choice([2**31, 2**63, 2**69, 2**200, 16 << 20, rng.randrange(1 << 16)]))
        elif how == 4:
            b[at:at] = bytes(rng.choice([1, 3, 4, 100, 5000]))
        elif how == 5:
            del b[at : at + rng.randrange(1, 40)]
        elif how == 6:
            end = min(len(b), at + rng.randrange(1, 400))
            b[at:at] = b[at:end] * rng.choice([1, 2, 5])
        elif how == 7:  # "the list changed, no item changed" and "one item changed", many times
            b[at:at] = rng.choice([b"\x04\xc4\x00", b"\x05\xc4\x01\x01", b"\x04\xc5\x00"]) * rng.choice([10, 1000])
        elif how == 8:
            b[at:at] = KEYFRAME + bytes([rng.randrange(256)]) * rng.randrange(1, 6)
    return bytes(b)


def read(blob: bytes, codec: Any, pieces: int) -> tuple[Any, ...]:
    saved, stepstream._C = stepstream._C, codec
    try:
        decoder = Decoder(dict, STEP_FIELDS, tuple)
    finally:
        stepstream._C = saved
    t0 = time.monotonic()
    events: list[Any] = []
    for k in range(0, len(blob), pieces):
        events += decoder.feed(blob[k : k + pieces])
    events += decoder.finish()
    took = time.monotonic() - t0
    if took > SLOW:
        raise AssertionError(f"a read took {took:.1f} s")
    return repr(events), decoder.damaged, decoder.problems, decoder.truncated


def main() -> None:
    seed, cases = int(sys.argv[1]), int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError(f"a read of over {5 * SLOW:.0f} s")

    signal.signal(signal.SIGALRM, hung)  # a read that hangs is stopped, and the case printed
    rng = random.Random(seed)
    bases = streams()
    codecs = [stepstream._C, None] if stepstream._C is not None else [None]
    damaged = clean = 0
    for case in range(cases):
        blob = mutate(rng, rng.choice(bases))
        pieces = rng.choice([1 << 20, 1 << 20, 1 << 20, 61, 4096])
        try:
            signal.setitimer(signal.ITIMER_REAL, 5 * SLOW * len(codecs))
            got = [read(blob, codec, pieces) for codec in codecs]
            signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as exc:
            print(f"case {case}: {type(exc).__name__}: {exc}\n{blob!r}")
            sys.exit(1)
        if any(g != got[0] for g in got):
            print(f"case {case}: the readers disagree\nC:      {got[0][1:]}\nPython: {got[-1][1:]}\n{blob!r}")
            sys.exit(1)
        if got[0][1]:
            damaged += 1
            if not all(p.startswith("byte ") for p in got[0][2]):
                print(f"case {case}: a problem without its byte: {got[0][2]}")
                sys.exit(1)
        else:
            clean += 1
    print(json.dumps({"seed": seed, "cases": cases, "damaged": damaged, "clean": clean}))


if __name__ == "__main__":
    main()
