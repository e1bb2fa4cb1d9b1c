"""A model built on the meta device and given memory with to_empty(), FSDP2's way, in one process.
`--init`: every submodule's reset_parameters() after to_empty() (without it the parameters hold
whatever that memory held); `--noise`: an unseeded generator adds noise in the forward (the runs
differ from step 0); `--compile BACKEND`: torch.compile(model, backend=BACKEND); `--save PATH`: the
final parameters."""
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--init", action="store_true")
parser.add_argument("--noise", action="store_true")
parser.add_argument("--compile")
parser.add_argument("--save")
args = parser.parse_args()


class Noise(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gen = torch.Generator()
        self.gen.seed()  # unseeded: a different stream in every process

    def forward(self, x):
        return x + 0.01 * torch.randn(x.shape, generator=self.gen)


torch.manual_seed(0)
with torch.device("meta"):
    layers = [torch.nn.Linear(8, 16), torch.nn.ReLU(), *([Noise()] if args.noise else []), torch.nn.Linear(16, 2)]
    model = torch.nn.Sequential(*layers)
model.to_empty(device="cpu")
if args.init:
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step_model = torch.compile(model, backend=args.compile) if args.compile else model
x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
for step in range(3):
    loss = torch.nn.functional.cross_entropy(step_model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
if args.save:
    torch.save(model.state_dict(), args.save)
