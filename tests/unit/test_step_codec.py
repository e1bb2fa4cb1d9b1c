"""The steps.bin codec in C (eventlog/_stepcodec.c) against its Python reference (eventlog/stepstream.py):
the same bytes from the same values, the same events and the same damage accounting from any bytes
(written records, mutated, cut and random ones, fed in any pieces); a stale build is not used
(captured runs: tests/e2e/test_step_codec_runs.py). Skipped where the extension was not built (no
compiler: the Python codec is then the one used)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from step_codecs import C, exact, implementation, needs_c

from torchrepro.eventlog import stepstream
from torchrepro.eventlog.stepstream import KEYFRAME, KEYFRAME_EVERY, MAX_DEPTH, Decoder, Encoder


ROOT = Path(__file__).resolve().parents[2]


FIELDS = ["index", "a", "b", "c"]


def encode(records: list[list[Any]], c: bool, checked: bool = True) -> tuple[bytes, list[str]]:
    """The stream of ``records`` (FIELDS' values after ``_lines``) and, for each record, "ok" or the
    TypeError it raised (a value the stream cannot hold: the record is not in the stream);
    ``checked``: records with their check (False: as torchrepro.steps/1 wrote them)."""
    with implementation(c):
        encoder = Encoder(FIELDS, checked)
    out, outcome = [encoder.header()], []
    for record in records:
        try:
            out.append(encoder.encode(record))
            outcome.append("ok")
        except TypeError as exc:
            outcome.append(f"TypeError: {exc}")
    return b"".join(out), outcome


def decode(blob: bytes, c: bool, pieces: list[int], positional: bool = False) -> tuple[Any, ...]:
    """Everything a decoder tells of ``blob`` fed in ``pieces`` (sizes, cycled): the events (as
    exact values), ``damaged``, ``problems``, ``truncated``."""
    with implementation(c):
        if positional:
            decoder = Decoder(dict, FIELDS, list)
        else:
            decoder = Decoder(lambda fields: sorted(fields.items()))
    got: list[Any] = []
    at, k = 0, 0
    while at < len(blob):
        size = max(1, pieces[k % len(pieces)]) if pieces else len(blob)
        got += decoder.feed(blob[at : at + size])
        at, k = at + size, k + 1
    got += decoder.finish()
    return exact(got), decoder.damaged, decoder.problems, decoder.truncated, decoder.positional


class Odd(str):
    """A str subclass: no JSON type of the stream's (the writer writes such a step as a line)."""


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.integers(),  # big ones too: over ~2**76 the stream writes what no reader reads (damage in both)
    st.floats(),  # NaN, inf, -0.0, subnormals
    st.integers(-(10**15), 10**15).map(lambda m: m / 1e6),  # whole microseconds
    st.binary(min_size=0, max_size=70).map(bytes.hex),  # fingerprints (and "" and ones too long to be one)
    st.text(max_size=6),
    st.sampled_from(["ABCDEF", "ab cd", "0f", "é", "\ud800x"]),  # capitals, a space, a lone surrogate
)


values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=12,
)


unencodable = st.sampled_from([object(), (1, 2), Odd("x"), {1: 2}, [1, {"k": b"raw"}], 1 + 2j])


@st.composite
def records(draw: st.DrawFn) -> list[list[Any]]:
    """Step-like records: ``_lines`` and ``index`` mostly growing, the other fields drawn from a
    small pool each (so values repeat, change a little, change type and length), now and then a
    value the stream cannot hold."""
    pools = [draw(st.lists(values, min_size=1, max_size=4)) for _ in FIELDS[1:]]
    out, lines, index = [], 0, 0
    for _ in range(draw(st.integers(1, 40))):
        lines += draw(st.sampled_from([0, 0, 1, 3, -2]))
        index += draw(st.sampled_from([1, 1, 1, 0, 7, -(2**65)]))
        record = [lines, index, *(draw(st.sampled_from(pool)) for pool in pools)]
        if draw(st.integers(0, 30)) == 0:
            record[draw(st.integers(1, len(FIELDS)))] = draw(unencodable)
        out.append(record)
    return out


def agree(blob: bytes, pieces: list[int]) -> None:
    for positional in (False, True):
        c, py = decode(blob, True, pieces, positional), decode(blob, False, pieces, positional)
        assert c == py


# TORCHREPRO_CODEC_EXAMPLES=N: N examples a test (a longer fuzz than the suite's)
slow_ok = settings(
    max_examples=int(os.environ.get("TORCHREPRO_CODEC_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@needs_c
@slow_ok
@given(records(), st.lists(st.integers(1, 64), max_size=4))
@pytest.mark.parametrize("checked", [True, False], ids=["checked", "unchecked"])
def test_both_encoders_write_the_same_bytes_and_both_decoders_read_them_back(checked, recs, pieces):
    blob, outcome = encode(recs, True, checked)
    assert (blob, outcome) == encode(recs, False, checked)
    written = [r for r, o in zip(recs, outcome) if o == "ok"]
    events, damaged, problems, truncated, _ = decode(blob, True, pieces)
    assert (events, damaged, problems, truncated) == decode(blob, False, pieces)[:4]
    if not damaged:  # (an int over ~2**76 is written, and read as damage by both)
        assert events == exact([(r[0], sorted(zip(FIELDS, r[1:]))) for r in written])
    assert decode(blob, True, pieces, positional=True) == decode(blob, False, pieces, positional=True)


@needs_c
@slow_ok
@given(
    records(),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
    st.sampled_from(["flip", "cut", "insert", "delete"]),
    st.lists(st.integers(1, 40), max_size=3),
)
@pytest.mark.parametrize("checked", [True, False], ids=["checked", "unchecked"])
def test_damaged_streams_read_the_same_with_either_decoder(checked, recs, edits, how, pieces):
    blob = bytearray(encode(recs, False, checked)[0])
    start = blob.index(b"\n") + 1  # the records (a damaged header is the Python header reader's, shared)
    for where, byte in edits:
        at = start + where % max(1, len(blob) - start)
        if how == "flip" and at < len(blob):
            blob[at] = byte
        elif how == "cut":
            del blob[at:]
        elif how == "insert":
            blob[at:at] = bytes([byte]) * (1 + where % 13)
        elif how == "delete":
            del blob[at : at + 1 + where % 5]
    agree(bytes(blob), pieces)


@needs_c
@slow_ok
@given(st.binary(max_size=400), st.booleans(), st.lists(st.integers(1, 40), max_size=3))
def test_random_bytes_read_the_same_with_either_decoder(junk, keyframed, pieces):
    for checked in (True, False):
        agree(Encoder(FIELDS, checked).header() + (KEYFRAME if keyframed else b"") + junk, pieces)
    agree(junk, pieces)  # no header at all


def test_hostile_records_are_damage_not_a_crash():
    """Lengths and varints of every size, masks beyond the fields, a mark cut, a string index past
    the table, invalid UTF-8, values nested without end: each counted as damage, alike in both (the
    Python decoder alone where the C one was not built: it once raised out of ``feed`` on an
    over-long length and on values nested past the recursion limit)."""
    built = [True, False] if C is not None else [False]
    header = Encoder(FIELDS, checked=False).header()  # (records without their check: what is past it)

    def keyframe(body: bytes) -> bytes:
        """A keyframe record of ``body`` (every field's bit set, ``_lines`` and ``index`` 0 first)."""
        body = b"\x1f\x03\x00\x03\x00" + body
        size = bytes([len(body)]) if len(body) < 0x80 else bytes([len(body) & 0x7F | 0x80, len(body) >> 7])
        return KEYFRAME + size + body

    cases = [
        KEYFRAME + b"\xff" * 20,  # a length varint of over 11 bytes
        KEYFRAME + b"\xff\xff\xff\x7f" + b"\x01" * 100,  # a length of over 16 MiB
        KEYFRAME + b"\x05\xff\xff\xff\xff\xff",  # a mask varint that never ends inside its record
        KEYFRAME + b"\x03\x7f\x03\x00",  # bits beyond the fields
        keyframe(b"\xc1\x05\x00\x00"),  # a string index beyond the table
        keyframe(b"\xc0\x02\xff\xfe\x00\x00"),  # not UTF-8
        keyframe(b"\xc0\xff\xff\xff\xff\x0f\x00"),  # a string longer than the record
        keyframe(b"\xc2\xff\xff\xff\xff\x7f"),  # a list count of 2**35 (read item by item, none there)
        keyframe(b"\xc4\x00\x00\x00"),  # a change to a value that is not there
        keyframe(b"\x7f\x00\x00\x00"),  # a float tag of no float
        keyframe(b"\xc3\x01\x03\x00\x00\x00\x00"),  # a dict key that is no string
        keyframe(b"\xc2\x01" * 5000 + b"\x00\x00\x00"),  # lists nested 5000 deep
        keyframe(b"\x00\x00\x00\x00"),  # a record of the wrong length
        keyframe(b"\x00\x00\x90\x01\x01"),  # a fingerprint cut by the record's end
        KEYFRAME[:3],  # a mark cut
        b"\x00\x01\x02",  # a zero byte that is no mark
    ]
    for case in cases:
        blob = header + case + KEYFRAME + b"\x08\x1f\x03\x02\x03\x00\x00\x00\x00" + b"\x01\x00"
        for pieces in ([], [1], [3, 5]):
            got = decode(blob, built[0], pieces)
            assert got == decode(blob, built[-1], pieces), case
            events, damaged = got[0], got[1]
            assert damaged >= 1 and events[-2:] == [[1, [["a", None], ["b", None], ["c", None], ["index", 0]]]] * 2
    nested = [[[1]]]
    for _ in range(MAX_DEPTH):
        nested = [nested]
    for c in built:
        with implementation(c), pytest.raises(TypeError, match="nested over"):
            Encoder(FIELDS).encode([0, 1, nested, None, None])


@needs_c
def test_every_value_reads_back_across_keyframes_in_either_order():
    """A stream written by one implementation reads back with the other, over several keyframes
    (the same values as tests/unit/test_step_stream.py's, C writing, Python reading and the reverse)."""
    from test_step_stream import odd_values

    import random

    rng = random.Random(36)
    recs = [[i // 3, i, *odd_values(rng, i)[:3]] for i in range(3 * KEYFRAME_EVERY)]
    blob, outcome = encode(recs, True)
    assert blob == encode(recs, False)[0] and set(outcome) == {"ok"} and blob.count(KEYFRAME) >= 3
    for c in (True, False):
        got = decode(blob, c, [4096])
        assert got[0] == exact([(r[0], sorted(zip(FIELDS, r[1:]))) for r in recs]) and not got[1]


@needs_c
def test_the_extension_is_used_only_when_its_version_matches(monkeypatch):
    """A build of an older _stepcodec.c (another VERSION) is not used; the variable forces Python's."""
    assert stepstream._load_codec() == (C, "C")
    assert (C.KEYFRAME, C.KEYFRAME_EVERY, C.MAX_RECORD, C.MAX_DEPTH) == (
        KEYFRAME,
        KEYFRAME_EVERY,
        stepstream._MAX_RECORD,
        MAX_DEPTH,
    )
    monkeypatch.setattr(C, "VERSION", stepstream.CODEC_VERSION + 1)
    module, why = stepstream._load_codec()
    assert module is None and f"version {stepstream.CODEC_VERSION + 1}, not" in why
    monkeypatch.undo()
    monkeypatch.setenv("TORCHREPRO_PURE_PYTHON_CODEC", "1")
    module, why = stepstream._load_codec()
    assert module is None and "TORCHREPRO_PURE_PYTHON_CODEC" in why


def test_the_extension_built_is_of_its_source_and_of_what_python_expects():
    """``_stepcodec.c``'s VERSION is :data:`stepstream.CODEC_VERSION`, and a build here is of it: a
    build from an older source fails here (rebuild: ``pip install -e .``, as ``make``'s STAMP does)
    where it would otherwise only be skipped, silently, for the Python codec."""
    source = (ROOT / "src/torchrepro/eventlog/_stepcodec.c").read_text()
    (version,) = re.findall(r"^#define VERSION (\d+)$", source, re.M)
    assert int(version) == stepstream.CODEC_VERSION
    try:
        from torchrepro.eventlog import _stepcodec
    except ImportError:
        pytest.skip("the C step codec was not built here (pip install -e .)")
    assert _stepcodec.VERSION == int(version)
