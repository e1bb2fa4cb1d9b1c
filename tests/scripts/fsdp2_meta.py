"""FSDP2 on CPU/gloo the way PyTorch's FSDP2 example builds its model (realworld/fsdp2): on the meta
device, each block and then the root sharded with fully_shard, materialised with to_empty(), and
initialised by the root's own reset_parameters(), which leaves the blocks out: they train on
uninitialised memory. `--init-all`: every submodule's reset_parameters() (the fix)."""
import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

parser = argparse.ArgumentParser()
parser.add_argument("--init-all", action="store_true")
args = parser.parse_args()


class Block(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.ffn = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.ffn(self.norm(x))


class Model(torch.nn.Module):
    def __init__(self, vocab=32, dim=16, n_layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.layers = torch.nn.ModuleList(Block(dim) for _ in range(n_layers))
        self.output = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(h)

    def reset_parameters(self):  # as the example's Transformer: its own parameters, not the blocks'
        self.embed.reset_parameters()
        self.output.reset_parameters()


dist.init_process_group("gloo")
torch.manual_seed(0)
with torch.device("meta"):
    model = Model()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
model.to_empty(device="cpu")
if args.init_all:
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
else:
    model.reset_parameters()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(dist.get_rank())
for step in range(3):
    x = torch.randint(0, 32, (4, 8), generator=g)
    loss = model(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
del model, opt
dist.destroy_process_group()
