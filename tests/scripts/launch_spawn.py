"""torch.multiprocessing.spawn with 2 ranks on gloo: DDP(torch.compile(model)), 6 steps.
`--kill-rank1`: rank 1 is SIGKILLed after step 2. `--helper`: the parent first runs a
non-training Python subprocess. `--fail-after`: the parent fails after the ranks finished."""
import gc
import os
import signal
import socket
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from launch_common import batch, flag, model, save_digest


def work(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    net = model()
    ddp = DDP(torch.compile(net, backend="aot_eager"))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(rank)
    for step in range(6):
        x, y = batch(rank, step, data)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if flag("--kill-rank1") and rank == 1 and step == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    save_digest(net, rank)
    del ddp, opt
    gc.collect()  # before the process group goes: avoids the teardown abort (FINDINGS.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    if flag("--helper"):
        subprocess.run([sys.executable, "-c", "import torch; print('helper', torch.ones(2).sum().item())"], check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(work, args=(free,), nprocs=2)
    if flag("--fail-after"):
        raise RuntimeError("evaluation failed")
