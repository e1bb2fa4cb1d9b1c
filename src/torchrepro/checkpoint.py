"""Everything besides model and optimizer that decides the rest of a run: every RNG state (per
global rank, via :class:`~torchrepro.rng.RngState`), the data position (epoch, batches consumed)
and the step. Files are JSON, one per rank; save model and optimizer with your own ``torch.save``
or torch.distributed.checkpoint next to them.

Resuming bit-exactly takes one ordering rule: a DataLoader draws its base seed from the global
generator when its iterator is created, so restore the RNG state *after* creating the epoch's
iterator and skipping the batches already consumed — :meth:`Resume.apply` does both::

    resume = checkpoint.load(path)              # position; RNG restored later, by apply()
    for epoch in range(resume.epoch, epochs):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        if epoch == resume.epoch:
            resume.apply(batches)               # skip resume.batch batches, then restore RNG
        for x, y in batches: ...

``torchrepro check-resume`` drives a script through this by environment variables; see
:func:`plan`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _dist, _state
from .errors import RngStateError
from .rng import RngState
from .eventlog.rundir import write_json
from .seed import derive

POSITION_SCHEMA = "torchrepro.position/1"
ENV_STOP_AT = "TORCHREPRO_STOP_AT"
ENV_SAVE_TO = "TORCHREPRO_CHECKPOINT_TO"
ENV_RESUME_FROM = "TORCHREPRO_RESUME_FROM"


@dataclass
class Plan:
    """What ``torchrepro check-resume`` (or you) asked this run to do: stop after ``stop_at``
    steps and checkpoint into ``save_to``, or resume from ``resume_from``."""

    stop_at: int | None = None
    save_to: Path | None = None
    resume_from: Path | None = None

    def should_stop(self, step: int) -> bool:
        """True once ``step`` optimizer steps are done and a stop was requested there."""
        return self.stop_at is not None and step >= self.stop_at


def plan(default_dir: str | os.PathLike[str] = "checkpoint") -> Plan:
    """Read the resume plan from ``$TORCHREPRO_STOP_AT``, ``$TORCHREPRO_CHECKPOINT_TO`` and
    ``$TORCHREPRO_RESUME_FROM``.

    >>> p = plan()
    >>> p.resume_from is None  # a plain run  # doctest: +SKIP
    True
    """
    env = os.environ
    stop = env.get(ENV_STOP_AT)
    return Plan(
        stop_at=int(stop) if stop else None,
        save_to=Path(env.get(ENV_SAVE_TO) or default_dir) if stop else None,
        resume_from=Path(env[ENV_RESUME_FROM]) if env.get(ENV_RESUME_FROM) else None,
    )


@dataclass
class Resume:
    """Where a run stopped. ``apply`` finishes the restore at the right moment."""

    path: Path
    step: int
    epoch: int
    batch: int
    world_size: int
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    rng: RngState | None = None
    applied: bool = False

    def apply(self, batches: Iterator[Any] | None = None) -> None:
        """Skip the ``batch`` batches of this epoch already consumed (from a fresh iterator), then
        restore every RNG state. Call once, right after creating the resumed epoch's iterator."""
        if self.applied:
            return
        if batches is not None:
            for _ in range(self.batch):
                next(batches)
        if self.rng is not None:
            self.rng.restore()
        else:  # re-derived for another world size: reproducible, not bit-exact
            derive(self.seed or 0, "resume", step=self.step, rank=_dist.rank()).seed_globals()
        self.applied = True
        _align_step_clock(self.step)


def _position_file(path: Path, rank: int) -> Path:
    return path / f"position-rank{rank}.json"


def save(
    path: str | os.PathLike[str], *, step: int, epoch: int = 0, batch: int = 0, extra: dict[str, Any] | None = None
) -> Path:
    """Save this rank's RNG states and data position into the folder ``path``.

    ``step``: optimizer steps done; ``epoch``: the current epoch; ``batch``: batches of it consumed.

    >>> save("ckpt", step=120, epoch=2, batch=17)  # doctest: +SKIP
    """
    path = Path(path)
    state = RngState.capture()
    state.save(path)
    position = {
        "schema": POSITION_SCHEMA,
        "step": step,
        "epoch": epoch,
        "batch": batch,
        "world_size": state.world_size,
        "rank": state.rank,
        "seed": _state.seed_root(),
        "extra": extra or {},
    }
    write_json(_position_file(path, state.rank), position)
    return path


def load(path: str | os.PathLike[str], *, rederive: bool = False) -> Resume:
    """Read this rank's position and RNG states from ``path`` (restored by :meth:`Resume.apply`).

    A checkpoint from another world size raises :class:`~torchrepro.errors.RngStateError` unless
    ``rederive=True``: RNG streams are then re-derived from the saved root seed (reproducible,
    not bit-exact).
    """
    path = Path(path)
    here = _dist.placement()
    rank, world = here.rank, here.world_size
    file = _position_file(path, rank)
    if not file.exists():
        saved = sorted(p.name for p in path.glob("position-rank*.json")) if path.is_dir() else []
        if saved and not rederive:
            raise RngStateError(
                f"{path} has no position for rank {rank} (it holds {', '.join(saved)}): saved by a "
                f"job of another world size; pass rederive=True to re-derive RNG streams"
            )
        if not saved:
            raise RngStateError(f"{path} is not a torchrepro checkpoint (no position-rank*.json)")
        file = path / saved[0]
    try:
        position = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise RngStateError(f"{file} is not a readable checkpoint position: {exc}") from None
    if position.get("schema") != POSITION_SCHEMA:
        raise RngStateError(f"{file} is not a {POSITION_SCHEMA} file")
    if position["world_size"] != world and not rederive:
        raise RngStateError(
            f"{path} was saved by a job of world size {position['world_size']}, this job has {world}; "
            "pass rederive=True to re-derive RNG streams from the seed"
        )
    rng = None if rederive and position["world_size"] != world else RngState.load(path)
    return Resume(
        path=path,
        step=position["step"],
        epoch=position["epoch"],
        batch=position["batch"],
        world_size=position["world_size"],
        seed=position.get("seed"),
        extra=position.get("extra", {}),
        rng=rng,
    )


def _align_step_clock(step: int) -> None:
    """Under torchrepro capture, number the resumed run's steps from where the checkpoint stopped."""
    session = _state.session()
    if session is not None:
        session.restart_steps_at(step)
