"""Bit-exact resume: DDP + torch.compile (inductor), dropout, a DistributedSampler and DataLoader
workers with random augmentation, on any number of ranks.

    torchrepro check-resume --nproc 2 --at 5 examples/resume_ddp.py

The three things a script needs for ``check-resume`` (and for resuming at all):

1. ``checkpoint.plan()`` says whether to stop after some step (and where to save) or to resume.
2. At the stop: save model and optimizer your way, plus ``checkpoint.save(...)`` for every RNG
   state and the data position.
3. On resume: load model and optimizer, ``checkpoint.load(...)``, and call ``resume.apply(batches)``
   right after creating the resumed epoch's iterator.
"""

from __future__ import annotations

import argparse
import gc

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from torchrepro import checkpoint, seed_everything, worker_rng


class Jittered(Dataset):
    """Fixed data with random augmentation drawn in the DataLoader workers."""

    def __init__(self, n: int = 96):
        g = torch.Generator().manual_seed(1234)
        self.x, self.y = torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        noise = torch.from_numpy(worker_rng().normal(0, 0.05, 16).astype(np.float32))
        return self.x[i] + noise, self.y[i]


def train(args: argparse.Namespace) -> None:
    rank = dist.get_rank()
    seeds = seed_everything(0)  # the same init on every rank; DataLoader workers seeded per (rank, worker, epoch)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(64, 4))
    # compile the module inside DDP: on torch 2.13 torch.compile(DDP(model)) produces no graph at all
    compiled = DDP(torch.compile(model, backend=args.backend))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = Jittered()
    sampler = DistributedSampler(data, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=args.workers, drop_last=True)

    plan = checkpoint.plan()
    step, first_epoch, resume = 0, 0, None
    if plan.resume_from is not None:
        model.load_state_dict(torch.load(plan.resume_from / "model.pt", weights_only=True))
        opt.load_state_dict(torch.load(plan.resume_from / f"optim-rank{rank}.pt", weights_only=True))
        resume = checkpoint.load(plan.resume_from)
        step, first_epoch = resume.step, resume.epoch

    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        done = 0
        if resume is not None and epoch == resume.epoch:
            resume.apply(batches)  # skip the batches already consumed, then restore every RNG state
            done = resume.batch
        for batch, (x, y) in enumerate(batches, start=done):
            with seeds.fork("dropout"):  # each rank its own dropout stream (saved by checkpoint.save)
                loss = torch.nn.functional.cross_entropy(compiled(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if plan.should_stop(step):
                plan.save_to.mkdir(parents=True, exist_ok=True)
                if rank == 0:
                    torch.save(model.state_dict(), plan.save_to / "model.pt")
                torch.save(opt.state_dict(), plan.save_to / f"optim-rank{rank}.pt")
                checkpoint.save(plan.save_to, step=step, epoch=epoch, batch=batch + 1)
                dist.barrier()
                return


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backend", default="inductor")
    dist.init_process_group("gloo")
    train(parser.parse_args())
    gc.collect()  # free DDP and the optimizer before destroy_process_group: avoids the rare gloo teardown abort
    dist.destroy_process_group()
