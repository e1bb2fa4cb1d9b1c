"""A step's loss: the values of its ``backward()`` calls, a CPU loss read in the wrapper
(``item()``, while it is in the caches), a device loss kept as a detached reference and read
back with the step (:mod:`.readback`); how a step's loss follows from them is defined in
:mod:`.steps`'s docstring (one value; several added in order in their dtype; a closure's first)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class StepLosses:
    """The losses of the step under way: ``values`` read on the CPU, ``device`` losses to read
    back, the CPU losses' ``dtype``, and whether the clock's ``step()`` took a ``closure``."""

    def __init__(self) -> None:
        self.device: list[torch.Tensor] = []  # device losses, read back at the batch point
        self.values: list[float] = []  # CPU losses, read in backward()
        self.dtype = torch.float32  # the CPU losses' (several are added in it)
        self.closure = False  # the clock's step() was given a closure (its backward() calls are inside it)

    def note(self, loss: torch.Tensor) -> None:
        """A scalar ``backward()`` was called on."""
        if loss.is_cpu:  # read now, while it is in the caches: no device to wait for (readback.py)
            self.values.append(loss.item())
            self.dtype = loss.dtype
        else:
            self.device.append(loss.detach())

    def put(self, event: Any, parts: list[torch.Tensor]) -> Loss | None:
        """Fill ``event``'s loss from the CPU values; or queue the device losses on ``parts`` and
        return what they are (:func:`step_loss` makes the loss once they are read back)."""
        losses, values = self.device, self.values
        if values and losses:
            raise ValueError("a step whose losses are on the CPU and on a device")  # (torch.stack cannot join them)
        if values:
            event.loss, event.loss_last = step_loss(values, self.closure, self.dtype)
        elif losses:  # at their own precision (a float64 loss stays float64)
            parts.append(losses[0] if len(losses) == 1 else torch.stack([x.reshape(()) for x in losses]))
            return Loss(len(losses), self.closure, parts[0].dtype)
        return None

    def reset(self) -> None:
        self.device, self.values, self.closure = [], [], False


@dataclass(frozen=True, slots=True)
class Loss:
    """What a step's loss values read back are: how many ``backward()`` calls, whether inside a
    closure, and their dtype (the module docstring defines the step's loss from them)."""

    calls: int
    closure: bool
    dtype: torch.dtype


def step_loss(values: list[Any], closure: bool, dtype: torch.dtype) -> tuple[Any, Any]:
    """A step's ``loss`` and ``loss_last`` from the values of its ``backward()`` calls (the module
    docstring): one value; else the first (a closure's) or their sum in ``dtype``, and the last."""
    if len(values) == 1:
        return values[0], None
    return (values[0] if closure else _summed(values, dtype)), values[-1]


def _summed(values: list[float], dtype: torch.dtype) -> float:
    """``values`` added in order in ``dtype``, rounded after each addition, as a script's
    ``total += loss.detach()`` adds them (CPU, at read-back: no extra work in the step)."""
    total = torch.tensor(values[0], dtype=dtype)
    for value in values[1:]:
        total += value
    return total.item()
