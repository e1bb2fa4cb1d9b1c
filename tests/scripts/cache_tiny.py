"""A tiny inductor-compiled training loop (2 steps) for the cache tests; prints Dynamo's
compile-cache counters and the cache directory as one JSON line.

Usage: cache_tiny.py [PACK POLICY ROOT]: with PACK, warm this process's cache from it first
(torchrepro.cache.prewarm, the documented per-rank flow).
"""

import json
import os
import sys

if len(sys.argv) > 1:
    import torchrepro.cache

    torchrepro.cache.prewarm(sys.argv[1], sys.argv[2], root=sys.argv[3], strict=True)

import torch
from torch._dynamo.utils import counters

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
compiled = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 8)
for _ in range(2):
    loss = compiled(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(json.dumps({
    "fx": {k.rsplit("_", 1)[1]: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache_")},
    "aot": {k.rsplit("_", 1)[1]: v for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache_")},
    "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
}))
