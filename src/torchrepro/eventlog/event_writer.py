"""The event log's writer: appends each event with one ``write`` system call, nothing buffered
in the process, so a crash keeps everything before it; step events go to ``steps.bin`` beside the
log as compact records (:mod:`.stepstream`). Encoding is :mod:`.event_codec`'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from . import stepstream
from .event_codec import common_step_values, encode_line, step_values
from .events import END_FILE, RESERVED_END, End, Event, Step, field_names
from .stepstream import STEPS_FILE

_CHUNK = 4 << 20  # what counting the lines of a log written before reads of it at once


def _write(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    while written < len(data):  # a regular file takes it whole, unless interrupted
        written += os.write(fd, data[written:])


def _count_lines(path: Path) -> int:
    with open(path, "rb") as fp:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: fp.read(_CHUNK), b""))


class EventWriter:
    """Appends events to a JSONL file (steps to ``steps.bin`` beside it), one ``write`` system call per event, nothing buffered in
    the process: once ``write`` returns, the line is the kernel's, and survives the process
    being killed (SIGKILL) at any later point; only an operating-system crash or power loss can
    take it (no ``fsync``). Each of ``listeners`` (e.g. the OpenTelemetry exporter) is called
    with every event right after its line is written; a listener must return quickly and never
    raise.

    >>> with EventWriter(Path("run/rank-0/events.jsonl")) as w:  # doctest: +SKIP
    ...     w.write(Step(index=0, loss=1.5))
    """

    def __init__(self, path: str | os.PathLike[str], compact_steps: bool = True):
        """``compact_steps``: step events go to ``steps.bin`` beside ``path`` (:mod:`.stepstream`);
        they are JSON lines in ``path`` without it, and whenever ``steps.bin`` already holds
        another writer's records (a second session of one process) or a step has a value that is
        no JSON type."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        self.listeners: list[Callable[[Event], None]] = []
        self.lines = _count_lines(self.path) if os.fstat(self._fd).st_size else 0  # what the reader counts
        self._steps: tuple[int, stepstream.Encoder] | None = None
        self._steps_pid = 0
        self._compact = compact_steps
        # steps.bin is opened at the first step, in the folder this log is in then (it may have been
        # renamed: a launched process's log moves to launcher/ while it writes, runtime.follow.claim)
        self._dir: int | None = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY) if compact_steps else None

    def write(self, event: Event) -> None:
        if self._fd is None:
            return
        if type(event) is Step and self._compact and self._write_step(event):
            pass
        else:
            _write(self._fd, encode_line(event))
            self.lines += 1
        for listener in self.listeners:
            listener(event)

    def write_step(
        self, t: float, rank: int, index: int, loss: float | None, backward_calls: int, time_s: float, compiles: int
    ) -> bool:
        """A common step (:data:`~.event_codec.COMMON_STEP`'s fields given, every other at its default) written
        from its values, without building its :class:`Step`: the same bytes as ``write(Step(...))``
        (the step hook's fast path, docs/evidence/performance.md). False, with nothing written, where
        :meth:`write` must take the ``Step``: listeners to call, ``steps.bin`` not open yet (its
        first step) or not used, a value the record cannot hold."""
        steps = self._steps
        if steps is None or self.listeners:
            return False
        fd, encoder = steps
        try:
            record = encoder.encode(
                common_step_values(self.lines, t, rank, index, loss, backward_calls, time_s, compiles)
            )
        except TypeError:
            return False
        written = os.write(fd, record)  # (_write's first call, inline: one function less, run cold once a step)
        if written < len(record):
            _write(fd, record[written:])
        return True

    def _write_step(self, step: Step) -> bool:
        """``step`` as a record of ``steps.bin``; False when it must be a JSON line instead."""
        if self._steps is None:
            fd = os.open(STEPS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666, dir_fd=self._dir)
            if os.fstat(fd).st_size:  # another writer's stream: its records' state is not ours
                os.close(fd)
                self._compact = False
                return False
            encoder = stepstream.Encoder(field_names(Step))
            _write(fd, encoder.header())
            self._steps = (fd, encoder)
            self._steps_pid = os.getpid()  # the process whose records they are (a fork's close adds no seal)
        fd, encoder = self._steps
        try:
            record = encoder.encode([self.lines, *step_values(step)])
        except TypeError:
            return False
        _write(fd, record)
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._steps is not None:
            fd, encoder = self._steps
            self._steps = None
            try:
                if os.getpid() == self._steps_pid:
                    _write(fd, encoder.seal())  # (the last records are checked as a block is)
            except OSError:
                pass  # (a log that cannot take its seal reads as one whose writer was killed)
            finally:
                os.close(fd)
        if self._dir is not None:
            os.close(self._dir)
            self._dir = None

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReservedEnd:
    """Room kept beside a log for its end record, for when the log itself cannot take it (a full
    disk, a quota): ``end.json`` written as :data:`~.events.RESERVED_END` spaces when the log is
    opened, so its block is the file's already; :meth:`write` puts an end record there in place
    (no new block needed), :meth:`drop` removes it once the log holds its own end. The reader takes
    it as the log's end when the log has none (:func:`~.event_reader.read_events`).

    >>> reserved = ReservedEnd.make(Path("run/rank-0"))  # doctest: +SKIP
    >>> reserved.write(End(exit_code=None, status="write_failed", error="ENOSPC rank-0/events.jsonl"))  # doctest: +SKIP
    """

    def __init__(self, folder: int, fd: int):
        self._folder, self._fd = folder, fd  # the folder's descriptor: it follows the folder if renamed

    @classmethod
    def make(cls, folder: Path) -> ReservedEnd | None:
        """The room, kept in ``folder``; None where even that cannot be written."""
        try:
            dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            fd = os.open(END_FILE, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666, dir_fd=dir_fd)
        except OSError:
            os.close(dir_fd)
            return None
        room = cls(dir_fd, fd)
        try:
            _write(fd, b" " * (RESERVED_END - 1) + b"\n")
            os.fsync(fd)  # (allocated now, not when the disk is full)
        except OSError:
            room.drop()
            return None
        return room

    def write(self, end: End) -> bool:
        """``end`` written into the room (whether it fitted and was written)."""
        line = encode_line(end).rstrip(b"\n")
        if len(line) >= RESERVED_END:
            line = encode_line(End(step=end.step, exit_code=end.exit_code, status=end.status, t=end.t, rank=end.rank))
            line = line.rstrip(b"\n")
        try:
            os.pwrite(self._fd, line.ljust(RESERVED_END - 1) + b"\n", 0)
            os.fsync(self._fd)
        except OSError:
            return False
        return True

    def drop(self) -> None:
        """Close and remove the room (the log ended with its own end record)."""
        try:
            os.unlink(END_FILE, dir_fd=self._folder)
        except OSError:
            pass  # (gone already)
        self.close()

    def close(self) -> None:
        """Close it, keeping what :meth:`write` put there."""
        os.close(self._fd)
        os.close(self._folder)


def write_all(path: str | os.PathLike[str], events: Iterable[Event], compact_steps: bool = True) -> None:
    """Write a whole log at once (used by trace import and tests); ``compact_steps``: as for
    :class:`EventWriter` (False writes a log as torchrepro.events/1 did, every step a line)."""
    with EventWriter(path, compact_steps) as writer:
        for event in events:
            writer.write(event)
