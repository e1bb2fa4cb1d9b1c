"""A run directory from someone else is read fail-closed: every JSON file kind survives a
structure-aware fuzz (tests/rundir_fuzz.py) under a memory and a time limit, each input a clean
read or one damage finding; a world size or rank of 10**9 or 2**70 sizes nothing; a comparison
that does not cover both runs (evidence one run lacks, steps unpaired, duplicated, out of order)
is INCOMPLETE with exit 3, never BIT-EXACT; a run directory that cannot be read exits 2 in one
line. Real files, processes and CLI."""

from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic_runs import training_steps
from test_hostile_input import fake_run, one_line_error, torchrepro

from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import End, Header

FUZZ = Path(__file__).parents[1] / "rundir_fuzz.py"
MEMORY = 1 << 30  # address space of the fuzzing process: a list of world_size items would need far more


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


@pytest.mark.parametrize("kind", ["run.json", "events.jsonl", "report.json", "manifest"])
def test_every_json_file_kind_survives_10000_hostile_inputs(kind):
    proc = subprocess.run(
        [sys.executable, FUZZ, kind, "10000", "48"],
        capture_output=True,
        text=True,
        timeout=120,  # an input that hangs the reader fails the test
        preexec_fn=_limited,
        cwd=FUZZ.parent,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout)
    assert counts["clean"] + counts["damage"] == 10_000
    assert counts["clean"] and counts["damage"]  # both outcomes reached: the fuzz can fail either way


def _run(path: Path, steps: list, *, world_size: int = 1) -> Path:
    write_all(path / "rank-0" / "events.jsonl", [Header(world_size=world_size), *steps, End(step=len(steps))])
    (path / "run.json").write_text(json.dumps({"script": "train.py", "world_size": world_size, "exit_code": 0}))
    return path


def _diff(tmp_path: Path, a: Path, b: Path) -> tuple[int, dict]:
    out = tmp_path / f"{a.name}-{b.name}.json"
    proc = torchrepro("diff", a, b, "--json", out, cwd=tmp_path, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.returncode, json.loads(out.read_text())


def test_a_good_pair_is_bit_exact_and_says_what_it_compared(tmp_path):
    code, report = _diff(tmp_path, _run(tmp_path / "a", training_steps(60)), _run(tmp_path / "b", training_steps(60)))
    det = report["determinism"]
    assert code == 0 and det["verdict"] == "bit_exact" and det["incomplete_because"] == []
    assert det["evidence_compared"] == {"params": 5, "grads": 0, "loss": 60, "rng": 60, "batch": 60}


def test_loss_missing_from_step_k_on_is_incomplete_not_bit_exact(tmp_path):
    lossless = [dataclasses.replace(s, loss=None) if s.index >= 40 else s for s in training_steps(600)]
    code, report = _diff(tmp_path, _run(tmp_path / "a", training_steps(600)), _run(tmp_path / "b", lossless))
    det = report["determinism"]
    assert code == 3 and det["verdict"] == "incomplete", report["verdict"]
    assert det["evidence_compared"]["loss"] == 40
    assert det["not_compared"][0].startswith("loss not compared at 560 step(s) (steps 40–599): ")
    assert "COMPARISON_INCOMPLETE" in {f["code"] for f in report["findings"]}


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda s: s[:300] + [dataclasses.replace(s[300], index=299)] + s[301:], "more than once"),
        (lambda s: s[:300] + s[301:], "lacks 1 step(s) between steps 0 and 599"),
        (lambda s: s[:300] + [s[301], s[300]] + s[302:], "out of order"),
    ],
    ids=["duplicated", "missing", "out-of-order"],
)
def test_steps_duplicated_missing_or_out_of_order_are_incomplete(tmp_path, damage, said):
    code, report = _diff(
        tmp_path, _run(tmp_path / "a", training_steps(600)), _run(tmp_path / "b", damage(training_steps(600)))
    )
    assert code == 3 and report["determinism"]["verdict"] == "incomplete", report["verdict"]
    assert any(said in why for why in report["determinism"]["incomplete_because"])


def test_a_world_size_of_a_billion_sizes_nothing(tmp_path):
    good = _run(tmp_path / "good", training_steps(20))
    huge = _run(tmp_path / "huge", training_steps(20), world_size=10**9)
    code, report = _diff(tmp_path, good, huge)
    assert code == 3 and "1–999999999 of 1000000000" in report["verdict"]
    proc = torchrepro("report", huge, "--json", tmp_path / "r.json", cwd=tmp_path, timeout=60)
    missing = next(f for f in json.loads((tmp_path / "r.json").read_text())["findings"] if f["code"] == "RANKS_MISSING")
    assert proc.returncode == 1 and missing["evidence"]["missing_count"] == 10**9 - 1
    assert len(missing["evidence"]["missing"]) == 1024 and missing["evidence"]["missing_ranges"] == "1–999999999"


@pytest.mark.parametrize(
    ("meta", "said"),
    [
        ({"world_size": 2**70}, "'world_size' is 1180591620717411303424, above its maximum"),
        ({"rank_exit_codes": {"zero": 1}}, "'rank_exit_codes' has the key \"zero\""),
        ({"rank_stderr_tails": {"0": 5}}, "'rank_stderr_tails.0' is int 5, not array"),
        ({"stall": {"after_s": 1, "stacks": {"0": [{"file": 1}]}}}, "'stall.stacks.0[0]' lacks 'line'"),
        ({"launcher": {"status": ["ok"]}}, "'launcher.status' is list"),
        ({"git": {"commit": 5}}, "'git.commit' is int 5"),
        ({"supervisor": {"pid": 2**40}}, "'supervisor.pid'"),
        ({"extra": json.loads("[" * 70 + "1" + "]" * 70)}, "nested more than 64"),
    ],
)
def test_a_damaged_run_json_is_one_line_naming_the_field(tmp_path, meta, said):
    run = fake_run(tmp_path / "run")
    (run / "run.json").write_text(json.dumps({"script": "train.py", **meta}))
    for command in (["report", run], ["diff", run, run]):
        line = one_line_error(torchrepro(*command, cwd=tmp_path, timeout=60))
        assert said in line and "run.json" in line, (command, line)


def test_run_json_nested_too_deeply_for_the_parser_is_one_line(tmp_path):
    run = fake_run(tmp_path / "run")
    (run / "run.json").write_text("[" * 100_000)
    line = one_line_error(torchrepro("report", run, cwd=tmp_path, timeout=60))
    (run / "run.json").unlink()  # damaged on purpose: not one for the schema check every test ends with
    assert "run.json: not JSON" in line


def test_an_event_line_of_wrong_nested_types_is_one_damage_finding_naming_its_line(tmp_path):
    run = fake_run(tmp_path / "run")
    log = run / "rank-0" / "events.jsonl"
    lines = log.read_text().splitlines()
    bad = {"kind": "compile", "t": 1.0, "rank": 0, "step": 0, "compile_id": "0/0", "cache": {"fxgraph": 5}}
    log.write_text("\n".join([*lines[:-1], json.dumps(bad), lines[-1]]) + "\n")
    proc = torchrepro("report", run, "--json", tmp_path / "r.json", cwd=tmp_path, timeout=60)
    report = json.loads((tmp_path / "r.json").read_text())
    assert "Traceback" not in proc.stderr and report["verdict"] != "healthy"
    (problem,) = report["run"]["problems"]
    assert (
        f"events.jsonl: unreadable line {len(lines)} (compile: field 'cache.fxgraph' is int 5, not object)" in problem
    )


def _truncated_steps(run: Path, keep: float) -> Path:
    steps = run / "rank-0" / "steps.bin"
    data = steps.read_bytes()
    steps.write_bytes(data[: int(len(data) * keep) + 3])  # cut inside a record
    return run


def test_a_step_log_cut_short_is_never_bit_exact_nor_healthy(tmp_path):
    good = _run(tmp_path / "good", training_steps(600))
    cut = _truncated_steps(_run(tmp_path / "cut", training_steps(600)), 0.5)
    code, report = _diff(tmp_path, good, cut)
    assert code == 3 and report["determinism"]["verdict"] == "incomplete", report["verdict"]
    proc = torchrepro("report", cut, "--json", tmp_path / "r.json", cwd=tmp_path, timeout=60)
    doctor = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == 0 and doctor["verdict"].startswith("WARNINGS"), doctor["verdict"]
    (damaged,) = [f for f in doctor["findings"] if f["code"] == "EVENT_LOG_DAMAGED"]
    assert "steps.bin" in damaged["evidence"]["problems"][0]


@pytest.fixture(scope="module")
def doctored(tmp_path_factory) -> tuple[Path, Path]:
    """A real run of a small training script under ``torchrepro doctor``, and a copy of it."""
    import shutil

    from torchrepro.cli import main

    root = tmp_path_factory.mktemp("doctored")
    assert (
        main(["doctor", "--out", str(root / "a"), str(Path(__file__).parents[1] / "scripts" / "deterministic.py")]) == 0
    )
    return root / "a", shutil.copytree(root / "a", root / "b")


def test_exit_codes_of_diff_on_real_runs_good_unreadable_and_incomplete(doctored, tmp_path, capsys):
    import shutil

    from torchrepro.cli import main

    a, b = doctored
    assert main(["diff", str(a), str(b)]) == 0
    assert capsys.readouterr().out.startswith("BIT-EXACT")
    huge = shutil.copytree(b, tmp_path / "huge")
    meta = json.loads((huge / "run.json").read_text())
    (huge / "run.json").write_text(json.dumps({**meta, "world_size": 2**70}))
    assert main(["diff", str(a), str(huge)]) == 2
    assert "run.json: field 'world_size'" in one_line_error(capsys.readouterr().err)
    (huge / "run.json").unlink()  # damaged on purpose: not one for the schema check every test ends with
    cut = _truncated_steps(shutil.copytree(b, tmp_path / "cut"), 0.9)
    assert main(["diff", str(a), str(cut)]) == 3
    assert capsys.readouterr().out.startswith("INCOMPLETE")


def test_a_rank_log_that_cannot_be_read_keeps_diff_from_bit_exact(tmp_path):
    import os

    good = fake_run(tmp_path / "good", ranks={"0": 0, "1": 1})
    fifo = fake_run(tmp_path / "fifo", ranks={"0": 0, "1": 1})
    for run in (good, fifo):  # no world size said: only the rank folders tell
        (run / "run.json").write_text(json.dumps({"script": "train.py"}))
    (fifo / "rank-1" / "events.jsonl").unlink()
    os.mkfifo(fifo / "rank-1" / "events.jsonl")
    code, report = _diff(tmp_path, good, fifo)
    assert code == 3 and report["determinism"]["verdict"] == "incomplete", report["verdict"]
    assert "rank-1/events.jsonl: not a regular file" in report["verdict"]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"compile_fixes": [{"name": 5}]}', "field 'compile_fixes[0]' lacks 'applied_to'"),
        ("[" * 100_000, "unreadable (nested more than 64 levels deep)"),
    ],
)
def test_a_damaged_stored_fixes_result_is_one_line(tmp_path, text, said):
    run = fake_run(tmp_path / "run")
    (run / "fixes").mkdir()
    (run / "fixes" / "compile_fixes.json").write_text(text)
    line = one_line_error(torchrepro("report", run, cwd=tmp_path, timeout=60))
    (run / "fixes" / "compile_fixes.json").unlink()  # damaged on purpose: not one for the schema check at the end
    assert "fixes/compile_fixes.json: " + said in line


@pytest.mark.parametrize(
    ("name", "damage", "said"),
    [
        ("step-3.npz", b"not a zip archive", "unreadable parameter snapshot"),
        ("step-3.npz", None, "is not an uncompressed array"),  # a compressed archive that would expand in memory
    ],
)
def test_a_damaged_parameter_snapshot_is_one_line(tmp_path, name, damage, said):
    import numpy as np

    a, b = (_run(tmp_path / x, training_steps(10)) for x in ("a", "b"))
    for run in (a, b):
        (run / "rank-0" / "snapshots").mkdir()
        np.savez(run / "rank-0" / "snapshots" / "step-3.npz", w=np.zeros(4))
        (run / "rank-0" / "snapshots" / "step-x.npz").write_bytes(b"a name that is no step: not a snapshot")
    target = b / "rank-0" / "snapshots" / name
    if damage is None:
        np.savez_compressed(target, w=np.zeros(1 << 24))  # 128 MB of zeros in a few hundred kB
    else:
        target.write_bytes(damage)
    assert _diff(tmp_path, a, a)[0] == 0  # the name that is no step is left alone
    line = one_line_error(torchrepro("diff", a, b, cwd=tmp_path, timeout=60))
    assert said in line and "step-3.npz" in line
