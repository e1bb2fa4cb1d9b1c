"""A small compiled training run for the golden-run example (examples/golden/test_training.py):
``train.py [--steps N] [--lr LR] [--noise]``. Seeded, one fixed batch, an MLP compiled with
aot_eager and trained with AdamW; ``--noise`` nudges the weights from a clock-seeded generator each
step (a run that drifts from its golden run)."""

import argparse
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--lr", type=float, default=1e-2)
parser.add_argument("--noise", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
step_fn = torch.compile(model, backend="aot_eager")
opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
nudge = torch.Generator().manual_seed(time.time_ns())
for step in range(args.steps):
    loss = torch.nn.functional.cross_entropy(step_fn(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if args.noise:
        with torch.no_grad():
            model[0].weight += 1e-6 * torch.randn(model[0].weight.shape, generator=nudge)
print(f"final loss {loss.item():.6f}")
