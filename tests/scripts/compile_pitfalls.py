"""One torch.compile pitfall per scenario, in a tiny training loop (backend eager by default):
what ``doctor --fixes`` tries fixes on (tests/test_doctor_fixes.py).

Usage: compile_pitfalls.py SCENARIO [--epochs E] [--backend B]

  clean          no recompile, no graph break
  short_batch    a short last batch (drop_last=False): a shape recompile on the batch dimension
  seq_len        a sequence length that changes every step: a shape recompile on dimension 1
  item           .item() inside the compiled forward: a graph break (and a recompile on its value)
  int_attr       a Python int attribute of the model changed every epoch: a recompile each
  nonzero        boolean-mask indexing in the forward: a data-dependent-shape graph break
  eval_only      evaluation under no_grad through the compiled model: the expected second graph
  limit          an int attribute with more values than the recompile limit allows
"""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("scenario")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--backend", default="eager")
args = parser.parse_args()
s = args.scenario


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.lin = nn.Linear(8, 4)
        self.scale = 1  # a Python int read in forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).mean(1)
        if s == "item":
            h = h / (1.0 + h.abs().mean().item())
        if s == "nonzero":
            h = h + h[h > 0].sum()
        return self.lin(h) / self.scale


torch.manual_seed(0)
model = Net()
compiled = torch.compile(model, backend=args.backend)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
epochs = 10 if s == "limit" else args.epochs
batches = [4, 4, 2] if s == "short_batch" else [4, 4, 4]
step = 0
for epoch in range(epochs):
    if s in ("int_attr", "limit"):
        model.scale = epoch + 1
    for i, batch in enumerate(batches):
        length = 5 + step if s == "seq_len" else 6
        x = torch.randint(0, 16, (batch, length))
        y = torch.randint(0, 4, (batch,))
        loss = nn.functional.cross_entropy(compiled(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if s == "eval_only" and step % 4 == 0:
            with torch.no_grad():
                compiled(x)
print(f"{s}: {step} steps, loss {loss.item():.4f}")
