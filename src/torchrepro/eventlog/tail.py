"""Follow a run directory while it is written: new rank directories, new lines of each log.

Each rank's log is read from where the last read stopped (its offset is remembered); a last
line still being written is kept until its newline arrives. Its ``steps.bin`` (step records) is
read the same way, each record put after the line it follows (a record that follows a line not
read yet waits for it). ``run.json`` is re-read each time
(it is written atomically). What is damaged is kept per rank (:meth:`RunFollower.damage`): lines
that are no event, step records that do not decode, and once the run has ended a last line or
record cut short. Whether a torchrepro process writes the directory is asked of its lock
(:attr:`RunFollower.writer`). This module only reads files: what the events mean is for whoever
polls (:class:`torchrepro.render.live_text.FollowedRun` feeds them to the live analysis).
"""

from __future__ import annotations

from pathlib import Path
from .jsoncheck import loads
from .event_codec import from_json, step_decoder
from .event_reader import MAX_LINE, open_regular
from .events import EVENTS_FILE, Event, Step
from .stepstream import STEPS_FILE, Decoder
from .payloads import JsonObject
from .rundir import LOCK_FILE, RUN_FILE, read_run_json, supervisor_lost, writer_of


def _rank_of(path: Path) -> int | None:
    try:
        return int(path.parent.name.split("-", 1)[1])
    except (IndexError, ValueError):
        return None


class RunFollower:
    """Reads what is new in a run directory on each :meth:`poll`: ``meta`` is ``run.json`` as
    last read (with ``interrupted`` when its supervisor is gone without recording the end, as
    :func:`~.rundir.load_run` says it), ``unreadable`` counts the lines and step records that were
    no event, ``writer`` is the pid of the torchrepro process writing the directory (None: none
    on this machine).

    >>> follower = RunFollower(Path("torchrepro-runs/x"))  # doctest: +SKIP
    >>> [(rank, type(event).__name__) for rank, event in follower.poll()]  # doctest: +SKIP
    [(0, 'Header'), (0, 'Compile')]
    """

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.meta: JsonObject = {}  # run.json as last read
        self.unreadable = 0
        self.writer: str | None = None
        self._bad_lines: dict[Path, int] = {}  # of each events.jsonl
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self._lines: dict[Path, int] = {}  # lines of each events.jsonl read so far
        self._decoders: dict[Path, Decoder] = {}  # of each steps.bin
        self._waiting: dict[Path, list[tuple[int, Step]]] = {}  # records after lines not read yet
        self._finished: set[Path] = set()  # the steps.bin read to their end (the run has ended)

    def poll(self) -> list[tuple[int, Event]]:
        """Re-read ``run.json``; the new events of every rank (new ranks included) as
        ``(rank, event)``, each rank's in the order it wrote them."""
        self._read_meta()
        self.writer = self._writer()
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
            return  # not written yet (or by a launcher that writes none)
        if (lost := supervisor_lost(self.meta)) is not None:
            self.meta["interrupted"] = {"supervisor_pid": lost}

    def _writer(self) -> str | None:
        """The pid of the process holding the run directory, or a rank's folder (``torchrepro run``
        started by hand holds its own)."""
        held = writer_of(self.run_dir)
        for lock in sorted(self.run_dir.glob(f"rank-*/{LOCK_FILE}")) if held is None else ():
            held = writer_of(lock.parent)
            if held is not None:
                break
        return held[1] if held is not None else None

    def damage(self, ended: bool) -> dict[int, list[str]]:
        """What is damaged in each rank's log read so far, in words; ``ended``: the run has ended,
        so a last line or step record still incomplete is cut short, not being written."""
        out: dict[int, list[str]] = {}
        for path in sorted(self._lines):
            rank = _rank_of(path)
            if rank is None:
                continue
            said = out.setdefault(rank, [])
            if bad := self._bad_lines.get(path, 0):
                said.append(f"{bad} unreadable line(s) in {EVENTS_FILE}")
            if ended and self._partial.get(path):
                said.append(f"{EVENTS_FILE} ends in a line cut short")
            steps = path.with_name(STEPS_FILE)
            decoder = self._decoders.get(steps)
            if decoder is not None and ended and steps not in self._finished:  # what is left is cut short
                self._finished.add(steps)
                self._waiting.setdefault(path, []).extend(decoder.finish())
            if decoder is not None and decoder.damaged:
                said.append(f"{decoder.damaged} damaged record(s) in {STEPS_FILE} ({decoder.problems[0]})")
        return {rank: said for rank, said in out.items() if said}

    def _read(self, path: Path) -> list[Event]:
        """The new events of one rank: its new lines, and its new step records each after the line
        it follows."""
        lines = self._new_lines(path)
        steps = path.with_name(STEPS_FILE)
        decoder = self._decoders.get(steps)
        data = self._new_bytes(steps)
        if data:
            if decoder is None:
                decoder = self._decoders[steps] = step_decoder()
            before = decoder.damaged
            self._waiting.setdefault(path, []).extend(decoder.feed(data))
            self.unreadable += decoder.damaged - before
        waiting = self._waiting.get(path, [])
        events: list[Event] = []
        for number, event in lines:
            while waiting and waiting[0][0] < number:
                events.append(waiting.pop(0)[1])
            if event is not None:
                events.append(event)
        read = self._lines.get(path, 0)
        while waiting and waiting[0][0] <= read:
            events.append(waiting.pop(0)[1])
        return events

    def _new_bytes(self, path: Path) -> bytes:
        """What was appended to ``path`` since the last read (at most :data:`MAX_LINE` bytes: the
        rest on the next poll, memory stays bounded)."""
        try:
            with open_regular(path) as fp:  # InputError: a FIFO would block the view
                fp.seek(self._offsets.get(path, 0))
                data = fp.read(MAX_LINE)
        except OSError:
            return b""
        self._offsets[path] = self._offsets.get(path, 0) + len(data)
        return data

    def _new_lines(self, path: Path) -> list[tuple[int, Event | None]]:
        """The complete lines appended to an ``events.jsonl`` since the last read, numbered from
        its first line: each one's event, or None (blank, unknown kind or unreadable)."""
        data = self._new_bytes(path)
        lines = (self._partial.pop(path, b"") + data).split(b"\n")
        if len(lines[-1]) > MAX_LINE:  # damage, not a line being written: skipped
            lines[-1] = b""
            self._bad(path)
        if lines[-1]:
            self._partial[path] = lines[-1]  # still being written
        first = self._lines.get(path, 0) + 1
        self._lines[path] = first - 1 + len(lines) - 1
        out: list[tuple[int, Event | None]] = []
        for number, raw in enumerate(lines[:-1], first):
            event = None
            if raw.strip():
                try:
                    event = from_json(loads(raw))
                except (ValueError, TypeError, AttributeError):
                    self._bad(path)
            out.append((number, event))
        return out

    def _bad(self, path: Path) -> None:
        self.unreadable += 1
        self._bad_lines[path] = self._bad_lines.get(path, 0) + 1
