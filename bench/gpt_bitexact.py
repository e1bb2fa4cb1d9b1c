"""How reliably is a script not bit-exact? Run it N times in fresh processes and count the distinct
digests of its final parameters (the script must leave its model in a global named ``model``).

    python bench/gpt_bitexact.py tests/scripts/gpt_tied.py 10 -- 2     # 10 runs of 2 steps
"""

import hashlib
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


def main() -> None:
    script, runs = sys.argv[1], int(sys.argv[2])
    args = sys.argv[4:] if sys.argv[3:4] == ["--"] else sys.argv[3:]
    code = open(script).read() + DIGEST
    digests = []
    for i in range(runs):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
        found = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("DIGEST")]
        digests.append(found[0] if found else "failed: " + hashlib.sha256(out.stderr.encode()).hexdigest()[:8])
        print(f"run {i}: {digests[-1]} ({time.perf_counter() - t0:.1f} s)", flush=True)
    pairs = runs * (runs - 1) // 2
    differing = sum(1 for i in range(runs) for j in range(i + 1, runs) if digests[i] != digests[j])
    print(f"{len(set(digests))} distinct digests of {runs} runs; {differing} of {pairs} pairs differ")


if __name__ == "__main__":
    main()
