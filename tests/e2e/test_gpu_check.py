"""`make gpu` (gpu/check.py) where no GPU is: its refusal, its options, its per-check line and exit
status. The checks themselves need a CUDA device (docs/evidence/gpu.md)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "gpu" / "check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", CHECK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


gpu = _module()


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True, timeout=120)


def test_without_cuda_one_skip_line_and_exit_2():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: make gpu runs the checks here")
    proc = _run()
    assert proc.returncode == 2 and proc.stderr == ""
    (line,) = proc.stdout.splitlines()
    assert line.startswith("SKIP  all") and "no CUDA device" in line and "nothing checked" in line


def test_list_names_every_check_without_a_gpu():
    proc = _run("--list")
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[0] for line in proc.stdout.splitlines()] == list(gpu.CHECKS)
    assert all((gpu.SCRIPTS / name).is_file() for name in ("rng_resume.py", "atomic_race.py", "cache_warm.py"))


@pytest.mark.parametrize(
    "args, says",
    [(["--only", "atomic-race,nope"], "unknown check nope"), (["--timeout", "0"], "must be a number > 0")],
)
def test_bad_arguments_are_one_line_and_exit_2(args, says):
    proc = _run(*args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and says in proc.stderr and proc.stderr.startswith("gpu/check.py: error:")


def test_line_format():
    line = gpu.format_line(gpu.Result("cache-warm-start", "PASS", "first step 9.1 s cold,\n0.8 s warm", 41.26))
    assert line == "PASS  cache-warm-start      first step 9.1 s cold, 0.8 s warm (41.3 s)"
    assert gpu.format_line(gpu.Result("x", "SKIP", "why")) == "SKIP  x                     why"
    assert gpu.format_line(gpu.Result("x", "FAIL", "\x1b[2Jboom")).endswith("  \\x1b[2Jboom")
    with pytest.raises(ValueError, match="status must be one of"):
        gpu.format_line(gpu.Result("x", "OK", ""))


def test_a_failing_or_crashing_check_is_a_fail_line_and_exit_1_a_skipped_one_fails_nothing(tmp_path):
    def passes(ctx):
        return f"worked in {ctx.work.name}"

    def fails(ctx):
        raise gpu.CheckFailed("expected 2, measured 3")

    def crashes(ctx):
        return {}["missing"]

    lines: list[str] = []
    ctx = gpu.Context(tmp_path, timeout=5)
    checks = {"passes": passes, "fails": fails, "crashes": crashes, "kernel": gpu.check_atomic_kernel}
    results = gpu.run_checks(checks, ctx, lines.append)
    assert [r.status for r in results] == ["PASS", "FAIL", "FAIL", "SKIP"] and gpu.exit_code(results) == 1
    assert lines[0].startswith(f"PASS  passes                worked in {tmp_path.name} (")
    assert "expected 2, measured 3" in lines[1] and "KeyError: 'missing'" in lines[2]
    assert lines[3].startswith("SKIP  kernel") and "atomic-race wrote no first divergence" in lines[3]
    assert gpu.exit_code(results[:1]) == 0 and gpu.exit_code([results[0], results[3]]) == 0


def test_a_command_past_its_timeout_fails_the_check(tmp_path):
    ctx = gpu.Context(tmp_path, timeout=0.5)
    with pytest.raises(gpu.CheckFailed, match="timed out after"):
        ctx.run([sys.executable, "-c", "import time; time.sleep(5)"])
    assert ctx.env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor-cache")
    assert "CUBLAS_WORKSPACE_CONFIG" not in ctx.env  # the audit check starts from it unset


def test_an_unexpected_exit_names_the_scripts_error_where_a_run_recorded_one(tmp_path):
    import json

    proc = subprocess.CompletedProcess([], 3, stdout="", stderr="torchrepro: report in out/report.json\n")
    assert gpu._why(proc) == "torchrepro: report in out/report.json"
    run = tmp_path / "out" / "run-1"
    run.mkdir(parents=True)
    tail = ["Traceback (most recent call last):", '  File "x.py", line 3', "RuntimeError: an illegal sync", ""]
    (run / "run.json").write_text(json.dumps({"stderr_tail": tail}))
    assert gpu._why(proc, tmp_path / "out") == "run-1: RuntimeError: an illegal sync"
    with pytest.raises(gpu.CheckFailed, match=r"doctor exited 3: run-1: RuntimeError: an illegal sync"):
        gpu._expect(proc, (0, 1), "doctor", tmp_path / "out")
