"""One seed tree: every random stream of a training job derived from one root seed.

Derivation
----------
A stream is named by a *role* (``"global"``, ``"dropout"``, ``"worker"``, ...) and integer
*coordinates* (``rank=3``, ``worker=1``, ``epoch=7``, ``dp=0``, ``tp=2``, ...). Its 128 bits
of seed material are::

    blake2b(json.dumps({"root": root, "role": role, **coords}, sort_keys=True), digest_size=16)

Distinct (role, coordinates) give distinct JSON texts, so streams collide only if blake2b
collides; nothing is added or multiplied (Megatron's ``seed + 100*pp + 10*dp`` makes
``pp=0, dp=10`` and ``pp=1, dp=0`` share a seed). Each library gets its own 16 bytes,
``blake2b(material, digest_size=16, person=library)``, so that Python's and numpy's
Mersenne Twisters (seeded alike from the same words) never produce the same numbers:

- torch CPU and every CUDA device: the first 8 bytes of ``"torch"``, little-endian;
- numpy's legacy global RNG: the four little-endian 32-bit words of ``"numpy"``;
- a numpy ``Generator``: ``np.random.default_rng`` of the 128-bit integer of ``"numpy-gen"``;
- Python ``random``: the 128-bit integer of ``"python"``.

Python's ``hash()`` is never involved, so seeds do not depend on ``PYTHONHASHSEED``.

Which stream is which
---------------------
``seed_everything`` seeds the global generators from ``("global")`` — the same on every
rank, so data-parallel replicas initialise identical parameters. Randomness that must differ
between ranks (dropout on different micro-batches) comes from a named per-rank stream,
``with plan.fork("dropout"):``. DataLoader workers draw from ``("worker", rank, worker,
epoch)``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import _dist, _state
from ._compat import dataloader_get_iterator, set_dataloader_get_iterator

if TYPE_CHECKING:
    import torch as _torch  # for StreamSeeds, whose `torch` property hides the module in its body

    from .determinism import Mode

_MAX_ROOT = 2**128


@dataclass(frozen=True)
class StreamSeeds:
    """The seeds of one named stream, derived from the root seed (see module docstring)."""

    role: str
    coords: tuple[tuple[str, int], ...]
    material: bytes

    def _library_bytes(self, library: str) -> bytes:
        return hashlib.blake2b(self.material, digest_size=16, person=library.encode()).digest()

    @property
    def torch(self) -> int:
        """Seed for ``torch.manual_seed`` / a ``torch.Generator`` (64 bits)."""
        return int.from_bytes(self._library_bytes("torch")[:8], "little")

    @property
    def numpy(self) -> list[int]:
        """Four 32-bit words for ``np.random.seed`` (the legacy global RNG)."""
        data = self._library_bytes("numpy")
        return [int.from_bytes(data[i : i + 4], "little") for i in range(0, 16, 4)]

    @property
    def python(self) -> int:
        """Seed for ``random.seed`` (128 bits)."""
        return int.from_bytes(self._library_bytes("python"), "little")

    def numpy_generator(self) -> np.random.Generator:
        """A fresh numpy ``Generator`` on this stream."""
        return np.random.default_rng(int.from_bytes(self._library_bytes("numpy-gen"), "little"))

    def torch_generator(self, device: str | _torch.device = "cpu") -> _torch.Generator:
        """A fresh ``torch.Generator`` on this stream."""
        g = torch.Generator(device=device)
        g.manual_seed(self.torch)
        return g

    def seed_globals(self) -> None:
        """Seed Python ``random``, numpy's global RNG, torch CPU and every CUDA device."""
        random.seed(self.python)
        np.random.seed(self.numpy)
        torch.manual_seed(self.torch)  # also seeds every CUDA device (lazily if uninitialised)

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "coords": dict(self.coords),
            "material": self.material.hex(),
            "torch": self.torch,
            "numpy": self.numpy,
            "python": self.python,
        }


def derive(root: int, role: str, **coords: int) -> StreamSeeds:
    """Derive the seeds of stream ``role`` at ``coords`` from ``root``.

    >>> derive(0, "worker", rank=1, worker=0, epoch=3).torch  # doctest: +SKIP
    """
    _check_root(root)
    if not isinstance(role, str) or not role:
        raise ValueError("a stream's role must be a non-empty string")
    for name, value in coords.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"coordinate {name}={value!r} must be an int")
    text = json.dumps({"root": root, "role": role, **coords}, sort_keys=True, separators=(",", ":"))
    material = hashlib.blake2b(text.encode(), digest_size=16).digest()
    return StreamSeeds(role, tuple(sorted(coords.items())), material)


def _check_root(root: int) -> None:
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < _MAX_ROOT:
        raise ValueError(f"the root seed must be an int in [0, 2**128), got {root!r}")


@dataclass
class SeedPlan:
    """Every stream a job has seeded from one root; printable and JSON-serialisable.

    >>> plan = seed_everything(1234)
    >>> with plan.fork("dropout"):      # per-rank stream for randomness that must differ
    ...     y = torch.nn.functional.dropout(torch.ones(4), 0.5)
    """

    root: int
    rank: int = 0
    world_size: int = 1
    workers: bool = True
    deterministic: Mode | None = None
    streams: dict[str, StreamSeeds] = field(default_factory=dict)
    _fork_states: dict[str, _state.TorchStates] = field(default_factory=dict, repr=False)

    def stream(self, role: str, **coords: int) -> StreamSeeds:
        """Derive (and record in the plan) the seeds of ``role`` at ``coords``."""
        seeds = derive(self.root, role, **coords)
        self.streams[_stream_key(seeds)] = seeds
        return seeds

    @contextlib.contextmanager
    def fork(self, role: str, *, shared: bool = False, **coords: int) -> Iterator[StreamSeeds]:
        """Run a block on the named stream's own torch state (CPU and every CUDA device).

        Per rank by default (``rank=self.rank`` is added to ``coords``); ``shared=True`` gives
        every rank the same stream. The stream continues where it stopped at the previous
        fork of the same name, and the outer state is restored on exit (Megatron's
        ``CudaRNGStatesTracker.fork``, for CPU and CUDA).
        """
        if not shared:
            coords.setdefault("rank", self.rank)
        seeds = self.stream(role, **coords)
        key = _stream_key(seeds)
        outer = _torch_states()
        inner = self._fork_states.get(key)
        if inner is None:
            torch.manual_seed(seeds.torch)
        else:
            _set_torch_states(inner)
        try:
            yield seeds
        finally:
            self._fork_states[key] = _torch_states()
            _set_torch_states(outer)

    def make_generator(self, name: str, device: str | torch.device = "cpu", **coords: int) -> torch.Generator:
        """A ``torch.Generator`` on stream ``name`` (shared across ranks unless ``coords`` say
        otherwise), registered so that ``RngState.capture()`` saves it.

        >>> sampler = torch.utils.data.RandomSampler(data, generator=plan.make_generator("sampler"))  # doctest: +SKIP
        """
        generator = self.stream(name, **coords).torch_generator(device)
        _state.add_generator(name, generator)
        return generator

    def worker_init_fn(self, user_fn: Callable[[int], Any] | None = None) -> WorkerSeeder:
        """A DataLoader ``worker_init_fn`` seeding each (rank, worker, epoch) distinctly,
        then calling ``user_fn`` (so a user's own hook keeps the rank mixing)."""
        return WorkerSeeder(self.root, self.rank, user_fn)

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "rank": self.rank,
            "world_size": self.world_size,
            "workers": self.workers,
            "deterministic": self.deterministic,
            "derivation": "blake2b-128 over canonical JSON {root, role, **coords}",
            "streams": [s.to_json() for s in self.streams.values()],
        }

    def __str__(self) -> str:
        lines = [f"SeedPlan(root={self.root}, rank={self.rank}/{self.world_size}, workers={self.workers})"]
        for key, s in self.streams.items():
            lines.append(f"  {key:<32} torch={s.torch:#018x}")
        return "\n".join(lines)


def _stream_key(seeds: StreamSeeds) -> str:
    coords = ",".join(f"{k}={v}" for k, v in seeds.coords)
    return f"{seeds.role}[{coords}]" if coords else seeds.role


def _torch_states() -> dict[str, Any]:
    states: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_torch_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["cpu"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


@dataclass
class WorkerStream:
    """The numpy stream of :func:`worker_rng` in process ``pid``: seeded from ``seeds`` (a
    DataLoader worker's, else the plan's ``data`` stream; ``None``: from numpy's global RNG)."""

    pid: int
    seeds: StreamSeeds | None
    generator: np.random.Generator | None = None


@dataclass
class _Seeded:
    """What seeding keeps for the life of the process (:func:`torchrepro._state.kept`; the plan's
    root and fork() states are in :mod:`torchrepro._state`, for ``rng`` and ``checkpoint``)."""

    plan: SeedPlan | None = None  # the last seed_everything call's
    worker: WorkerStream | None = None  # worker_rng's (maybe a parent process's: compare its pid)
    original_get_iterator: Callable[[Any], Any] | None = None  # DataLoader._get_iterator while wrapped


_SEEDED = _state.kept(_Seeded)


class WorkerSeeder:
    """Picklable DataLoader ``worker_init_fn``: seeds Python, numpy and torch in a worker from
    ``("worker", rank, worker, epoch)``, then calls the user's own ``worker_init_fn``.

    ``epoch`` is set by the DataLoader patch each time the loader starts its workers: the
    sampler's ``epoch`` (``DistributedSampler.set_epoch``) when it has one, else the number
    of times this loader has started workers.
    """

    def __init__(self, root: int, rank: int, user_fn: Callable[[int], Any] | None = None, epoch: int = 0):
        _check_root(root)
        self.root, self.rank, self.user_fn, self.epoch = root, rank, user_fn, epoch
        self.starts = 0

    def seeds(self, worker_id: int) -> StreamSeeds:
        return derive(self.root, "worker", rank=self.rank, worker=worker_id, epoch=self.epoch)

    def __call__(self, worker_id: int) -> None:
        seeds = self.seeds(worker_id)
        seeds.seed_globals()
        _SEEDED.value.worker = WorkerStream(pid=os.getpid(), seeds=seeds)
        if self.user_fn is not None:
            self.user_fn(worker_id)


def worker_rng() -> np.random.Generator:
    """A numpy ``Generator`` on the current DataLoader worker's (rank, worker, epoch) stream.

    Call it inside ``Dataset.__getitem__`` instead of creating ``np.random.default_rng(seed)``
    in ``Dataset.__init__``, which every worker and every epoch would repeat. Outside a seeded
    worker it is the ``("data", rank)`` stream of the active plan, else a generator seeded from
    numpy's global RNG. Cached per process.
    """
    stream = _SEEDED.value.worker
    if stream is None or stream.pid != os.getpid():
        plan = active_plan()
        stream = _SEEDED.value.worker = WorkerStream(
            pid=os.getpid(), seeds=plan.stream("data", rank=plan.rank) if plan else None
        )
    if stream.generator is None:
        stream.generator = (
            stream.seeds.numpy_generator()
            if stream.seeds is not None
            else (np.random.default_rng(np.random.randint(0, 2**32, size=4, dtype=np.uint64).tolist()))
        )
    return stream.generator


def active_plan() -> SeedPlan | None:
    """The plan of the last ``seed_everything`` call in this process, if any."""
    return _SEEDED.value.plan


def seed_everything(
    seed: int,
    *,
    workers: bool = True,
    rank: int | None = None,
    deterministic: Mode | None = None,
) -> SeedPlan:
    """Seed Python, numpy, torch CPU and every CUDA device from one root; return the plan.

    The global generators get the ``"global"`` stream, identical on every rank (replicated
    parameter init). ``rank`` defaults to this process's (:mod:`torchrepro._dist`: the process
    group's, else the launcher's environment's, else 0).
    With ``workers=True`` every DataLoader with ``num_workers > 0`` seeds its workers from
    ``("worker", rank, worker, epoch)`` with no code change (its ``worker_init_fn`` is wrapped,
    keeping the user's own). ``deterministic="strict"|"warn"`` also calls
    :func:`torchrepro.deterministic`.

    >>> plan = seed_everything(1234)
    >>> print(plan)  # doctest: +SKIP
    """
    here = _dist.placement()
    rank = here.rank if rank is None else rank
    plan = SeedPlan(root=seed, rank=rank, world_size=here.world_size, workers=workers, deterministic=deterministic)
    plan.stream("global").seed_globals()
    if deterministic is not None:
        from .determinism import deterministic as set_deterministic

        set_deterministic(mode=deterministic)
    _SEEDED.value.plan = plan
    _state.set_seed(plan.root, plan._fork_states)
    if workers:
        _patch_dataloader()
    else:
        _unpatch_dataloader()
    return plan


def worker_init_fn(user_fn: Callable[[int], Any] | None = None) -> WorkerSeeder:
    """``worker_init_fn`` for the active plan (after :func:`seed_everything`)."""
    return _require_plan().worker_init_fn(user_fn)


def make_generator(name: str, device: str | torch.device = "cpu", **coords: int) -> torch.Generator:
    """A registered ``torch.Generator`` on stream ``name`` of the active plan (for samplers)."""
    return _require_plan().make_generator(name, device, **coords)


def _require_plan() -> SeedPlan:
    plan = active_plan()
    if plan is None:
        raise RuntimeError("call torchrepro.seed_everything(seed) first")
    return plan


# --- DataLoader patch -------------------------------------------------------------------
# One class-level wrapper around DataLoader._get_iterator (where worker processes are
# created): it wraps the loader's worker_init_fn in a WorkerSeeder once and sets its epoch.


def _loader_epoch(loader: torch.utils.data.DataLoader[Any], seeder: WorkerSeeder) -> int:
    for sampler in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        epoch = getattr(sampler, "epoch", None)
        if isinstance(epoch, int):
            return epoch
    return seeder.starts


def _patch_dataloader() -> None:
    original = dataloader_get_iterator()
    state = _SEEDED.value  # the original, while the wrapper is in place
    if state.original_get_iterator is not None or original is None:
        return
    state.original_get_iterator = original

    def _get_iterator(self: torch.utils.data.DataLoader[Any]) -> Any:
        plan = active_plan()
        if self.num_workers > 0 and plan is not None and plan.workers:
            seeder = self.worker_init_fn
            if not isinstance(seeder, WorkerSeeder):
                seeder = plan.worker_init_fn(seeder)
                self.worker_init_fn = seeder
            seeder.epoch = _loader_epoch(self, seeder)
            seeder.starts += 1
        return original(self)

    set_dataloader_get_iterator(_get_iterator)


def _unpatch_dataloader() -> None:
    state = _SEEDED.value
    original, state.original_get_iterator = state.original_get_iterator, None
    if original is not None:
        set_dataloader_get_iterator(original)
