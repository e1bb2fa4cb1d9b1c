"""How reliably is a script not bit-exact? Run it N times in fresh processes and count the distinct
digests of its final parameters (the script must leave its model in a global named ``model``).

    python bench/gpt_bitexact.py tests/scripts/gpt_tied.py 10 -- 2     # 10 runs of 2 steps
    python bench/gpt_bitexact.py --side-by-side tests/scripts/gpt_tied.py 10 -- 2

``--side-by-side``: the runs go two at a time, as ``check`` runs its two runs, and each pair's two
digests are compared; the pairs take turns between the environment as it is and, for each
``--env NAME=VALUE`` given, the environment with it set (e.g. ``--env OMP_WAIT_POLICY=PASSIVE``,
which ``check`` sets for runs side by side): how often each configuration shows the difference.
"""

import argparse
import hashlib
import os
import subprocess
import sys
import time

DIGEST = """
import hashlib
_h = hashlib.sha256()
for _n, _p in model.named_parameters():
    _h.update(_p.detach().numpy().tobytes())
print("DIGEST", _h.hexdigest()[:16])
"""


def start(code: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def digest(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate()
    found = [line.split()[1] for line in out.splitlines() if line.startswith("DIGEST")]
    return found[0] if found else "failed: " + hashlib.sha256(err.encode()).hexdigest()[:8]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("script")
    parser.add_argument("runs", type=int)
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the script's arguments")
    parser.add_argument("--side-by-side", action="store_true", help="pairs of runs at once, pairs compared")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="with --side-by-side")
    opts = parser.parse_args()
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    code = open(opts.script).read() + DIGEST
    if opts.side_by_side:
        side_by_side(code, args, opts.runs, [dict([e.split("=", 1)]) for e in opts.env])
        return
    digests = []
    for i in range(opts.runs):
        t0 = time.perf_counter()
        digests.append(digest(start(code, args, dict(os.environ))))
        print(f"run {i}: {digests[-1]} ({time.perf_counter() - t0:.1f} s)", flush=True)
    pairs = opts.runs * (opts.runs - 1) // 2
    differing = sum(1 for i in range(opts.runs) for j in range(i + 1, opts.runs) if digests[i] != digests[j])
    print(f"{len(set(digests))} distinct digests of {opts.runs} runs; {differing} of {pairs} pairs differ")


def side_by_side(code: str, args: list[str], pairs: int, extra: list[dict[str, str]]) -> None:
    """``pairs`` pairs for each configuration, the configurations taking turns."""
    configs = [{}, *extra]
    differ = {i: 0 for i in range(len(configs))}
    for n in range(pairs):
        for i, config in enumerate(configs):
            t0 = time.perf_counter()
            two = [digest(p) for p in [start(code, args, {**os.environ, **config}) for _ in range(2)]]
            differ[i] += two[0] != two[1]
            print(f"pair {n} {config or 'as is'}: {' '.join(two)} ({time.perf_counter() - t0:.1f} s)", flush=True)
    for i, config in enumerate(configs):
        print(f"{config or 'environment as is'}: {differ[i]} of {pairs} pairs side by side differ")


if __name__ == "__main__":
    main()
