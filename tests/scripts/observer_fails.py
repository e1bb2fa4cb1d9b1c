"""Training whose batches are a Mapping that cannot be iterated as a whole (its items() raises):
torchrepro's batch observer fails on it, is switched off, and the run must go on untouched."""
from collections.abc import Mapping

import torch


class Batch(Mapping):
    def __init__(self, x, y):
        self._data = {"x": x, "y": y}

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        raise RuntimeError("this batch type is not iterable")

    def __len__(self):
        return 2


torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
loader = torch.utils.data.DataLoader(data, batch_size=8, collate_fn=lambda items: Batch(
    torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])))
for batch in loader:
    loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])
    opt.zero_grad()
    loss.backward()
    opt.step()
print("trained")
