"""Run by `accelerate launch --cpu --num_processes 2`: Accelerator on CPU (gloo), compiled inner
model, 6 steps; rank 1's batch at step 3 is cut short (a planted one-rank recompile)."""
import gc

import torch
from accelerate import Accelerator

from launch_common import batch, model, save_digest

accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
net = model()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
ddp, opt = accelerator.prepare(torch.compile(net, backend="aot_eager"), opt)
data = torch.Generator().manual_seed(rank)
for step in range(6):
    x, y = batch(rank, step, data)
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad()
    accelerator.backward(loss)
    opt.step()
save_digest(net, rank)
del ddp, opt
gc.collect()  # before the process group goes: avoids the teardown abort (FINDINGS.md)
accelerator.end_training()
