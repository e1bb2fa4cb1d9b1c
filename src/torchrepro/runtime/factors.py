"""The factor levels of one ``torchrepro drift`` run, applied in its process before the script starts.

``drift`` passes them in the run's :class:`~torchrepro.runtime.run_options.RunOptions` (``factors``,
applied by ``prepare.prepare``); ``compile`` and ``fallback-random`` are its ``compile_mode``. Every
stream comes from the seed tree (:mod:`torchrepro.seed`) of the experiment's root seed:

- ``init``: Python ``random``, numpy's global RNG and torch (CPU and CUDA) from the stream
  ``("init", level=i)`` — what the model is initialised from.
- ``order``: every DataLoader gets the generator of ``("order", level=j, loader=n)``, n counting
  loaders in creation order; it draws the shuffling (``RandomSampler``, the one the loader builds or
  one the script passes) and the loader's base seed; a ``DistributedSampler`` gets its ``seed``
  from the same stream. A generator the script passed is replaced: the experiment varies the order.
- ``augment``: DataLoader workers are seeded from ``("worker", rank, worker, epoch)`` under the
  root of ``("augment", level=k)`` (``seed_everything``'s worker seeding), and so is
  :func:`torchrepro.worker_rng` in the main process.
- ``threads``: ``torch.set_num_threads(n)``; ``deterministic``: :func:`torchrepro.deterministic`;
  ``backend``: every ``torch.compile`` call gets ``backend=`` this (and inductor-only ``mode`` /
  ``options`` are dropped for other backends).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from .._compat import patch


def apply(levels: Mapping[str, int | str]) -> None:
    """Seed the streams and set the switches of one run (see the module docstring): ``root`` (the
    experiment's seed), ``init``, ``order`` and ``augment`` (a level each), ``threads``, ``deterministic``
    (1/True) and ``backend``; a factor not given keeps its default."""
    import torch

    from ..seed import derive, seed_everything

    root = int(levels.get("root", 0))
    augment = derive(root, "augment", level=int(levels.get("augment", 0)))
    seed_everything(int.from_bytes(augment.material, "little"))  # workers and worker_rng() under this root
    derive(root, "init", level=int(levels.get("init", 0))).seed_globals()
    _order_loaders(root, int(levels.get("order", 0)))
    if "threads" in levels:
        torch.set_num_threads(int(levels["threads"]))
    if levels.get("deterministic"):
        from ..determinism import deterministic

        deterministic()
    if levels.get("backend"):
        _force_backend(str(levels["backend"]))


def _order_loaders(root: int, level: int) -> None:
    import torch
    from torch.utils.data import DistributedSampler, RandomSampler

    from ..seed import derive

    cls = torch.utils.data.DataLoader
    original = cls.__init__
    count = itertools.count()

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        stream = derive(root, "order", level=level, loader=next(count))
        generator, theirs = stream.torch_generator(), self.generator
        self.generator = generator
        for sampler in (self.sampler, getattr(self.batch_sampler, "sampler", None)):
            if isinstance(sampler, RandomSampler) and sampler.generator in (None, theirs):
                sampler.generator = generator
            elif isinstance(sampler, DistributedSampler):
                sampler.seed = stream.torch % 2**62

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    patch(cls, "__init__", __init__)


def _force_backend(backend: str) -> None:
    import torch

    original = torch.compile

    def compile(model: Any = None, **kwargs: Any) -> Any:
        kwargs["backend"] = backend
        if backend != "inductor":
            kwargs.pop("mode", None)
            kwargs.pop("options", None)
        return original(model, **kwargs)

    compile.__wrapped__ = original  # type: ignore[attr-defined]
    patch(torch, "compile", compile)
