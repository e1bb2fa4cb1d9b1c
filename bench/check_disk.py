"""How much disk ``torchrepro check --against eager`` leaves in its run directory, per step and
next to one copy of the model's parameters, on a GPT of a chosen size (tests/scripts/gpt_sized.py).

    python bench/check_disk.py --size 10m --steps 3           # ~8M parameters: minutes on CPU
    python bench/check_disk.py --size 124m --steps 3          # GPT-2 small's shapes (124M): slow on CPU
    python bench/check_disk.py --size 10m -- --no-fixes       # arguments after -- go to check

``check`` runs with ``--out`` in a temporary directory (``--keep DIR``: in DIR, kept), and the
bytes there are counted: the whole directory, and per run its full parameter copies
(``step-*.npz``; the target: at most two), its sketches (``sketch-*.npz``) per snapshot step, and
all it holds but the full copies (sketches, event log, run.json) per snapshot step (the target: at most 1 MB),
and the most the directory held while the check ran (sampled every 0.5 s).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "gpt_sized.py"
SIZES = ("1m", "10m", "124m")


def size_of(path: Path, pattern: str = "**/*") -> int:
    return sum(p.stat().st_size for p in path.glob(pattern) if p.is_file())


def measure(run_dir: Path, copy: int) -> list[str]:
    """Lines saying what ``run_dir`` (a check's directory) holds, for parameters of ``copy`` bytes."""
    total = size_of(run_dir)
    lines = [f"run directory {total / 1e6:.1f} MB = {total / copy:.2f} parameter copies"]
    for run in sorted(p.name for p in run_dir.iterdir() if list(p.glob("rank-*/snapshots"))):
        snaps = run_dir / run / "rank-0" / "snapshots"
        full, sketches = size_of(snaps, "step-*.npz"), size_of(snaps, "sketch-*.npz")
        steps = len(list(snaps.glob("sketch-*.npz"))) or len(list(snaps.glob("step-*.npz"))) or 1
        whole = size_of(run_dir / run)
        lines.append(
            f"  {run:>16}: {whole / 1e6:8.1f} MB ({whole / copy:.2f} copies); full copies {full / 1e6:.1f} MB, "
            f"sketches {sketches / steps / 1e3:.0f} kB/step; all but the full copies {(whole - full) / steps / 1e6:.3f} "
            f"MB/step over {steps} snapshot steps"
        )
    rest = total - size_of(run_dir, "*/rank-*/**/*")
    lines.append(f"  {'outside runs':>16}: {rest / 1e6:8.1f} MB (run.json, report, replays)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="10m")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--keep", metavar="DIR", help="run check in DIR (kept) instead of a temporary directory")
    parser.add_argument("check_args", nargs=argparse.REMAINDER, help="-- then more arguments for check")
    opts = parser.parse_args()
    extra = opts.check_args[1:] if opts.check_args[:1] == ["--"] else opts.check_args
    params = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.argv = ['x', '0', {opts.size!r}]; exec(open({str(SCRIPT)!r}).read())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]
    copy = 4 * int(params)  # float32
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(opts.keep) if opts.keep else Path(tmp)
        run_dir = work / "check"
        cmd = [sys.executable, "-m", "torchrepro", "check", "--against", "eager", "--out", str(run_dir), *extra]
        cmd += [str(SCRIPT), str(opts.steps), opts.size]
        print("$ torchrepro", " ".join(cmd[3:]), flush=True)
        t0 = time.perf_counter()
        peak = [0, 0]  # the most the check directory held while the check ran, and its full copies then
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.5):
                try:
                    now = [size_of(run_dir), size_of(run_dir, "*/rank-*/snapshots/step-*.npz")]
                except OSError:  # a file removed while listed
                    continue
                peak[:] = max(peak, now)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        done.set()
        watcher.join()
        if proc.returncode not in (0, 1):
            sys.exit(f"check exited {proc.returncode}: {proc.stderr[-2000:]}")
        print(f"GPT {opts.size}: {int(params):,} parameters, one float32 copy {copy / 1e6:.1f} MB; {opts.steps} steps")
        print(f"check: exit {proc.returncode} in {time.perf_counter() - t0:.0f} s")
        print(
            f"peak while it ran (sampled every 0.5 s): {peak[0] / 1e6:.1f} MB = {peak[0] / copy:.2f} parameter copies, "
            f"{peak[1] / copy:.2f} of them full copies"
        )
        print("\n".join(measure(run_dir, copy)))


if __name__ == "__main__":
    main()
