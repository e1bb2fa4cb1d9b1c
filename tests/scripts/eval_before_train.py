"""A small GPT-style model, compiled with inductor, that evaluates under ``no_grad`` before it
trains, as nanoGPT's ``estimate_loss()`` does at iteration 0: Dynamo's graph 0/0 is the
evaluation graph (an inference graph: no backward), the grad-mode recompile 0/1 the training
graph. Compiled and eager part by rounding in both; only the training graph makes a gradient."""
import sys

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
VOCAB, CTX, DIM = 64, 16, 32


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(DIM)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        return x + self.mlp(self.ln(x))


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.Sequential(Block(), Block())
        self.ln = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx, targets):
        logits = self.head(self.ln(self.blocks(self.tok(idx))))
        return logits, F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))


model = GPT()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
compiled = torch.compile(model)
data = torch.randint(0, VOCAB, (8, CTX + 1))
for step in range(STEPS):
    if step == 0:  # evaluate before training, as nanoGPT does
        model.eval()
        with torch.no_grad():
            _, val = compiled(data[:, :-1], data[:, 1:])
        model.train()
        print(f"step {step} val loss {val.item():.6f}")
    logits, loss = compiled(data[:, :-1], data[:, 1:])
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
