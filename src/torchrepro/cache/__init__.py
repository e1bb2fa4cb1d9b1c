"""Compile caches: inventory, why a lookup missed, warm-start packs, per-rank policies.

>>> import torchrepro.cache
>>> torchrepro.cache.configure("per-node", root="/local/cache")  # before the first compile  # doctest: +SKIP
>>> torchrepro.cache.pack("warm.tar", sign_with="packs.key")  # after a run that compiled  # doctest: +SKIP
>>> torchrepro.cache.prewarm("warm.tar", trusted=["packs.key.pub"])  # every rank, before training  # doctest: +SKIP

Submodules are imported on first use: ``configure`` must not pay for (or trigger) more than it needs.
"""

from __future__ import annotations

from .._lazy import lazy_api

_API = {
    "CachePlan": "policy",
    "POLICIES": "policy",
    "DEFAULT_POLICY": "policy",
    "PREWARM_POLICY": "policy",
    "plan": "policy",
    "configure": "policy",
    "configure_from_env": "policy",
    "prewarm": "policy",
    "cache_dir": "layout",
    "status": "inventory",
    "clear": "inventory",
    "pack": "archive",
    "unpack": "archive",
    "verify": "integrity",
    "keygen": "signing",
}

__all__ = sorted(_API)
__getattr__, __dir__ = lazy_api(__name__, _API, globals())
