"""A tiny compiled training run for the OpenTelemetry and watch tests.

Usage: otel_train.py [--epochs E] [--save PATH] [--sleep S] [--backend B] [--print]
An explicit graph break in forward and a planted shape recompile (70 samples in batches of 16:
a short last batch). Seeded, no dropout: the same parameters every run. `--sleep S` pauses after
each step, so that a test can watch the run while it is written.
"""

import argparse
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--save", default=None)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--backend", default="aot_eager")
parser.add_argument("--print", action="store_true", help="print one line per epoch")
args = parser.parse_args()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 3)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        torch._dynamo.graph_break()
        return self.fc2(h)


torch.manual_seed(0)
model = Net()
compiled = torch.compile(model, backend=args.backend)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(70, 8), torch.randint(0, 3, (70,)))
loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
for epoch in range(args.epochs):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.sleep)
    if args.print:
        print(f"epoch {epoch} done, loss {loss.item():.4f}", flush=True)
if args.save:
    torch.save(model.state_dict(), args.save)
