"""Rank 1 is killed (SIGKILL) right after step 2; rank 0 then fails in its next collective."""
import os
import signal

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.ones(2, 4)).sum()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    if rank == 1 and step == 2:
        os.kill(os.getpid(), signal.SIGKILL)
dist.destroy_process_group()
