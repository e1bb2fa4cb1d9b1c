"""torchrepro: reproducible torch.compile training, and an exact account of why a run is not.

The public API is imported lazily, so that ``torchrepro.analysis`` and the report code can
read event logs on a machine without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {
    "seed_everything": "seed",
    "SeedPlan": "seed",
    "worker_init_fn": "seed",
    "make_generator": "seed",
    "worker_rng": "seed",
    "RngState": "rng",
    "deterministic": "determinism",
    "audit": "determinism",
    "fingerprint": "fingerprint",
    "stable_uid": "fingerprint",
    "UserError": "errors",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'torchrepro' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
