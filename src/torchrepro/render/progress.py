"""Progress of a command's long phases, one facility for all: ``check``'s runs and replays, the fix
ladder's and ``doctor --fixes``' fix runs, ``drift``'s runs. Each phase says which run it is, the
step it reached (of how many, when known: read from the run's event log as it is written,
:class:`~torchrepro.render.live_text.FollowedRun`) and how long it has run.

On a terminal (the command's console is one), a live line at the bottom of stderr, redrawn each
second, the command's own lines printing above it; otherwise (a log, CI), one line every
:data:`LOG_EVERY_S` seconds (``TORCHREPRO_PROGRESS_S``; 0: none) while any phase runs, so that a log
is never silent for long.

>>> p = Progress(console=None, every_s=30)
>>> with p.phase("run-1", total=32):
...     p.line(now=p._phases[0].started + 75)
'run-1: 1 min 15 s'
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .sanitize import visible

if TYPE_CHECKING:
    from rich.console import Console

    from .live_text import FollowedRun

LOG_EVERY_S = 30.0  # not a terminal: a progress line this often (TORCHREPRO_PROGRESS_S sets another)
PERIOD_VAR = "TORCHREPRO_PROGRESS_S"
TICK_S = 1.0  # a terminal: the live line redrawn this often


def elapsed(seconds: float) -> str:
    """``45 s``, ``12 min 14 s``, ``2 h 03 min``.

    >>> elapsed(734.4)
    '12 min 14 s'
    """
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


@dataclass
class _Phase:
    label: str
    started: float
    total: int | None
    run: FollowedRun | None = None
    note: Callable[[], str] | None = None
    steps: int = field(default=0)

    def describe(self, now: float) -> str:
        if self.run is not None:
            try:
                self.run.poll()
                self.steps = max((r.steps for r in self.run.live.ranks.values()), default=self.steps)
            except Exception:  # noqa: BLE001 - progress must never stop the run it shows
                self.run = None
        parts = [self.label]
        if self.note is not None:
            parts.append(self.note())
        elif self.run is not None or self.steps:
            parts.append(f"step {self.steps}" + (f" of {self.total}" if self.total else ""))
        return ": ".join([parts[0], ", ".join([*parts[1:], elapsed(now - self.started)])])


class Progress:
    """The phases running now (several, side by side) and the thread that shows them. ``console``:
    the command's (None: never shown, :meth:`line` only); ``every_s``: a log's period."""

    def __init__(self, console: Console | None, every_s: float | None = None):
        self.console, self.every_s = console, LOG_EVERY_S if every_s is None else every_s
        if every_s is None and os.environ.get(PERIOD_VAR):
            try:
                self.every_s = float(os.environ[PERIOD_VAR])
            except ValueError:
                pass  # an unreadable period: the default
        if self.every_s <= 0 and console is not None and not console.is_terminal:
            self.console = None  # no lines in a log
        self._phases: list[_Phase] = []
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._live: Any = None

    def line(self, now: float | None = None) -> str:
        """Every phase running, in the order they started: ``run-1: step 12 of 32, 1 min 04 s · …``."""
        now = time.monotonic() if now is None else now
        with self._lock:
            phases = list(self._phases)
        return visible(" · ".join(p.describe(now) for p in phases))

    @contextmanager
    def phase(
        self,
        label: str,
        run_dir: Path | None = None,
        total: int | None = None,
        note: Callable[[], str] | None = None,
    ) -> Iterator[None]:
        """While the body runs, ``label`` is shown: with the steps ``run_dir``'s ranks recorded (of
        ``total``), or what ``note`` says, and the time since it began."""
        run = None
        if run_dir is not None:
            from .live_text import FollowedRun

            run = FollowedRun(run_dir)
        entry = _Phase(label, time.monotonic(), total, run, note)
        with self._lock:
            self._phases.append(entry)
            start = self._thread is None and self.console is not None
            if start:
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._show, args=(self._stop,), daemon=True)
        if start and self._thread is not None:
            self._begin()
            self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._phases.remove(entry)
                ending = not self._phases and self._thread is not None
                thread, stop = (self._thread, self._stop) if ending else (None, None)
                if ending:
                    self._thread = self._stop = None
            if thread is not None and stop is not None:
                stop.set()
                thread.join(timeout=5)
                self._end()

    def _begin(self) -> None:
        if self.console is not None and self.console.is_terminal:
            from rich.live import Live
            from rich.text import Text

            self._live = Live(Text(""), console=self.console, transient=True, auto_refresh=False)
            self._live.start()

    def _end(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _show(self, stop: threading.Event) -> None:
        terminal = self._live is not None
        period = TICK_S if terminal else self.every_s
        while not stop.wait(period):
            try:
                text = self.line()
                if not text:
                    continue
                if terminal:
                    from rich.text import Text

                    self._live.update(Text("· " + text, style="dim", no_wrap=True, overflow="ellipsis"), refresh=True)
                elif self.console is not None:
                    self.console.print(f"· {text}", markup=False, highlight=False, soft_wrap=True)
            except Exception:  # noqa: BLE001 - progress must never stop the command it shows
                return
