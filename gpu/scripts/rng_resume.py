"""A small CUDA training run following torchrepro's checkpoint convention: dropout draws from the
CUDA generator, the batches are fixed, so the CUDA RNG state is the only randomness after start.

Usage: rng_resume.py [--forget-rng]: with it, a resumed run does not restore the saved RNG states
(the negative control: check-resume must then find the runs differ).
"""

import argparse

import torch

from torchrepro import RngState, checkpoint, seed_everything

parser = argparse.ArgumentParser()
parser.add_argument("--forget-rng", action="store_true")
args = parser.parse_args()
if not torch.cuda.is_available():
    raise SystemExit("rng_resume.py: no CUDA device")

seed_everything(0)
device = torch.device("cuda")

# capture and restore in place: the same CUDA draws after restore()
state = RngState.capture()
first = torch.rand(1024, device=device)
state.restore()
if not torch.equal(first, torch.rand(1024, device=device)):
    raise SystemExit("rng_resume.py: RngState.restore() did not restore the CUDA generator")
state.restore()

model = torch.nn.Sequential(
    torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(256, 4)
).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(5)
batches = [
    (torch.randn(32, 64, generator=g).to(device), torch.randint(0, 4, (32,), generator=g).to(device)) for _ in range(8)
]

plan = checkpoint.plan()
step, resume = 0, None
if plan.resume_from is not None:
    model.load_state_dict(torch.load(plan.resume_from / "model.pt", weights_only=True))
    opt.load_state_dict(torch.load(plan.resume_from / "optim.pt", weights_only=True))
    resume = checkpoint.load(plan.resume_from)
    step = resume.step
    if args.forget_rng:
        resume.rng = None  # re-derived from the seed: reproducible, not the stream the run had
it = iter(batches)
done = 0
if resume is not None:
    done = resume.batch
    resume.apply(it)
for batch, (x, y) in enumerate(it, start=done):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    if plan.should_stop(step):
        plan.save_to.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), plan.save_to / "model.pt")
        torch.save(opt.state_dict(), plan.save_to / "optim.pt")
        checkpoint.save(plan.save_to, step=step, epoch=0, batch=batch + 1)
        raise SystemExit(0)
