"""A planted race: an inductor-compiled index_add_ on CUDA float32 with many collisions (2^20 rows
into 4 bins). Inductor lowers it to a Triton kernel that accumulates with atomic adds, whose order
changes from call to call, so two runs of this script differ in the low bits of the loss.

Usage: atomic_race.py [STEPS]
"""

import sys

import torch

if not torch.cuda.is_available():
    raise SystemExit("atomic_race.py: no CUDA device")
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
device = torch.device("cuda")
BINS, ROWS, WIDTH = 4, 1 << 20, 16


class Binned(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        return torch.zeros(BINS, WIDTH, device=x.device, dtype=h.dtype).index_add_(0, index, h)


torch.manual_seed(0)
model = Binned().to(device)
compiled = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
# magnitudes spread over many orders, so the order of the additions shows in the sum's low bits
x = (torch.randn(ROWS, WIDTH, generator=g) * torch.exp(3 * torch.randn(ROWS, 1, generator=g))).to(device)
index = torch.randint(0, BINS, (ROWS,), generator=g).to(device)
for step in range(steps):
    loss = compiled(x, index).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.9e}")
