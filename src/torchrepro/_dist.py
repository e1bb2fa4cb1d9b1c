"""Where this process sits in its job: rank, local rank, world size, node.

One precedence, for every part of torchrepro that asks:

1. an initialised ``torch.distributed`` process group says the rank and the world size;
2. else the launcher's environment: torchrun's variables (``RANK``, ``LOCAL_RANK``,
   ``WORLD_SIZE``; the node from ``GROUP_RANK``, or Lightning's ``NODE_RANK``) when any of
   ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` is set, else SLURM's (``SLURM_PROCID``,
   ``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_NODEID``) when ``SLURM_PROCID`` is set; one
   family, never a mix of both;
3. else the defaults: rank 0 of a world of 1.

A process group has no local rank nor node: those always come from the environment, and are
``None`` in a :class:`Placement` when it does not say (:func:`local_rank` then falls back to
the rank). An empty variable counts as unset; a value that is not an integer raises
``ValueError``.

Importing this module does not import torch: a process group can only be initialised in a
process that has imported ``torch.distributed`` already.

>>> from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "GROUP_RANK": "1"})
Placement(rank=3, world_size=4, local_rank=1, node=1, source='env')
>>> from_env({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}).rank
5
>>> from_env({})
Placement(rank=0, world_size=1, local_rank=None, node=None, source='default')
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

TORCHRUN = {
    "rank": ("RANK",),
    "local_rank": ("LOCAL_RANK",),
    "world_size": ("WORLD_SIZE",),
    "node": ("GROUP_RANK", "NODE_RANK"),
}
SLURM = {
    "rank": ("SLURM_PROCID",),
    "local_rank": ("SLURM_LOCALID",),
    "world_size": ("SLURM_NTASKS",),
    "node": ("SLURM_NODEID",),
}


@dataclass(frozen=True)
class Placement:
    """This process's place in its job, and where it was read (``source``: ``process_group``,
    ``env`` or ``default``, for the rank and world size)."""

    rank: int
    world_size: int
    local_rank: int | None  # None: the environment does not say
    node: int | None  # None: the environment does not say
    source: str


def from_env(environ: Mapping[str, str] | None = None) -> Placement:
    """The placement the environment gives (steps 2 and 3 of the module's precedence);
    ``environ`` defaults to ``os.environ``."""
    environ = os.environ if environ is None else environ
    family = (
        TORCHRUN
        if any(_value(environ, name) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        else (SLURM if _value(environ, "SLURM_PROCID") else None)
    )
    if family is None:
        return Placement(rank=0, world_size=1, local_rank=None, node=None, source="default")
    rank, local, world, node = (_int(environ, family[key]) for key in ("rank", "local_rank", "world_size", "node"))
    return Placement(
        rank=0 if rank is None else rank,
        world_size=1 if world is None else world,
        local_rank=local,
        node=node,
        source="env",
    )


def placement() -> Placement:
    """This process's placement: the process group's rank and world size once one is
    initialised, the environment's otherwise (see the module's precedence)."""
    here = from_env()
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return Placement(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            local_rank=here.local_rank,
            node=here.node,
            source="process_group",
        )
    return here


def rank() -> int:
    """This process's global rank (0 alone)."""
    return placement().rank


def world_size() -> int:
    """The number of ranks of this process's job (1 alone)."""
    return placement().world_size


def local_rank() -> int:
    """This process's rank on its node: the environment's, else its global rank."""
    here = placement()
    return here.rank if here.local_rank is None else here.local_rank


def node() -> int | None:
    """The index of this process's node in its job, if the environment says."""
    return from_env().node


def _value(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "").strip()


def _int(environ: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = _value(environ, name)
        if value:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{name}={environ[name]!r} is not an integer") from None
    return None
