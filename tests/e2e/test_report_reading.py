"""The report's reader (compiled per-kind builders, step fields shared across ranks, events looked
up by type) gives the same events and the same report as a plain reader: the standard library's
json and every field checked one by one (``event_codec._checked``), nothing shared. Compared on a real
2-rank run and on synthetic many-rank logs with damage of every kind the reader tolerates."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchrepro.analysis.doctor import analyse
from torchrepro.analysis.kept_steps import StepReducer
from torchrepro.eventlog.event_codec import _checked, from_json
from torchrepro.eventlog.event_reader import EventLog, read_events
from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import (
    KINDS,
    CacheLookup,
    Compile,
    End,
    GraphBreak,
    Header,
    Params,
    Step,
    check_event,
    field_names,
)
from torchrepro.eventlog.rundir import load_run
from torchrepro.eventlog.stepstream import STEPS_FILE, Decoder

SCRIPTS = Path(__file__).parents[1] / "scripts"


def plain_events(path: Path) -> tuple[list, int, dict[str, int]]:
    """The events, bad line count and unknown kinds of one log, read the plain way: its lines, and
    the records of its steps.bin (if any) each after the line it follows, every field checked."""
    events, bad, unknown = [], 0, {}
    records = []
    if path.with_name(STEPS_FILE).exists():
        decoder = Decoder(lambda fields: _checked("step", dict(fields)))
        records = decoder.feed(path.with_name(STEPS_FILE).read_bytes()) + decoder.finish()
        bad += decoder.damaged
    for number, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        events += [step for at, step in records if at == number - 1]
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not an object")
            kind = data.pop("kind", "")
            if kind not in KINDS:
                unknown[str(kind)] = unknown.get(str(kind), 0) + 1
                continue
            events.append(_checked(kind, data))
        except (ValueError, TypeError, UnicodeDecodeError):
            bad += 1
    events += [step for at, step in records if at >= number]
    return events, bad, unknown


def same(a: object, b: object) -> bool:
    """Equal, NaN included (a NaN loss is the same NaN on both sides)."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def assert_read_alike(run_dir: Path) -> dict:
    """Every log reads alike both ways, and the report over them is the same (also from the logs read
    with their steps reduced, in one process and in two); returns it (as JSON)."""
    run = load_run(run_dir)
    plain_logs = []
    for log in run.logs:
        events, bad, unknown = plain_events(log.path)
        assert (log.bad_lines, log.unknown_kinds) == (bad, unknown), log.path
        if not log.unreadable:
            assert same([e.to_json() for e in log.events], [e.to_json() for e in events]), log.path
        plain_logs.append(dataclasses.replace(log, events=log.events if log.unreadable else events, _by_type=None))
    report = analyse(run.meta, run.logs, run.problems).to_json()
    assert same(report, analyse(run.meta, plain_logs, run.problems).to_json())
    for jobs in (1, 2):  # the report's own reader: each rank's steps kept reduced, in one or two processes
        kept = load_run(run_dir, keep=StepReducer, jobs=jobs)
        assert same(report, analyse(kept.meta, kept.logs, kept.problems).to_json()), jobs
    return report


# ~13 s of CPU (torchrun, 2 compiled ranks). In make test: the readers agree on a 9-rank run with a rank that
# recompiles alone (test_reading_processes.py) and on the synthetic runs here; real 2-rank logs are reported by
# test_distributed.py::test_killed_rank_is_named_and_others_kept
@pytest.mark.slow
def test_a_real_two_rank_run_reports_alike(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchrepro",
            "doctor",
            "--nproc",
            "2",
            "--out",
            str(out),
            str(SCRIPTS / "ddp_compile.py"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=os.environ,
        timeout=300,
    )
    assert (out / "report.json").exists(), proc.stdout + proc.stderr
    report = assert_read_alike(out)
    assert report["run"]["ranks_present"] == [0, 1]
    assert "RANK_RECOMPILE_ASYMMETRY" in {f["code"] for f in report["findings"]}
    stored = json.loads((out / "report.json").read_text())  # written by doctor when the run ended
    assert same(report["findings"], stored["findings"]) and same(report["steps"], stored["steps"])


def synthetic_run(root: Path, ranks: int = 12, steps: int = 120, foreign: int | None = None) -> None:
    """A data-parallel run: replicas agree (but rank 5 diverges at step 60), the same RNG stream on
    every rank, batches per rank; rank 7 recompiles; and damaged logs (rank ``foreign``'s written
    by another schema)."""
    names = [f"layer{i}.weight" for i in range(4)]
    for rank in range(ranks):
        events = [
            Header(rank=rank, world_size=ranks),
            Params(rank=rank, names=names, shapes=[[4, 4]] * 4, dtypes=["float32"] * 4, kinds=["tensor"] * 4),
            Compile(
                rank=rank,
                step=0,
                compile_id="0/0",
                function="forward",
                file="train.py",
                line=3,
                dynamo_s=0.3 + rank / 100,
            ),
            CacheLookup(rank=rank, step=0, compile_id="0/0", cache="fxgraph", status="hit" if rank else "miss"),
        ]
        for i in range(steps):
            fps = [f"{i:08x}{j}" if rank != 5 or i < 60 else f"x{i}{j}" for j in range(4)]
            events.append(
                Step(
                    rank=rank,
                    step=i,
                    index=i,
                    loss=float("nan") if (rank, i) == (2, 9) else 1 / (i + 1),
                    time_s=0.01 + rank / 1000,
                    params_fp=fps[0],
                    param_fps=fps if i % 3 == 0 else None,
                    batch_fp=f"b{rank}-{i}",
                    rng_fp=f"r{i}",
                    rng_fps={"torch_cpu": f"r{i}", "numpy": "n"},
                    rng_at="batch",
                    compiles=int(i == 0),
                )
            )
            if rank == 7 and i == 40:
                events.append(
                    Compile(
                        rank=rank,
                        step=i,
                        compile_id="0/1",
                        function="forward",
                        file="train.py",
                        line=3,
                        recompile_reasons=["tensor 'x' size mismatch at index 0"],
                    )
                )
                events.append(
                    GraphBreak(
                        rank=rank, step=i, compile_id="0/1", reason="Data-dependent branching", file="train.py", line=5
                    )
                )
        events.append(End(rank=rank, step=steps, duration_s=2.0))
        path = root / f"rank-{rank}" / "events.jsonl"
        write_all(path, events, compact_steps=rank not in (3, 9))  # those two: steps as lines (events/1), damaged
        lines = path.read_text().splitlines(keepends=True)
        if rank == 3:  # killed mid-write: no end, a truncated last line
            lines = lines[:-2] + [lines[-2][:30]]
        if rank == 9:  # garbled, mistyped, unknown, extra and missing fields, a bare value
            step = json.loads(lines[20])
            lines[20:21] = [
                "{not json\n",
                json.dumps({**step, "loss": "high"}) + "\n",
                '{"kind":"future_kind","t":1}\n',
                json.dumps({**step, "index": 200, "new_field": [1]}) + "\n",
                json.dumps({k: v for k, v in step.items() if k not in ("rng_fps", "param_fps")}) + "\n",
                "[1, 2]\n",
                json.dumps({**step, "index": True, "batches": False}) + "\n",
            ]
        path.write_text("".join(lines))
    if foreign is not None:
        (root / f"rank-{foreign}" / "events.jsonl").write_text(
            f'{{"kind":"header","schema":"torchrepro.events/99","rank":{foreign}}}\n'
        )


def test_many_damaged_ranks_report_alike(tmp_path):
    synthetic_run(tmp_path)
    report = assert_read_alike(tmp_path)
    codes = {f["code"] for f in report["findings"]}
    assert {"REPLICAS_DIVERGE", "RANK_RECOMPILE_ASYMMETRY", "RANK_CRASHED", "EVENT_LOG_DAMAGED"} <= codes
    assert report["run"]["ranks"]["3"]["status"] == "incomplete"
    synthetic_run(tmp_path / "foreign", foreign=4)
    assert_read_alike(tmp_path / "foreign")


def test_steps_the_report_cannot_reduce_as_it_reads_them_report_alike(tmp_path):
    """The report's reader reduces steps.bin's records a few hundred at a time as they are decoded,
    their JSON types checked a column at a time: a log with a record of the wrong type (damage: it
    and the records up to the next keyframe are skipped) and one with steps in both files (put in
    order by the line each record follows) are read whole instead, and report the same; so does a
    log of steps.bin alone (no header: no steps) and one whose steps.bin is only its header."""
    synthetic_run(tmp_path, ranks=5, steps=700)
    mistyped = tmp_path / "rank-1" / "events.jsonl"
    events = [e for e in read_events(mistyped).events if not (isinstance(e, Step) and e.index == 300)]
    mistyped.with_name(STEPS_FILE).unlink()
    mistyped.unlink()
    write_all(mistyped, [*events[:300], Step(rank=1, index="three hundred"), *events[300:]])  # type: ignore[arg-type]
    mixed = tmp_path / "rank-2" / "events.jsonl"
    lines = mixed.read_text().splitlines(keepends=True)
    lines.insert(2, json.dumps(Step(rank=2, index=5000, loss=0.5, time_s=0.2).to_json()) + "\n")
    mixed.write_text("".join(lines))
    alone = tmp_path / "rank-6" / "events.jsonl"
    alone.parent.mkdir()
    alone.write_bytes(b"")
    (tmp_path / "rank-0" / STEPS_FILE).replace(alone.with_name(STEPS_FILE))
    only_header = (tmp_path / "rank-4" / STEPS_FILE).read_bytes().split(b"\n", 1)[0] + b"\n"
    (tmp_path / "rank-4" / STEPS_FILE).write_bytes(only_header)
    report = assert_read_alike(tmp_path)
    logs = {log.rank: log for log in load_run(tmp_path, keep=StepReducer).logs}
    # the mistyped record is the 297th (4 other events came first): it and the rest up to the keyframe at 512 are lost
    assert logs[1].bad_lines == 1 and logs[1].kept.count == 700 - (512 - 296)
    assert logs[2].kept.count == 701 and 5000 in logs[2].kept.indices and logs[0].kept.count == 0
    assert logs[6].unreadable and logs[6].kept.count == 0 and logs[4].kept.count == 0
    assert report["run"]["ranks_present"] == [0, 1, 2, 3, 4, 6]


def test_the_reader_shares_what_replicas_agree_on_and_nothing_else(tmp_path):
    synthetic_run(tmp_path)
    logs = load_run(tmp_path).logs
    a, b, diverged = (logs[r].of(Step) for r in (0, 1, 5))
    assert all(x.rng_fps is y.rng_fps and x.params_fp is y.params_fp for x, y in zip(a, b))
    assert a[3].param_fps is b[3].param_fps and a[3].batch_fp != b[3].batch_fp
    assert diverged[63].param_fps == [f"x63{j}" for j in range(4)] != a[63].param_fps
    assert diverged[3].param_fps is a[3].param_fps


# one value of every JSON type (lists and objects of strings and of numbers)
VALUES = [None, True, 0, 3, 1.5, "s", [], ["s"], [1], [[4, 4]], {}, {"a": "b"}, {"a": 1}, {"a": {"b": 1}}]


def built(kind: str, build, fields: dict) -> object:
    try:
        event = build(kind, dict(fields))
    except (TypeError, ValueError) as refused:  # a wrong JSON type; a schema or bound broken (check_event)
        return type(refused)
    out = event.to_json()
    if "t" not in fields:  # both take the time of reading
        out.pop("t")
    return json.dumps(out, sort_keys=True)


def _reference(kind: str, data: dict) -> object:
    """What the compiled builder must agree with: the schema and bounds checked (a step's nested
    values too), then every field's JSON type one by one."""
    check_event(kind, data)
    return _checked(kind, data)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_compiled_builder_accepts_and_refuses_what_the_field_checks_do(kind):
    names = field_names(KINDS[kind])
    default = KINDS[kind]()
    written = {n: json.loads(json.dumps(getattr(default, n))) for n in names}
    cases = [{**written, name: value} for name in names for value in VALUES]
    cases += [{k: v for k, v in case.items() if k != gone} for case in cases[::7] for gone in names[::3]]
    cases += [{**case, "extra": 1} for case in cases[::5]] + [dict(reversed(case.items())) for case in cases[::5]]
    for fields in cases:
        fast = built(kind, lambda k, d: from_json({"kind": k, **d}), fields)
        assert fast == built(kind, _reference, fields), fields


def test_an_unreadable_log_keeps_its_header_only(tmp_path):
    synthetic_run(tmp_path, ranks=5, steps=4, foreign=4)
    log: EventLog = read_events(tmp_path / "rank-4" / "events.jsonl")
    assert log.unreadable and "schema" in log.unreadable and [type(e) for e in log.events] == [Header]


def canon(x: object) -> object:
    """A JSON value with numbers compared by value (a float field read as 3.0 from ``3``), bools apart."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, (int, float)):
        return ("number", float(x)) if x == x else "nan"
    if isinstance(x, list):
        return [canon(v) for v in x]
    return {k: canon(v) for k, v in x.items()}


def test_step_lines_read_by_msgspec_are_what_the_general_reader_makes(tmp_path, monkeypatch):
    """msgspec reads step lines straight into their events when it is installed, then what agrees
    with the first rank is shared (the containers too: the same values in other bytes, not other
    values); whatever it refuses (NaN, a bool where an int goes, a truncated line, a wrong type
    inside a container) falls back to the general reader: the same events, the same lines
    skipped, the same fields shared across ranks."""
    pytest.importorskip("msgspec")
    from torchrepro.eventlog import event_reader

    assert event_reader.decode_step_line is not None
    names = field_names(Step)
    written = {n: json.loads(json.dumps(getattr(Step(), n))) for n in names}
    cases = [{**written, name: value} for name in names for value in VALUES]
    cases += [{k: v for k, v in case.items() if k != gone} for case in cases[::7] for gone in names[::3]]
    cases += [{**case, "extra": [1]} for case in cases[::5]] + [dict(reversed(case.items())) for case in cases[::5]]
    cases = [{**case, "index": i} for i, case in enumerate(cases)]  # one step index each, as in a run
    containers = {"param_fps": ["a", "b"], "rng_fps": {"torch_cpu": "c", "python": "d"}}
    cases += [{**written, "index": len(cases) + i, **containers} for i in range(4)]
    lines = [json.dumps({"kind": "step", **case}) for case in cases]
    lines += ['{"kind":"step","index":1,"loss":NaN}', '{"kind":"step","index":1,"loss":1e400}', lines[3][:25]]
    others = {  # the same steps on other ranks: the same containers in other bytes, other values, other types
        "spaced": lambda line: line.replace('", "', '",  "'),
        "other values": lambda line: line.replace('"a", "b"', '"a", "x"').replace('"d"}', '"y"}'),
        "wrong types": lambda line: line.replace('"a", "b"', '"a", 2').replace('"d"}', "null}"),
    }
    for rank, edit in enumerate([lambda line: line, *others.values()]):
        write_all(tmp_path / f"rank-{rank}" / "events.jsonl", [Header(rank=rank)])
        with open(tmp_path / f"rank-{rank}" / "events.jsonl", "a") as fp:
            fp.write("\n".join(edit(line) for line in lines) + "\n")
    fast = load_run(tmp_path)
    monkeypatch.setattr(event_reader, "decode_step_line", None)
    general = load_run(tmp_path)
    for a, b in zip(fast.logs, general.logs, strict=True):
        assert (a.bad_lines, a.truncated, len(a.events)) == (b.bad_lines, b.truncated, len(b.events))
        for x, y in zip(a.events, b.events):
            x_json, y_json = x.to_json(), y.to_json()
            if abs(x.t - y.t) > 0 and abs(x.t - y.t) < 60:  # a line without "t": each took its time of reading
                x_json.pop("t"), y_json.pop("t")
            assert canon(x_json) == canon(y_json), (x, y)
    assert sharing(fast) == sharing(general)
    by_rank = [[s for s in log.of(Step) if s.index == len(cases) - 1] for log in fast.logs]
    assert by_rank[1][0].param_fps is by_rank[0][0].param_fps  # the same values in other bytes: still one object
    assert by_rank[2][0].param_fps == ["a", "x"] and by_rank[2][0].rng_fps["python"] == "y"
    assert by_rank[3] == [] and fast.logs[3].bad_lines > fast.logs[0].bad_lines  # refused by both readers alike


def sharing(run) -> list[tuple[bool, bool, bool]]:
    """Per step of rank 0 and each other rank: do they hold one object for the RNG digests, for
    the parameters' (both, and the list of each parameter's)?"""
    first, *others = (log.of(Step) for log in run.logs)
    return [
        (x.rng_fps is y.rng_fps, x.params_fp is y.params_fp, x.param_fps is y.param_fps)
        for steps in others
        for x, y in zip(first, steps)
    ]
