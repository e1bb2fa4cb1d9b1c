import sys
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, nan_at = torch.randn(16, 4), int(sys.argv[1]) if sys.argv[1:] else 0
for step in range(4):
    loss = (model(x) - (float("nan") if step >= nan_at else 0.0)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
