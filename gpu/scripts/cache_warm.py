"""One inductor-compiled training step on CUDA (Triton kernels), timed from the first call to the
end of the optimizer step, with the FX-graph and AOTAutograd cache counters, written to OUT.json.
Run it twice on the same TORCHINDUCTOR_CACHE_DIR (or on one filled from a pack) for a warm start.

Usage: cache_warm.py OUT.json
"""

import json
import sys
import time

import torch
from torch._dynamo.utils import counters

if not torch.cuda.is_available():
    raise SystemExit("cache_warm.py: no CUDA device")
device = torch.device("cuda")
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(128, 256), torch.nn.LayerNorm(256), torch.nn.GELU(), torch.nn.Linear(256, 10)
).to(device)
compiled = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 128, device=device)
y = torch.randint(0, 10, (64,), device=device)
torch.cuda.synchronize()
start = time.perf_counter()
loss = torch.nn.functional.cross_entropy(compiled(x), y)
opt.zero_grad()
loss.backward()
opt.step()
torch.cuda.synchronize()
first_step_s = time.perf_counter() - start
with open(sys.argv[1], "w") as f:
    json.dump(
        {
            "first_step_s": first_step_s,
            "fx": {k.rsplit("_", 1)[1]: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache_")},
            "aot": {
                k.rsplit("_", 1)[1]: v for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache_")
            },
        },
        f,
    )
