"""`make demo`: torchrepro doctor on a training script with four torch.compile pitfalls, then on
the same script without them, then the two side by side.

Writes torchrepro-runs/demo-pitfalls and torchrepro-runs/demo-clean (replaced on every run).
Exits 0 when both runs and both reports succeed, else non-zero with the reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "train_digits.py"
RUNS = Path("torchrepro-runs")
EXIT_MEANING = {1: "a budget failed", 2: "usage or input error", 3: "the training script failed"}


def banner(text: str) -> None:
    print(f"\n{'=' * 78}\n{text}\n{'=' * 78}", flush=True)


def doctor(name: str, *script_args: str) -> dict:
    """``torchrepro doctor`` on train_digits.py into torchrepro-runs/<name>; returns report.json."""
    run_dir = RUNS / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cmd = [sys.executable, "-m", "torchrepro", "doctor", "--out", str(run_dir), str(SCRIPT), "--", *script_args]
    shown = SCRIPT.relative_to(Path.cwd()) if SCRIPT.is_relative_to(Path.cwd()) else SCRIPT
    print(" ".join(["$ torchrepro doctor --out", str(run_dir), str(shown), *(["--", *script_args] if script_args else [])]),
          flush=True)
    start = time.perf_counter()
    code = subprocess.call(cmd)
    print(f"({time.perf_counter() - start:.1f} s)", flush=True)
    if code != 0:
        print(f"demo: torchrepro doctor exited {code} ({EXIT_MEANING.get(code, 'unexpected')}); "
              f"see {run_dir}/rank-0/stderr.log", file=sys.stderr)
        sys.exit(code)
    return json.loads((run_dir / "report.json").read_text())


def main() -> int:
    start = time.perf_counter()
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    print("torchrepro demo: what torch.compile did in a real training run, and how to fix it.")
    print(f"torch {torch_version}, Python {sys.version.split()[0]}; the script trains an MLP on "
          "scikit-learn's digits (backend aot_eager).")

    banner("1/2  With four common pitfalls (--pitfalls): short last batch, .item() in forward,\n"
           "     model.eval() inside the loop, an int attribute changed per epoch")
    bad = doctor("demo-pitfalls", "--pitfalls")

    banner("2/2  The same script without them")
    good = doctor("demo-clean")

    banner("Summary")
    for label, report in (("with pitfalls", bad), ("clean", good)):
        c = report["compile"]
        by = ", ".join(f"{k} {v}" for k, v in sorted(c["recompiles_by_category"].items())) or "none"
        print(f"{label:>14}: {c['compiles']:2d} compiles, {c['recompiles']:2d} recompiles ({by}), "
              f"{c['graph_breaks']} graph breaks, {c['compile_time_s']:.1f} s compiling")
    print(f"{'reports':>14}: {RUNS / 'demo-pitfalls' / 'report.json'}, {RUNS / 'demo-clean' / 'report.json'} "
          f"(demo took {time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
