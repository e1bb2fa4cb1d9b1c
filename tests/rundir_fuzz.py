"""A structure-aware fuzz of the JSON files a run directory holds (``run.json``, a rank's
``events.jsonl``, ``report.json``, a cache pack's manifest): each input is a valid document with
one field set to a value of another JSON type, a huge or negative integer, NaN/Infinity, deep
nesting, or the document's bytes flipped, cut or repeated. Every input must read as a clean
document or as one damage finding naming the file (and its field or line), and never raise
anything but :class:`~torchrepro.errors.InputError`; what reads clean goes on through what
``report`` and ``diff`` do with it. Run as ``python rundir_fuzz.py KIND N SEED``: prints a JSON
summary (tests/e2e/test_rundir_fuzz.py runs it under a memory and a time limit)."""

from __future__ import annotations

import copy
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torchrepro.errors import InputError

HOSTILE: list[Any] = [
    None,
    True,
    0,
    -1,
    10**9,
    2**31,
    2**70,
    -(2**70),
    1.5,
    1e308,
    float("nan"),
    float("inf"),
    "",
    "x" * 300,
    "\u202e\x1b[31m",
    [],
    [1, "a"],
    {},
    {"0": {"x": [None]}},
    {"name": 1, "value": [1]},
    [[[[[[[[[[]]]]]]]]]],
]
DEEP = [b"[" * 100_000, b'{"a":' * 20_000, b"[" * 60 + b"]" * 60, b'{"world_size": ' + b"[" * 5000]


def paths(doc: Any, at: tuple = ()) -> Iterator[tuple]:
    """Every place in ``doc`` (keys and indices from the top)."""
    yield at
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from paths(value, (*at, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc[:3]):
            yield from paths(value, (*at, i))


def replaced(doc: Any, at: tuple, value: Any) -> Any:
    """``doc`` with the value at ``at`` replaced (the containers on the way copied, the rest shared)."""
    if not at:
        return value
    out = copy.copy(doc)
    out[at[0]] = replaced(doc[at[0]], at[1:], value)
    return out


def without(doc: Any, at: tuple) -> Any:
    """``doc`` without the key at ``at`` (a field an object lacks; the containers on the way copied)."""
    out = copy.copy(doc)
    if len(at) == 1:
        del out[at[0]]
    else:
        out[at[0]] = without(doc[at[0]], at[1:])
    return out


def _in_object(doc: Any, at: tuple) -> bool:
    for key in at[:-1]:
        doc = doc[key]
    return isinstance(doc, dict)


def inputs(doc: Any, n: int, rng: random.Random, dumps: Callable[[Any], bytes]) -> Iterator[bytes]:
    """``n`` inputs made from ``doc``: every field of every object left out, then every field with
    every hostile value (the nested ones too: an object of other keys, a value of another type
    inside an object or array), then bit flips, cuts, repeats and random hostile fields, until ``n``."""
    given = 0
    base = dumps(doc)
    places = list(paths(doc))
    for raw in DEEP:
        yield raw
        given += 1
    for at in places:
        if at and _in_object(doc, at) and given < n:
            yield dumps(without(doc, at))
            given += 1
    for at in places:
        for value in HOSTILE:
            if given >= n:
                return
            yield dumps(replaced(doc, at, value))
            given += 1
    while given < n:
        how = rng.randrange(4)
        data = bytearray(base)
        if how == 0:
            for _ in range(rng.randint(1, 8)):
                i = rng.randrange(len(data))
                data[i] ^= 1 << rng.randrange(8)
        elif how == 1:
            data = data[: rng.randrange(len(data))]
        elif how == 2:
            i = rng.randrange(len(data))
            data[i:i] = data[i : i + rng.randint(1, 64)] * rng.randint(2, 50)
        else:
            at = rng.choice(places)
            deeper = rng.choice(HOSTILE)
            data = bytearray(dumps(replaced(doc, at, [deeper] * rng.randint(1, 3) if rng.random() < 0.3 else deeper)))
        yield bytes(data)
        given += 1


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc).encode()  # NaN and Infinity as Python writes them


# --- the kinds of file -------------------------------------------------------------------------


def run_json(root: Path, n: int, rng: random.Random) -> dict[str, int]:
    """``run.json``: read by ``load_run``; what reads clean goes through the comparison's and the
    doctor report's use of it."""
    from torchrepro.analysis.doctor import analyse
    from torchrepro.analysis.kept_steps import StepReducer
    from torchrepro.analysis.verdict import ending
    from torchrepro.eventlog.provenance import provenance
    from torchrepro.eventlog.rundir import RUN_FILE, load_run, read_run_json

    from synthetic_runs import write_run

    run = write_run(root / "run", 2)
    meta = {
        "script": "train.py",
        "args": ["--lr", "1"],
        "command": ["torchrepro", "doctor", "train.py"],
        "seed": 0,
        "world_size": 2,
        "exit_code": 1,
        "wall_s": 1.5,
        "git": {"commit": "abc", "root": "/r", "dirty": False},
        "rank_exit_codes": {"0": 0, "1": -9},
        "rank_stderr_tails": {"0": ["a"], "1": ["b"]},
        "stderr_tail": ["x"],
        "stall": {"after_s": 3.0, "stacks": {"0": [{"file": "t.py", "line": 3, "function": "f"}]}},
        "launcher": {"exit_code": 1, "status": "error", "error": "boom"},
        "supervisor": {"pid": 1, "host": "elsewhere", "start_time": 5},
        "stopped_by": "SIGTERM",
        "records_not_used": {"t.log": 2},
    }
    logs, kept = load_run(run).logs, load_run(run, keep=StepReducer).logs
    counts = {"clean": 0, "damage": 0}
    for i, data in enumerate(inputs(meta, n, rng, _dumps)):
        (run / RUN_FILE).write_bytes(data)
        try:  # the whole reader now and then, else its run.json part (the same checks, faster)
            got = load_run(run).meta if i % 50 == 0 else read_run_json_or_damage(read_run_json, run / RUN_FILE)
        except InputError as exc:
            assert RUN_FILE in str(exc) and "\n" not in str(exc), str(exc)
            counts["damage"] += 1
            continue
        counts["clean"] += 1
        ending("a", got, logs)
        provenance(got, logs[0].header)
        analyse(got, kept, [], None).to_json()
    return counts


def read_run_json_or_damage(read: Callable[[Path], Any], path: Path) -> Any:
    """``read(path)``, a file that is not JSON being damage as ``load_run`` says it (an InputError)."""
    try:
        return read(path)
    except ValueError as exc:
        raise InputError(f"{path}: not JSON ({exc})") from None


def events_jsonl(root: Path, n: int, rng: random.Random) -> dict[str, int]:
    """A rank's ``events.jsonl``, one event line of each kind made hostile in turn: read by the
    reader (a damaged line is skipped and said), then what ``report`` and ``diff`` do with the log."""
    from torchrepro.analysis.divergence import compile_differences, coverage, environment_differences
    from torchrepro.analysis.doctor import analyse
    from torchrepro.analysis.kept_steps import StepReducer
    from torchrepro.analysis.ranks import missing_ranks, rank_findings, world_findings
    from torchrepro.analysis.sides import side
    from torchrepro.analysis.verdict import ending
    from torchrepro.eventlog.event_reader import read_events
    from torchrepro.eventlog.events import (
        CacheLookup,
        Capability,
        Compile,
        Counters,
        End,
        GraphBreak,
        Header,
        InitParams,
        Metric,
        Params,
        Setting,
        Step,
        World,
    )

    env = {
        "versions": {"torch": "2.13"},
        "hardware": {"platform": "linux"},
        "threads": {"intra_op": 4},
        "determinism": [{"name": "deterministic_algorithms", "value": False}],
        "env_vars": [{"name": "OMP_NUM_THREADS", "value": "1", "in_fingerprint": True}],
    }
    events = [
        Header(rank=0, world_size=2, argv=["t.py"], env=env),
        World(rank=0, world_size=2, local_rank=0, node=0, host="h"),
        Compile(step=0, compile_id="0/0", function="f", cache={"fxgraph": {"hit": 1}}, recompile_reasons=["r"]),
        GraphBreak(step=0, compile_id="0/0", reason="x", hints=["h"], file="t.py", line=3),
        CacheLookup(step=0, compile_id="0/0", cache="fxgraph", status="hit", components=[{"name": "a"}]),
        Params(names=["w"], shapes=[[2, 3]], dtypes=["float32"], kinds=["tensor"]),
        InitParams(source="first_forward", module="m", names=["w"], fps=["00"]),
        Step(index=0, step=0, loss=1.0, time_s=0.1, params_fp="a", param_fps=["a"], rng_fps={"torch_cpu": "b"}),
        Step(index=1, step=1, loss=0.5, time_s=0.1, params_fp="c", param_fps=["c"], rng_fps={"torch_cpu": "d"}),
        Capability(name="capture_error", available=False, note="n"),
        Setting(name="deterministic_algorithms", value=True),
        Counters(counters={"stats": {"unique_graphs": 1}}),
        Metric(name="m", value=1.0),
        End(step=1, duration_s=1.0),
    ]
    lines = [e.to_json() for e in events]
    path = root / "rank-0" / "events.jsonl"
    path.parent.mkdir(parents=True)
    # rank 1, as written: what the ranks' analysis compares the mutated rank 0 with
    other = root / "rank-1" / "events.jsonl"
    other.parent.mkdir()
    other.write_bytes(b"\n".join(_dumps({**x, "rank": 1} if "rank" in x else x) for x in lines) + b"\n")
    other_kept = read_events(other, reduce=StepReducer())
    counts = {"clean": 0, "damage": 0}
    per_line = n // len(lines) + 1
    given = 0
    for which, line in enumerate(lines):
        for data in inputs(line, per_line, rng, _dumps):
            if given >= n:
                break
            given += 1
            path.write_bytes(b"\n".join(_dumps(x) if j != which else data for j, x in enumerate(lines)) + b"\n")
            log = read_events(path)
            if log.bad_lines or log.unreadable:
                counts["damage"] += 1
                assert log.problems and all(str(path) in p for p in log.problems), log.problems
                assert log.unreadable or any("line" in p for p in log.problems), log.problems
            else:
                counts["clean"] += 1
            logs = [log]
            ending("a", {}, logs)
            world_findings(logs, {})
            assert len(missing_ranks(logs, {})) <= 1024
            environment_differences(log.header, log.header)
            compile_differences(log, log)
            coverage(logs, logs, ("a", "b"))
            side("a", str(path), {}, logs)
            kept = read_events(path, reduce=StepReducer())  # (two ranks: what they should share compared)
            two = [kept, other_kept]
            rank_findings(two, {log.rank: log.kept for log in two})
            if given % 50 == 0:
                analyse({}, two, list(kept.problems), None).to_json()
    return counts


def reports_of_each_kind(root: Path) -> dict[str, Any]:
    """A report of each kind, as the real analysis makes them: a doctor report of a two-rank run, a
    check (``diff``) report, a compare report of hand-built logs, a drift report."""
    from torchrepro.analysis.doctor import analyse
    from torchrepro.analysis.equivalence import Config, compare_report, judge
    from torchrepro.analysis.kept_steps import StepReducer
    from torchrepro.analysis.verdict import Ending
    from torchrepro.commands.check.comparison import diff
    from torchrepro.eventlog.event_reader import EventLog
    from torchrepro.eventlog.events import End, Header, Params, Step
    from torchrepro.eventlog.rundir import load_run

    from synthetic_runs import drift_experiment, write_run

    run = load_run(write_run(root / "doctor", 2, odd=(1,), crashed=(0,)), keep=StepReducer)

    def config(label: str, scale: float) -> Config:
        events: list = [Header(world_size=1), Params(names=["w"], shapes=[[2]], dtypes=["float32"], kinds=["tensor"])]
        events += [
            Step(
                step=i, index=i, loss=1.0 - 0.1 * i * scale, param_fps=["p"], params_fp="p", batch_fp=f"b{i}", batches=1
            )
            for i in range(6)
        ]
        log = EventLog(root / label / "rank-0" / "events.jsonl", events=[*events, End()])
        return Config(label, [log], Ending(label))

    section = judge(config("a-1", 1.0), config("a-2", 1.0), config("b", 1.5))
    return {
        "doctor": analyse(run.meta, run.logs, run.problems, None),
        "check": diff(write_run(root / "a", 1), write_run(root / "b", 1, odd=(0,))),
        "compare": compare_report(section, {"a-1": "x"}, {"a-1": 1.0}, {"script": "train.py"}),
        "drift": drift_experiment(root / "drift", "<b>"),
    }


def report_json(root: Path, n: int, rng: random.Random) -> dict[str, int]:
    """A stored ``report.json`` of each kind (doctor, check, compare, drift): read back by ``report``
    (:func:`load_report`), then written out again and rendered as ``report`` renders it (terminal and
    HTML): a field a renderer needs that the document lacks is a damaged report, never a traceback."""
    import io

    from rich.console import Console

    from torchrepro.eventlog.jsoncheck import loads
    from torchrepro.render.drift_text import render_drift
    from torchrepro.render.html import render_html
    from torchrepro.render.junit import junit_xml
    from torchrepro.render.terminal import render_check, render_compare, render_doctor
    from torchrepro.reports.loader import load_report

    renderers: dict[str, Callable[..., None]] = {
        "doctor": render_doctor,
        "check": render_check,
        "compare": render_compare,
        "drift": render_drift,
    }
    counts = {"clean": 0, "damage": 0}
    reports = reports_of_each_kind(root)
    for k, (kind, report) in enumerate(reports.items()):
        doc = report.to_json()
        load_report(json.loads(_dumps(doc)), "report.json")  # each kind reads clean as written
        share = n // len(reports) + (k < n % len(reports))
        left_out = len(DEEP) + sum(1 for at in paths(doc) if at and _in_object(doc, at))  # the inputs lacking a field
        for i, data in enumerate(inputs(doc, share, rng, _dumps)):
            try:
                got = load_report(read_run_json_or_damage(lambda _: loads(data), Path("report.json")), "report.json")
            except InputError as exc:
                assert "report.json" in str(exc) and "\n" not in str(exc), str(exc)
                counts["damage"] += 1
                continue
            counts["clean"] += 1
            got.to_json()
            if i < left_out or i % 10 == 0:  # (rendering is most of the time: each input lacking a field, some others)
                renderers[kind](got, Console(file=io.StringIO(), width=100))
            if kind == "doctor":
                junit_xml(got)
            if i % 100 == 0 or i < left_out and i % 10 == 0:
                render_html(got)
    return counts


def pack_manifest(root: Path, n: int, rng: random.Random) -> dict[str, int]:
    """A cache pack's ``torchrepro-pack.json``, parsed as ``cache unpack`` parses it."""
    from torchrepro.cache.archive import PACK_SCHEMA, parse_manifest

    doc = {
        "schema": PACK_SCHEMA,
        "created": "2026-01-01",
        "build": {"torch": "2.13.0", "python": "3.11.7"},
        "files": [{"area": "cache", "path": "ab/cd", "sha256": "0" * 64, "size": 10}],
    }
    counts = {"clean": 0, "damage": 0}
    for data in inputs(doc, n, rng, _dumps):
        try:
            parse_manifest(data, "pack.tar.gz")
        except InputError as exc:
            assert "pack.tar.gz" in str(exc) and "\n" not in str(exc), str(exc)
            counts["damage"] += 1
            continue
        counts["clean"] += 1
    return counts


KINDS = {"run.json": run_json, "events.jsonl": events_jsonl, "report.json": report_json, "manifest": pack_manifest}


def main() -> None:
    kind, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sys.path.insert(0, str(Path(__file__).parent))
    start = time.perf_counter()
    memory = Path("/dev/shm")  # the same file written again and again: in memory where there is one
    with tempfile.TemporaryDirectory(dir=memory if memory.is_dir() else None) as tmp:
        counts = KINDS[kind](Path(tmp), n, random.Random(seed))
    print(json.dumps({**counts, "seconds": round(time.perf_counter() - start, 2)}))


if __name__ == "__main__":
    main()
