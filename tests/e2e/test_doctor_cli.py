"""`torchrepro doctor` / `report` end to end: real scripts in real processes, bad input,
budgets, and the rule that observation must not perturb the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
import torch

SCRIPTS = Path(__file__).parents[1] / "scripts"
SMALL = SCRIPTS / "train_small.py"


def torchrepro(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run(
        [sys.executable, "-m", "torchrepro", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def report_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "report.json").read_text())


def _last_json(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


def test_observation_does_not_perturb(tmp_path):
    plain = subprocess.run(
        [sys.executable, str(SMALL), "--save", str(tmp_path / "plain.pt")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    proc = torchrepro(
        "doctor", "--out", str(tmp_path / "run"), str(SMALL), "--", "--save", str(tmp_path / "doctor.pt"), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    a = torch.load(tmp_path / "plain.pt", weights_only=True)
    b = torch.load(tmp_path / "doctor.pt", weights_only=True)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name
    counts_plain, counts_doctor = _last_json(plain.stdout), _last_json(proc.stdout)
    assert counts_plain == counts_doctor
    report = report_of(tmp_path / "run")
    assert report["compile"]["compiles"] == counts_doctor["frames_ok"]
    assert report["compile"]["unique_graphs"] == counts_doctor["unique_graphs"]
    assert report["steps"]["steps"] == counts_doctor["steps"]
    # the planted short last batch: one shape recompile with the drop_last hint
    [recompile] = report["compile"]["recompile_events"]
    assert recompile["category"] == "shape" and recompile["step"] == 4
    finding = next(f for f in report["findings"] if f["code"] == "RECOMPILE_SHAPE")
    assert "drop_last" in finding["hint"]
    # the report can be re-rendered from the stored run
    again = torchrepro("report", str(tmp_path / "run"), cwd=tmp_path)
    assert again.returncode == 0 and "recompile" in again.stdout


def test_budgets_junit_and_json(tmp_path):
    proc = torchrepro(
        "doctor",
        "--out",
        str(tmp_path / "run"),
        "--max-recompiles",
        "0",
        "--junit",
        str(tmp_path / "junit.xml"),
        "--json",
        str(tmp_path / "copy.json"),
        str(SMALL),
        "--",
        "--epochs",
        "1",
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    assert any(line.startswith("FAILS BUDGET") for line in proc.stdout.splitlines())
    suite = ElementTree.parse(tmp_path / "junit.xml").getroot()
    assert suite.get("failures") == "1"
    assert "recompiles > budget 0" in suite.find("testcase/failure").get("message")
    assert json.loads((tmp_path / "copy.json").read_text())["budget_failures"]


def test_script_that_raises_keeps_partial_events(tmp_path):
    proc = torchrepro(
        "doctor", "--out", str(tmp_path / "run"), str(SMALL), "--", "--steps-then-raise", "3", cwd=tmp_path
    )
    assert proc.returncode == 3
    report = report_of(tmp_path / "run")
    assert report["steps"]["steps"] == 3
    failed = next(f for f in report["findings"] if f["code"] == "SCRIPT_FAILED")
    assert "planted failure after step 3" in failed["title"]
    assert any("planted failure" in line for line in failed["evidence"]["stderr_tail"])
    assert "Traceback" in (tmp_path / "run" / "logs" / "stderr.log").read_text()


def test_script_exit_code_is_reported(tmp_path):
    proc = torchrepro(
        "doctor", "--out", str(tmp_path / "run"), str(SMALL), "--", "--epochs", "1", "--exit-code", "3", cwd=tmp_path
    )
    assert proc.returncode == 3
    assert report_of(tmp_path / "run")["run"]["ranks"]["0"]["exit_code"] == 3


@pytest.mark.parametrize(
    "case", ["missing", "syntax", "existing_out", "not_a_run", "trace_empty", "trace_missing", "both", "neither"]
)
def test_bad_input_is_one_clear_line_exit_2(tmp_path, case):
    (tmp_path / "bad.py").write_text("def f(:\n    pass\n")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "run.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    args = {
        "missing": ["doctor", "nope.py"],
        "syntax": ["doctor", "bad.py"],
        "existing_out": ["doctor", "--out", "used", str(SMALL)],
        "not_a_run": ["report", "empty"],
        "trace_empty": ["doctor", "--trace", "empty"],
        "trace_missing": ["doctor", "--trace", "nowhere"],
        "both": ["doctor", "--trace", "empty", str(SMALL)],
        "neither": ["doctor"],
    }[case]
    proc = torchrepro(*args, cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchrepro: error:"), proc.stderr
    assert (tmp_path / "used" / "run.json").read_text() == "{}"  # nothing overwritten
    if case == "syntax":
        assert "bad.py:1" in lines[0]


def test_damaged_event_log_is_reported_not_fatal(tmp_path):
    proc = torchrepro("doctor", "--out", str(tmp_path / "run"), str(SMALL), "--", "--epochs", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    log = tmp_path / "run" / "rank-0" / "events.jsonl"
    lines = log.read_text().splitlines()
    steps_before = report_of(tmp_path / "run")["steps"]["steps"]
    lines.insert(5, "{not json at all")
    log.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])  # garble one, truncate the end
    proc = torchrepro("report", "--json", str(tmp_path / "r.json"), str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr  # analysed; the run counts as failed: its end record is gone
    report = json.loads((tmp_path / "r.json").read_text())
    damaged = next(f for f in report["findings"] if f["code"] == "EVENT_LOG_DAMAGED")
    assert any("truncated last line" in p for p in damaged["evidence"]["problems"])
    assert any("unreadable line 6" in p for p in damaged["evidence"]["problems"])
    assert report["steps"]["steps"] == steps_before  # the end record was the truncated line
    assert any(f["code"] == "RANK_CRASHED" for f in report["findings"])


# make test reads real TORCH_TRACE logs through `doctor --trace` in test_damaged_input.py (a shape recompile,
# its count, garbled lines counted) and compares the counts on the recorded corpus (compat/test_trace_corpus.py)
@pytest.mark.slow
def test_doctor_from_torch_trace_logs(tmp_path):
    trace = tmp_path / "trace"
    subprocess.run(
        [sys.executable, str(SMALL), "--epochs", "1"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        env={**os.environ, "TORCH_TRACE": str(trace)},
    )
    proc = torchrepro("doctor", "--trace", str(trace), "--out", str(tmp_path / "imported"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = report_of(tmp_path / "imported")
    assert report["compile"]["compiles"] == 2 and report["compile"]["recompiles"] == 1
    assert report["compile"]["recompile_events"][0]["category"] == "shape"
    assert report["compile"]["unique_graphs"] == 2
    assert not [f for f in report["findings"] if f["severity"] == "error"]
    # a garbled trace line is skipped, not fatal
    log = next(trace.glob("*.log"))
    log.write_text(log.read_text().replace('{"dynamo_start"', '{"dynamo_start" garbage', 1))
    proc = torchrepro("doctor", "--trace", str(trace), "--out", str(tmp_path / "again"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
