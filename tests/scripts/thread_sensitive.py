"""A reduction whose rounding depends on the number of threads."""
import torch

torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(512, 512) / 512)
opt = torch.optim.SGD([w], lr=1e-3)
x = torch.randn(512, 512)
for step in range(3):
    loss = (x @ w).square().sum() / 1e4
    opt.zero_grad()
    loss.backward()
    opt.step()
