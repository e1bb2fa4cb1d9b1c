"""Follow a run directory while it is written: new rank directories, new lines of each log.

Each rank's log is read from where the last read stopped (its offset is remembered); a last
line still being written is kept until its newline arrives. ``run.json`` is re-read each time
(it is written atomically). This module only reads files: what the events mean is for whoever
polls (:class:`torchrepro.report.live.FollowedRun` feeds them to the live analysis).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .events import EVENTS_FILE, MAX_LINE, Event, from_json, open_regular
from .rundir import RUN_FILE, read_run_json


def _rank_of(path: Path) -> int | None:
    try:
        return int(path.parent.name.split("-", 1)[1])
    except (IndexError, ValueError):
        return None


class RunFollower:
    """Reads what is new in a run directory on each :meth:`poll`: ``meta`` is ``run.json`` as
    last read, ``unreadable`` counts the lines that were no event.

    >>> follower = RunFollower(Path("torchrepro-runs/x"))  # doctest: +SKIP
    >>> [(rank, type(event).__name__) for rank, event in follower.poll()]  # doctest: +SKIP
    [(0, 'Header'), (0, 'Compile')]
    """

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.meta: dict[str, Any] = {}
        self.unreadable = 0
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    def poll(self) -> list[tuple[int, Event]]:
        """Re-read ``run.json``; the new events of every rank (new ranks included) as
        ``(rank, event)``, each rank's in the order it wrote them."""
        self._read_meta()
        events: list[tuple[int, Event]] = []
        for path in sorted(self.run_dir.glob(f"rank-*/{EVENTS_FILE}")):
            rank = _rank_of(path)
            if rank is not None:
                events += ((rank, event) for event in self._read(path))
        return events

    def _read_meta(self) -> None:
        try:
            self.meta = read_run_json(self.run_dir / RUN_FILE)  # InputError: a FIFO, a field of a wrong type
        except (OSError, ValueError):
            pass  # not written yet (or by a launcher that writes none)

    def _read(self, path: Path) -> list[Event]:
        try:
            with open_regular(path) as fp:  # InputError: a FIFO would block the view
                fp.seek(self._offsets.get(path, 0))
                data = fp.read(MAX_LINE)  # the rest on the next poll: memory stays bounded
        except OSError:
            return []
        self._offsets[path] = self._offsets.get(path, 0) + len(data)
        lines = (self._partial.pop(path, b"") + data).split(b"\n")
        if len(lines[-1]) > MAX_LINE:  # damage, not a line being written: skipped
            lines[-1] = b""
            self.unreadable += 1
        if lines[-1]:
            self._partial[path] = lines[-1]  # still being written
        events = []
        for raw in lines[:-1]:
            if not raw.strip():
                continue
            try:
                event = from_json(json.loads(raw))
            except (ValueError, TypeError, AttributeError):
                self.unreadable += 1
                continue
            if event is not None:
                events.append(event)
        return events
