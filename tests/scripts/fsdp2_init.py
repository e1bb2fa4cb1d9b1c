"""FSDP2 on CPU/gloo. `--seed-per-rank`: every rank seeds differently (FSDP2 does not broadcast,
so the ranks train a silent mix of two inits). `--broadcast`: the fix - build on meta, shard,
materialise, and load rank 0's full state dict into every rank."""
import argparse

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

parser = argparse.ArgumentParser()
parser.add_argument("--seed-per-rank", action="store_true")
parser.add_argument("--broadcast", action="store_true")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))


def build():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


torch.manual_seed(100 + rank if args.seed_per_rank else 0)
if args.broadcast:
    full = build().state_dict() if rank == 0 else {}
    with torch.device("meta"):
        model = build()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
else:
    model = build()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
for step in range(3):
    x, y = torch.randn(8, 8, generator=g), torch.randint(0, 2, (8,), generator=g)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
del model, opt
dist.destroy_process_group()
