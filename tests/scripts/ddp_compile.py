"""DDP + torch.compile on gloo. Rank 1 gets a short batch at step 4 (a planted recompile on one
rank only). The parameters stay identical across ranks. `--compile-outside`: torch.compile(DDP(model)),
which on torch 2.13 produces no graph at all."""
import gc
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
if "--compile-outside" in sys.argv:
    compiled = torch.compile(DDP(model), backend="aot_eager")
else:
    compiled = DDP(torch.compile(model, backend="aot_eager"))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(rank)
for step in range(6):
    n = 8 if (rank == 1 and step == 4) else 16
    x, y = torch.randn(n, 8, generator=data), torch.randint(0, 2, (n,), generator=data)
    loss = torch.nn.functional.cross_entropy(compiled(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
del compiled, opt
gc.collect()
dist.destroy_process_group()
