"""What ``torchrepro check`` (2 runs under capture, then the comparison) costs next to one plain run.

    python bench/check_cost.py [--rounds 3] [--baseline OTHER/src] [SCRIPT]   # default: examples/train_digits.py

Each round runs the script once plainly (``python SCRIPT``), ``torchrepro check SCRIPT`` once with
its runs side by side (``check``, the default where the cores allow) and once with them one after
the other (``sequential``, ``TORCHREPRO_CHECK_SIDE_BY_SIDE=0``), in an order rotated every round,
each in a fresh process; wall and CPU times (of the whole process tree: the machine's other jobs
inflate wall time more than CPU time), the wall and CPU ratios to the plain run within each round
and their min/median/max are printed (the target: check ≤ 1.5x the plain run's wall time). With
``--baseline``, another tree's ``check`` (its ``src`` first on ``PYTHONPATH``) runs in every round too,
beside this tree's and the same plain run: the per-round CPU difference is what a change did.
Each tree is byte-compiled first, as pip leaves an installed package: with PYTHONDONTWRITEBYTECODE=1
(set on this project's machines) every process would otherwise compile torchrepro's sources again,
~0.15 s of CPU each, which no installed copy pays.
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIDE_BY_SIDE = "TORCHREPRO_CHECK_SIDE_BY_SIDE"  # (commands/check/runs.py)


def timed(cmd: list[str], src: Path, cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process tree) of one command, with torchrepro from ``src``."""
    env = {
        **os.environ,
        **env,
        "PYTHONPATH": os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, capture_output=True, env=env)  # check exits 1 when the runs differ: timed all the same
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}/{statistics.median(values):.2f}/{max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("script", nargs="?", default=str(ROOT / "examples" / "train_digits.py"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another tree's src: its check runs beside this tree's")
    args = parser.parse_args()
    trees = {"check": ROOT / "src", **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    for src in trees.values():
        compileall.compile_dir(src, quiet=1)
    checks = {**{name: (src, {}) for name, src in trees.items()}, "sequential": (trees["check"], {SIDE_BY_SIDE: "0"})}
    walls: dict[str, list[float]] = {name: [] for name in checks}
    cpus: dict[str, list[float]] = {name: [] for name in checks}
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="torchrepro-checkcost-") as tmp:
            commands = {"plain": ([sys.executable, args.script], trees["check"], {})}
            for name, (src, env) in checks.items():
                out = str(Path(tmp) / name)
                commands[name] = ([sys.executable, "-m", "torchrepro", "check", "--out", out, args.script], src, env)
            names = list(commands)  # each takes every place in turn: the machine's speed drifts within a round
            order = names[r % len(names) :] + names[: r % len(names)]
            took = {name: timed(*commands[name][:2], Path(tmp), commands[name][2]) for name in order}
        line = f"round {r + 1}: plain {took['plain'][0]:.2f} s wall {took['plain'][1]:.2f} s CPU"
        for name in checks:
            walls[name].append(took[name][0] / took["plain"][0])
            cpus[name].append(took[name][1] / took["plain"][1])
            line += f"; {name} {took[name][0]:.2f} s wall ({walls[name][-1]:.2f}x) {took[name][1]:.2f} s CPU ({cpus[name][-1]:.2f}x)"
        print(line, flush=True)
    for name in checks:
        print(
            f"{name} / plain: wall {spread(walls[name])}x, CPU {spread(cpus[name])}x (min/median/max of {args.rounds})"
        )


if __name__ == "__main__":
    main()
