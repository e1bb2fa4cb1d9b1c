"""A step given a closure, as Lightning's automatic optimization runs one: optimizer.step(closure) calls
the closure, which zeroes the gradients and calls backward(), so the gradients of a step exist only
inside step(). Prints the norm of each step's gradients as its closure's backward() left them."""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for step in range(4):

    def closure():
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        norms = torch.stack([p.grad.norm().float() for p in model.parameters()])
        print(f"step {step} grad_norm {torch.linalg.vector_norm(norms).item()!r}", flush=True)
        return loss

    optimizer.step(closure)
