"""One torch.compile pitfall per scenario, in a tiny training loop (backend eager by default):
what ``doctor --fixes`` tries fixes on (tests/test_doctor_fixes.py).

Usage: compile_pitfalls.py SCENARIO [--epochs E] [--backend B] [--counters FILE]

With --counters, one JSON line is appended to FILE at exit (also when torchrepro stops the run
after a step): Dynamo's own counts for this process and the settings a fix may have changed, as the script started.

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
import atexit
import json

import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters, get_compilation_metrics

parser = argparse.ArgumentParser()
parser.add_argument("scenario")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--backend", default="eager")
parser.add_argument("--counters")
args = parser.parse_args()
s = args.scenario
SETTINGS = ("capture_scalar_outputs", "capture_dynamic_output_shape_ops", "allow_unspec_int_on_nn_module")
# the settings as the script starts (a fix torchrepro applies is undone when its capture stops)
CONFIG = {name: getattr(torch._dynamo.config, name) for name in SETTINGS}
CONFIG["recompile_limit"] = torch._dynamo.config.recompile_limit
CONFIG["dynamic_sources"] = torch.compiler.config.dynamic_sources


def write_counters() -> None:
    """Dynamo's bookkeeping, as tests/test_doctor_scenarios.py reads it."""
    done = [m for m in get_compilation_metrics() if m.co_name and not m.fail_type]
    breaks = sum(counters["graph_break"].values()) + sum(
        n for reason, n in counters["unimplemented"].items() if not reason.startswith("Dynamo recompile limit")
    )
    line = {"compiles": len(done), "recompiles": sum(bool(m.recompile_reason) for m in done), "graph_breaks": breaks}
    with open(args.counters, "a") as f:
        f.write(json.dumps({**line, "config": CONFIG, "steps": step}) + "\n")


if args.counters:
    atexit.register(write_counters)


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
