"""One small regression trained in the configurations `torchrepro compare` is asked about, each
over the same global batch per step: one process accumulating `--accum` micro-batches, DDP or
FSDP2 (`fully_shard`) over the ranks torchrun started (gloo, CPU). The sampler's permutation
does not depend on the world size, so step k covers the same samples in every configuration.

Planted differences: `--wrong-count-from K` divides the accumulated loss by one micro-batch too
many from step K on; `--no-set-epoch` repeats epoch 0's order; `--wrong-rank` gives every rank
rank 0's shard. The checkpoint convention (torchrepro.checkpoint) is followed for resume."""

import argparse

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from torchrepro import checkpoint

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("single", "ddp", "fsdp2"), default="single")
parser.add_argument("--accum", type=int, default=1, help="micro-batches per rank per step")
parser.add_argument("--global-batch", type=int, default=16)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--wrong-count-from", type=int, default=None)
parser.add_argument("--no-set-epoch", action="store_true")
parser.add_argument("--wrong-rank", action="store_true")
args = parser.parse_args()

torch.set_num_threads(1)
distributed = args.mode != "single"
if distributed:
    dist.init_process_group("gloo")
world = dist.get_world_size() if distributed else 1
rank = dist.get_rank() if distributed else 0
micro = args.global_batch // (world * args.accum)
assert micro * world * args.accum == args.global_batch, "the global batch must split evenly"

g = torch.Generator().manual_seed(5)
data = TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
sampler = DistributedSampler(data, num_replicas=world, rank=0 if args.wrong_rank else rank, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=micro, sampler=sampler)

torch.manual_seed(0)  # every rank builds the same parameters
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
if args.mode == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(model)
elif args.mode == "fsdp2":
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

plan = checkpoint.plan()
step, first_epoch, resume = 0, 0, None
if plan.resume_from is not None:
    suffix = f"-rank{rank}"
    model.load_state_dict(torch.load(plan.resume_from / f"model{suffix}.pt", weights_only=True))
    opt.load_state_dict(torch.load(plan.resume_from / f"optim{suffix}.pt", weights_only=True))
    resume = checkpoint.load(plan.resume_from)
    step, first_epoch = resume.step, resume.epoch
for epoch in range(first_epoch, args.epochs):
    if not args.no_set_epoch:
        sampler.set_epoch(epoch)
    batches = iter(loader)
    if resume is not None and epoch == resume.epoch:
        resume.apply(batches)
    while True:
        micro_batches = [b for _, b in zip(range(args.accum), batches)]
        if len(micro_batches) < args.accum:
            break
        count = args.accum + (1 if args.wrong_count_from is not None and step >= args.wrong_count_from else 0)
        opt.zero_grad()
        for i, (x, y) in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            sync = model.no_sync() if args.mode == "ddp" and not last else None
            if sync is not None:
                with sync:
                    (torch.nn.functional.mse_loss(model(x), y) / count).backward()
            else:
                (torch.nn.functional.mse_loss(model(x), y) / count).backward()
        opt.step()
        step += 1
        if plan.should_stop(step):
            plan.save_to.mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), plan.save_to / f"model-rank{rank}.pt")
            torch.save(opt.state_dict(), plan.save_to / f"optim-rank{rank}.pt")
            in_epoch = step - epoch * (len(data) // args.global_batch)
            checkpoint.save(plan.save_to, step=step, epoch=epoch, batch=in_epoch * args.accum)
            if distributed:
                dist.destroy_process_group()
            raise SystemExit(0)
if distributed:
    dist.destroy_process_group()
