"""DataLoader with 2 workers, shuffling and numpy/torch augmentation, and no seeding of the data
pipeline (the model's initial weights come from a fixed seed, so only the data can differ)."""
import numpy as np
import torch


class Augmented(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(48, 8, generator=g), torch.randint(0, 2, (48,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        jitter = torch.from_numpy(np.random.normal(0, 0.1, 8).astype(np.float32))
        return self.x[i] + jitter + 0.05 * torch.randn(8), self.y[i]


if __name__ == "__main__":
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(Augmented(), batch_size=8, shuffle=True, num_workers=2)
    for epoch in range(2):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
