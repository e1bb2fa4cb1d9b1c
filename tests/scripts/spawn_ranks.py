"""torch.multiprocessing.spawn with 2 ranks on gloo: DDP of a tiny eager model, 3 steps, each rank
logs its last loss (torchrepro.log_metric("loss")). Seeds itself unless `--unseeded` (the model
and the batches then come from the global generators). `--noise-rank1`: rank 1's forward adds noise
from an unseeded generator (a one-rank nondeterminism)."""
import gc
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import torchrepro
from launch_common import flag, model, save_digest


class Noisy(torch.nn.Module):
    def __init__(self, body: torch.nn.Module):
        super().__init__()
        self.body, self.gen = body, torch.Generator()
        self.gen.seed()  # unseeded: a different stream in every process

    def forward(self, x):
        return self.body(x) + 0.01 * torch.randn(x.shape[0], 2, generator=self.gen)


def work(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    unseeded = flag("--unseeded")
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)) if unseeded else model()
    ddp = DDP(Noisy(net) if flag("--noise-rank1") and rank == 1 else net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    data = None if unseeded else torch.Generator().manual_seed(rank)
    for _ in range(3):
        x, y = torch.randn(16, 8, generator=data), torch.randint(0, 2, (16,), generator=data)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torchrepro.log_metric("loss", loss.item())
    save_digest(net, rank)
    del ddp, opt
    gc.collect()  # before the process group goes: avoids the teardown abort (FINDINGS.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(work, args=(free,), nprocs=2)
