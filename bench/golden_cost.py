"""What a golden run costs: its directory's size, and ``golden record`` / ``golden check`` next to
one plain run of the script (docs/evidence/performance.md, "Golden runs").

    python bench/golden_cost.py tests/scripts/gpt_sized.py -- 20 10m   # the 10M GPT, 20 steps
    python bench/golden_cost.py --corpus nanoGPT                         # realworld/nanoGPT, as make realworld runs it
    python bench/golden_cost.py --rounds 2 --band SCRIPT [-- ARGS]       # the golden with its run-to-run band

A plain run first fills the compile cache (not counted: a cold compile would weigh on whichever run
came first). Then each round runs the script once plainly (``python SCRIPT ARGS``), ``torchrepro golden record`` once
and ``torchrepro golden check --no-localize`` of that recording once, each in a fresh process, in an
order rotated every round (the check always after its recording); wall and CPU times (of the whole
process tree) and their ratios to the plain run within the round are printed, then the golden's size
on disk: in all, per recorded step and per parameter tensor and step (from its ``golden.json``), and
the verdict each check reached. It measures and prints; it asserts nothing.
"""

from __future__ import annotations

import argparse
import compileall
import json
import shutil
import sys
import tempfile
from pathlib import Path

from check_cost import ROOT, Target, corpus_target, spread, timed  # bench/check_cost.py


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("script", nargs="?", help="the script (or --corpus NAME)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the script's arguments")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--band", action="store_true", help="record the golden with its run-to-run band")
    parser.add_argument("--corpus", metavar="NAME", help="an entry of the real-script corpus instead of SCRIPT")
    opts = parser.parse_args()
    if not opts.script and not opts.corpus:
        parser.error("give a SCRIPT or --corpus NAME")
    work = Path(tempfile.mkdtemp(prefix="torchrepro-goldencost-work-"))
    try:
        args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
        target = corpus_target(opts.corpus, work) if opts.corpus else Target([opts.script, *args], Path.cwd())
        measure(target, opts.rounds, opts.band)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(target: Target, rounds: int, band: bool) -> None:
    """Plain run, recording and check in turn, ``rounds`` times; ratios and sizes printed."""
    src = ROOT / "src"
    compileall.compile_dir(src, quiet=1)
    script_argv = [a for a in target.argv if a != "--"]
    tool = [sys.executable, "-m", "torchrepro", "golden"]
    ratios: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in ("record", "check")}
    warm = timed([sys.executable, *script_argv], src, target.cwd, target.env)  # compiles once: every run after is warm
    print(f"warm-up (fills the compile cache, not counted): {warm[0]:.2f} s wall {warm[1]:.2f} s CPU", flush=True)
    for r in range(rounds):
        with tempfile.TemporaryDirectory(prefix="torchrepro-goldencost-") as tmp:
            golden, run = Path(tmp) / "golden", Path(tmp) / "check"
            record = [*tool, "record", *(["--band"] if band else []), "--out", str(golden), *target.argv]
            check = [*tool, "check", "--no-localize", "--out", str(run), str(golden), *target.argv]
            steps = [("plain", [sys.executable, *script_argv]), ("record", record), ("check", check)]
            if r % 2:  # the plain run after the golden's two, every other round
                steps = steps[1:] + steps[:1]
            took = {name: timed(cmd, src, target.cwd, target.env) for name, cmd in steps}
            manifest = json.loads((golden / "golden.json").read_text())
            report = run / "report.json"
            verdict = json.loads(report.read_text())["golden_verdict"] if report.is_file() else "no report"
        line = f"round {r + 1}: plain {took['plain'][0]:.2f} s wall {took['plain'][1]:.2f} s CPU"
        for name in ratios:
            ratios[name]["wall"].append(took[name][0] / took["plain"][0])
            ratios[name]["cpu"].append(took[name][1] / took["plain"][1])
            line += (
                f"; {name} {took[name][0]:.2f} s wall ({ratios[name]['wall'][-1]:.2f}x) "
                f"{took[name][1]:.2f} s CPU ({ratios[name]['cpu'][-1]:.2f}x)"
            )
        sizes = manifest["sizes"]
        print(
            f"{line}; golden {sizes['bytes'] / 1e3:.1f} kB ({sizes['fixed'] / 1e3:.1f} kB once; {sizes['steps']} steps: "
            f"{sizes['per_step'] / 1e3:.2f} kB a step, {sizes['parameters']} tensors: {sizes['per_parameter_step']:.0f} B a "
            f"tensor and step); check: {verdict}",
            flush=True,
        )
    for name, got in ratios.items():
        print(f"{name} / plain: wall {spread(got['wall'])}x, CPU {spread(got['cpu'])}x (min/median/max of {rounds})")


if __name__ == "__main__":
    main()
