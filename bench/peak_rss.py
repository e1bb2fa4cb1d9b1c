"""Peak memory of a training script run plainly and under ``torchrepro doctor`` (issue 35: doctor's
peak RSS within 1 % of the plain run's).

    python bench/peak_rss.py [--rounds 3] [SCRIPT [-- ARGS]]   # default: examples/train_digits.py

Each measurement runs in a fresh wrapper process, whose ``RUSAGE_CHILDREN`` peak is the largest
process below it: the script itself (``doctor``'s own process never imports torch). The plain run and
``doctor`` take turns; per round the ratio, then min/median/max.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEAK = (
    "import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)"
)


def peak_kb(cmd: list[str], cwd: Path) -> int:
    """The peak RSS (KB) of the largest process ``cmd`` started, itself included."""
    done = subprocess.run([sys.executable, "-c", PEAK, *cmd], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"peak_rss: {' '.join(cmd)} exited {done.returncode}: {done.stderr[-500:]}")
    return int(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("script", nargs="?", default=str(ROOT / "examples" / "train_digits.py"))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the script's arguments")
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    script = str(Path(opts.script).resolve())
    ratios = []
    for r in range(opts.rounds):
        with tempfile.TemporaryDirectory(prefix="torchrepro-rss-") as tmp:
            plain = [sys.executable, script, *args]
            doctor = [sys.executable, "-m", "torchrepro", "doctor", "--out", f"{tmp}/run", script, "--", *args]
            order = [("plain", plain), ("doctor", doctor)][:: 1 if r % 2 == 0 else -1]
            kb = {name: peak_kb(cmd, Path(tmp)) for name, cmd in order}
        ratios.append(kb["doctor"] / kb["plain"])
        print(
            f"round {r + 1}: plain {kb['plain'] / 1024:.1f} MB, doctor {kb['doctor'] / 1024:.1f} MB ({ratios[-1]:.4f}x)"
        )
    print(f"doctor / plain peak RSS: {min(ratios):.4f}/{statistics.median(ratios):.4f}/{max(ratios):.4f}x")


if __name__ == "__main__":
    main()
