"""Inductor-compiled training with dropout: inductor's RNG differs from eager's."""
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Dropout(0.2), torch.nn.LayerNorm(64),
                            torch.nn.Linear(64, 4))
compiled = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
for step in range(8):
    loss = torch.nn.functional.cross_entropy(compiled(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
