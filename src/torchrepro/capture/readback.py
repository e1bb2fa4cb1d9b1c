"""Step values that live where the step computed them, read back in batches.

A step's loss, gradient norm and device fingerprints are tensors; reading each one on the host
(``float()``, ``.cpu()``) would wait for the device every step. Instead a step's event waits in
a queue with its tensors packed into one int64 vector (floats bit-cast), and the queue is read
at one **batch point**, :meth:`Readback.poll`, with a single ``tolist()`` over every step ready:

- CPU tensors are ready at once: the step's event is written as the step ends (nothing to wait
  for, and the log holds every completed step even if the process is then SIGKILLed);
- device tensors are copied with ``non_blocking=True`` to the host behind a CUDA event; their
  steps are written at a later step end once the event has completed (``query()``, no wait), or
  when more than ``max_pending`` steps are waiting (the oldest is then waited for), or at the end
  of the run.

Events emitted while steps wait queue behind them, so the log keeps its order.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..events import Event

Fill = Callable[[Event, list[int]], None]


@dataclass(slots=True)
class _Waiting:
    event: Event
    values: torch.Tensor | None = None  # int64[n] on the host once copied, or still on the CPU
    fill: Fill | None = None
    ready: Any = None  # a torch.cuda.Event, for device values


def as_int64(t: torch.Tensor) -> torch.Tensor:
    """A scalar or vector as int64 words: floats widened to float64 and bit-cast, ints as is."""
    t = t.detach().reshape(-1)
    if t.is_floating_point():
        return t.double().view(torch.int64)
    return t.to(torch.int64)


def as_float(word: int) -> float:
    """The float64 whose bits an :func:`as_int64` word holds."""
    return struct.unpack("<d", struct.pack("<q", word))[0]


class Readback:
    """The queue of step events waiting for their tensors; ``write`` gets them in order."""

    def __init__(self, write: Callable[[Event], None], max_pending: int = 64):
        self._write, self.max_pending = write, max_pending
        self._queue: deque[_Waiting] = deque()
        self.reads = 0  # batch reads done (one tolist() each)

    def emit(self, event: Event) -> None:
        """Write an event with nothing to read back (after any step still waiting)."""
        if self._queue:
            self._queue.append(_Waiting(event))
        else:
            self._write(event)

    def add(self, event: Event, parts: list[torch.Tensor], fill: Fill) -> None:
        """Queue a step event; ``fill(event, words)`` gets ``parts`` read back as int64 words."""
        if not parts:
            fill(event, [])
            self.emit(event)
            return
        values = torch.cat([as_int64(p) for p in parts]) if len(parts) > 1 else as_int64(parts[0])
        waiting = _Waiting(event, values, fill)
        if values.device.type != "cpu":
            host = torch.empty(values.shape, dtype=torch.int64, pin_memory=torch.cuda.is_available())
            host.copy_(values, non_blocking=True)
            waiting.values, waiting.ready = host, torch.cuda.Event()
            waiting.ready.record()
        self._queue.append(waiting)

    def poll(self, force: bool = False) -> None:
        """The batch point: write every queued event whose values have reached the host (all,
        waiting for the device, when ``force`` or when too many steps wait)."""
        waiting = sum(1 for w in self._queue if w.values is not None)
        ready: list[_Waiting] = []
        for w in self._queue:
            if w.ready is not None and not w.ready.query():
                if not (force or waiting > self.max_pending):
                    break
                w.ready.synchronize()
            ready.append(w)
            waiting -= w.values is not None
        if not ready:
            return
        with_values = [w for w in ready if w.values is not None]
        if with_values:
            words = torch.cat([w.values for w in with_values]).tolist() if len(with_values) > 1 \
                else with_values[0].values.tolist()
            self.reads += 1
            at = 0
            for w in with_values:
                n = w.values.numel()
                w.fill(w.event, words[at:at + n])
                at += n
        for _ in ready:
            w = self._queue.popleft()
            self._write(w.event)
