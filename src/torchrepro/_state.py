"""This process's state, in one place: the active seed plan and its ``fork()`` streams, the
registered generators, the DataLoader worker's stream and the capture session.

Each piece has one writer (:func:`torchrepro.seed_everything` the plan, :func:`torchrepro.rng.register`
the generators, a :class:`~torchrepro.capture.session.CaptureSession` itself) and is read here by
the others, so that ``seed``, ``rng``, ``checkpoint`` and ``capture`` need not import each other.
Importing this module imports neither torch nor any other torchrepro module.

>>> reset()
>>> seed_plan() is None and fork_states() == {} and session() is None
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from .capture.session import CaptureSession
    from .seed import SeedPlan, StreamSeeds

TorchStates = dict[str, Any]  # one fork() stream's saved torch state: {"cpu": ByteTensor, "cuda": [ByteTensor, ...]}


@dataclass
class WorkerStream:
    """The numpy stream of :func:`torchrepro.worker_rng` in process ``pid``: seeded from ``seeds``
    (a DataLoader worker's, else the plan's ``data`` stream; ``None``: from numpy's global RNG)."""

    pid: int
    seeds: StreamSeeds | None
    generator: np.random.Generator | None = None


@dataclass
class ProcessState:
    """Everything torchrepro keeps for the life of a process."""

    seed_plan: SeedPlan | None = None
    forks: dict[str, TorchStates] = field(default_factory=dict)  # the seed plan's own fork() states, by stream
    generators: dict[str, Any] = field(default_factory=dict)  # torch / numpy Generators, by registered name
    worker: WorkerStream | None = None
    session: CaptureSession | None = None


_STATE = ProcessState()


def reset() -> None:
    """Forget everything (a fresh process's state); for tests."""
    global _STATE
    _STATE = ProcessState()


def seed_plan() -> SeedPlan | None:
    """The plan of the last ``seed_everything`` call in this process, if any."""
    return _STATE.seed_plan


def set_seed_plan(plan: SeedPlan, forks: dict[str, TorchStates]) -> None:
    """Make ``plan`` the active one; ``forks`` is the dict in which it keeps its ``fork()`` states."""
    _STATE.seed_plan, _STATE.forks = plan, forks


def fork_states() -> dict[str, TorchStates]:
    """The active plan's ``fork()`` states by stream key (live: an update changes the plan's
    streams); empty without a plan."""
    return _STATE.forks


def generators() -> dict[str, Any]:
    """The registered generators by name (a copy)."""
    return dict(_STATE.generators)


def has_streams() -> bool:
    """Whether any generator is registered or any ``fork()`` state kept (most runs: none; asked at
    every training step)."""
    return bool(_STATE.generators or _STATE.forks)


def add_generator(name: str, generator: Any) -> None:
    """Register ``generator`` as ``name`` (checked by :func:`torchrepro.rng.register`)."""
    _STATE.generators[name] = generator


def clear_generators() -> None:
    """Unregister every generator."""
    _STATE.generators.clear()


def worker() -> WorkerStream | None:
    """The :func:`torchrepro.worker_rng` stream, if one was set (maybe by a parent process:
    compare its ``pid``)."""
    return _STATE.worker


def set_worker(stream: WorkerStream) -> None:
    """Set the :func:`torchrepro.worker_rng` stream of this process."""
    _STATE.worker = stream


def session() -> CaptureSession | None:
    """The capture session running in this process, if any."""
    return _STATE.session


def set_session(value: CaptureSession | None) -> None:
    """Record the capture session that started (``None``: it stopped)."""
    _STATE.session = value
