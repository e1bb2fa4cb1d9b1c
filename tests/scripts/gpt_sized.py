"""A GPT of a chosen size (token and position embeddings, pre-LN blocks, output head tied to the
token embedding, AdamW), compiled with inductor, trained on one fixed random batch:
``gpt_sized.py STEPS SIZE`` with SIZE 1m, 10m or 124m (GPT-2 small's shapes: 12 layers, 768
wide, 50257 tokens, 1024 positions). Prints its parameter count."""

import sys

import torch
import torch.nn.functional as F

torch.manual_seed(0)
SIZES = {  # layers, width, heads, vocabulary, positions
    "1m": (2, 128, 4, 2048, 64),
    "10m": (6, 288, 6, 8192, 256),
    "124m": (12, 768, 12, 50257, 1024),
}
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
LAYERS, DIM, HEADS, VOCAB, POSITIONS = SIZES[sys.argv[2] if len(sys.argv) > 2 else "1m"]
BATCH, T = 2, 32


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
        self.tok, self.pos = torch.nn.Embedding(VOCAB, DIM), torch.nn.Embedding(POSITIONS, DIM)
        self.blocks = torch.nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.ln = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        return self.head(self.ln(self.blocks(x)))


model = GPT()
print("PARAMS", sum(p.numel() for p in model.parameters()), flush=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
step_fn = torch.compile(model)
data = torch.randint(0, VOCAB, (BATCH, T + 1))
for step in range(STEPS):
    loss = F.cross_entropy(step_fn(data[:, :-1]).reshape(-1, VOCAB), data[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
