"""Objects finalized at exit, for tests/test_exit.py. Each writes its name to the file in argv[1]
when it is finalized: one reference cycle that is garbage before the script ends ("garbage"), one
kept by a module until the interpreter tears modules down ("teardown"), and an atexit call."""

import atexit
import os
import sys
import types

import torch



def note(name, path=sys.argv[1], flags=os.O_WRONLY | os.O_APPEND | os.O_CREAT, open=os.open, write=os.write, close=os.close):
    fd = open(path, flags)  # all bound now: works while modules are torn down
    write(fd, f"{name}\n".encode())
    close(fd)


class Noted:
    def __init__(self, name):
        self.name, self.me = name, self  # a reference cycle: only the garbage collector frees it

    def __del__(self, note=note):
        note(self.name)


registry = types.ModuleType("noted_registry")
sys.modules["noted_registry"] = registry
registry.kept = Noted("teardown")
Noted("garbage")
atexit.register(note, "atexit")

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
