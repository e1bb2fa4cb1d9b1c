"""A small MLP compiled with inductor, with a planted nondeterministic custom op: ``jitter``
adds 1e-6 on every other call in this process (a call counter), in the forward (``fwd``) or in
the backward of ``x * w`` (``bwd``). Two runs call it in the same order, so they agree bit for
bit; a compiled graph called again on the same inputs does not. ``none``: no jitter at all."""

import sys

import torch

torch.set_num_threads(1)
torch.manual_seed(0)
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
WHERE = sys.argv[2] if len(sys.argv) > 2 else "fwd"
CALLS = [0]


@torch.library.custom_op("probe_planted::jitter", mutates_args=())
def jitter(x: torch.Tensor) -> torch.Tensor:
    CALLS[0] += 1
    return x + (CALLS[0] % 2) * 1e-6


@jitter.register_fake
def _(x):
    return torch.empty_like(x)


jitter.register_autograd(lambda ctx, grad: grad)


# one op name a mode: AOTAutograd's cache keys an op by its name and schema, not by the Python of
# its backward, so the modes would otherwise be served each other's cached backward graphs
@torch.library.custom_op(f"probe_planted::scale_{WHERE}", mutates_args=())
def scale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w


@scale.register_fake
def _(x, w):
    return torch.empty_like(x)


def _scale_backward(ctx, grad):
    x, w = ctx.saved_tensors
    gw = grad * x
    return grad * w, jitter(gw) if WHERE == "bwd" else gw


scale.register_autograd(_scale_backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)
        self.w = torch.nn.Parameter(torch.ones(16))

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if WHERE == "fwd":
            h = jitter(h)
        return self.fc2(scale(h, self.w))


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
compiled = torch.compile(model)
data = torch.randn(32, 8)
for step in range(STEPS):
    loss = compiled(data).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
