"""A sequence model trained with LBFGS and a closure, in float64 (as PyTorch's
time_sequence_prediction example does): LBFGS calls the closure, and so backward(), up to
max_iter times per optimizer.step(). Prints each step's loss as step(closure) returns it."""

import math

import torch

torch.manual_seed(0)
torch.set_default_dtype(torch.float64)
t = torch.arange(0, 40).reshape(1, -1) / 4.0
data = torch.sin(t + torch.rand(8, 1) * 2 * math.pi)
inputs, targets = data[:, :-1].unsqueeze(-1), data[:, 1:].unsqueeze(-1)


class Sequence(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(1, 8, batch_first=True)
        self.linear = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.linear(self.lstm(x)[0])


model = Sequence()
criterion = torch.nn.MSELoss()
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.8, max_iter=20)
for i in range(3):

    def closure():
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    print(f"step {i} loss {loss.item()!r}", flush=True)
