"""A compiled CUDA training loop that never waits for the device: after three warm-up steps,
torch.cuda.set_sync_debug_mode("error") is on for STEPS steps, so any synchronising call made
inside them (by the loop, or by whatever observes it) raises. Writes the loop's wall time per step
(ended by one synchronize after the mode is off) to OUT.json.

Usage: sync_free_loop.py OUT.json [STEPS]
"""

import json
import sys
import time

import torch

if not torch.cuda.is_available():
    raise SystemExit("sync_free_loop.py: no CUDA device")
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
device = torch.device("cuda")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024)).to(device)
compiled = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
x = torch.randn(2048, 1024, device=device)


def train_step() -> None:
    loss = compiled(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


for _ in range(3):  # compiles, allocates the optimizer's state
    train_step()
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("error")
start = time.perf_counter()
try:
    for _ in range(steps):
        train_step()
finally:
    torch.cuda.set_sync_debug_mode(0)
torch.cuda.synchronize()
elapsed = time.perf_counter() - start
with open(sys.argv[1], "w") as f:
    json.dump({"steps": steps + 3, "timed_steps": steps, "step_ms": elapsed / steps * 1000}, f)
