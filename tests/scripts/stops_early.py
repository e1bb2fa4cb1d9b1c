"""Deterministic training that stops after 3 of its 6 steps when MARKER exists (a second run),
and creates MARKER on the first run. Usage: stops_early.py MARKER"""
import sys
from pathlib import Path

import torch

marker = Path(sys.argv[1])
steps = 3 if marker.exists() else 6
marker.touch()
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
for step in range(steps):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
