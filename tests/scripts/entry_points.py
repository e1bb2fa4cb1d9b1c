"""Every way into torch.compile, each called with a short last batch (one recompile each), under
torchrepro's module wrapper: where the report says each compile happened (tests/test_locations.py).
Lines marked ``# ENTRY <name>`` are the call sites; ``# DEF <name>`` the first line of the compiled code (its decorator's, as Python counts)."""

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):  # DEF user module
        y = self.lin(x)
        torch._dynamo.graph_break()  # BREAK
        return y.relu()

    @torch.compile(backend="eager")  # DEF method
    def method(self, x):
        return self.lin(x) * 2


def plain(x):  # DEF function
    return x.sin() + 1


@torch.compile(backend="eager")  # DEF decorator
def decorated(x):
    return x.cos() * 2


torch.manual_seed(0)
sequential = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), backend="eager")
net = torch.compile(Net(), backend="eager")
function = torch.compile(plain, backend="eager")
optimizer = torch.optim.SGD([*sequential.parameters(), *net.parameters()], lr=0.01)
for batch in (4, 4, 2):
    y = sequential(torch.randn(batch, 4))  # ENTRY torch module
    y = net(y)  # ENTRY user module
    y = function(y)  # ENTRY function
    y = decorated(y)  # ENTRY decorator
    y = net.method(y)  # ENTRY method
    loss = y.pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
