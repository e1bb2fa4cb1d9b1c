"""After step 1, rank 0 waits in an all_reduce that rank 1 never joins (rank 1 sleeps)."""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    loss = model(torch.ones(2, 4)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
if rank == 0:
    dist.all_reduce(torch.ones(1))
else:
    time.sleep(600)
dist.destroy_process_group()
