"""Follow a run directory while it is written: new rank directories, new lines of each log.

Each rank's log is read from where the last read stopped (its offset is remembered); a last
line still being written is kept until its newline arrives. ``run.json`` is re-read each time
(it is written atomically). Used by ``torchrepro watch`` and ``doctor``'s live status line.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..analysis.live import LiveRun, is_finished, snapshot
from .events import EVENTS_FILE, MAX_LINE, from_json, open_regular
from .rundir import RUN_FILE, read_run_json


def _rank_of(path: Path) -> int | None:
    try:
        return int(path.parent.name.split("-", 1)[1])
    except (IndexError, ValueError):
        return None


class RunFollower:
    """Reads what is new in a run directory on each :meth:`poll`.

    >>> follower = RunFollower(Path("torchrepro-runs/x"))  # doctest: +SKIP
    >>> follower.poll(); follower.snapshot()["ranks"]  # doctest: +SKIP
    """

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.live = LiveRun()
        self.meta: dict[str, Any] = {}
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    def poll(self) -> int:
        """Read new events of every rank (new ranks included); returns how many were read."""
        self._read_meta()
        count = 0
        for path in sorted(self.run_dir.glob(f"rank-*/{EVENTS_FILE}")):
            rank = _rank_of(path)
            if rank is not None:
                count += self._read(path, rank)
        return count

    def _read_meta(self) -> None:
        try:
            self.meta = read_run_json(self.run_dir / RUN_FILE)  # InputError: a FIFO, a field of a wrong type
        except (OSError, ValueError):
            pass  # not written yet (or by a launcher that writes none)

    def _read(self, path: Path, rank: int) -> int:
        try:
            with open_regular(path) as fp:  # InputError: a FIFO would block the view
                fp.seek(self._offsets.get(path, 0))
                data = fp.read(MAX_LINE)  # the rest on the next poll: memory stays bounded
        except OSError:
            return 0
        self._offsets[path] = self._offsets.get(path, 0) + len(data)
        lines = (self._partial.pop(path, b"") + data).split(b"\n")
        if len(lines[-1]) > MAX_LINE:  # damage, not a line being written: skipped
            lines[-1] = b""
            self.live.problems += 1
        if lines[-1]:
            self._partial[path] = lines[-1]  # still being written
        count = 0
        for raw in lines[:-1]:
            if not raw.strip():
                continue
            try:
                event = from_json(json.loads(raw))
            except (ValueError, TypeError, AttributeError):
                self.live.problems += 1
                continue
            if event is not None:
                self.live.add(rank, event)
                count += 1
        return count

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """The run as read so far (see :func:`torchrepro.analysis.live.snapshot`)."""
        return {"run_dir": str(self.run_dir), **snapshot(self.live, self.meta, time.time() if now is None else now)}

    @property
    def finished(self) -> bool:
        return is_finished(self.live, self.meta)
