"""Reading a ``steps.bin`` that a crash extended with zero bytes (as some file systems leave it):
300 steps, then ``--mb`` MB of zeros, read by ``read_events`` with the C codec and with the Python
one, side by side in one run (CPU seconds, one read each).

    .venv/bin/python bench/step_log_zeros.py [--mb 300]
    PYTHONPATH=OLD/src .venv/bin/python bench/step_log_zeros.py   # another tree's readers
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from event_builders import training_steps  # (the steps the tests use)

from torchrepro.eventlog import stepstream
from torchrepro.eventlog.event_reader import read_events
from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import Header, Step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank-0" / "events.jsonl"
        write_all(path, [Header(), *training_steps(300)])
        with open(path.with_name(stepstream.STEPS_FILE), "ab") as fp:
            fp.write(bytes(args.mb << 20))
        took = {}
        for name, codec in (("C", stepstream._C), ("Python", None)):
            if name == "C" and codec is None:
                print("C: not built here (pip install -e .)")
                continue
            stepstream._C = codec
            t0 = time.process_time()
            log = read_events(path)
            took[name] = time.process_time() - t0
            print(
                f"{name:>7}: {took[name]:.2f} s CPU, {len(log.of(Step))} steps, {log.bad_lines} damaged: {log.problems[-1]}"
            )
        if len(took) == 2:
            print(f"C / Python: {took['C'] / took['Python']:.2f}")


if __name__ == "__main__":
    main()
