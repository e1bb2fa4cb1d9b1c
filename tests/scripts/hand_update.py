"""A GPT-style loop without DataLoader or torch.optim: batches are drawn by indexing a tensor
with torch.randint, parameters are updated by hand (``w -= lr * w.grad``).

Usage: hand_update.py [--steps N] [--no-update] [--order-from-clock] [--raise-at K]
"""

import argparse
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--no-update", action="store_true", help="backward only: no parameter update at all")
parser.add_argument("--order-from-clock", action="store_true", help="draw batch indices from a clock-seeded generator")
parser.add_argument("--raise-at", type=int, default=None)
args = parser.parse_args()

torch.manual_seed(0)
data = torch.randn(256, 16)
targets = data.sum(dim=1, keepdim=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
compiled = torch.compile(model, backend="aot_eager")
order = torch.Generator().manual_seed(time.time_ns() if args.order_from_clock else 1)

for step in range(args.steps):
    if step == args.raise_at:
        raise RuntimeError(f"planted failure at step {step}")
    index = torch.randint(0, len(data), (32,), generator=order)
    loss = torch.nn.functional.mse_loss(compiled(data[index]), targets[index])
    loss.backward()
    with torch.no_grad():
        for w in model.parameters():
            if not args.no_update:
                w -= 0.01 * w.grad
            w.grad = None
print("done")
