"""Shared by the launcher test scripts: a tiny model, its batches, and a parameter digest."""
import hashlib
import os
import sys

import torch


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def batch(rank: int, step: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """16 samples; rank 1 gets 8 at step 3 (a planted recompile on one rank only)."""
    n = 8 if (rank == 1 and step == 3) else 16
    return torch.randn(n, 8, generator=generator), torch.randint(0, 2, (n,), generator=generator)


def save_digest(module: torch.nn.Module, rank: int) -> None:
    """Write sha256 of every parameter's bytes to $LAUNCH_DIGESTS/rank<r>.sha (when set)."""
    out = os.environ.get("LAUNCH_DIGESTS")
    if not out:
        return
    digest = hashlib.sha256(b"".join(p.detach().contiguous().numpy().tobytes() for p in module.parameters()))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank{rank}.sha"), "w") as fp:
        fp.write(digest.hexdigest())


def flag(name: str) -> bool:
    return name in sys.argv
