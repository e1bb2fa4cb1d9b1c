"""A slow training loop (one eager step every 0.1 s) to stop from outside.

Usage: long_train.py [--steps N] [--ignore-term] [--spawn PIDFILE] [--ranks]
--ignore-term ignores SIGTERM (torchrepro must escalate to SIGKILL); --spawn starts
``sleep 123`` (never waited for) and writes its pid to PIDFILE; --ranks joins a gloo group.
"""

import argparse
import signal
import subprocess
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=600)
parser.add_argument("--ignore-term", action="store_true")
parser.add_argument("--spawn", default=None)
parser.add_argument("--ranks", action="store_true")
args = parser.parse_args()

if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if args.spawn:
    child = subprocess.Popen(["sleep", "123"])
    with open(args.spawn, "w") as fp:
        fp.write(str(child.pid))
if args.ranks:
    import torch.distributed as dist

    dist.init_process_group("gloo")
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(args.steps):
    loss = model(torch.ones(3, 4)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
    time.sleep(0.1)
