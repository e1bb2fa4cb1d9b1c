"""What ``torchrepro check`` (2 runs under capture, then the comparison) costs next to one plain run.

    python bench/check_cost.py [--rounds 3] [SCRIPT]       # default: examples/train_digits.py

Each round runs the script once plainly (``python SCRIPT``) and ``torchrepro check SCRIPT`` once,
in an order swapped every round, each in a fresh process; wall and CPU times (of the whole
process tree: the machine's other jobs inflate wall time, not CPU time), the CPU ratio within
each round and its median are printed (2.0 would be two plain runs and nothing else).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process tree) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, capture_output=True)  # check exits 1 when the runs differ: timed all the same
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("script", nargs="?", default=str(ROOT / "examples" / "train_digits.py"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ratios = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="torchrepro-checkcost-") as tmp:
            plain = [sys.executable, args.script]
            check = [sys.executable, "-m", "torchrepro", "check", "--out", str(Path(tmp) / "check"), args.script]
            order = (("plain", plain), ("check", check)) if r % 2 == 0 else (("check", check), ("plain", plain))
            took = {name: timed(cmd, Path(tmp)) for name, cmd in order}
        ratios.append(took["check"][1] / took["plain"][1])
        print(
            f"round {r + 1}: plain {took['plain'][0]:.2f} s wall {took['plain'][1]:.2f} s CPU, check "
            f"{took['check'][0]:.2f} s wall {took['check'][1]:.2f} s CPU; CPU ratio {ratios[-1]:.3f}",
            flush=True,
        )
    print(f"median CPU ratio check / plain: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
