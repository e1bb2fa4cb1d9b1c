"""A linear layer whose weight alone takes just over 256 MiB, trained one step with inductor: its
graphs are probed, but too large to be saved for `torchrepro repro`."""

import torch

torch.manual_seed(0)
model = torch.nn.Linear(8192, 8200, bias=False)  # 8192 x 8200 x 4 bytes: 256.25 MiB
opt = torch.optim.SGD(model.parameters(), lr=0.1)
compiled = torch.compile(model)
loss = compiled(torch.randn(2, 8192)).pow(2).mean()
loss.backward()
opt.step()
