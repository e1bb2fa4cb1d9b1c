"""The event log's tolerant reader: one rank's ``events.jsonl`` and ``steps.bin`` back into its
typed events (:class:`EventLog`), step records among the lines in writing order.

It skips garbled lines, lines over :data:`MAX_LINE` bytes, a truncated last line and damaged step
records and says so in ``EventLog.problems``; events of kinds it does not know are counted, not
fatal. It reads a chunk at a time (memory holds the events, not the file) and only regular files
(:func:`open_regular`: a FIFO or a device would block or never end). For a report over many ranks,
``read_events(reduce=...)`` hands a reducer each rank's step values a few hundred at a time, field
by field, as they are decoded, and builds no step event. Decoding is :mod:`.event_codec`'s.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

from ..errors import InputError
from . import stepstream
from .event_codec import (
    BUILDERS,
    DECODE_ERRORS,
    STEP_PREFIX,
    STEP_TYPES,
    Shared,
    decode_step_line,
    from_json,
    json_loads,
    row_decoder,
    share_step,
    step_decoder,
    step_row,
)
from .events import EVENTS_FILE, KINDS, READABLE, SCHEMA, STEP_FIELDS, End, Event, Header, Step, check_event
from .jsoncheck import loads
from .stepstream import STEPS_FILE

MAX_LINE = 64 << 20  # a longer line is damage (a sparse or garbled file), skipped unread: memory stays bounded
_CHUNK = 4 << 20  # what the reader holds of the file at once, besides one line
OVERSIZED = b"\0 a line over MAX_LINE bytes"  # what LineReader gives for such a line (never valid JSON)

E = TypeVar("E", bound=Event)  # EventLog.of: the events of the type asked for

_LEAF_TYPES = frozenset(KINDS.values())  # no event type derives from another: of() may look them up by type


StepColumns = Sequence[Sequence[Any]]  # steps field by field: a sequence per field of STEP_FIELDS, in that order
StepReduce = Callable[[Iterator[StepColumns]], Any]  # what read_events(reduce=...) makes of a log's steps


def step_columns(steps: Iterable[Step]) -> StepColumns:
    """The values of ``steps`` field by field (:data:`STEP_FIELDS` order), each in the order of ``steps``.

    >>> step_columns([Step(index=0, loss=2.0), Step(index=1, loss=1.5)])[STEP_FIELDS.index("loss")]
    (2.0, 1.5)
    """
    return _columns(list(map(step_row, steps)))


def _columns(rows: list[Sequence[Any]]) -> StepColumns:
    return list(zip(*rows)) or [()] * len(STEP_FIELDS)


@dataclass(slots=True)
class EventLog:
    """The events of one rank, and what could not be read: ``bad_lines`` skipped (a
    ``truncated`` last line among them), and ``unreadable``, the reason the file is not a log
    this torchrepro can read at all (no header, another schema), or None. ``kept``: what a reader
    that keeps no step events kept of them instead (``analysis.kept_steps.KeptSteps``), or None."""

    path: Path
    events: list[Event] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    unknown_kinds: dict[str, int] = field(default_factory=dict)
    bad_lines: int = 0
    truncated: bool = False
    unreadable: str | None = None
    kept: Any = None
    _by_type: tuple[list[Event], int, dict[type, list[Event]]] | None = field(default=None, repr=False, compare=False)

    @property
    def header(self) -> Header | None:
        return next((e for e in self.events if isinstance(e, Header)), None)

    @property
    def end(self) -> End | None:
        return next((e for e in reversed(self.events) if isinstance(e, End)), None)

    @property
    def damage(self) -> list[str]:
        """The ``problems`` that are damage: all but the note that a step log of an older format
        carries no checks (its records read as written; nothing in them is known to be wrong)."""
        return [p for p in self.problems if not p.endswith(stepstream.UNCHECKED)]

    @property
    def rank(self) -> int:
        header = self.header
        return header.rank if header else _rank_from_dir(self.path.parent.name)

    def of(self, cls: type[E]) -> list[E]:
        """The events of one type, in order (a new list; the reader groups the events by type as it
        reads them, this again when ``events`` changes, so the analyses' many calls cost little).
        The steps of a log read without them (``kept``) are a programming error to ask for."""
        if cls is Step and self.kept is not None:
            raise TypeError(f"{self.path}: read without its step events (kept: {type(self.kept).__name__})")
        if cls not in _LEAF_TYPES:
            return [e for e in self.events if isinstance(e, cls)]
        cached = self._by_type
        if cached is None or cached[0] is not self.events or cached[1] != len(self.events):
            by_type: dict[type, list[Event]] = {}
            for event in self.events:
                kind = type(event)
                if kind in by_type:
                    by_type[kind].append(event)
                else:
                    by_type[kind] = [event]
            cached = self._by_type = (self.events, len(self.events), by_type)
        return cast("list[E]", list(cached[2].get(cls, ())))  # the list under cls holds only cls's events

    def keep_instead_of_steps(self, kept: Any) -> None:
        """Hold ``kept`` (made from this log's step events) instead of the step events."""
        self.events = [e for e in self.events if type(e) is not Step]
        self._by_type = None  # it holds the steps too
        self.kept = kept


def _rank_from_dir(name: str) -> int:
    try:
        return int(name.split("-", 1)[1])
    except (IndexError, ValueError):
        return 0


def open_regular(path: str | os.PathLike[str], *, follow_links: bool = True) -> BinaryIO:
    """``path`` opened for reading in binary; :class:`InputError` unless it is a regular file: a FIFO
    would block the reader (it is opened non-blocking, then checked), a device would never end.
    Without ``follow_links``, a symbolic link is refused too (a file of someone else's run
    directory that leads elsewhere: ``graph.py -> ~/.ssh/id_ed25519``). ``OSError`` when it cannot
    be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW))
    except OSError as exc:
        if not follow_links and exc.errno == errno.ELOOP:
            raise InputError(
                f"{path}: a symbolic link: torchrepro reads no file of a run directory through a link"
            ) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{path}: not a regular file (a FIFO, a device or a directory)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class LineReader:
    """The lines of a binary file (without their newline), read :data:`_CHUNK` bytes at a time, so
    memory holds one chunk and one line at most: a line over ``limit`` bytes comes out as
    :data:`OVERSIZED`, never held whole. ``final`` turns True when the file's last line comes out
    without a newline (a file cut while written)."""

    def __init__(self, fp: BinaryIO, limit: int = MAX_LINE):
        self.fp, self.limit, self.final = fp, limit, False

    def __iter__(self) -> Iterator[bytes]:
        pieces: list[bytes] = []  # the line read so far, when it spans chunks
        size, skipping, limit, read = 0, False, self.limit, self.fp.read
        while chunk := read(_CHUNK):
            lines = chunk.split(b"\n")
            tail = lines.pop()
            if lines:  # the line that spanned chunks ends here
                if skipping:
                    lines[0], skipping = OVERSIZED, False
                elif pieces:
                    size += len(lines[0])
                    lines[0] = OVERSIZED if size > limit else b"".join([*pieces, lines[0]])
                    pieces, size = [], 0
                yield from lines
            if tail and not skipping:
                pieces.append(tail)
                size += len(tail)
                if size > limit:
                    pieces, size, skipping = [], 0, True
        if skipping or pieces:
            self.final = True
            yield OVERSIZED if skipping else b"".join(pieces)


def read_events(
    path: str | os.PathLike[str],
    shared: Shared | None = None,
    reduce: StepReduce | None = None,
) -> EventLog:
    """Read one rank's log, tolerating damage: see the module docstring. ``shared`` (one
    :class:`Shared` for every rank of a run) keeps what repeats across ranks once. ``reduce``:
    the log holds what ``reduce(batches)`` makes of its step events (``EventLog.kept``) instead of
    them: ``batches`` gives their values in log order, a few hundred steps at a time, field by
    field (:func:`step_columns`), each batch as soon as it is read, while it is in the processor's
    caches; a record of ``steps.bin`` then becomes no :class:`Step` (a report over many ranks).

    >>> read_events("run/rank-0/events.jsonl", reduce=lambda batches: sum(len(b[0]) for b in batches)).kept  # doctest: +SKIP
    300
    """
    path = Path(path)
    if reduce is None:
        return _read(path, shared)
    try:
        return _read(path, None, reduce)
    except _ReadWhole:  # the steps read as events, then reduced
        log = _read(path, None)
        log.keep_instead_of_steps(reduce(iter([step_columns(log.of(Step))])))
        return log


class _ReadWhole(Exception):
    """A log whose steps cannot be reduced as they are read: a record with a value of the wrong JSON
    type (damage, found by checking each record alone), or steps in both files (to be put in order)."""


def _read(path: Path, shared: Shared | None, reduce: StepReduce | None = None) -> EventLog:
    """:func:`read_events`; with ``reduce``, the steps reduced as they are read (steps.bin's first),
    :class:`_ReadWhole` where they cannot be."""
    log = EventLog(path)
    stream = path.with_name(STEPS_FILE)
    records: list[tuple[int, Step]] = []  # without reduce
    streamed = 0  # with reduce: the records of steps.bin reduced
    kept = None
    if reduce is None:
        records = _read_steps(log, stream, shared)
        with open_regular(path) as fp:
            for _ in _read_lines(log, LineReader(fp), shared, records):
                pass
    else:
        with _StepRecords(log, stream) as stepped, open_regular(path) as fp:  # (steps.bin opened first, as above)
            steps = chain(stepped, stepped.alone(_read_lines(log, LineReader(fp), None, [], rows=True)))
            kept = reduce(steps)
            for _ in steps:  # what reduce left unread: the lines' events, the damage counted at the end
                pass
        streamed = stepped.count
    if log.bad_lines > 5:
        log.problems.append(f"{path}: {log.bad_lines} unreadable lines skipped in all")
    header = log.header
    if header is None:
        log.unreadable = "no header line: not a torchrepro event log"
        ids = {id(step) for _, step in records}
        if (ids and all(id(e) in ids for e in log.events)) or (streamed and not log.events):
            # a step stream beside a log of no event at all (garbage, not a torchrepro log) means nothing;
            # beside a log that only lost its header line it is that log's steps, read as its lines are
            log.events = []
            log._by_type = None
            kept = None if reduce is None else reduce(iter(()))
    elif header.schema not in READABLE:
        by = f"torchrepro {header.torchrepro_version}" if header.torchrepro_version else "another torchrepro"
        log.unreadable = (
            f"schema {header.schema!r} written by {by}; this is torchrepro {_version()}, which reads {SCHEMA!r}"
        )
        log.events = [header]  # nothing else is trusted: field meanings may have changed
        kept = None if reduce is None else reduce(iter(()))
    log.kept = kept
    if log.unreadable:
        log.problems.append(f"{path}: {log.unreadable}")
    return log


_PIECE = 16 << 10  # what of steps.bin is decoded and reduced at once (a few hundred records)
_BATCH = 256  # step lines reduced at once


class _StepRecords:
    """The step records of ``path`` (``steps.bin``, opened here; none if there is no such file) as
    batches of columns (:func:`step_columns`), decoded :data:`_PIECE` bytes at a time, their
    values' JSON types checked a column at a time (:class:`_ReadWhole` for a wrong one). ``count``:
    the records given so far. Damage is counted in ``log`` as for a line, once all are read."""

    def __init__(self, log: EventLog, path: Path):
        self.log, self.path, self.count = log, path, 0
        try:
            self.fp: BinaryIO | None = open_regular(path)
        except FileNotFoundError:
            self.fp = None

    def __enter__(self) -> _StepRecords:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fp is not None:
            self.fp.close()

    def __iter__(self) -> Iterator[StepColumns]:
        if self.fp is None:
            return
        decoder, types, read = row_decoder(), STEP_TYPES, self.fp.read
        while True:
            piece = read(_PIECE)
            records = decoder.feed(piece) if piece else decoder.finish()
            if records:
                self.count += len(records)
                columns = list(zip(*[row for _, row in records]))
                for values, accepted in zip(columns, types):
                    if accepted is not None and not set(map(type, values)) <= accepted:
                        raise _ReadWhole("a step record with a value of the wrong JSON type")
                yield columns
            if not piece:
                break
        _count_damage(self.log, self.path, decoder)

    def alone(self, batches: Iterator[StepColumns]) -> Iterator[StepColumns]:
        """``batches`` (the steps of events.jsonl), which must be none where records were given."""
        for batch in batches:
            if self.count:
                raise _ReadWhole("steps in events.jsonl and in steps.bin")
            yield batch


def _read_steps(log: EventLog, path: Path, shared: Shared | None) -> list[tuple[int, Step]]:
    """The step records of ``path`` (``steps.bin``) as ``(lines before it in events.jsonl, step)``;
    none if there is no such file. Damage is counted in ``log`` as for a line."""
    try:
        fp = open_regular(path)
    except FileNotFoundError:
        return []
    decoder = step_decoder(shared)
    out: list[tuple[int, Step]] = []
    with fp:
        while chunk := fp.read(_CHUNK):
            out += decoder.feed(chunk)
    out += decoder.finish()
    _count_damage(log, path, decoder)
    return out


def _count_damage(log: EventLog, path: Path, decoder: stepstream.Decoder) -> None:
    if decoder.fields and not decoder.checked:
        log.problems.append(f"{path}: {stepstream.UNCHECKED}")
    if decoder.damaged:
        log.bad_lines += decoder.damaged
        log.truncated = decoder.truncated
        log.problems += (f"{path}: {why}" for why in decoder.problems)


def _read_lines(
    log: EventLog, lines: LineReader, shared: Shared | None, records: list[tuple[int, Step]], rows: bool = False
) -> Iterator[StepColumns]:
    """Each line of ``lines`` into ``log`` as it is iterated: its event, or counted as skipped (see
    :func:`read_events`); the step ``records`` of ``steps.bin`` each after the line it follows.
    ``rows``: the step events are not kept in ``log`` but given out, :data:`_BATCH` at a time, as
    columns of their values (:func:`step_columns`)."""
    loads, builders, events = json_loads, BUILDERS, log.events
    fast, share, step_prefix, row = decode_step_line, share_step, STEP_PREFIX, step_row
    by_type: dict[type, list[Event]] = {Step: []}  # the events grouped by type as they are read (EventLog.of)
    steps = by_type[Step]
    given: list[Sequence[Any]] = []  # rows: the steps not given out yet
    decode_error = DECODE_ERRORS  # what `fast` raises
    pending = iter(records)
    record = next(pending, None)  # the next record and the line it follows
    for number, raw in enumerate(lines, 1):
        while record is not None and record[0] < number:
            events.append(record[1])
            steps.append(record[1])
            record = next(pending, None)
        if len(given) >= _BATCH:
            yield _columns(given)
            given = []
        if fast is not None and raw.startswith(step_prefix):
            try:  # a step line straight into its event, JSON types checked by msgspec
                step = share(fast(raw), shared)
            except decode_error:
                pass  # NaN, a truncated line, other types: the general path below decides
            else:
                if rows:
                    given.append(row(step))
                else:
                    events.append(step)
                    steps.append(step)
                continue
        if not raw.strip():
            continue
        try:
            try:
                data = loads(raw)
            except ValueError:  # orjson refuses NaN and Infinity, which the writer keeps
                data = json.loads(raw)
            if type(data) is not dict:
                raise ValueError("not an object")
            kind = data.pop("kind", "")
            build = builders.get(kind)
            if build is None:
                kind = str(kind)
                log.unknown_kinds[kind] = log.unknown_kinds.get(kind, 0) + 1
                continue
            if kind != "step":  # (steps: their values' JSON types, as the builder checks them)
                check_event(kind, data)
            event = build(data, shared)
            if rows and type(event) is Step:
                given.append(row(event))
                continue
            events.append(event)
            by_type.setdefault(type(event), []).append(event)
        except (ValueError, TypeError, UnicodeDecodeError, RecursionError) as exc:
            log.bad_lines += 1
            log.truncated = lines.final
            if log.bad_lines <= 5:
                what = f"unreadable line {number} ({_why(exc)})"
                if raw is OVERSIZED:
                    what = f"line {number} (over {MAX_LINE >> 20} MiB)"
                elif log.truncated:
                    what = "truncated last line"
                log.problems.append(f"{log.path}: {what} skipped")
    if record is not None:  # records after the last line (events.jsonl cut short, or steps alone)
        rest = [record[1], *(r for _, r in pending)]
        events += rest
        steps += rest
    log._by_type = (events, len(events), by_type)
    if given:
        yield _columns(given)


def _why(exc: BaseException) -> str:
    """What was wrong with a line, in a few words (its first line, at most 200 characters)."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _version() -> str:
    from .. import __version__

    return __version__


def read_header(path: str | os.PathLike[str]) -> Header | None:
    """Only the header (first line) of a rank's log, without reading the rest."""
    try:
        with open_regular(path) as fp:
            event = from_json(loads(fp.readline(MAX_LINE)))
    except (OSError, InputError, ValueError, TypeError, AttributeError):
        return None
    return event if isinstance(event, Header) else None


def rank_logs(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Every ``rank-<r>/events.jsonl`` under a run directory, by rank."""
    found = Path(run_dir).glob(f"rank-*/{EVENTS_FILE}")
    return sorted(found, key=lambda p: _rank_from_dir(p.parent.name))
