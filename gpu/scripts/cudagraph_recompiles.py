"""A training loop compiled with mode="reduce-overhead" (CUDA graphs) whose batch size changes
twice: Dynamo recompiles once (the second size marks the batch dimension dynamic), and CUDA graphs
are recorded again per size (which is no recompile). At the end it writes Dynamo's own numbers to
OUT.json, by the correspondence of docs/evidence/accuracy.md: compiles = compilation-metrics records with a
code name and no failure, recompiles = those with a recompile reason, graph breaks =
counters["graph_break"] plus the "unimplemented" entries other than the recompile limit, unique
graphs = counters["stats"]["unique_graphs"]. Nothing of torchrepro is imported.

Usage: cudagraph_recompiles.py OUT.json
"""

import json
import sys

import torch
from torch._dynamo.utils import counters, get_compilation_metrics

if not torch.cuda.is_available():
    raise SystemExit("cudagraph_recompiles.py: no CUDA device")
device = torch.device("cuda")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8)).to(device)
compiled = torch.compile(model, mode="reduce-overhead")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for batch in (32, 32, 32, 16, 16, 8, 8, 32):
    torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs may be overwritten now
    x = torch.randn(batch, 64, device=device)
    loss = compiled(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()

metrics = [m for m in get_compilation_metrics() if m.co_name and not m.fail_type]
unimplemented = sum(n for msg, n in counters["unimplemented"].items() if "recompile limit" not in msg)
with open(sys.argv[1], "w") as f:
    json.dump(
        {
            "compiles": len(metrics),
            "recompiles": sum(1 for m in metrics if m.recompile_reason),
            "graph_breaks": sum(counters["graph_break"].values()) + unimplemented,
            "unique_graphs": counters["stats"]["unique_graphs"],
        },
        f,
    )
