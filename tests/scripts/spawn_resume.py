"""torch.multiprocessing.spawn with 2 ranks on gloo following the checkpoint convention: DDP with
dropout, a DistributedSampler, 2 epochs of 4 steps; stops, saves and resumes as check-resume asks."""
import gc
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from torchrepro import checkpoint, seed_everything


def work(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    seed_everything(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 2))
    ddp = DDP(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(5)
    data = TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g))
    sampler = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    plan = checkpoint.plan()
    step, first_epoch, resume = 0, 0, None
    if plan.resume_from is not None:
        net.load_state_dict(torch.load(plan.resume_from / "model.pt", weights_only=True))
        opt.load_state_dict(torch.load(plan.resume_from / f"optim-{rank}.pt", weights_only=True))
        resume = checkpoint.load(plan.resume_from)
        step, first_epoch = resume.step, resume.epoch
    for epoch in range(first_epoch, 2):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        done = 0
        if resume is not None and epoch == resume.epoch:
            done = resume.batch
            resume.apply(batches)
        for batch, (x, y) in enumerate(batches, start=done):
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if plan.should_stop(step):
                plan.save_to.mkdir(parents=True, exist_ok=True)
                torch.save(net.state_dict(), plan.save_to / "model.pt")
                torch.save(opt.state_dict(), plan.save_to / f"optim-{rank}.pt")
                checkpoint.save(plan.save_to, step=step, epoch=epoch, batch=batch + 1)
                break
        else:
            continue
        break
    del ddp, opt
    gc.collect()  # before the process group goes: avoids the teardown abort (FINDINGS.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(work, args=(free,), nprocs=2)
