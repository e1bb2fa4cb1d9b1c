"""Is one intra-op thread really faster than two for a compiled GPT when a CPU-heavy process runs
beside it? Measured without torchrepro: the unmodified script runs in a plain `python` child, with
`torch.set_num_threads(n)` made to set THREADS instead of n (the script's own knob, pinned), and a
global optimizer step hook (public torch API) timing each step. The median step time after warm-up
(steps 0 and 1 left out: step 0 compiles) is printed per run, 1 and 2 threads alternating, with and
without a busy loop beside them (issue 32: `threads_1`'s step-time ratio).

    python bench/thread_step_time.py [SCRIPT] [REPEATS] [-- ARGS...]
    python bench/thread_step_time.py tests/scripts/gpt_tied.py 3 -- 12
"""

import json
import multiprocessing
import os
import statistics
import subprocess
import sys

CHILD = """
import json, runpy, sys, time
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

threads = int(sys.argv[1])
set_threads = torch.set_num_threads
set_threads(threads)
torch.set_num_threads = lambda n: set_threads(threads)  # the script's knob, pinned to THREADS
ends = [time.perf_counter()]
register_optimizer_step_post_hook(lambda *_: ends.append(time.perf_counter()))
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
print(json.dumps({"threads": torch.get_num_threads(), "steps": [b - a for a, b in zip(ends, ends[1:])]}))
"""


def _spin() -> None:
    while True:
        pass


def run(script: str, args: list[str], threads: int) -> tuple[float, list[float]]:
    """One plain run: the median step time after warm-up and every step's time."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(threads), script, *args], env=env, capture_output=True, text=True, check=True
    )
    steps = json.loads(p.stdout.strip().splitlines()[-1])["steps"]
    return statistics.median(steps[2:]), steps


def main() -> None:
    script = sys.argv[1] if len(sys.argv) > 1 else "tests/scripts/gpt_tied.py"
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    args = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else ["12"]
    for hog_on in (True, False):
        hog = multiprocessing.Process(target=_spin, daemon=True) if hog_on else None
        if hog:
            hog.start()
        medians: dict[int, list[float]] = {1: [], 2: []}
        try:
            for i in range(repeats):
                for threads in (1, 2):
                    median, steps = run(script, args, threads)
                    medians[threads].append(median)
                    print(
                        f"{'busy loop beside' if hog_on else 'no busy loop'}, run {i + 1}, {threads} thread(s): "
                        f"median step {median:.3f} s (load {os.getloadavg()[0]:.1f}; steps "
                        f"{', '.join(f'{s:.3f}' for s in steps)})",
                        flush=True,
                    )
        finally:
            if hog:
                hog.terminate()
        one, two = statistics.median(medians[1]), statistics.median(medians[2])
        print(
            f"{'busy loop beside' if hog_on else 'no busy loop'}: 1 thread {one:.3f} s, 2 threads {two:.3f} s "
            f"per step (medians of {repeats} runs): ratio 1/2 threads = {one / two:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
