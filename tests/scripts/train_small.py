"""A small compiled training run used by the tests.

Usage: train_small.py [--steps-then-raise K] [--exit-code C] [--save PATH] [--epochs E]
Dropout, a shuffled DataLoader and a short last batch (one shape recompile) exercise RNG,
data order and compile capture. Prints one JSON line with Dynamo's counters at the end.
"""

import argparse
import json

import torch
from torch._dynamo.utils import counters

parser = argparse.ArgumentParser()
parser.add_argument("--steps-then-raise", type=int, default=None)
parser.add_argument("--exit-code", type=int, default=None)
parser.add_argument("--save", default=None)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--backend", default="aot_eager")
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 3))
compiled = torch.compile(model, backend=args.backend)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
data = torch.utils.data.TensorDataset(torch.randn(70, 8), torch.randint(0, 3, (70,)))
loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)

step = 0
for epoch in range(args.epochs):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if args.steps_then_raise is not None and step == args.steps_then_raise:
            raise RuntimeError(f"planted failure after step {step}")
if args.save:
    torch.save(model.state_dict(), args.save)
print(json.dumps({"frames_ok": counters["frames"]["ok"], "unique_graphs": counters["stats"]["unique_graphs"],
                  "steps": step}))
if args.exit_code is not None:
    raise SystemExit(args.exit_code)
