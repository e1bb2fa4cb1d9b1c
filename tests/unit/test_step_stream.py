"""The compact step stream (``steps.bin``, eventlog/stepstream.py): every value reads back as
written, a diff gives the same report on runs written in it as on runs whose steps are JSON lines
(torchrepro.events/1), a damaged stream is read up to the damage (and on from the next keyframe),
the live view follows it record by record, and a doctor-like step costs at most 64 bytes; each with
the C codec and with the Python one."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import struct
from pathlib import Path
from typing import Any

import pytest

from torchrepro.commands.check.comparison import diff
from torchrepro.eventlog.event_reader import read_events
from torchrepro.eventlog.event_writer import EventWriter, write_all
from torchrepro.eventlog.events import STEP_FIELDS, Capability, Compile, End, Header, Params, Step
from torchrepro.eventlog import stepstream
from torchrepro.eventlog.stepstream import KEYFRAME, KEYFRAME_EVERY, STEPS_FILE, Decoder, Encoder
from torchrepro.eventlog.tail import RunFollower
from synthetic_runs import training_steps


@pytest.fixture(autouse=True, params=["c", "python"])
def codec(request, monkeypatch):
    """Every test here runs with the C codec (eventlog/_stepcodec.c) and with the Python one."""
    if request.param == "c" and stepstream._C is None:
        pytest.skip("the C step codec was not built here (pip install -e .)")
    if request.param == "python":
        monkeypatch.setattr(stepstream, "_C", None)
    return request.param


def exact(value: object) -> object:
    """``value`` with every float as its bits (NaN, -0.0 and inf compared exactly)."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value).hex())
    if isinstance(value, list):
        return [exact(v) for v in value]
    if isinstance(value, dict):
        return {k: exact(v) for k, v in value.items()}
    return value


def odd_values(rng: random.Random, i: int) -> list:
    """Values of every JSON type, changing type, length and keys from record to record."""
    choices = [
        None,
        True,
        False,
        0,
        -(2**70),
        i,
        rng.random(),
        -0.0,
        0.0,
        float("nan"),
        float("inf"),
        round(rng.random(), 6),
        struct.unpack("<f", struct.pack("<f", rng.random()))[0],
        os.urandom(8).hex(),
        "ABCDEF",
        "ab cd",
        "é" * (i % 3),
        "",
        [os.urandom(8).hex() for _ in range(i % 4)],
        ["x", 1, None, [2.5]],
        {"python": "00ff", "numpy": os.urandom(4).hex()},
        {"numpy": "00ff", "python": "00ff"},
        {"a": {"b": [1, -0.0]}},
    ]
    return [rng.choice(choices) for _ in range(5)]


def decode_in_pieces(blob: bytes, piece: int) -> list[Any]:
    """Every record of ``blob`` fed to a decoder ``piece`` bytes at a time (as a growing file is
    read), checked undamaged."""
    decoder = Decoder(dict)
    got = []
    for i in range(0, len(blob), piece):
        got += decoder.feed(blob[i : i + piece])
    got += decoder.finish()
    assert not decoder.damaged, decoder.problems
    return got


def test_every_value_reads_back_exactly_through_any_piece_size():
    rng = random.Random(35)
    records = [[i // 3, *odd_values(rng, i)] for i in range(3 * KEYFRAME_EVERY)]
    encoder = Encoder(["a", "b", "c", "d", "e"])
    blob = encoder.header() + b"".join(encoder.encode(r) for r in records)
    assert blob.count(KEYFRAME) >= 3  # a keyframe every KEYFRAME_EVERY records, the first one included
    for piece in (1, 7, len(blob)):
        got = decode_in_pieces(blob, piece)
        assert [exact([at, *f.values()]) for at, f in got] == [exact(r) for r in records]


def test_lists_and_dicts_of_fingerprints_that_all_change_read_back_exactly():
    """Every item of a list or dict changed (a step's parameter or RNG fingerprints): a long list
    of fingerprints of one size is decoded in one piece, any other mix item by item."""
    rng = random.Random(7)

    def fps(sizes: list[int]) -> list[str]:
        return [os.urandom(n).hex() for n in sizes]

    records = []
    for i in range(3 * KEYFRAME_EVERY // 2):
        sizes = rng.choice([[8] * 20, [8] * 19 + [4], [2] * 16, [8] * 3, [8, 8, 4]])
        items: list[Any] = fps(sizes)
        if i % 5 == 0:
            items[-1] = rng.choice(["ABCD", 3, None, "00ff" * 70])  # no fingerprint, or one too long to be one
        keys = ["torch_cpu", "numpy", "python"][: len(items)] if len(items) <= 3 else None
        records.append([i, items, dict(zip(keys, items)) if keys else {"x": fps([8])[0]}])
    encoder = Encoder(["list", "dict"])
    blob = encoder.header() + b"".join(encoder.encode(r) for r in records)
    for piece in (5, len(blob)):
        got = decode_in_pieces(blob, piece)
        assert [[at, *f.values()] for at, f in got] == records
    cut = blob[: len(blob) - 3]  # the last record cut inside its fingerprints: damage, not wrong values
    decoder = Decoder(dict)
    got = decoder.feed(cut) + decoder.finish()
    assert decoder.truncated and [[at, *f.values()] for at, f in got] == records[: len(got)]
    assert len(got) == len(records) - 1


def test_a_model_of_over_70_parameter_tensors_fingerprinted_every_step_reads_back(tmp_path):
    """``check`` fingerprints every parameter every step: a GPT-2 has 148 parameter tensors, so a
    record's list of changed fingerprints carries a 148-bit mask (the reader once refused masks
    over 70 bits as damage and kept only the keyframes: 2 steps of 300)."""
    rng = random.Random(148)
    steps = [
        Step(index=i, step=i, loss=1.0 / (i + 1), param_fps=[rng.randbytes(8).hex() for _ in range(148)])
        for i in range(300)
    ]
    for i in range(0, 300, 7):  # and some steps where only some of them changed
        steps[i].param_fps = [*steps[i - 1].param_fps[:100], *steps[i].param_fps[100:]] if i else steps[i].param_fps
    path = tmp_path / "rank-0" / "events.jsonl"
    write_all(path, [Header(), *steps])
    log = read_events(path)
    assert not log.problems
    assert [s.param_fps for s in log.of(Step)] == [s.param_fps for s in steps]


def test_fields_are_matched_by_name_and_a_name_no_step_has_is_damage(tmp_path):
    """A stream from a writer whose steps lacked a field this one has (its default) reads; one that
    names a field no step has (a renamed or damaged header) is damage: nothing of it reads as
    default steps."""
    path = tmp_path / "rank-0" / "events.jsonl"
    write_all(path, [Header()])
    values = Step(index=4, step=4, loss=0.5).to_json()
    older = [n for n in STEP_FIELDS if n != "compiles"]
    encoder = Encoder(older)
    path.with_name(STEPS_FILE).write_bytes(encoder.header() + encoder.encode([1, *(values[n] for n in older)]))
    log = read_events(path)
    (step,) = log.of(Step)
    assert (step.index, step.loss, step.compiles) == (4, 0.5, 0) and not log.problems

    renamed = [n.upper() for n in STEP_FIELDS]
    encoder = Encoder(renamed)
    stream = encoder.header() + b"".join(encoder.encode([i, i, *[None] * (len(renamed) - 1)]) for i in range(3))
    path.with_name(STEPS_FILE).write_bytes(stream)
    log = read_events(path)
    assert log.of(Step) == [] and log.bad_lines == 1, log.problems
    (problem,) = log.problems
    assert (
        "steps.bin: byte 0: a header naming fields no step has ('T', 'RANK', 'STEP'" in problem
        and "expected names among" in problem
    )


def doctor_like_steps(n: int, seed: int = 0) -> list[Step]:
    """Steps as capture records them on a training loop, the parameters fingerprinted every 13th."""
    return training_steps(n, seed=seed)


def test_a_doctor_step_costs_at_most_64_bytes_on_disk(tmp_path):
    path = tmp_path / "rank-0" / "events.jsonl"
    steps = doctor_like_steps(1600)
    write_all(path, [Header(), *steps[:800]])
    at_800 = sum(f.stat().st_size for f in path.parent.iterdir())
    write_all(tmp_path / "lines" / "events.jsonl", steps, compact_steps=False)  # the same steps as lines
    path.unlink()
    path.with_name(STEPS_FILE).unlink()
    write_all(path, [Header(), *steps])
    at_1600 = sum(f.stat().st_size for f in path.parent.iterdir())
    per_step = (at_1600 - at_800) / 800
    lines = (tmp_path / "lines" / "events.jsonl").stat().st_size / 1600
    assert per_step <= 64 and lines > 5 * per_step, (per_step, lines)
    assert [s.to_json() for s in read_events(path).of(Step)] == [s.to_json() for s in steps]


def write_run(root: Path, steps: list[Step], compact: bool, end: bool = True) -> Path:
    """A one-rank run directory of ``steps`` (with a compile, a capability and the parameters' names
    between them), its steps compact or as lines."""
    events: list = [Header(world_size=1, argv=["train.py"]), Params(names=[f"p{i}" for i in range(6)])]
    for step in steps:
        if step.index == 2:
            events.append(Compile(step=2, compile_id="0/1", recompile_reasons=["size mismatch"]))
        if step.index == 5:
            events.append(Capability(step=5, name="batches", available=True))
        events.append(step)
    if end:
        events.append(End(step=len(steps)))
    write_all(root / "rank-0" / "events.jsonl", events, compact_steps=compact)
    (root / "run.json").write_text(json.dumps({"script": "train.py", "world_size": 1}))
    return root


def check_like_steps(n: int) -> list[Step]:
    """Steps as check records them: every fingerprint, every step (grads too)."""
    steps = doctor_like_steps(n, seed=7)
    for s in steps:
        s.params_fp, s.param_fps = "%016x" % (s.index * 7919), ["%016x" % (s.index * 31 + j) for j in range(6)]
        s.grads_fp, s.grad_norm = "%016x" % (s.index * 104729), 1.0 / (s.index + 1)
    return steps


TWINS = ("same", "loss_last_bit", "params", "batch", "rng", "grads", "short")


def twins(steps: list[Step]) -> dict[str, tuple[list[Step], list[Step], bool]]:
    """Run B beside run A for each way two runs can differ, as (A's steps, B's steps, B ends)."""

    def changed(at: int, **fields: Any) -> list[Step]:
        return [dataclasses.replace(s, **fields) if s.index >= at else s for s in steps]

    made = {
        "same": (steps, steps, True),
        "loss_last_bit": (steps, changed(9, loss=steps[9].loss + 1e-7), True),
        "params": (steps, changed(6, params_fp="ffff000000000000", param_fps=["ffff000000000000"] * 6), True),
        "batch": (steps, changed(4, batch_fp="0000000000000bad"), True),
        "rng": (steps, changed(3, rng_fp="00000000000000aa", rng_fps={"torch_cpu": "00000000000000aa"}), True),
        "grads": (steps, changed(8, grads_fp="1111111111111111"), True),
        "short": (steps, steps[:12], False),
    }
    assert tuple(made) == TWINS
    return made


@pytest.mark.parametrize("name", TWINS)
def test_diff_gives_the_same_report_on_compact_and_line_logs(tmp_path, name):
    a, b, ends = twins(check_like_steps(20))[name]
    reports = {}
    for compact in (False, True):
        root = tmp_path / ("compact" if compact else "lines")
        run_a, run_b = write_run(root / "a", a, compact), write_run(root / "b", b, compact, end=ends)
        assert (run_a / "rank-0" / STEPS_FILE).exists() == compact
        text = json.dumps(diff(run_a, run_b).to_json(), sort_keys=True, default=str)
        reports[compact] = json.loads(text.replace(str(root), "ROOT"))
    assert reports[True] == reports[False]
    verdict = reports[True]["determinism"]["verdict"]
    if name in ("same", "params", "loss_last_bit", "short"):  # (a digest of RNG state alone decides nothing)
        assert (verdict == "bit_exact") == (name == "same"), verdict


def test_a_cut_or_garbled_stream_is_read_up_to_the_damage(tmp_path):
    steps = doctor_like_steps(3 * KEYFRAME_EVERY)
    good = write_run(tmp_path / "good", steps, compact=True)
    stream = (good / "rank-0" / STEPS_FILE).read_bytes()

    cut = write_run(tmp_path / "cut", steps, compact=True)
    (cut / "rank-0" / STEPS_FILE).write_bytes(stream[:-20])  # killed mid-write
    log = read_events(cut / "rank-0" / "events.jsonl")
    assert [s.index for s in log.of(Step)] == list(range(len(steps) - 1))
    assert log.truncated and log.bad_lines == 1 and any("truncated last step record" in p for p in log.problems)
    report = diff(good, cut).to_json()
    assert report["determinism"]["verdict"] != "bit_exact"
    assert any("damaged" in p for e in report["determinism"]["endings"] for p in e["problems"])

    garbled = write_run(tmp_path / "garbled", steps, compact=True)
    middle = stream.index(KEYFRAME, stream.index(KEYFRAME) + 1) - 300  # a few records before the second keyframe
    (garbled / "rank-0" / STEPS_FILE).write_bytes(stream[:middle] + b"\xff" * 40 + stream[middle + 40 :])
    log = read_events(garbled / "rank-0" / "events.jsonl")
    indices = [s.index for s in log.of(Step)]
    assert indices[: KEYFRAME_EVERY - 10] == list(range(KEYFRAME_EVERY - 10))  # up to the damage
    after = len(steps) - KEYFRAME_EVERY
    assert indices[-after:] == list(range(KEYFRAME_EVERY, len(steps))) and len(indices) < len(steps)  # and on
    assert log.bad_lines >= 1 and not log.truncated and log.end is not None
    assert [s.to_json() for s in log.of(Step)][-after:] == [s.to_json() for s in steps[KEYFRAME_EVERY:]]


def test_the_live_view_follows_a_compact_log_record_by_record(tmp_path):
    """Each poll gives what was written since, in writing order; a record or line half written
    waits for the rest."""
    events = [Header(), *doctor_like_steps(40)]
    events.insert(10, Compile(step=8, compile_id="0/1"))
    path = tmp_path / "rank-0" / "events.jsonl"
    follower, seen = RunFollower(tmp_path), []
    with EventWriter(path) as writer:
        for i, event in enumerate(events):
            writer.write(event)
            if i % 3 == 0:
                seen += [e for _, e in follower.poll()]
    seen += [e for _, e in follower.poll()]
    assert [e.to_json() for e in seen] == [e.to_json() for e in events]
    stream = path.with_name(STEPS_FILE)
    with open(stream, "ab") as fp:
        fp.write(b"\x05\x01")  # the start of a 5-byte record whose rest has not arrived
    assert follower.poll() == [] and follower.unreadable == 0


def test_a_step_a_stream_cannot_hold_is_written_as_a_line(tmp_path):
    path = tmp_path / "rank-0" / "events.jsonl"
    odd = Step(index=1, step=1, rng_fps={"python": object()})  # type: ignore[dict-item]
    with EventWriter(path) as writer:
        writer.write(Header())
        writer.write(Step(index=0, step=0, loss=1.0))
        writer.write(odd)
        writer.write(Step(index=2, step=2, loss=math.pi))
    got = read_events(path)
    assert [s.index for s in got.of(Step)] == [0, 1, 2] and got.of(Step)[2].loss == math.pi
    assert '"index":1' in path.read_text()  # the one step that is a line


def test_a_step_stream_beside_a_log_without_header_is_not_read(tmp_path):
    run = write_run(tmp_path / "run", doctor_like_steps(5), compact=True)
    (run / "rank-0" / "events.jsonl").write_bytes(b"garbage\n{}\n")
    log = read_events(run / "rank-0" / "events.jsonl")
    assert log.unreadable and log.of(Step) == [] and log.events == []


def test_storing_a_report_says_what_the_run_directory_holds(tmp_path, capsys):
    from torchrepro.analysis.doctor import analyse
    from torchrepro.eventlog.rundir import disk_use, load_run, size_text
    from torchrepro.render.save import write_report

    run_dir = write_run(tmp_path / "run", doctor_like_steps(300), compact=True)
    logs = sum(f.stat().st_size for f in (run_dir / "rank-0").iterdir())
    run = load_run(run_dir)
    write_report(run_dir, analyse(run.meta, run.logs, run.problems))
    total, counted = disk_use(run_dir)
    assert counted == logs and total == sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file())
    assert (
        capsys.readouterr().err == f"torchrepro: {run_dir} holds {size_text(total)} ({size_text(logs)} of event logs)\n"
    )
    assert [size_text(n) for n in (999, 1000, 1_234_567, 5e12)] == ["999 B", "1.0 kB", "1.2 MB", "5000.0 GB"]
