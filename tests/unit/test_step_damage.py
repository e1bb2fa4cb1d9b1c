"""Damage in ``steps.bin`` never reads as a good run: each record's check (torchrepro.steps/2), a
record where a keyframe must be, a header naming fields no step has, an amplifying record, a string
longer than the file, a tail of zero bytes; each found alike by the C reader and the Python one, with
the same problem text naming the byte it is at (the fuzz of mutated streams:
tests/e2e/test_step_damage_fuzz.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from torchrepro.eventlog import stepstream
from torchrepro.eventlog.event_codec import step_values
from torchrepro.eventlog.event_reader import read_events
from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import STEP_FIELDS, Header, Step
from torchrepro.eventlog.stepstream import KEYFRAME, KEYFRAME_EVERY, STEPS_FILE, Decoder, Encoder
from synthetic_runs import training_steps


C = stepstream._C


@pytest.fixture(params=["c", "python"])
def codec(request, monkeypatch):
    """The test runs with the C codec (eventlog/_stepcodec.c) and with the Python one."""
    if request.param == "c" and C is None:
        pytest.skip("the C step codec was not built here (pip install -e .)")
    if request.param == "python":
        monkeypatch.setattr(stepstream, "_C", None)
    return request.param


def both(blob: bytes) -> list[tuple[object, ...]]:
    """What each reader there is makes of ``blob`` (events as repr, damaged, problems, truncated)."""
    out = []
    for codec in [C, None] if C is not None else [None]:
        saved, stepstream._C = stepstream._C, codec
        try:
            decoder = Decoder(lambda fields: sorted(fields.items()))
        finally:
            stepstream._C = saved
        events = decoder.feed(blob) + decoder.finish()
        out.append((repr(events), decoder.damaged, decoder.problems, decoder.truncated))
    assert all(o == out[0] for o in out), out
    return out


def run_of(tmp_path: Path, steps: list[Step], checked: bool = True) -> Path:
    """A rank's log of ``steps`` (their records in steps.bin, with checks or as torchrepro.steps/1)."""
    path = tmp_path / "rank-0" / "events.jsonl"
    write_all(path, [Header()])
    encoder = Encoder(STEP_FIELDS, checked)
    path.with_name(STEPS_FILE).write_bytes(
        encoder.header() + b"".join(encoder.encode([1, *step_values(s)]) for s in steps)
    )
    return path


def assert_no_wrong_step(path: Path, steps: list[Step]) -> list[str]:
    """Every step read is one written, unchanged; the damage is counted; its problems."""
    log = read_events(path)
    written = {s.index: s.to_json() for s in steps}
    read = log.of(Step)
    assert all(s.to_json() == written.get(s.index) for s in read), "a damaged record read as a step"
    assert log.bad_lines >= 1 and len(read) < len(steps)
    return log.problems


def test_one_bit_flipped_in_a_parameter_fingerprint_is_damage(tmp_path, codec):
    steps = training_steps(40, check=True)
    path = run_of(tmp_path, steps)
    stream = bytearray(path.with_name(STEPS_FILE).read_bytes())
    at = stream.index(bytes.fromhex(steps[4].param_fps[3])) + 2
    stream[at] ^= 0x10
    path.with_name(STEPS_FILE).write_bytes(stream)
    problems = assert_no_wrong_step(path, steps)
    assert [s.index for s in read_events(path).of(Step)] == list(range(4))  # on from the next keyframe: none
    (problem,) = [p for p in problems if "check" in p]
    assert f"{path.with_name(STEPS_FILE)}: byte " in problem and "where its bytes give" in problem


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "unchecked"])
def test_a_record_where_a_keyframe_must_be_is_damage(tmp_path, codec, checked):
    """Four bytes deleted at the second keyframe mark: the record there follows 256 others."""
    steps = training_steps(600)
    path = run_of(tmp_path, steps, checked)
    stream = path.with_name(STEPS_FILE).read_bytes()
    second = stream.index(KEYFRAME, stream.index(KEYFRAME) + 1)
    path.with_name(STEPS_FILE).write_bytes(stream[:second] + stream[second + 4 :])
    problems = assert_no_wrong_step(path, steps)
    indices = [s.index for s in read_events(path).of(Step)]
    assert indices == [*range(KEYFRAME_EVERY), *range(2 * KEYFRAME_EVERY, 600)]
    assert any(f"byte {second}: an undecodable step record" in p for p in problems), problems
    if not checked:
        assert any("a keyframe mark must be" in p for p in problems), problems


@pytest.mark.parametrize("how", ["deleted", "repeated"])
def test_a_whole_keyframe_block_deleted_or_repeated_is_damage(tmp_path, codec, how):
    """Each record's check holds inside the block; its keyframe names the check of the records
    before it, which then are not the ones read."""
    steps = training_steps(600)
    path = run_of(tmp_path, steps)
    stream = path.with_name(STEPS_FILE).read_bytes()
    second = stream.index(KEYFRAME, stream.index(KEYFRAME) + 1)
    third = stream.index(KEYFRAME, second + 1)
    if how == "deleted":
        changed = stream[:second] + stream[third:]
    else:
        changed = stream[:third] + stream[second:third] + stream[third:]
    path.with_name(STEPS_FILE).write_bytes(changed)
    log = read_events(path)
    assert log.bad_lines == 1, log.problems
    (problem,) = log.problems
    assert f"byte {second if how == 'deleted' else third}: a keyframe does not follow the records before it" in problem


def test_every_bit_flipped_at_the_end_of_a_closed_log_is_damage(tmp_path, codec):
    """The writer's close seals the log with the CRC-32 its records end with: the last records are
    checked by 32 bits, not by their own byte alone; the last record deleted is damage too."""
    steps = training_steps(40)
    path = tmp_path / "rank-0" / "events.jsonl"
    write_all(path, [Header(), *steps])
    stream = path.with_name(STEPS_FILE).read_bytes()
    seal = stream.rindex(KEYFRAME)
    assert len(stream) - seal == 9 and seal > stream.index(KEYFRAME)  # mark, 4 bytes, a zero length
    for at in range(seal - 16, seal):
        for bit in range(8):
            flipped = bytearray(stream)
            flipped[at] ^= 1 << bit
            path.with_name(STEPS_FILE).write_bytes(flipped)
            assert_no_wrong_step(path, steps)
    shorter = tmp_path / "shorter" / "rank-0" / "events.jsonl"
    write_all(shorter, [Header(), *steps[:-1]])
    records = shorter.with_name(STEPS_FILE).read_bytes()
    assert stream.startswith(records[: records.rindex(KEYFRAME)])
    path.with_name(STEPS_FILE).write_bytes(records[: records.rindex(KEYFRAME)] + stream[seal:])  # the last one gone
    log = read_events(path)
    assert log.bad_lines == 1 and len(log.of(Step)) == 39
    assert any("the end of the log does not follow the records before it" in p for p in log.problems), log.problems


def test_a_header_whose_names_fail_their_check_reads_nothing(tmp_path, codec):
    steps = training_steps(20)
    path = run_of(tmp_path, steps)
    stream = path.with_name(STEPS_FILE).read_bytes()
    swapped = stream.replace(b'"loss"', b'"LOSS"', 1).replace(b'"time_s"', b'"loss"', 1).replace(b'"LOSS"', b'"time_s"')
    path.with_name(STEPS_FILE).write_bytes(swapped)
    log = read_events(path)
    assert log.of(Step) == [] and log.bad_lines == 1
    assert any("byte 0: a header whose field names fail their check" in p for p in log.problems), log.problems


def test_a_log_of_records_without_checks_reads_and_says_so(tmp_path, codec):
    steps = training_steps(300)
    log = read_events(run_of(tmp_path, steps, checked=False))
    assert [s.to_json() for s in log.of(Step)] == [s.to_json() for s in steps] and log.bad_lines == 0
    assert any(stepstream.UNCHECKED in p and "steps.bin" in p for p in log.problems), log.problems
    log = read_events(run_of(tmp_path, steps))
    assert log.problems == [] and len(log.of(Step)) == 300


def framed(records: list[bytes], checked: bool = True) -> bytes:
    """Records of the given bodies (a keyframe every :data:`KEYFRAME_EVERY`) after a header of fields
    ``_lines``, ``x``."""
    out, chain = [Encoder(["x"], checked).header()], 0
    for k, body in enumerate(records):
        size = bytearray()
        stepstream._varint(len(body), size)
        key = k % KEYFRAME_EVERY == 0
        mark = KEYFRAME + (chain.to_bytes(4, "little") if checked else b"") if key else b""
        record = mark + bytes(size) + body
        if checked:
            chain = stepstream._check(record, 0 if key else chain)
            record += bytes((chain & 0xFF,))
        out.append(record)
    return b"".join(out)


def keyframe_list(n: int) -> bytes:
    """A keyframe body: ``_lines`` 0 and a list of ``n`` Nones."""
    count = bytearray()
    stepstream._varint(n, count)
    return b"\x03\x03\x00\xc2" + bytes(count) + b"\x00" * n


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "unchecked"])
def test_records_that_change_nothing_of_a_long_list_share_it(checked):
    """A keyframe list of N items, then R records "the list changed, no item changed": the list is
    shared, not R new lists (memory N x R from N + 5R bytes); R records each changing an item make
    new lists until the decoded items pass 16 a byte of the file, then are damage."""
    import tracemalloc

    n, r = 5_000, 1_000
    key = keyframe_list(n)
    unchanged = framed([b"\x02\xc4\x00" if k % KEYFRAME_EVERY else key for k in range(r)], checked)
    one_changed = framed([b"\x02\xc4\x01\x01" if k % KEYFRAME_EVERY else key for k in range(r)], checked)
    for blob, damaged in ((unchanged, False), (one_changed, True)):
        for codec in [C, None] if C is not None else [None]:
            saved, stepstream._C = stepstream._C, codec
            try:
                decoder = Decoder(dict)
                tracemalloc.start()
                events = decoder.feed(blob) + decoder.finish()
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            finally:
                stepstream._C = saved
            assert peak < 200 * len(blob) + (16 << 20), (peak, len(blob))
            assert bool(decoder.damaged) == damaged, decoder.problems
            if damaged:
                assert "changed lists of over 16 items a byte of the log" in decoder.problems[0]
                assert len(events) < r
            else:
                assert len(events) == r and all(
                    e["x"] is events[k - k % KEYFRAME_EVERY][1]["x"] for k, (_, e) in enumerate(events)
                )
        both(blob)


def test_a_string_longer_than_the_file_reads_the_same_in_both():
    size = bytearray()
    stepstream._varint(2**69, size)
    for checked in (True, False):
        (_, damaged, problems, _), *_ = both(framed([b"\x03\x03\x00\xc0" + bytes(size) + b"ab"], checked))
        assert damaged == 1 and "a string longer than the 2 bytes left of its record" in problems[0], problems


@pytest.mark.skipif(C is None, reason="the C step codec was not built here (pip install -e .)")
def test_a_tail_of_zero_bytes_reads_as_fast_in_c_as_in_python(tmp_path):
    """A crash that leaves zeros at the end (some file systems): one damage, and the C reader passes
    them at least as fast as the Python one (it once took 2.5 times as long)."""
    steps = training_steps(300)
    path = run_of(tmp_path, steps)
    stream = path.with_name(STEPS_FILE)
    with open(stream, "ab") as fp:
        fp.write(bytes(32 << 20))
    took = {}
    for name, codec in (("c", C), ("python", None)):
        saved, stepstream._C = stepstream._C, codec
        try:
            best = float("inf")
            for _ in range(3):
                t0 = time.process_time()
                log = read_events(path)
                best = min(best, time.process_time() - t0)
        finally:
            stepstream._C = saved
        assert len(log.of(Step)) == 300 and log.bad_lines == 1, log.problems
        took[name] = best
    assert took["c"] <= took["python"] * 1.5 + 0.02, took


def test_damage_reaches_the_loaded_run_as_one_problem_naming_file_and_byte(tmp_path, codec):
    """What a report reads: ``Run.logs[r].bad_lines`` counts the damage, ``Run.problems`` (and the
    log's) says where it is and what was expected there."""
    from torchrepro.eventlog.rundir import load_run

    steps = training_steps(100)
    path = run_of(tmp_path, steps)
    stream = bytearray(path.with_name(STEPS_FILE).read_bytes())
    at = len(stream) // 2
    stream[at] ^= 0x01
    path.with_name(STEPS_FILE).write_bytes(stream)
    run = load_run(tmp_path)
    (log,) = run.logs
    assert log.bad_lines == 1 and len(log.of(Step)) < 100
    found = [p for p in run.problems if "steps.bin: byte " in p]
    assert len(found) == 1 and found[0].startswith(str(path.with_name(STEPS_FILE))), run.problems
    assert "an undecodable step record (" in found[0] and "read on from the next keyframe" in found[0]
