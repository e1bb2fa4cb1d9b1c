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


class CausalSelfAttention(torch.nn.Module):
    """GPT-2's attention, its parameters named as GPT-2's (c_attn, c_proj)."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.c_attn, self.c_proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.c_attn(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Layer(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln_1, self.attn = torch.nn.LayerNorm(width), CausalSelfAttention(width, heads)
        self.ln_2 = torch.nn.LayerNorm(width)
        self.c_fc, self.c_proj = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(VOCAB, DIM), torch.nn.Embedding(POSITIONS, DIM)
        self.h = torch.nn.ModuleList(Layer(DIM, HEADS) for _ in range(LAYERS))
        self.ln_f = torch.nn.LayerNorm(DIM)
        self.lm_head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2's

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for layer in self.h:
            x = layer(x)
        return self.lm_head(self.ln_f(x))


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
