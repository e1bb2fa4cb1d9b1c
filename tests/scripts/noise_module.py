import torch
torch.manual_seed(0)
class Noise(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gen = torch.Generator()
        self.gen.seed()  # unseeded: a different stream in every process
    def forward(self, x):
        return x + 0.01 * torch.randn(x.shape, generator=self.gen)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
        self.noise = Noise()
        self.head = torch.nn.Linear(16, 2)
    def forward(self, x):
        return self.head(self.noise(self.body(x)))
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
for step in range(3):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
