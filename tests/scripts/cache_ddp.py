"""DDP + inductor on gloo under a torchrepro cache policy; each rank writes its first-step time
and compile-cache counters to OUT_DIR/rank-<r>.json.

Usage: torchrun --standalone --nproc-per-node 2 cache_ddp.py OUT_DIR [--policy P --root DIR]
       [--warm-from PACK] [--model mlp|transformer]
With --warm-from, every rank warms its directory from that pack first (torchrepro.cache.prewarm).
"""

import argparse
import gc
import json
import os
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--policy")
parser.add_argument("--root")
parser.add_argument("--warm-from")
parser.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
args = parser.parse_args()
if args.policy:
    import torchrepro.cache

    if args.warm_from:
        torchrepro.cache.prewarm(args.warm_from, args.policy, root=args.root, strict=True)
    else:
        torchrepro.cache.configure(args.policy, root=args.root)

import torch  # noqa: E402 - after the cache is configured
import torch.distributed as dist  # noqa: E402 - after the cache is configured
from torch._dynamo.utils import counters  # noqa: E402 - after the cache is configured
from torch.nn.parallel import DistributedDataParallel  # noqa: E402 - after the cache is configured

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
if args.model == "mlp":
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 4))
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(rank))
else:
    model = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0,
                                             batch_first=True)
    x = torch.randn(4, 16, 64, generator=torch.Generator().manual_seed(rank))
# DDP around the compiled module: on torch 2.13, torch.compile(DDP(model)) compiles nothing here
ddp = DistributedDataParallel(torch.compile(model))
opt = torch.optim.SGD(model.parameters(), lr=0.1)

dist.barrier()
start = time.perf_counter()
ddp(x).square().mean().backward()
opt.step()
first = time.perf_counter() - start
dist.barrier()
job_first = time.perf_counter() - start  # the step is done when the slowest rank is done

out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
(out / f"rank-{rank}.json").write_text(json.dumps({
    "rank": rank, "first_step_s": round(first, 3), "job_first_step_s": round(job_first, 3),
    "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
    "fx": {k.split("_")[-1]: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")},
    "aot": {k.split("_")[-1]: v for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache")},
}))
del ddp, opt
gc.collect()
dist.destroy_process_group()
