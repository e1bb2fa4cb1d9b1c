"""A small Llama/GPT-style model whose compiled forward returns ``(logits, loss)`` — the loss a
0-dim tensor, as nanoGPT's does — with dropouts of p=0.0 (inert), trained with AdamW. Compiled
with inductor and compared with eager it differs by rounding (numerics), not by any random op."""
import sys

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
VOCAB, CTX, DIM, HEADS = 64, 16, 32, 2


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.qkv, self.proj = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM))
        self.drop = torch.nn.Dropout(0.0)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, c // HEADS).transpose(1, 3).unbind(2)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, DIM)
        self.pos = torch.nn.Embedding(CTX, DIM)
        self.drop = torch.nn.Dropout(0.0)
        self.blocks = torch.nn.Sequential(Block(), Block())
        self.ln = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx, targets):
        x = self.drop(self.tok(idx) + self.pos(torch.arange(idx.shape[1])))
        logits = self.head(self.ln(self.blocks(x)))
        loss = F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))
        return logits, loss


model = GPT()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
compiled = torch.compile(model)
data = torch.randint(0, VOCAB, (8, CTX + 1))
for step in range(STEPS):
    logits, loss = compiled(data[:, :-1], data[:, 1:])
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
