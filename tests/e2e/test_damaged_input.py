"""Damaged and hostile inputs are never read as clean: a TORCH_TRACE log cut mid-record keeps
doctor off HEALTHY, a run.json field of a wrong type is one line naming it, a FIFO never blocks a
command, a huge sparse event log is read in bounded memory. Real torch, files and processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_hostile_input import fake_run, one_line_error, torchrepro

TINY = """
import torch
f = torch.compile(lambda x: torch.sin(x) + 1, backend="aot_eager")
for n in (4, 5):
    f(torch.randn(n))
"""


@pytest.fixture(scope="session")  # made once: its tests share a worker (xdist_group "damaged-trace")
def trace_dir(tmp_path_factory) -> Path:
    """A real TORCH_TRACE directory: one function compiled twice (a shape recompile)."""
    root = tmp_path_factory.mktemp("trace")
    (root / "tiny.py").write_text(TINY)
    env = {**os.environ, "TORCH_TRACE": str(root / "trace")}
    subprocess.run([sys.executable, root / "tiny.py"], env=env, check=True, timeout=300, cwd=root)
    return root / "trace"


def _doctor_trace(trace: Path, tmp_path: Path) -> dict:
    tmp_path.mkdir(exist_ok=True)
    proc = torchrepro("doctor", "--trace", trace, "--json", tmp_path / "r.json", cwd=tmp_path)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return json.loads((tmp_path / "r.json").read_text())


@pytest.mark.xdist_group("damaged-trace")
def test_a_trace_cut_mid_record_is_not_healthy(trace_dir, tmp_path):
    (log,) = trace_dir.glob("*.log")
    whole = _doctor_trace(trace_dir, tmp_path / "whole")
    assert whole["compile"]["compiles"] == 2
    assert "CAPTURE_DEGRADED" not in {f["code"] for f in whole["findings"]}  # the intact log reads clean
    data = log.read_bytes()
    last = data.rindex(b'"has_payload"')  # the last record with a payload: cut inside its payload
    cut = data.index(b"\n\t", last) + 40
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / log.name).write_bytes(data[:cut])
    report = _doctor_trace(tmp_path / "cut", tmp_path)
    assert report["verdict"] != "healthy"
    (finding,) = [f for f in report["findings"] if f["code"] == "CAPTURE_DEGRADED"]
    assert finding["severity"] == "warning" and finding["evidence"]["records"] == 1
    assert "compile events may be missing" in finding["title"]


@pytest.mark.xdist_group("damaged-trace")
def test_garbled_trace_lines_are_counted(trace_dir, tmp_path):
    (log,) = trace_dir.glob("*.log")
    (tmp_path / "bad").mkdir()
    lines = log.read_bytes().split(b"\n")
    lines.insert(3, b"garbage that is no record")
    lines.insert(5, b"V1203 11:16:00.000000 1 x.py:1] {not json}")
    (tmp_path / "bad" / log.name).write_bytes(b"\n".join(lines))
    report = _doctor_trace(tmp_path / "bad", tmp_path)
    (finding,) = [f for f in report["findings"] if f["code"] == "CAPTURE_DEGRADED"]
    assert finding["evidence"]["records"] >= 2 and report["verdict"] != "healthy"


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("world_size", "two", "'world_size' is a string, not an integer"),
        ("world_size", True, "'world_size' is a boolean"),
        ("rank_exit_codes", "0", "'rank_exit_codes' is a string, not an object"),
        ("stall", 5, "'stall' is an integer, not an object"),
        ("launcher", [], "'launcher' is an array, not an object"),
        ("stopped_by", "SIGNOPE", "'stopped_by' is 'SIGNOPE', not a signal name"),
    ],
)
def test_run_json_with_a_field_of_a_wrong_type(tmp_path, field, value, said):
    run = fake_run(tmp_path / "run")
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, field: value}))
    for command in (["report", run], ["watch", run, "--once"], ["diff", run, run]):
        line = one_line_error(torchrepro(*command, cwd=tmp_path, timeout=120))
        assert said in line and "run.json" in line, command


def test_run_json_not_an_object(tmp_path):
    run = fake_run(tmp_path / "run")
    (run / "run.json").write_text("[1, 2]")
    assert "not a JSON object" in one_line_error(torchrepro("report", run, cwd=tmp_path))


@pytest.mark.parametrize("which", ["run.json", "rank-0/events.jsonl"])
@pytest.mark.parametrize("command", ["report", "watch"])
def test_a_fifo_in_a_run_never_blocks(tmp_path, which, command):
    run = fake_run(tmp_path / "run")
    (run / which).unlink()
    os.mkfifo(run / which)
    args = [command, run] + (["--once"] if command == "watch" else [])
    line = one_line_error(torchrepro(*args, cwd=tmp_path, timeout=60))  # the timeout fails the test, never hangs
    assert "not a regular file" in line or "no readable event log" in line


READ_PEAK = """
import resource, sys
from torchrepro.eventlog.rundir import load_run
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run = load_run(sys.argv[1])
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(grown // 1024, run.logs[0].bad_lines, "|".join(run.problems))
"""


def test_a_huge_sparse_event_log_is_read_in_bounded_memory(tmp_path):
    run = fake_run(tmp_path / "run")
    log = run / "rank-0" / "events.jsonl"
    header = log.read_bytes().split(b"\n")[0] + b"\n"
    log.write_bytes(header)
    os.truncate(log, 400 << 20)  # 400 MB of NULs after the header: one line, no newline
    proc = subprocess.run(
        [sys.executable, "-c", READ_PEAK, run], capture_output=True, text=True, timeout=300, check=True
    )
    grown_mb, bad, problems = proc.stdout.split(maxsplit=2)
    assert int(grown_mb) < 200, f"peak RSS grew {grown_mb} MB reading a 400 MB log"  # whole-file reading: > 800 MB
    assert int(bad) == 1 and "over 64 MiB" in problems


def test_plan_json_with_a_field_of_a_wrong_type(tmp_path):
    from torchrepro.commands.drift.experiment import MetricSpec, make_plan

    script = tmp_path / "train.py"
    script.write_text("print('loss=1.0')\n")
    plan = make_plan(script, [], "init", 2, 0, MetricSpec(name="loss"))
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "plan.json").write_text(json.dumps({**plan, "metric": "loss"}))
    line = one_line_error(torchrepro("drift", "--collect", tmp_path / "exp", cwd=tmp_path))
    assert "'metric' is a string, not an object" in line


@pytest.mark.parametrize(("field", "value", "said"), [("drift", "x", "'drift' is str"), ("run", {}, "lacks 'script'")])
def test_report_json_with_a_field_of_a_wrong_type(tmp_path, field, value, said):
    from synthetic_runs import drift_experiment

    drift_experiment(tmp_path / "exp", "m")
    stored = tmp_path / "exp" / "report.json"
    stored.write_text(json.dumps({**json.loads(stored.read_text()), field: value}))
    line = one_line_error(torchrepro("report", tmp_path / "exp", cwd=tmp_path))
    stored.unlink()  # damaged on purpose: not one for the schema check every test ends with
    assert said in line and "report.json" in line
