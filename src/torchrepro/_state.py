"""This process's state, in one place: the active seed plan and its ``fork()`` streams, the
registered generators, the DataLoader worker's stream and the capture session; and what the
modules that patch or prepare this process keep for its life (:class:`ProcessState`, read and
written by them through :func:`current`): torch's patches in place and who watches the probes
(``_compat``), the imports capture waits for (``capture.on_import``), the DataLoader's original
``_get_iterator`` (``seed``), whether the cuBLAS workspace was set too late (``determinism``),
how the process was prepared before its rank was known (``runtime.follow``) and the telemetry
exporter's (``telemetry``), the guardian of what this process launched (``commands.launcher``),
and this process's id (:func:`pid`: renewed in a forked child; capture compares it per event). Caches of pure lookups (digests of unchanged states, calibrated
memory layouts) stay in their modules.

Each piece has one writer (:func:`torchrepro.seed_everything` the plan, :func:`torchrepro.rng.register`
the generators, a :class:`~torchrepro.capture.session.CaptureSession` itself) and is read here by
the others, so that ``seed``, ``rng``, ``checkpoint`` and ``capture`` need not import each other.
Importing this module imports neither torch nor any other torchrepro module.

>>> reset()
>>> seed_plan() is None and fork_states() == {} and session() is None
True
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from collections.abc import Callable
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
    patches: list[Any] = field(default_factory=list)  # _compat.Patch: torch objects capture replaced, in order
    probe_watchers: list[Callable[[Any], None]] = field(default_factory=list)  # _compat.watch callbacks
    awaited_imports: dict[str, list[Callable[[], None]]] = field(default_factory=dict)  # module -> callbacks
    original_get_iterator: Callable[[Any], Any] | None = None  # DataLoader._get_iterator while seed wraps it
    cublas_set_late: bool = False  # CUBLAS_WORKSPACE_CONFIG set after CUDA initialised (too late to count)
    prepared: dict[str, Any] = field(default_factory=dict)  # runtime.follow: plan, factors, spawned
    otlp_launcher: Any = None  # telemetry.otlp: the command's Launcher while a launcher command exports
    otel_health: dict[str, Any] = field(default_factory=dict)  # telemetry.otel: the exporter's health
    guardian: tuple[int, Any, int] | None = (
        None  # commands.launcher: (for pid, its guardian's Popen, the pipe's write end)
    )
    pid: int = field(default_factory=os.getpid)  # renewed in a forked child (os.register_at_fork below)


_STATE = ProcessState()


def current() -> ProcessState:
    """This process's state (for the modules that keep theirs here; read it anew each time:
    :func:`reset` replaces it)."""
    return _STATE


def reset() -> None:
    """Forget everything (a fresh process's state); for tests. The guardian is kept: it is a
    running process holding this one's pipe, which forgetting would leave behind."""
    global _STATE
    _STATE = ProcessState(guardian=_STATE.guardian)


def pid() -> int:
    """This process's id, without a system call (capture asks per event, to stay quiet in the
    DataLoader workers forked from the training process)."""
    return _STATE.pid


def _forked() -> None:
    _STATE.pid = os.getpid()


if hasattr(os, "register_at_fork"):  # POSIX; where processes cannot fork, the pid stays right
    os.register_at_fork(after_in_child=_forked)


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
