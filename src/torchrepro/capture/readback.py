"""Step values that live where the step computed them, read back in batches.

A step's loss, gradient norm and device fingerprints are tensors; reading each one on the host
(``float()``, ``.cpu()``) would wait for the device every step. Instead a step's event waits in
a queue with its tensors, and the queue is read at one **batch point**, :meth:`Readback.poll`
(called as each step ends, and at the end of the run):

- CPU tensors are ready at once: read as the step's event is queued (``item()``; when nothing
  waits before it, :meth:`Readback.add` is the batch point), the event is written as the step
  ends (the log holds every completed step even if the process is then SIGKILLed); a CPU loss is
  not even queued: ``capture.steps`` reads it in the ``backward()`` wrapper;
- device tensors are packed into one int64 vector per step (floats bit-cast) and copied with
  ``non_blocking=True`` to pinned host memory behind a CUDA event; their steps are written at a
  later step end once the event has completed (``query()``, no wait), or when more than
  ``max_pending`` steps are waiting (the oldest is then waited for), or at the end of the run.

Events emitted while steps wait queue behind them, so the log keeps its order.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..eventlog.events import Event

Fill = Callable[[Event, list[int | float]], None]  # the step's values read back: ints, and floats bit-cast


@dataclass(slots=True)
class _Waiting:
    event: Event
    fill: Fill | None = None
    parts: list[torch.Tensor] | None = None  # CPU tensors, read as they are
    values: torch.Tensor | None = None  # device parts packed as int64 words, copied to the host
    floats: list[bool] | None = None  # per word of ``values``: a bit-cast float64
    ready: Any = None  # the torch.cuda.Event after the copy


def as_int64(t: torch.Tensor) -> torch.Tensor:
    """A scalar or vector as int64 words: floats widened to float64 and bit-cast, ints as is."""
    t = t.detach().reshape(-1)
    if t.is_floating_point():
        return t.double().view(torch.int64)
    return t.to(torch.int64)


def as_float(word: int) -> float:
    """The float64 whose bits an :func:`as_int64` word holds."""
    value: float = struct.unpack("<d", struct.pack("<q", word))[0]
    return value


class Readback:
    """The queue of step events waiting for their tensors; ``write`` gets them in order."""

    def __init__(self, write: Callable[[Event], None], max_pending: int = 64):
        self._write, self.max_pending = write, max_pending
        self.queue: deque[_Waiting] = deque()  # the events waiting, in order (empty: nothing waits)
        self.reads = 0  # batch points that read values

    def emit(self, event: Event) -> None:
        """Write an event with nothing to read back (after any step still waiting)."""
        if self.queue:
            self.queue.append(_Waiting(event))
        else:
            self._write(event)

    def add(self, event: Event, parts: list[torch.Tensor], fill: Fill) -> None:
        """Queue a step event; ``fill(event, values)`` gets ``parts`` read back as Python numbers."""
        if not parts:
            fill(event, [])
            self.emit(event)
            return
        if all(p.is_cpu for p in parts):
            if self.queue:  # behind a step still waiting for its device values
                self.queue.append(_Waiting(event, fill, parts=parts))
                return
            fill(event, _cpu_values(parts))  # nothing to wait for: read and written now
            self.reads += 1
            self._write(event)
            return
        words = [as_int64(p) for p in parts]
        floats = [p.is_floating_point() for p, w in zip(parts, words) for _ in range(w.numel())]
        values = torch.cat([w.to(parts[0].device) for w in words])
        host = torch.empty(values.shape, dtype=torch.int64, pin_memory=torch.cuda.is_available())
        host.copy_(values, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        self.queue.append(_Waiting(event, fill, values=host, floats=floats, ready=ready))

    def poll(self, force: bool = False) -> None:
        """The batch point: write every queued event whose values have reached the host (all,
        waiting for the device, when ``force`` or when too many steps wait)."""
        if not self.queue:
            return
        waiting = sum(1 for w in self.queue if w.fill is not None)
        ready: list[_Waiting] = []
        for w in self.queue:
            if w.ready is not None and not w.ready.query():
                if not (force or waiting > self.max_pending):
                    break
                w.ready.synchronize()
            ready.append(w)
            waiting -= w.fill is not None
        if any(w.fill is not None for w in ready):
            self.reads += 1
        for w in ready:
            self.queue.popleft()
            if w.fill is None:  # an event with nothing to read back
                pass
            elif w.parts is not None:  # CPU: nothing to wait for
                w.fill(w.event, _cpu_values(w.parts))
            elif w.values is not None and w.floats is not None:
                w.fill(w.event, [as_float(v) if f else v for v, f in zip(w.values.tolist(), w.floats)])
            self._write(w.event)


def _cpu_values(parts: list[torch.Tensor]) -> list[int | float]:
    """CPU tensors' values as Python numbers, in order (scalars and vectors)."""
    return [v for p in parts for v in (p.tolist() if p.dim() else [p.item()])]
