"""A tiny training script for the `torchrepro drift` tests (full batch by default; data fixed by its
own generator, so only the model init and the data order can vary it).

--planted        compiled forward halves the logits: a compile-only change (loss higher when compiled)
--rounding       compiled forward computes the logits in float64: only rounding differs
--global-order   mini-batches from a sampler that draws torch.randperm from the global RNG
--constant-seed  torch.manual_seed(0) first: the script overrides every seed
--crash-below U  fail when the first global random draw is below U
Prints `loss=<final loss>` and logs the training accuracy with torchrepro.log_metric("acc", ...).
"""

import argparse

import torch
from torch import nn

import torchrepro

parser = argparse.ArgumentParser()
for flag in ("--planted", "--rounding", "--global-order", "--constant-seed"):
    parser.add_argument(flag, action="store_true")
parser.add_argument("--crash-below", type=float)
parser.add_argument("--steps", type=int, default=25)
args = parser.parse_args()

if args.constant_seed:
    torch.manual_seed(0)
u = torch.rand(()).item()
if args.crash_below is not None and u < args.crash_below:
    raise RuntimeError(f"planted crash: first draw {u:.4f} < {args.crash_below}")

g = torch.Generator().manual_seed(1234)
X = torch.randn(96, 8, generator=g)
Y = (X @ torch.randn(8, generator=g) > 0).long()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 2)

    def forward(self, x):
        if args.rounding and torch.compiler.is_compiling():
            w, b = self.lin.weight.double(), self.lin.bias.double()
            logits = (x.double() @ w.T + b).float()
        else:
            logits = self.lin(x)
        if args.planted and torch.compiler.is_compiling():
            logits = logits * 0.5
        return logits


class GlobalShuffle(torch.utils.data.Sampler):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(torch.randperm(self.n).tolist())

    def __len__(self):
        return self.n


model = Net()
compiled = torch.compile(model, backend="eager")
opt = torch.optim.SGD(model.parameters(), lr=0.5)
data = torch.utils.data.TensorDataset(X, Y)
if args.global_order:
    loader = torch.utils.data.DataLoader(data, batch_size=16, sampler=GlobalShuffle(len(data)))
else:
    loader = torch.utils.data.DataLoader(data, batch_size=len(data), shuffle=True)
step = 0
while step < args.steps:
    for x, y in loader:
        loss = nn.functional.cross_entropy(compiled(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
with torch.no_grad():
    acc = (model(X).argmax(1) == Y).float().mean()
torchrepro.log_metric("acc", acc)
print(f"loss={loss.item()!r}")
