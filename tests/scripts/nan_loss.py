"""A tiny eager training loop whose loss turns NaN at step 2 (then stays NaN: the parameters are):
every report and renderer must carry and show it, never end in a traceback."""

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4)
for step in range(6):
    loss = (model(x) * (float("nan") if step == 2 else 1.0)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
