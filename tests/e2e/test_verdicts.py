"""Verdicts are earned: every way a run can end (crash, signal, timeout, lost rank, truncated or
foreign log, zero comparable steps) gives the verdict and exit code it deserves, never BIT-EXACT
or HEALTHY on evidence that is not there. Real scripts, real processes, real files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parents[1] / "scripts"


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchrepro", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def check(
    tmp_path: Path, script: str, *options: str, args: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "check"
    proc = cli(
        "check", "--out", str(out), *options, str(SCRIPTS / script), *(("--", *args) if args else ()), cwd=tmp_path
    )
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return proc, report


def record(tmp_path: Path, name: str, script: str, *args: str) -> Path:
    proc = cli(
        "run", "--out", str(tmp_path / name), str(SCRIPTS / script), *(("--", *args) if args else ()), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    return tmp_path / name


@pytest.fixture(scope="session")  # made once; its tests share a worker (xdist_group "verdicts-good")
def good_run(tmp_path_factory) -> Path:
    """A recorded run of deterministic.py that the tests below copy, then damage."""
    return record(tmp_path_factory.mktemp("verdicts"), "good", "deterministic.py")


def diff(tmp_path: Path, a: Path, b: Path, *options: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / f"diff-{a.name}-{b.name}.json"
    proc = cli("diff", "--json", str(out), *options, str(a), str(b), cwd=tmp_path)
    return proc, json.loads(out.read_text()) if out.exists() else {}


def first_line(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout.splitlines()[0]


def said(proc: subprocess.CompletedProcess) -> str:
    """The terminal output with rich's line wrapping undone."""
    return " ".join(proc.stdout.split())


# --- how runs end ---------------------------------------------------------------------------


def test_both_runs_crash_at_the_same_step_is_not_bit_exact(tmp_path):
    proc, report = check(tmp_path, "train_small.py", args=("--steps-then-raise", "3"))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    det = report["determinism"]
    assert det["verdict"] == "incomplete" and det["steps_compared"] == 3
    assert first_line(proc).startswith("INCOMPLETE") and "run-1" in said(proc)
    assert "planted failure" in said(proc)
    assert [e["ended_normally"] for e in det["endings"]] == [False, False]
    assert {f["code"] for f in report["findings"]} == {"RUN_DID_NOT_END_NORMALLY"}
    assert report["exit_code"] == 3


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_second_run_stopping_early_is_named(tmp_path):
    proc, report = check(tmp_path, "stops_early.py", args=(str(tmp_path / "marker"),))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    det = report["determinism"]
    assert det["verdict"] == "incomplete" and det["steps_compared"] == 3
    # the runs go side by side: whichever saw the other's marker stopped early
    (short,) = [e for e in det["endings"] if not e["ended_normally"]]
    other = "run-1" if short["run"] == "run-2" else "run-2"
    assert f"recorded 3 step(s), {other} recorded 6" in short["problems"][0]
    assert short["run"] in said(proc)


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it (a timeout before start-up is in `make test`)
def test_timeout_kills_both_runs(tmp_path):
    script = tmp_path / "sleeps.py"
    script.write_text(
        "import time, torch\nm = torch.nn.Linear(2, 2)\nm(torch.ones(1, 2)).sum().backward()\ntime.sleep(120)\n"
    )
    # 10 s without progress: importing torch on a loaded machine can take several seconds, and a run stopped before capture started is another verdict (nothing to
    # compare); no replays: the same timeout would stop them
    proc = cli("check", "--out", str(tmp_path / "c"), "--timeout", "10", "--no-localize", str(script), cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    det = json.loads((tmp_path / "c" / "report.json").read_text())["determinism"]
    assert det["verdict"] != "bit_exact"
    assert all(any("--timeout" in p for p in e["problems"]) for e in det["endings"])


@pytest.mark.distributed
@pytest.mark.slow  # two torchrun jobs of two ranks: make test-slow
def test_a_rank_killed_in_both_runs(tmp_path):
    proc, report = check(tmp_path, "rank_killed.py", "--nproc", "2", "--no-localize")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    det = report["determinism"]
    assert det["verdict"] in ("incomplete", "diverged") and det["verdict"] != "bit_exact"
    for e in det["endings"]:
        assert any(p.startswith("rank 1: no end record") for p in e["problems"]), e


@pytest.mark.xdist_group("verdicts-good")
def test_diff_against_truncated_garbage_and_newer_schema_copies(tmp_path, good_run):
    good = shutil.copytree(good_run, tmp_path / "good")
    log = good / "rank-0" / "events.jsonl"

    truncated = tmp_path / "truncated"
    shutil.copytree(good, truncated)
    lines = log.read_text().splitlines(keepends=True)
    (truncated / "rank-0" / "events.jsonl").write_text("".join(lines[:-4]) + lines[-4][:20])  # killed mid-write
    proc, report = diff(tmp_path, good, truncated)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert report["determinism"]["verdict"] in ("incomplete", "nothing_compared")
    assert "BIT-EXACT" not in proc.stdout

    garbage = tmp_path / "garbage"
    shutil.copytree(good, garbage)
    (garbage / "rank-0" / "events.jsonl").write_bytes(os.urandom(2000).replace(b"\n", b" ") + b"\n{}\n")
    proc, report = diff(tmp_path, good, garbage)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert report["determinism"]["verdict"] == "nothing_compared"
    assert first_line(proc).startswith("NOTHING COMPARED")

    newer = tmp_path / "newer"
    shutil.copytree(good, newer)
    lines = log.read_text().splitlines()
    header = json.loads(lines[0]) | {"schema": "torchrepro.events/9", "torchrepro_version": "9.0.0"}
    (newer / "rank-0" / "events.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    proc, report = diff(tmp_path, good, newer)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    newer_ending = report["determinism"]["endings"][1]
    assert any("written by torchrepro 9.0.0; this is torchrepro" in p for p in newer_ending["problems"])
    assert "written by torchrepro 9.0.0" in said(proc) and "damaged" not in said(proc)

    proc, report = diff(tmp_path, good, good)
    assert proc.returncode == 0 and report["determinism"]["verdict"] == "bit_exact"


@pytest.mark.xdist_group("verdicts-good")
def test_report_of_a_newer_schema_is_an_input_error(tmp_path, good_run):
    good = shutil.copytree(good_run, tmp_path / "good")
    log = good / "rank-0" / "events.jsonl"
    lines = log.read_text().splitlines()
    log.write_text(
        "\n".join(
            [
                json.dumps(json.loads(lines[0]) | {"schema": "torchrepro.events/9", "torchrepro_version": "0.9"}),
                *lines[1:],
            ]
        )
    )
    proc = cli("report", str(good), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "written by torchrepro 0.9" in proc.stderr and proc.stderr.count("\n") == 1


def test_doctor_trace_of_garbage_is_an_input_error(tmp_path):
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "dedicated_log_torch_trace_rank_0_abc.log").write_text('not json\n{"also": "not a record"}\n' * 50)
    proc = cli("doctor", "--trace", str(trace), "--out", str(tmp_path / "d"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "HEALTHY" not in proc.stdout and "no valid structured-trace record" in proc.stderr


# --- what is compared -----------------------------------------------------------------------


def test_zero_compared_steps_is_never_bit_exact(tmp_path):
    proc, report = check(tmp_path, "no_training.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    det = report["determinism"]
    assert det["verdict"] == "nothing_compared" and det["steps_compared"] == 0
    assert first_line(proc).startswith("NOTHING COMPARED") and "recorded no training step" in said(proc)


# a check of a compiled script is ~9 s of CPU: the loop without any update clocks its steps by backward() as the
# hand-updated one does (make test); it runs in the slow tier
@pytest.mark.parametrize(
    "extra",
    [pytest.param((), marks=pytest.mark.slow), pytest.param(("--no-update",), marks=pytest.mark.slow)],
    ids=["hand-update", "no-update"],
)
def test_loop_without_optimizer_is_clocked_by_backward(tmp_path, extra):
    proc, report = check(tmp_path, "hand_update.py", args=extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    det = report["determinism"]
    assert det["verdict"] == "bit_exact" and det["steps_compared"] == 6
    assert det["step_clock"].startswith("backward()")


def test_loop_without_dataloader_gets_batch_fingerprints(tmp_path):
    """Batches drawn by indexing tensors with a clock-seeded generator: data order is proven."""
    proc, report = check(tmp_path, "hand_update.py", "--no-localize", args=("--order-from-clock",))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fd = report["determinism"]["first_divergence"]
    assert (fd["step"], fd["what"], fd["cause"]) == (0, "batch", "data_order")


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_unseeded_initial_weights_are_init_params_before_step_0(tmp_path):
    script = tmp_path / "unseeded_init.py"
    script.write_text(
        (SCRIPTS / "hand_update.py")
        .read_text()
        .replace("torch.manual_seed(0)\n", "", 1)
        .replace(
            "data = torch.randn(256, 16)", "data = torch.randn(256, 16, generator=torch.Generator().manual_seed(0))"
        )
    )
    proc = cli("check", "--out", str(tmp_path / "c"), "--no-localize", str(script), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "c" / "report.json").read_text())
    fd = report["determinism"]["first_divergence"]
    assert fd["what"] == "init_params" and fd["cause"] == "init_params" and fd["before_step"] == 0
    assert first_line(proc).startswith("DIVERGED before step 0")
    assert "Seed before building the model" in report["findings"][0]["hint"]


def test_tolerance_is_worded_as_such(tmp_path):
    proc, report = check(tmp_path, "tiny_noise.py", "--atol", "1e-3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    det = report["determinism"]
    assert det["verdict"] == "within_tolerance"
    assert first_line(proc).startswith("WITHIN TOLERANCE") and "bit for bit" not in said(proc).replace(
        "not bit for bit", ""
    )
    largest = det["largest_difference"]["params_max_abs"]
    assert 0 < largest < 1e-3
    runs = tmp_path / "check"
    proc, report = diff(tmp_path, runs / "run-1", runs / "run-2")  # the same runs bit for bit: they differ
    assert proc.returncode == 1 and report["determinism"]["verdict"] == "diverged"


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_environment_differences_are_reported_in_every_diff(tmp_path):
    """A certain difference: the recorded value of OMP_NUM_THREADS, whatever the BLAS makes of it."""
    a = tmp_path / "t1"
    b = tmp_path / "t2"
    for path, threads in ((a, "1"), (b, "2")):
        proc = cli(
            "run", "--out", str(path), str(SCRIPTS / "deterministic.py"), cwd=tmp_path, env={"OMP_NUM_THREADS": threads}
        )
        assert proc.returncode == 0, proc.stderr
    proc, report = diff(tmp_path, a, b)
    det = report["determinism"]
    assert any("OMP_NUM_THREADS" in d for d in det["environment_differences"])
    if det["verdict"] == "bit_exact":  # this CPU computes the same with 1 and 2 threads: said as a note
        assert proc.returncode == 0 and any("environments differ" in n for n in det["notes"])
    else:
        assert det["first_divergence"]["cause"] == "environment"


# --- check-resume --------------------------------------------------------------------------


def test_check_resume_at_the_end_is_an_input_error(tmp_path):
    proc = cli(
        "check-resume", "--at", "1000", "--out", str(tmp_path / "r"), str(SCRIPTS / "resume_small.py"), cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = proc.stderr.splitlines()[-1]  # after the progress lines of the full run
    assert error.startswith("torchrepro: error: --at 1000: the run has 24 step(s)")


# --- capture that degrades ------------------------------------------------------------------


@pytest.mark.slow  # moved out of `make test` for its time (TORCHREPRO_TEST_CPU_LOG); `make test-slow` runs it
def test_an_observer_that_fails_is_a_finding_and_fails_under_strict(tmp_path):
    # `run` digests every batch (doctor alone does not: its verdicts do not read them)
    proc = cli("run", "--out", str(tmp_path / "d"), str(SCRIPTS / "observer_fails.py"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "trained" in proc.stdout  # the script itself was untouched
    shown = cli("report", str(tmp_path / "d"), "--json", str(tmp_path / "d.json"), cwd=tmp_path)
    # the observer failed on the first batch: no step was recorded, so nothing is judged (exit 1), and the
    # reason is torchrepro's failure, not a launcher out of its sight
    assert shown.returncode == 1, shown.stdout + shown.stderr
    report = json.loads((tmp_path / "d.json").read_text())
    degraded = [f for f in report["findings"] if f["code"] == "CAPTURE_DEGRADED"]
    assert degraded and "not iterable" in degraded[0]["title"] and "step events" in degraded[0]["title"]
    (nothing,) = [f for f in report["findings"] if f["code"] == "NOTHING_OBSERVED"]
    assert "torchrepro's step capture stopped: RuntimeError: this batch type is not iterable" in nothing["title"]
    assert "not of your script" in nothing["hint"] and report["verdict"].startswith("NOTHING OBSERVED")
    strict = cli("report", "--strict", str(tmp_path / "d"), cwd=tmp_path)
    assert strict.returncode == 1, strict.stdout + strict.stderr
    proc, report = check(tmp_path, "observer_fails.py")  # the steps after the failure were not recorded
    assert proc.returncode == 3 and report["determinism"]["verdict"] != "bit_exact"


def test_trace_whose_every_record_is_malformed_is_not_healthy(tmp_path):
    trace = tmp_path / "trace"
    trace.mkdir()
    line = 'V1201 08:00:00.000000 1234 torch/_dynamo/utils.py:1] {"compilation_metrics": "garbled", "frame_id": %d}\n'
    (trace / "dedicated_log_torch_trace_rank_0_x.log").write_text("".join(line % i for i in range(5)))
    proc = cli("doctor", "--trace", str(trace), "--out", str(tmp_path / "d"), cwd=tmp_path)
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    assert report["verdict"].startswith("NOTHING OBSERVED"), report["verdict"]  # not one compile could be read
    degraded = next(f for f in report["findings"] if f["code"] == "CAPTURE_DEGRADED")
    assert degraded["evidence"]["records"] == 5
    assert proc.returncode == 1
    assert cli("report", "--strict", str(tmp_path / "d"), cwd=tmp_path).returncode == 1


def test_a_run_with_no_step_and_no_compile_is_nothing_observed(tmp_path):
    """Forward passes under no_grad, nothing compiled: not a step, not a compile to judge. Never
    HEALTHY; `report` of the stored run says the same."""
    proc = cli("doctor", "--out", str(tmp_path / "d"), str(SCRIPTS / "no_training.py"), cwd=tmp_path)
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert report["verdict"] == "NOTHING OBSERVED: no training step and no compile seen in 1 captured process(es)"
    assert proc.stdout.startswith("NOTHING OBSERVED") and report["failing_findings"] == ["NOTHING_OBSERVED"]
    again = cli("report", str(tmp_path / "d"), cwd=tmp_path)
    assert again.returncode == 1 and again.stdout.startswith("NOTHING OBSERVED"), again.stdout
