"""Minimal reproduction: inductor's CPU code for an accumulating scatter (`index_put_(...,
accumulate=True)`, also what the backward of `nn.Embedding` becomes) adds floats with atomic adds
from several OpenMP threads, so the same compiled call on the same inputs gives different bits
from call to call. Eager's embedding backward is deterministic (eager's own index_put_ with
accumulation is not, as documented); inductor is deterministic with one thread or with
`torch.use_deterministic_algorithms(True)` set before compiling. `TORCHINDUCTOR_DETERMINISTIC=1`
(inductor's own deterministic mode) does not help. See docs/compiled-nondeterminism.md.

    python examples/atomic_add_repro.py    # per mode: distinct results of 20 identical calls (1 = deterministic)
"""
import os
import subprocess
import sys

CHILD = r"""
import os, sys, torch
torch.set_num_threads(int(os.environ["THREADS"]))
if os.environ.get("DETERMINISTIC_ALGORITHMS") == "1":
    torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
rows, n, dim = 8, 65536, 16        # many updates land on few rows: their order decides the rounding
idx = torch.randint(0, rows, (n,))
values = torch.randn(n, dim) * torch.logspace(-4, 4, n).unsqueeze(1)

weight = torch.randn(rows, dim, requires_grad=True)

def scatter(idx, values):                           # index_put_ with accumulation
    return torch.zeros(rows, dim).index_put_((idx,), values, accumulate=True)

def embedding(idx, values):                         # the gradient of an embedding lookup
    weight.grad = None
    (torch.nn.functional.embedding(idx, weight) * values).sum().backward()
    return weight.grad

compiled = os.environ.get("BACKEND") != "eager"
counts = []
for fn in (scatter, embedding):
    fn = torch.compile(fn) if compiled else fn
    counts.append(len({fn(idx, values).numpy().tobytes() for _ in range(20)}))
print(*counts)
"""

MODES = [
    ("eager, 2 threads", {"BACKEND": "eager", "THREADS": "2"}),
    ("inductor, 1 thread", {"THREADS": "1"}),
    ("inductor, 2 threads", {"THREADS": "2"}),
    ("inductor, 2 threads, TORCHINDUCTOR_DETERMINISTIC=1", {"THREADS": "2", "TORCHINDUCTOR_DETERMINISTIC": "1"}),
    ("inductor, 2 threads, use_deterministic_algorithms(True)", {"THREADS": "2", "DETERMINISTIC_ALGORITHMS": "1"}),
]

if __name__ == "__main__":
    for title, env in MODES:
        out = subprocess.run([sys.executable, "-c", CHILD], env={**os.environ, **env}, capture_output=True, text=True)
        counts = out.stdout.split() or ["error: " + out.stderr.strip().splitlines()[-1]] * 2
        print(f"{title:<58} index_put_: {counts[0]:>2}   embedding backward: {counts[1]:>2}")
