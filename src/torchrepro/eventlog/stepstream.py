"""The compact step stream: ``RUN_DIR/rank-<r>/steps.bin``, one binary record per step event,
each a delta against the step before; everything else stays a JSON line in ``events.jsonl``.

Why: a step event as a JSON line is ~400 bytes (field names, hex fingerprints, 17-digit floats),
and a job writes one per step per rank. A record holds only what changed, in binary: ~40-60
bytes a step for what ``doctor`` records (docs/reports.md, "The event log on disk").

Layout (all integers unsigned LEB128 varints unless said)::

    file    := header-line record* [seal]
    header  := one JSON line: {"format": "torchrepro.steps/2", "fields": ["_lines", "t", "rank", ...],
                               "check": CRC-32 of the field names joined by newlines, 8 hex digits}
    record  := [KEYFRAME follows] varint(len(body)) body check
    body    := varint(mask) value*          one value per field whose bit is set in mask, in order
    check   := 1 byte: the low byte of the CRC-32 (zlib's) of the record's bytes before it (mark,
               follows and length included), chained: computed from the previous record's CRC-32
               (``zlib.crc32(record, previous)``), from 0 at a keyframe
    follows := 4 bytes, little-endian: the CRC-32 the records before the keyframe ended with (0 first)
    seal    := KEYFRAME follows 00        written when the writer closes the log (Encoder.seal)

``fields`` names the record's fields (the step event's own, in the writer's order; the reader
matches them by name: a field the stream lacks is its default, a field no step has is damage, as
a renamed header would be). Field 0,
``_lines``, is how many lines ``events.jsonl`` held when the step was written: the reader puts the
step after that line, so the two files read back as one log in writing order. A field's bit is
clear when its value is the *predicted* one: the previous record's value, or for integers the
previous value plus the previous change (``index`` and ``step`` grow by one: no bit, no byte).
:data:`KEYFRAME` (4 bytes) starts a record that is encoded against nothing (every field
present, string table empty): every :data:`KEYFRAME_EVERY` records at least, so a reader that meets
damage (a cut record, bytes that do not decode, a check that fails) skips to the next keyframe and
reads on.

Damage is never read as values. Each record's check is chained: a damaged record that its own byte
lets through (1 in 256) is caught by the next record's (the chain then differs), and a keyframe's
``follows`` (32 bits) checks the whole block before it, and the seal the last block of a log whose
writer closed it (a log without one was cut: its last records are checked by their bytes alone); a
keyframe block deleted, repeated or moved breaks ``follows`` too. One byte a record, not two: doctor's common step is ~14.4 bytes without a
check, and the log must stay within 16 (``bench/event_builders.py``: 15.4 with it). A record where a
keyframe must be (:data:`KEYFRAME_EVERY` records after the last) is damage, as is a header whose
names fail their check. Each damage is one problem: ``byte N: what was there (and what was expected
there)``. A stream of :data:`UNCHECKED_FORMAT` (no checks, no ``follows``) is read as before, with a
problem that says it has no checks (:data:`UNCHECKED`).

Decoded size is bounded by the file's: a list or dict "changed with no item changed" is the previous
one, shared, and the items of changed lists and dicts made while decoding are at most
:data:`BUDGET_PER_BYTE` a byte of the file read so far (and :data:`FREE_ITEMS` more): past that a
record is damage.

Values (one tag byte, then its payload)::

    00 None   01 False   02 True
    03 int: zigzag varint of (value - predicted) for a field whose previous value is an int, else
          of the value
    04 float that is a whole number of microseconds: zigzag varint of its change in µs from the
          field's previous float (when that is one too; else from 0)
    40-7F float: bits XOR the field's previous float (0.0 if none); tag = 0x40 | trailing-zero bytes
          << 3 | (significant bytes - 1), then the significant bytes, little-endian
    80-BF lowercase hex string of n = tag & 0x3F bytes (2n hex digits): the bytes
    C0 str: varint length + UTF-8 (added to the string table)   C1 str: varint index into the table
    C2 list: varint count + values   C3 dict: varint count + (key value, value) pairs
    C4 list of the previous value's length: varint mask of changed items + their values
    C5 dict with the previous value's keys in order: varint mask of changed values + the values

A list or dict equal (``==``) to the field's previous one is written as unchanged: a ``-0.0``
inside one that held ``0.0`` reads back as ``0.0`` (no step field holds floats in a list).

Values nest at most :data:`MAX_DEPTH` deep (a step's are 2 deep). Two implementations of this
format agree byte for byte: the C extension ``_stepcodec`` (``_stepcodec.c``: ~1.4 µs to encode a
doctor step and ~0.7 µs to decode one, where this module's Python takes ~15 and ~11 µs), used when
it was built and is of :data:`CODEC_VERSION`, and this module's (the reference, and what runs where
no compiler built the extension, or when ``TORCHREPRO_PURE_PYTHON_CODEC=1``);
``tests/unit/test_step_codec.py`` compares them on generated values and on damaged bytes,
``tests/e2e/test_step_damage_fuzz.py`` on 10 000 mutated streams a run (``tests/step_fuzz.py``). Neither
msgspec nor numpy reads this format (varints, deltas, a string table): ``bench/step_decoders.py``
compares their own formats with it (docs/step-log.md).

Writes are one ``os.write`` per record (``O_APPEND``): a record the kernel took survives SIGKILL, a
record cut by a crash is the file's last bytes and is reported as a truncated last record. Nothing
here imports torch.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zlib
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Protocol

FORMAT = "torchrepro.steps/2"
UNCHECKED_FORMAT = "torchrepro.steps/1"  # records without their check (still read, said to be unchecked)
UNCHECKED = (
    f"step records of {UNCHECKED_FORMAT}, written before records carried a check: damage inside one may read as values"
)
STEPS_FILE = "steps.bin"
KEYFRAME = b"\x00TRK"  # no record starts with a zero byte (a body is never empty)
KEYFRAME_EVERY = 256
_MAX_RECORD = 16 << 20  # a longer record is damage (a garbled length), not a record still being written
LINES = "_lines"  # the pseudo-field: events.jsonl lines written before the step
BUDGET_PER_BYTE = 16  # items of changed lists and dicts decoded per byte of the file (and FREE_ITEMS more) at most
FREE_ITEMS = 1 << 20
MAX_DEPTH = 100  # lists and dicts in lists and dicts: a deeper value is no step's (and no recursion without end)
CODEC_VERSION = 2  # the _stepcodec this module uses: its VERSION, raised with every change to _stepcodec.c

_D = struct.Struct("<d")
_Q = struct.Struct("<Q")
_ABSENT = object()  # the previous value of a field before any record (and after a keyframe)


def _varint(n: int, out: bytearray) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(n: int) -> int:
    return n * 2 if n >= 0 else -n * 2 - 1


def _hex_bytes(s: str) -> bytes | None:
    """``s`` as bytes when it is lowercase hex of 1 to 63 bytes (a fingerprint), else None."""
    if not 0 < len(s) <= 126:
        return None
    try:
        raw = bytes.fromhex(s)
    except ValueError:
        return None
    return raw if raw.hex() == s else None  # fromhex takes spaces and capitals: those stay strings


def _micros(f: float) -> int | None:
    """``f`` in whole microseconds when it is exactly the float nearest such a number (a time
    rounded to 6 decimals), else None."""
    if not -1e9 < f < 1e9:  # NaN and infinities too
        return None
    m = round(f * 1e6)
    return m if m / 1e6 == f and (m or math.copysign(1.0, f) > 0) else None  # -0.0 is no 0 µs


def _check(record: bytes, chain: int) -> int:
    """The CRC-32 of ``record`` chained from the record before's (0 at a keyframe)."""
    return zlib.crc32(record, chain)


def header_check(fields: Sequence[str]) -> str:
    """The check of a header's field names (a renamed or reordered field is damage)."""
    names = "\n".join(fields).encode()
    return f"{zlib.crc32(names):08x}"


def _load_codec() -> tuple[ModuleType | None, str]:
    """The C extension, when it was built, is of :data:`CODEC_VERSION` (a build from an older
    ``_stepcodec.c`` is not used) and ``TORCHREPRO_PURE_PYTHON_CODEC`` is unset; else None. And
    which codec that is, in words (``torchrepro env`` says it)."""
    if os.environ.get("TORCHREPRO_PURE_PYTHON_CODEC", "") not in ("", "0"):
        return None, "Python (TORCHREPRO_PURE_PYTHON_CODEC is set)"
    try:
        from . import _stepcodec
    except ImportError:
        return None, "Python (the C extension was not built: no C compiler when torchrepro was installed)"
    version = getattr(_stepcodec, "VERSION", None)
    if version != CODEC_VERSION:
        return None, f"Python (the C extension is of version {version}, not {CODEC_VERSION}: reinstall torchrepro)"
    return _stepcodec, "C"


# the implementation new encoders and decoders use (tests set _C to None for Python's), and which it is
_C, CODEC = _load_codec()


class Encoder:
    """Encodes step records for one stream; ``fields`` are the record's fields after ``_lines``.
    Holds the previous record's values (memory stays flat)."""

    def __init__(self, fields: Sequence[str], checked: bool = True):
        """``checked``: records end with their check (:data:`FORMAT`); False writes
        :data:`UNCHECKED_FORMAT`, as torchrepro did before checks (tests of old logs)."""
        self.fields, self.checked = (LINES, *fields), checked
        encoding = (_C.Encoding if _C else _Encoding)(len(self.fields), checked)
        self._encode: Callable[[Sequence[Any]], bytes] = encoding.encode
        self._chain: Callable[[], int] = lambda: encoding.chain

    def encode(self, values: Sequence[Any]) -> bytes:
        """One record of ``values`` (``_lines`` first, then ``fields`` in order); ``TypeError`` for a
        value that is no JSON type (the caller writes that step as a JSON line instead)."""
        return self._encode(values)

    def seal(self) -> bytes:
        """What ends a stream whose writer closed it: a keyframe mark with no record, holding the
        CRC-32 the records end with (the last ones are then checked as a block is); nothing where
        the records carry no check."""
        return KEYFRAME + self._chain().to_bytes(4, "little") + b"\x00" if self.checked else b""

    def header(self) -> bytes:
        head: dict[str, Any] = {"format": FORMAT if self.checked else UNCHECKED_FORMAT, "fields": list(self.fields)}
        if self.checked:
            head["check"] = header_check(self.fields)
        return (json.dumps(head, separators=(",", ":")) + "\n").encode()


class _Encoding:
    """The encoder's state for a stream of records of ``n`` fields, and :meth:`encode` (the
    reference implementation of ``_stepcodec.Encoding``)."""

    def __init__(self, n: int, checked: bool = True):
        self._body = _body_encoder(n)
        self.n, self.checked = n, checked
        self.chain = 0  # the check of the record before (0 before a keyframe)
        self._reset()
        self.records = 0
        self._key_next = True
        self._depth = 0

    def _reset(self) -> None:
        self.prev: list[Any] = [_ABSENT] * self.n
        self.delta: list[int] = [0] * self.n
        self.strings: dict[str, int] = {}

    def encode(self, values: Sequence[Any]) -> bytes:
        key = self._key_next or self.records % KEYFRAME_EVERY == 0
        if key:
            self._reset()
        self._depth = 0
        try:
            body, mask = self._body(values, self.prev, self.delta, self._value)
        except Exception:
            self._key_next = True  # the state holds part of a record never written: start afresh
            raise
        self._key_next = False
        self.records += 1
        if mask < 0x80 and len(body) < 0x7F and not key:  # most records: length and mask one byte each
            record = bytes((len(body) + 1, mask)) + body
        else:
            out = bytearray(KEYFRAME if key else b"")
            if key and self.checked:
                out += self.chain.to_bytes(4, "little")  # what the records before end with: the keyframe follows them
            head = bytearray()
            _varint(mask, head)
            _varint(len(head) + len(body), out)
            record = bytes(out + head + body)
        if not self.checked:
            return record
        self.chain = _check(record, 0 if key else self.chain)
        return record + bytes((self.chain & 0xFF,))

    def _value(self, value: Any, old: Any, out: bytearray) -> None:
        encode = _ENCODE.get(type(value))
        if encode is None:
            raise TypeError(f"{type(value).__name__} in a step record")
        encode(self, value, old, out)

    def _none(self, value: None, old: Any, out: bytearray) -> None:
        out.append(0x00)

    def _bool(self, value: bool, old: Any, out: bytearray) -> None:
        out.append(0x02 if value else 0x01)

    def _int(self, value: int, old: Any, out: bytearray) -> None:
        out.append(0x03)
        _varint(_zigzag(value), out)

    def _float(self, value: float, old: Any, out: bytearray) -> None:
        if (m := _micros(value)) is not None:
            # a duration rounded to the microsecond: its change in µs (from the previous such float)
            out.append(0x04)
            _varint(_zigzag(m - ((_micros(old) or 0) if type(old) is float else 0)), out)
            return
        x = _Q.unpack(_D.pack(value))[0]
        if type(old) is float:
            x ^= _Q.unpack(_D.pack(old))[0]
        tz = min(((x & -x).bit_length() - 1) >> 3, 7) if x else 7
        nb = max((x.bit_length() + 7) >> 3, tz + 1) - tz
        out.append(0x40 | tz << 3 | (nb - 1))
        out += (x >> (tz << 3)).to_bytes(nb, "little")

    def _str(self, value: str, old: Any, out: bytearray) -> None:
        raw = _hex_bytes(value)
        if raw is not None:
            out.append(0x80 | len(raw))
            out += raw
        elif value in self.strings:
            out.append(0xC1)
            _varint(self.strings[value], out)
        else:
            try:
                data = value.encode()
            except UnicodeEncodeError:
                raise TypeError("a str that UTF-8 cannot encode (a lone surrogate)") from None
            self.strings[value] = len(self.strings)
            out.append(0xC0)
            _varint(len(data), out)
            out += data

    def _nested(self) -> None:
        if self._depth >= MAX_DEPTH:
            raise TypeError(f"a value nested over {MAX_DEPTH} deep")
        self._depth += 1

    def _list(self, value: list[Any], old: Any, out: bytearray) -> None:
        self._nested()
        if type(old) is list and len(old) == len(value):
            self._changed(0xC4, value, old, out)
        else:
            out.append(0xC2)
            _varint(len(value), out)
            for item in value:
                self._value(item, None, out)
        self._depth -= 1

    def _dict(self, value: dict[str, Any], old: Any, out: bytearray) -> None:
        self._nested()
        if type(old) is dict and len(old) == len(value) and list(old) == list(value):
            self._changed(0xC5, list(value.values()), list(old.values()), out)
        else:
            out.append(0xC3)
            _varint(len(value), out)
            for k, item in value.items():
                if type(k) is not str:
                    raise TypeError(f"dict key {k!r}")
                self._str(k, None, out)
                self._value(item, None, out)
        self._depth -= 1

    def _changed(self, tag: int, items: list[Any], olds: list[Any], out: bytearray) -> None:
        mask, body = 0, bytearray()
        for j, (item, old) in enumerate(zip(items, olds)):
            if item is not old and (item != old or type(item) is not type(old) or type(item) is float and item == 0.0):
                mask |= 1 << j
                self._value(item, old, body)
        out.append(tag)
        _varint(mask, out)
        out += body


_ENCODE: dict[type, Callable[[_Encoding, Any, Any, bytearray], None]] = {
    type(None): _Encoding._none,
    bool: _Encoding._bool,
    int: _Encoding._int,
    float: _Encoding._float,
    str: _Encoding._str,
    list: _Encoding._list,
    dict: _Encoding._dict,
}


def _body_encoder(n: int) -> Callable[..., tuple[bytearray, int]]:
    """The function that encodes a record's ``n`` values against ``prev`` (updated in place), each
    field's test written out (the writer's hot path): an int that changed by the predicted change,
    or a value that is (or equals, of the same type) the previous one, costs no byte."""
    lines = [
        "def body(values, prev, delta, value_of, _int=int, _float=float, _type=type):",
        "    mask = 0",
        "    out = bytearray()",
    ]
    lines.append(f"    {''.join(f'v{i}, ' for i in range(n))}= values")
    for i in range(n):
        lines += [
            f"    o = prev[{i}]",
            f"    if _type(v{i}) is _int and _type(o) is _int:",
            f"        c = v{i} - o",
            f"        if c != delta[{i}]:",
            f"            mask |= {1 << i}",
            "            out.append(3)",
            f"            _varint(_zigzag(c - delta[{i}]), out)",
            f"            delta[{i}] = c",
            f"    elif v{i} is not o and (v{i} != o or _type(v{i}) is not _type(o) or _type(v{i}) is _float and v{i} == 0.0):",
            f"        mask |= {1 << i}",  # 0.0 == -0.0: a zero float is written again
            f"        value_of(v{i}, o, out)",
            f"        delta[{i}] = 0",
            f"    prev[{i}] = v{i}",
        ]
    lines.append("    return out, mask")
    scope: dict[str, Any] = {"_varint": _varint, "_zigzag": _zigzag}
    exec("\n".join(lines), scope)  # noqa: S102 -- source built above from the field count alone
    body: Callable[..., tuple[bytearray, int]] = scope["body"]
    return body


class Damaged(ValueError):
    """Bytes that are no record."""


class _Core(Protocol):
    """What decodes the records after the header line: :class:`_Records` or ``_stepcodec.Records``."""

    damaged: int
    problems: list[str]
    truncated: bool

    def feed(self, data: bytes) -> list[tuple[int, Any]]: ...

    def finish(self) -> list[tuple[int, Any]]: ...

    def fail(self, why: str) -> None: ...


class Decoder:
    """Decodes a step stream fed in pieces (:meth:`feed`): the records complete so far come out as
    ``(lines_before, fields)``, a record cut at the end of what was fed is kept for the next
    piece. ``make(fields)`` builds the event from a dict of the fields it knows by name. Damage is
    counted in ``damaged`` (with a reason in ``problems``: the byte offset in the file and what was
    expected there) and skipped up to the next keyframe. ``checked``: the stream's records carry
    their check (:data:`FORMAT`; False for :data:`UNCHECKED_FORMAT`, or before the header is read)."""

    def __init__(
        self,
        make: Callable[[dict[str, Any]], Any],
        known: Sequence[str] = (),
        make_from_values: Callable[[list[Any]], Any] | None = None,
    ):
        """``known``: the fields the events have (a stream naming another is damage; none given:
        any name is taken). ``make_from_values``: builds the event from the values alone, in order,
        when the stream's fields are ``known`` (this torchrepro's: the reader's hot path)."""
        self.make, self.known, self.make_from_values = make, tuple(known), make_from_values
        self.positional = False
        self.checked = False
        self.fields: tuple[str, ...] | None = None
        self._head = b""  # the header line so far
        self._core: _Core | None = None  # once the header is read
        self._records: Callable[[int, Callable[[list[Any]], Any], bool, int], _Core] = _C.Records if _C else _Records

    @property
    def damaged(self) -> int:
        return self._core.damaged if self._core else 0

    @property
    def problems(self) -> list[str]:
        return self._core.problems if self._core else []

    @property
    def truncated(self) -> bool:
        return self._core.truncated if self._core else False

    def feed(self, data: bytes) -> list[tuple[int, Any]]:
        if self._core is not None:
            return self._core.feed(data)
        buf = self._head + data
        end = buf.find(b"\n", 0, _MAX_RECORD)
        if end < 0 and len(buf) < _MAX_RECORD:
            self._head = buf
            return []
        self._head = b""
        fields, self.checked, why = _header(buf[:end])
        return self._start(fields, why, end + 1).feed(buf[end + 1 :])

    def _start(self, fields: tuple[str, ...], why: str | None, offset: int) -> _Core:
        """The decoder of the records of a stream of ``fields`` that start at byte ``offset``;
        ``why``: the reason nothing in the stream can be read (None: it can)."""
        self.fields = fields
        names = fields[1:]
        unknown = [name for name in names if name not in self.known] if self.known else []
        if why is None and unknown:
            why = (
                f"byte 0: a header naming fields no step has ({', '.join(map(repr, unknown[:3]))}; "
                f"expected names among {', '.join(self.known)}): nothing of it read"
            )
        make, from_values = self.make, self.make_from_values
        self.positional = from_values is not None and names == self.known
        build = from_values if from_values is not None and self.positional else lambda v: make(dict(zip(names, v)))
        core = self._core = self._records(0 if why else len(fields), build, self.checked, offset)
        if why:
            core.fail(why)
        return core

    def finish(self) -> list[tuple[int, Any]]:
        """At the end of the file: a record left cut short is damage (``truncated`` turns True
        when nothing after it could be read); the records after the next keyframe in what was left
        (a garbled length that claimed the rest of the file) come out."""
        core = self._core
        if core is None:
            if not self._head:
                return []
            core = self._start((), "byte 0: truncated last step record (a header line cut short)", 0)
            core.truncated = True
            self._head = b""
        return core.finish()


def _header(line: bytes) -> tuple[tuple[str, ...], bool, str | None]:
    """The fields a header line names (``_lines`` first), whether its records carry their check,
    and why nothing of the stream can be read (None when it can)."""
    try:
        head = json.loads(line)
        form = head.get("format")
        fields = tuple(map(str, head["fields"]))
        check = head.get("check")
    except (ValueError, TypeError, AttributeError, KeyError):
        form, fields, check = None, (), None
    if form not in (FORMAT, UNCHECKED_FORMAT) or fields[:1] != (LINES,):
        return (), False, f"byte 0: not a step stream of format {FORMAT}"
    if form == FORMAT and check != header_check(fields):
        return (
            fields,
            True,
            f"byte 0: a header whose field names fail their check (expected {check!r}, they give {header_check(fields)!r})",
        )
    return fields, form == FORMAT, None


class _Records:
    """The records of a stream of ``n`` fields after its header line, each made an event by
    ``build(values)`` (the reference implementation of ``_stepcodec.Records``); ``checked``: each
    ends with its check; ``offset``: the file's byte the first one starts at. A record is decoded
    from its own bytes (a read past them fails, a slice past them is cut short), so damage reads
    the same whatever the pieces fed were."""

    def __init__(self, n: int, build: Callable[[list[Any]], Any], checked: bool = False, offset: int = 0):
        self.n, self.build, self.checked = n, build, checked
        self.damaged = 0
        self.problems: list[str] = []
        self.truncated = False
        self.table = self._table()
        self._buf = b""
        self._at = offset  # the file's byte that _buf starts at
        self._seeking = n == 0  # nothing in it can be read
        self._depth = 0
        self._items = 0  # the items of changed lists and dicts decoded (against the budget)
        self._budget = 0
        self._follows: int | None = 0  # the check the records read end with; None after damage
        self._reset()

    def _reset(self) -> None:
        self.prev: list[Any] = [_ABSENT] * self.n
        self.delta: list[int] = [0] * self.n
        self.moving: set[int] = set()  # fields whose delta is not 0
        self.strings: list[str] = []
        self.fresh = True  # the next record must hold every field
        self.chain = 0  # the check of the record before
        self.since_key = 0  # records read since the last keyframe mark, the keyframe's own included

    def feed(self, data: bytes) -> list[tuple[int, Any]]:
        buf = self._buf + data if self._buf else data
        pos, out = 0, list[tuple[int, Any]]()
        n, tail = len(buf), 1 if self.checked else 0
        while pos < n:
            if self._seeking:
                found = buf.find(KEYFRAME, pos) if self.n else -1
                if found < 0:
                    pos = max(pos, n - len(KEYFRAME) + 1)
                    break
                pos, self._seeking = found, False
            start = pos
            keyed, follows, before = False, 0, self._follows
            if buf[pos] == 0:
                if n - pos < len(KEYFRAME):
                    break  # the rest of the mark comes with the next piece
                if buf[pos : pos + len(KEYFRAME)] == KEYFRAME:
                    pos += len(KEYFRAME)
                    if tail:
                        if n - pos < 4:
                            pos = start
                            break
                        follows = int.from_bytes(buf[pos : pos + 4], "little")
                        pos += 4
                    self._reset()
                    keyed = True
            try:
                size, pos = _read_varint(buf, pos)
            except IndexError:
                pos = start  # a length cut at the end of this piece: wait for the rest
                break
            except Damaged:
                size = _MAX_RECORD + 1  # a length of over 11 bytes: a garbled one
            if keyed and tail and size == 0:  # a seal (Encoder.seal): the end of a log its writer closed
                if before is not None and follows != before:
                    self._not_following("the end of the log", start, follows, before)
                continue
            if pos + size + tail > n and size <= _MAX_RECORD:
                pos = start
                break
            try:
                if size == 0 or size > _MAX_RECORD:
                    raise Damaged("a zero byte that is no keyframe mark" if size == 0 else "a record of over 16 MiB")
                if not keyed and self.since_key >= KEYFRAME_EVERY:
                    raise Damaged(f"a record where a keyframe mark must be, {KEYFRAME_EVERY} records after the last")
                end = pos + size
                if tail:
                    want = _check(buf[start:end], self.chain)
                    if buf[end] != want & 0xFF:
                        raise Damaged(f"check {buf[end]:02x} where its bytes give {want & 0xFF:02x}")
                self._budget = BUDGET_PER_BYTE * (self._at + end + tail) + FREE_ITEMS
                out.append(self._record(buf[pos:end]))
                if keyed and tail and before is not None and follows != before:
                    self._not_following("a keyframe", start, follows, before)
                if tail:
                    self.chain = self._follows = want
            except (Damaged, IndexError, ValueError, TypeError, UnicodeDecodeError) as exc:
                self.fail(
                    f"byte {self._at + start}: an undecodable step record ({exc}); read on from the next keyframe"
                )
                pos, self._seeking = start + 1, True
                continue
            self.since_key += 1
            pos = end + tail
        self._buf = buf[pos:]
        self._at += pos
        return out

    def finish(self) -> list[tuple[int, Any]]:
        out: list[tuple[int, Any]] = []
        while self._buf and not self._seeking:
            self.fail(f"byte {self._at}: truncated last step record")
            self.truncated = True
            rest, self._buf, self._seeking = self._buf[1:], b"", True
            self._at += 1
            found = self.feed(rest)
            if found:
                self.truncated = False
                out += found
        self._at += len(self._buf)
        self._buf = b""
        return out

    def _not_following(self, what: str, start: int, follows: int, before: int) -> None:
        """Damage: ``what`` at ``start`` (a keyframe, the seal) names another check than the records
        before it end with."""
        self.fail(
            f"byte {self._at + start}: {what} does not follow the records before it (it follows check "
            f"{follows:08x}, they end with {before:08x}): records lost or repeated"
        )

    def fail(self, why: str) -> None:
        self.damaged += 1
        self._follows = None
        if len(self.problems) < 5:
            self.problems.append(why)

    def _record(self, buf: bytes) -> tuple[int, Any]:
        n, prev, delta, moving, table = self.n, self.prev, self.delta, self.moving, self.table
        self._depth = 0
        mask, pos = _read_varint(buf, 0)
        if mask >> n:
            raise Damaged("a field beyond the header's")
        if self.fresh:
            if mask != (1 << n) - 1:
                raise Damaged("a field missing from the first record")
            self.fresh = False
        for i in moving:  # ints that change as they changed last time: no bit, no byte
            if not mask >> i & 1:
                prev[i] += delta[i]
        while mask:
            low = mask & -mask
            mask ^= low
            i = low.bit_length() - 1
            old = prev[i]
            if buf[pos] == 0x03 and type(old) is int:  # an int's change, less the predicted change
                z, pos = _read_varint(buf, pos + 1)
                change = delta[i] + (z >> 1 if not z & 1 else -(z >> 1) - 1)
                prev[i] = old + change
            else:
                prev[i], pos = table[buf[pos]](buf, pos + 1, old)
                change = 0
            delta[i] = change
            if change:
                moving.add(i)
            else:
                moving.discard(i)
        if pos != len(buf):
            raise Damaged("a record of the wrong length")
        lines = prev[0]
        if type(lines) is not int:
            raise Damaged("no line count")
        return lines, self.build(prev[1:])

    def _table(self) -> list[Callable[[bytes, int, Any], tuple[Any, int]]]:
        """The decoder of each tag byte: ``(buf, pos after the tag, previous value) -> (value, pos)``.
        Reading past a record is caught by the record's length check."""

        def bad(buf: bytes, pos: int, old: Any) -> tuple[Any, int]:
            raise Damaged(f"tag {buf[pos - 1]:#x}")

        def const(value: Any) -> Callable[[bytes, int, Any], tuple[Any, int]]:
            return lambda buf, pos, old: (value, pos)

        def whole(buf: bytes, pos: int, old: Any) -> tuple[Any, int]:
            z, pos = _read_varint(buf, pos)
            return (z >> 1 if not z & 1 else -(z >> 1) - 1), pos

        def micros(buf: bytes, pos: int, old: Any) -> tuple[Any, int]:
            z, pos = _read_varint(buf, pos)
            base = (_micros(old) or 0) if type(old) is float else 0
            return (base + (z >> 1 if not z & 1 else -(z >> 1) - 1)) / 1e6, pos

        def xor(tz: int, nb: int) -> Callable[[bytes, int, Any], tuple[Any, int]]:
            shift, end = 8 * tz, nb

            def read(buf: bytes, pos: int, old: Any) -> tuple[Any, int]:
                x = int.from_bytes(buf[pos : pos + end], "little") << shift
                if type(old) is float:
                    x ^= _Q.unpack(_D.pack(old))[0]
                return _D.unpack(_Q.pack(x))[0], pos + end

            return read

        def hexed(size: int) -> Callable[[bytes, int, Any], tuple[Any, int]]:
            return lambda buf, pos, old: (buf[pos : pos + size].hex(), pos + size)

        def text(buf: bytes, pos: int, old: Any) -> tuple[Any, int]:
            size, pos = _read_varint(buf, pos)
            if size > len(buf) - pos:
                raise Damaged(f"a string longer than the {max(len(buf) - pos, 0)} bytes left of its record")
            s = buf[pos : pos + size].decode()
            self.strings.append(s)
            return s, pos + size

        def known(buf: bytes, pos: int, old: Any) -> tuple[Any, int]:
            index, pos = _read_varint(buf, pos)
            if index >= len(self.strings):
                raise Damaged("a string index beyond the table")
            return self.strings[index], pos

        def items(buf: bytes, pos: int, old: Any) -> tuple[Any, int]:
            count, pos = _read_varint(buf, pos)
            out = []
            for _ in range(count):
                item, pos = table[buf[pos]](buf, pos + 1, None)
                out.append(item)
            return out, pos

        def pairs(buf: bytes, pos: int, old: Any) -> tuple[Any, int]:
            count, pos = _read_varint(buf, pos)
            out = {}
            for _ in range(count):
                k, pos = table[buf[pos]](buf, pos + 1, None)
                if type(k) is not str:
                    raise Damaged("a dict key that is no string")
                out[k], pos = table[buf[pos]](buf, pos + 1, None)
            return out, pos

        def changed(keyed: bool) -> Callable[[bytes, int, Any], tuple[Any, int]]:
            def read(buf: bytes, pos: int, old: Any) -> tuple[Any, int]:
                if type(old) is not (dict if keyed else list):
                    raise Damaged("a change to a value that is not there")
                n = len(old)
                mask, pos = _read_varint(buf, pos, n + 70)  # a bit an item: a model's parameters, over 70
                if mask >> n:
                    raise Damaged("an item beyond the previous value's")
                if not mask:
                    return old, pos  # the same value: shared, not copied (a byte may not make n items)
                self._items += n
                if self._items > self._budget:
                    raise Damaged(f"changed lists of over {BUDGET_PER_BYTE} items a byte of the log")
                out = list(old.values() if isinstance(old, dict) else old)
                if n >= 16 and mask == (1 << n) - 1 and 0x80 <= (tag := buf[pos]) < 0xC0:
                    # every item of a long list changed (a model's parameter fingerprints): when all
                    # are fingerprints of one size, one hex() of their bytes cut in n, tags and all
                    # (a third faster at 20 items, half the time at 148; no faster at 6)
                    stride = (tag & 0x3F) + 1
                    end = pos + n * stride
                    if buf[pos:end:stride] == bytes((tag,)) * n and end <= len(buf):
                        text, w = buf[pos:end].hex(), 2 * stride
                        out = [text[k + 2 : k + w] for k in range(0, n * w, w)]
                        return (dict(zip(old, out)) if keyed else out), end
                while mask:
                    low = mask & -mask
                    mask ^= low
                    j = low.bit_length() - 1
                    out[j], pos = table[buf[pos]](buf, pos + 1, out[j])
                return (dict(zip(old, out)) if keyed else out), pos

            return read

        table: list[Callable[[bytes, int, Any], tuple[Any, int]]] = [bad] * 256
        table[0x00], table[0x01], table[0x02] = const(None), const(False), const(True)
        table[0x03], table[0x04] = whole, micros
        for tag in range(0x40, 0x80):
            tz, nb = tag >> 3 & 7, (tag & 7) + 1
            if tz + nb <= 8:
                table[tag] = xor(tz, nb)
        for tag in range(0x80, 0xC0):
            table[tag] = hexed(tag & 0x3F)

        def nested(read: Callable[[bytes, int, Any], tuple[Any, int]]) -> Callable[[bytes, int, Any], tuple[Any, int]]:
            def inner(buf: bytes, pos: int, old: Any) -> tuple[Any, int]:
                if self._depth >= MAX_DEPTH:
                    raise Damaged(f"values nested over {MAX_DEPTH} deep")
                self._depth += 1
                value = read(buf, pos, old)
                self._depth -= 1
                return value

            return inner

        table[0xC0], table[0xC1] = text, known
        table[0xC2], table[0xC3], table[0xC4], table[0xC5] = map(nested, (items, pairs, changed(False), changed(True)))
        return table


def _read_varint(buf: bytes, pos: int, limit: int = 70) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; ``Damaged`` for one of over ``limit // 7 + 1``
    bytes (a list's mask has a bit an item: a model's parameter fingerprints, over 70)."""
    n = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7
        if shift > limit:
            raise Damaged(f"a varint of over {limit // 7 + 1} bytes")
