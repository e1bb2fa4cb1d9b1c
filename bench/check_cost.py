"""What ``torchrepro check`` (2 runs under capture, then the comparison) costs next to one plain run.

    python bench/check_cost.py [--rounds 3] [--baseline OTHER/src] [SCRIPT]   # default: examples/train_digits.py
    python bench/check_cost.py --corpus NAME [--rounds 3]   # a script of the real-script corpus (realworld/)

``--corpus NAME`` measures an entry of ``realworld/run.py``'s corpus (one rank) with its arguments,
in a work directory prepared as ``make realworld`` prepares it (its synthetic data written first).

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
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIDE_BY_SIDE = "TORCHREPRO_CHECK_SIDE_BY_SIDE"  # (commands/check/runs.py)


@dataclass
class Target:
    """What is measured: the script's command line (its arguments), where it runs and its environment."""

    argv: list[str]
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)


def corpus_target(name: str, root: Path) -> Target:
    """An entry of the real-script corpus, its work directory prepared under ``root``."""
    sys.path.insert(0, str(ROOT / "realworld"))
    from run import SCRIPTS, Runner  # realworld/run.py

    entry = next((s for s in SCRIPTS if s.name == name), None)
    if entry is None:
        sys.exit(f"check_cost: no corpus entry {name!r}; one of: {', '.join(s.name for s in SCRIPTS)}")
    if entry.nproc > 1:
        sys.exit(f"check_cost: {name} runs on {entry.nproc} ranks; measure a one-rank entry")
    runner = Runner(entry, root, timeout=3600)
    runner.prepare()
    env = {k: v for k, v in runner.env.items() if os.environ.get(k) != v}  # its variables and PYTHONPATH
    return Target([entry.entry, "--", *entry.args] if entry.args else [entry.entry], runner.work, env)


def timed(cmd: list[str], src: Path, cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process tree) of one command, with torchrepro from ``src``."""
    paths = env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
    env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(src), *filter(None, [paths])])}
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
    parser.add_argument("--corpus", metavar="NAME", help="an entry of the real-script corpus instead of SCRIPT")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="torchrepro-checkcost-work-"))
    try:
        measure(args, corpus_target(args.corpus, work) if args.corpus else Target([args.script], work))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(args: argparse.Namespace, target: Target) -> None:
    """Plain run and checks in turn, ``args.rounds`` times; the ratios printed."""
    plain_argv = [a for a in target.argv if a != "--"]  # (`--` separates check's options from the script's)
    trees = {"check": ROOT / "src", **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    for src in trees.values():
        compileall.compile_dir(src, quiet=1)
    checks = {**{name: (src, {}) for name, src in trees.items()}, "sequential": (trees["check"], {SIDE_BY_SIDE: "0"})}
    walls: dict[str, list[float]] = {name: [] for name in checks}
    cpus: dict[str, list[float]] = {name: [] for name in checks}
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="torchrepro-checkcost-") as tmp:
            commands = {"plain": ([sys.executable, *plain_argv], trees["check"], target.env)}
            for name, (src, env) in checks.items():
                out = str(Path(tmp) / name)
                check = [sys.executable, "-m", "torchrepro", "check", "--no-fixes", "--out", out, *target.argv]
                commands[name] = (check, src, {**target.env, **env})
            names = list(commands)  # each takes every place in turn: the machine's speed drifts within a round
            order = names[r % len(names) :] + names[: r % len(names)]
            took = {name: timed(*commands[name][:2], target.cwd, commands[name][2]) for name in order}
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
