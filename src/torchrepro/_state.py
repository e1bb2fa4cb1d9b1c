"""This process's state, in one place: what the library below capture shares (the active seed
plan's root and its ``fork()`` streams, the registered generators, the running capture session
and this process's id), and the registry of what each higher module keeps for the life of the
process.

Each module that patches or prepares this process declares its own state once, at module level, with
:func:`kept` (``_compat``: torch's patches in place and who watches the probes; ``seed``: the
active plan, the DataLoader worker's stream, the original ``_get_iterator``; ``determinism``:
whether the cuBLAS workspace was set too late; ``capture.on_import``, ``runtime.follow``,
``telemetry``, ``commands.launcher``: theirs). This module knows them only as :class:`Kept`
values, never by their types, so it imports none of its owners; :func:`reset` makes each anew.
Caches of pure lookups (digests of unchanged states, calibrated memory layouts) stay in their
modules.

Each shared piece has one writer (:func:`torchrepro.seed_everything` the plan, :func:`torchrepro.rng.register`
the generators, a :class:`~torchrepro.capture.session.CaptureSession` itself) and is read here by
the others, so that ``seed``, ``rng``, ``checkpoint`` and ``capture`` need not import each other.
Importing this module imports neither torch nor any other torchrepro module.

>>> reset()
>>> seed_root() is None and fork_states() == {} and session() is None
True
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")

TorchStates = dict[str, Any]  # one fork() stream's saved torch state: {"cpu": ByteTensor, "cuda": [ByteTensor, ...]}


class Session(Protocol):
    """The capture session running in this process, as the modules below capture see it."""

    pid: int  # the process that started it (a forked DataLoader worker is another)

    @property
    def run_dir(self) -> Path: ...

    def restart_steps_at(self, step: int) -> None:
        """Number the next step ``step + 1`` (a run resumed from a checkpoint)."""


class Kept(Generic[T]):
    """One module's state for the life of this process: :attr:`value`, made by ``factory`` when
    declared and made anew by :func:`reset` (not when ``survives_reset``: a running process that
    forgetting would leave behind)."""

    __slots__ = ("factory", "survives_reset", "value")

    def __init__(self, factory: Callable[[], T], survives_reset: bool) -> None:
        self.factory, self.survives_reset = factory, survives_reset
        self.value: T = factory()


_KEPT: list[Kept[Any]] = []  # every module's declared state, in the order declared


def kept(factory: Callable[[], T], *, survives_reset: bool = False) -> Kept[T]:
    """Declare a module's state for the life of this process (once, at module level)."""
    declared = Kept(factory, survives_reset)
    _KEPT.append(declared)
    return declared


@dataclass
class ProcessState:
    """What the library below capture shares for the life of a process."""

    seed_root: int | None = None  # the active seed plan's root
    forks: dict[str, TorchStates] = field(default_factory=dict)  # the seed plan's own fork() states, by stream
    generators: dict[str, Any] = field(default_factory=dict)  # torch / numpy Generators, by registered name
    session: Session | None = None
    pid: int = field(default_factory=os.getpid)  # renewed in a forked child (os.register_at_fork below)


_STATE = ProcessState()


def reset() -> None:
    """Forget everything (a fresh process's state), every module's declared state too; for tests."""
    global _STATE
    _STATE = ProcessState()
    for declared in _KEPT:
        if not declared.survives_reset:
            declared.value = declared.factory()


def pid() -> int:
    """This process's id, without a system call (capture asks per event, to stay quiet in the
    DataLoader workers forked from the training process)."""
    return _STATE.pid


def _forked() -> None:
    _STATE.pid = os.getpid()


if hasattr(os, "register_at_fork"):  # POSIX; where processes cannot fork, the pid stays right
    os.register_at_fork(after_in_child=_forked)


def seed_root() -> int | None:
    """The root of the last ``seed_everything`` call's plan in this process, if any."""
    return _STATE.seed_root


def set_seed(root: int, forks: dict[str, TorchStates]) -> None:
    """The active plan's root; ``forks`` is the dict in which it keeps its ``fork()`` states."""
    _STATE.seed_root, _STATE.forks = root, forks


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


def session() -> Session | None:
    """The capture session running in this process, if any."""
    return _STATE.session


def set_session(value: Session | None) -> None:
    """Record the capture session that started (``None``: it stopped)."""
    _STATE.session = value
