"""Does `check` name the compiled graph and kernel of a race inside compiled code, run after run,
when other work shares the machine? Runs `torchrepro check --no-fixes` N times on a script while a
CPU-heavy process (a busy loop) runs beside it, and prints per check what it named: the
first divergent step, compile id, graph, kernel and FX node, and which evidence named them (two
replays' graph calls compared across processes, or the in-process repeat).

    python bench/check_localisation.py tests/scripts/gpt_tied.py 5 -- 4
"""

import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _spin() -> None:
    while True:
        pass


def main() -> None:
    script, runs = sys.argv[1], int(sys.argv[2])
    args = sys.argv[4:] if sys.argv[3:4] == ["--"] else sys.argv[3:]
    hogs = [multiprocessing.Process(target=_spin, daemon=True)]
    for hog in hogs:
        hog.start()
    named = 0
    try:
        for i in range(runs):
            run_dir = Path(tempfile.mkdtemp(prefix="check-loc-")) / "check"
            t0 = time.perf_counter()
            argv = [
                sys.executable,
                "-m",
                "torchrepro",
                "check",
                "--no-fixes",
                "--out",
                str(run_dir),
                script,
                "--",
                *args,
            ]
            proc = subprocess.run(argv, capture_output=True, text=True)
            report = run_dir / "report.json"
            fd = json.loads(report.read_text())["determinism"]["first_divergence"] if report.exists() else None
            fd = fd or {}
            ok = all(fd.get(k) for k in ("compile_id", "graph")) and bool(fd.get("kernel") or fd.get("node"))
            named += ok
            evidence = fd.get("evidence") or {}
            print(
                f"check {i + 1}: exit {proc.returncode}, step {fd.get('step')}, compile id {fd.get('compile_id')}, "
                f"graph {fd.get('graph')}, kernel {fd.get('kernel')}, node {fd.get('node')}, named by "
                f"{evidence.get('named_by')} (replay pairs {evidence.get('replay_pairs')}) "
                f"[{'named' if ok else 'NOT named'}; {time.perf_counter() - t0:.0f} s; {run_dir}]",
                flush=True,
            )
    finally:
        for hog in hogs:
            hog.terminate()
    print(f"named the compile id, graph and kernel or node in {named} of {runs} checks")


if __name__ == "__main__":
    main()
