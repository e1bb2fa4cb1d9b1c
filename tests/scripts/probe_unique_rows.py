"""An embedding trained with inductor at 2 threads, its batch naming every row once: its backward
adds atomically (embedding_dense_backward), but no two threads add to the same row, so every call
on the same inputs is bit for bit the same."""

import torch

torch.set_num_threads(2)
torch.manual_seed(0)
ROWS = 64


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(ROWS, 16)
        self.out = torch.nn.Linear(16, 1)

    def forward(self, ids):
        return self.out(torch.tanh(self.emb(ids)))


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
compiled = torch.compile(model)
ids = torch.randperm(ROWS)
for step in range(2):
    loss = compiled(ids).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
