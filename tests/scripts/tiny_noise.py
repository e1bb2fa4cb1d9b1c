"""Seeded training whose parameters get a 1e-7 nudge from a clock-seeded generator each step: the
runs differ, by far less than 1e-3."""
import time

import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
nudge = torch.Generator().manual_seed(time.time_ns())
for step in range(4):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        model.weight += 1e-7 * torch.randn(model.weight.shape, generator=nudge)
