"""A small GPT-style model (token + position embeddings, causal attention, MLP, output head tied
to the token embedding, AdamW) compiled with inductor and trained with 2 intra-op threads: on
torch 2.13 CPU its runs are not bit-exact (docs/compiled-nondeterminism.md explains why)."""
import sys

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
torch.manual_seed(0)
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 6
VOCAB, CTX, DIM, HEADS = 96, 32, 64, 4


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.qkv, self.proj = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, c // HEADS).transpose(1, 3).unbind(2)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, DIM)
        self.pos = torch.nn.Embedding(CTX, DIM)
        self.blocks = torch.nn.Sequential(Block(), Block())
        self.ln = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.tok.weight  # tied

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        return self.head(self.ln(self.blocks(x)))


model = GPT()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
step_fn = torch.compile(model)
data = torch.randint(0, VOCAB, (16, CTX + 1))
for step in range(STEPS):
    x, y = data[:, :-1], data[:, 1:]
    loss = F.cross_entropy(step_fn(x).reshape(-1, VOCAB), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
