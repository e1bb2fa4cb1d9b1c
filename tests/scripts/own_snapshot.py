"""Saves its model and epoch to ``snapshot.pt`` in the working directory after each epoch and, when
the file is there at start, resumes from it (as the PyTorch DDP tutorial does), in one process: a
second run started in the same directory trains fewer epochs on other batches."""

import os

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(12, 4)
first = 0
if os.path.exists("snapshot.pt"):
    snap = torch.load("snapshot.pt")
    model.load_state_dict(snap["model"])
    first = snap["epoch"]  # the saved epoch again, as the DDP tutorial does
for epoch in range(first, 3):
    for batch in data[epoch * 4 : epoch * 4 + 4].split(2):
        loss = model(batch).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.save({"model": model.state_dict(), "epoch": epoch}, "snapshot.pt")
