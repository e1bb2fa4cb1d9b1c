"""The events the step recorder writes besides its steps: capabilities (the step clock, the
fingerprint interval, capture errors, FSDP2, snapshots), the initial parameters, tensors that hold
NaN or an infinity, the parameters' names, shapes and kinds, and the settings in force after the first step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _compat as compat
from ..eventlog.events import Capability, Event, InitParams, NonFinite, Params, Setting
from .step_params import NAMED_AT_MOST, kind


class StepEvents:
    """Writes this rank's step-side events through ``emit``."""

    def __init__(self, emit: Callable[[Event], None], rank: int):
        self.emit, self.rank = emit, rank

    def capability(self, name: str, available: bool, note: str, step: int | None = None) -> None:
        self.emit(Capability(rank=self.rank, step=step, name=name, available=available, note=note))

    def init_params(
        self,
        step: int,
        source: str,
        module: Any,
        named: list[tuple[str, Any]],
        fps: list[str],
        unwritten: list[str] | None = None,
    ) -> None:
        """The one ``InitParams`` event: the fingerprints ``fps`` of ``module``'s ``named``
        parameters as training starts (``source``: at its first forward, or before FSDP2 shards it),
        and those ``to_empty()`` materialised that were never written (``unwritten``)."""
        self.emit(
            InitParams(
                rank=self.rank,
                step=step,
                source=source,
                module=type(module).__name__,
                names=[n for n, _ in named],
                fps=fps,
                unwritten=unwritten or [],
            )
        )

    def nonfinite(self, step: int, what: str, names: list[str], of: int, count: int | None = None) -> None:
        """A ``NonFinite`` event for the ``names`` (the first :data:`NAMED_AT_MOST` of ``count``, of
        ``of``) that hold NaN or an infinity; nothing when there are none."""
        if names:
            count = len(names) if count is None else count
            self.emit(NonFinite(rank=self.rank, step=step, what=what, names=names[:NAMED_AT_MOST], count=count, of=of))

    def params(self, names: list[str], params: list[torch.Tensor]) -> None:
        self.emit(
            Params(
                rank=self.rank,
                names=names,
                shapes=[list(p.shape) for p in params],
                dtypes=[str(p.dtype).replace("torch.", "") for p in params],
                kinds=[kind(p) for p in params],
            )
        )

    def settings(self, index: int) -> None:
        """The switches in force once the script has set itself up (read after its first step)."""
        settings = {
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "num_threads": torch.get_num_threads(),
        }
        inductor = compat.inductor_config(load=False)
        if inductor is not None:
            settings |= {
                "inductor.fallback_random": bool(getattr(inductor, "fallback_random", False)),
                "inductor.deterministic": bool(getattr(inductor, "deterministic", False)),
            }
        for name, value in settings.items():
            self.emit(Setting(rank=self.rank, step=index, name=name, value=value))
