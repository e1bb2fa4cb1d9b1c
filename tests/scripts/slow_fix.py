"""Eager training whose steps take a value from an unseeded source unless deterministic
algorithms are on — and then every step also waits 0.2 s: a fix (``deterministic``) that makes
the runs bit-exact and slows each step, so its step-time ratio must be well above 1."""
import os
import time

import torch

torch.manual_seed(0)
w = torch.nn.Parameter(torch.ones(8))
opt = torch.optim.SGD([w], lr=0.1)
for step in range(10):
    if torch.are_deterministic_algorithms_enabled():
        time.sleep(0.2)
        noise = 0.0
    else:
        noise = int.from_bytes(os.urandom(2), "little") * 1e-6
    loss = ((w - noise) ** 2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
