"""How often does `check` find a race inside compiled code, and what does probing cost? Runs
`torchrepro check --no-fixes --no-localize` N times with the graph probe (the default) and N
times without it (`--probe-repeats 0`), alternating, its two runs side by side, while a CPU-heavy
process (a busy loop, like `yes > /dev/null`) runs beside it, after one check of each kind to warm
the compile caches; prints each check, then the share of
checks that said DIVERGED with and without the probe, and the cost of the probe as the ratio of
the median wall times (both kinds measured in this one run, under the same load).

    python bench/probe_sensitivity.py tests/scripts/gpt_tied.py 40 -- 2
    python bench/probe_sensitivity.py --in DIR train.py 40 -- ARGS   # each check started in DIR
    python bench/probe_sensitivity.py --nanogpt DIR 40   # nanoGPT as `make realworld` runs it, put in DIR (new)
"""

import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _spin() -> None:
    while True:
        pass


def _check(script: str, args: list[str], probe: bool, i: int, cwd: str | None) -> tuple[bool, str, float]:
    """One check: (it said DIVERGED, what named it, wall seconds)."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"probe-sens-{i}-")) / "check"
    argv = [sys.executable, "-m", "torchrepro", "check", "--no-fixes", "--no-localize", "--out", str(run_dir)]
    argv += [] if probe else ["--probe-repeats", "0"]
    env = {**os.environ, "TORCHREPRO_CHECK_SIDE_BY_SIDE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([*argv, script, "--", *args], capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    report = run_dir / "report.json"
    det = json.loads(report.read_text())["determinism"] if report.exists() else {}
    fd = det.get("first_divergence") or {}
    how = (
        f"exit {proc.returncode}, {det.get('verdict')}, {fd.get('what')}, named by "
        f"{(fd.get('evidence') or {}).get('named_by')}, graph {fd.get('compile_id')} {fd.get('graph')}"
    )
    shutil.rmtree(run_dir.parent, ignore_errors=True)
    return det.get("verdict") == "diverged", how, wall


def _nanogpt(folder: str) -> tuple[str, list[str]]:
    """nanoGPT (realworld/nanoGPT) and its synthetic data put in ``folder``, as `make realworld`
    does: its script and the arguments the corpus runs it with (inductor, 2 layers, 4 iterations)."""
    sys.path.insert(0, str(ROOT))
    from realworld.run import SCRIPTS, prep_nanogpt

    (script,) = [s for s in SCRIPTS if s.name == "nanoGPT"]
    shutil.copytree(ROOT / "realworld" / "nanoGPT", folder)
    prep_nanogpt(Path(folder))
    return script.entry, list(script.args)


def main() -> None:
    cwd = None
    if sys.argv[1] == "--nanogpt":
        cwd, runs = sys.argv[2], int(sys.argv[3])
        script, args = _nanogpt(cwd)
    else:
        if sys.argv[1] == "--in":
            cwd = sys.argv[2]
            del sys.argv[1:3]
        script, runs = sys.argv[1], int(sys.argv[2])
        args = sys.argv[4:] if sys.argv[3:4] == ["--"] else sys.argv[3:]
    hog = multiprocessing.Process(target=_spin, daemon=True)
    hog.start()
    found = {True: 0, False: 0}
    walls: dict[bool, list[float]] = {True: [], False: []}
    try:
        for probe in (True, False):  # caches warm for both kinds (a first probed run keeps its FX graphs)
            print(f"warm-up {'probe' if probe else 'plain'}: {_check(script, args, probe, -1, cwd)[1]}", flush=True)
        for i in range(runs):
            for probe in (True, False) if i % 2 == 0 else (False, True):
                diverged, how, wall = _check(script, args, probe, i, cwd)
                found[probe] += diverged
                walls[probe].append(wall)
                kind = "probe" if probe else "plain"
                print(f"check {i + 1} {kind}: {how} [{wall:.0f} s]", flush=True)
            ratio = statistics.median(walls[True]) / statistics.median(walls[False])
            print(
                f"after {i + 1}: found with the probe {found[True]}/{i + 1}, without {found[False]}/{i + 1}; "
                f"cost ratio {ratio:.2f}",
                flush=True,
            )
    finally:
        hog.terminate()
    print(
        f"detection with the probe: {found[True]} of {runs} ({100 * found[True] / runs:.0f} %); without: "
        f"{found[False]} of {runs} ({100 * found[False] / runs:.0f} %); check's median wall time with the probe "
        f"{statistics.median(walls[True]):.1f} s, without {statistics.median(walls[False]):.1f} s: cost ratio "
        f"{statistics.median(walls[True]) / statistics.median(walls[False]):.2f}"
    )


if __name__ == "__main__":
    main()
