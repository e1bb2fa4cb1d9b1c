"""Data order seeded from the clock: every run sees the batches in another order."""
import time

import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
order = torch.Generator().manual_seed(time.time_ns())
loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True, generator=order)
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
