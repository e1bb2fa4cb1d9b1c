"""Compile counts doctor must give as Dynamo's counters do, and place as they happened:

- a graph break in a loop (``print`` in a helper called in a ``for`` loop): Dynamo skips the
  looping frame, logging the break once more ("Failed to handle graph break gracefully"), then
  traces the helper as a frame of its own and breaks there: one break, logged twice;
- a shape recompile on ``idx``'s dimension 1 (the sequence grows), the guard Dynamo names;
- an evaluation under ``no_grad`` after the last training step: a recompile after step 3, not in a
  step 4 that never ran."""

import torch


def helper(x):
    print("inside")  # the graph break
    return x + 1


@torch.compile(backend="eager")
def looped(x):
    for _ in range(2):
        x = helper(x) * 2
    return x


emb = torch.nn.Embedding(16, 4)
head = torch.nn.Linear(4, 16)


@torch.compile(backend="eager", dynamic=False)
def model(idx):
    return head(emb(idx)).mean()


opt = torch.optim.SGD([*emb.parameters(), *head.parameters()], lr=0.1)
for step in range(4):
    idx = torch.randint(0, 16, (2, 4 + (step >= 2)))
    looped(torch.ones(2))
    loss = model(idx)
    opt.zero_grad()
    loss.backward()
    opt.step()
with torch.no_grad():
    model(torch.randint(0, 16, (2, 5)))
