"""A small single-process run following the checkpoint convention, with a switch to forget one
piece of state on resume (to see check-resume name it)."""
import argparse

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from torchrepro import checkpoint, seed_everything

parser = argparse.ArgumentParser()
parser.add_argument("--forget", choices=("nothing", "rng", "data", "optimizer"), default="nothing")
args = parser.parse_args()

seed_everything(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.2), torch.nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(5)
data = TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g))
sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=8, sampler=sampler)

plan = checkpoint.plan()
step, first_epoch, resume = 0, 0, None
if plan.resume_from is not None:
    model.load_state_dict(torch.load(plan.resume_from / "model.pt", weights_only=True))
    if args.forget != "optimizer":
        opt.load_state_dict(torch.load(plan.resume_from / "optim.pt", weights_only=True))
    resume = checkpoint.load(plan.resume_from)
    step, first_epoch = resume.step, resume.epoch
    if args.forget == "rng":
        resume.rng = None  # re-derive instead of restoring: reproducible, not the same stream
    if args.forget == "data":
        resume.batch = 0  # do not skip the batches already consumed
for epoch in range(first_epoch, 3):
    sampler.set_epoch(epoch)
    batches = iter(loader)
    done = 0
    if resume is not None and epoch == resume.epoch:
        done = resume.batch
        resume.apply(batches)
    for batch, (x, y) in enumerate(batches, start=done):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if plan.should_stop(step):
            plan.save_to.mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), plan.save_to / "model.pt")
            torch.save(opt.state_dict(), plan.save_to / "optim.pt")
            checkpoint.save(plan.save_to, step=step, epoch=epoch, batch=batch + 1)
            raise SystemExit(0)
