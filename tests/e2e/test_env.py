"""`torchrepro env`: JSON and table output, cache permission risks, environment variables."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from rich.console import Console

from torchrepro.capture import environment as envinfo
from torchrepro.render.env_text import render_env


def _run(*args: str, **extra: str) -> subprocess.CompletedProcess:
    """`python -m torchrepro env ARGS` with extra environment variables, wide enough for tables."""
    return subprocess.run(
        [sys.executable, "-m", "torchrepro", "env", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **extra},
        timeout=120,
    )


def _json(**extra: str) -> dict:
    proc = _run("--json", **extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _cache(info: dict, name: str) -> dict:
    return next(c for c in info["caches"] if c["name"] == name)


def _var(info: dict, name: str) -> dict | None:
    return next((v for v in info["env_vars"] if v["name"] == name), None)


def test_json_is_valid_and_names_this_torch():
    info = _json()
    assert info["versions"]["torch"] == torch.__version__
    assert info["threads"]["intra_op"] >= 1
    assert len(info["env_fingerprint"]) == 16
    assert {s["name"] for s in info["determinism"]} >= {"torch.use_deterministic_algorithms", "PYTHONHASHSEED"}


def test_world_writable_inductor_cache_is_a_risk(tmp_path):
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    shared.chmod(0o777)
    info = _json(TORCHINDUCTOR_CACHE_DIR=str(shared))
    cache = _cache(info, "inductor")
    assert cache["source"] == "TORCHINDUCTOR_CACHE_DIR"
    assert cache["mode"] == "0o777"
    assert any(str(shared) in r and "run code in your training job" in r for r in cache["risks"])
    assert _var(info, "TORCHINDUCTOR_CACHE_DIR")["risky"]


def test_private_inductor_cache_is_not_a_risk(tmp_path):
    private = tmp_path / "private-cache"
    private.mkdir()
    private.chmod(0o700)
    info = _json(TORCHINDUCTOR_CACHE_DIR=str(private))
    cache = _cache(info, "inductor")
    assert cache["exists"] and cache["mode"] == "0o700"
    assert cache["risks"] == []
    assert not _var(info, "TORCHINDUCTOR_CACHE_DIR")["risky"]


def test_missing_cache_under_a_world_writable_parent_is_a_risk(tmp_path, monkeypatch):
    parent = tmp_path / "open"
    parent.mkdir()
    parent.chmod(0o777)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(parent / "not-yet"))
    risks = _cache(envinfo.collect(), "inductor")["risks"]
    assert any("does not exist yet" in r and str(parent) in r for r in risks)


def test_writable_parent_is_a_risk_but_a_sticky_one_is_not(tmp_path, monkeypatch):
    parent = tmp_path / "parent"
    cache = parent / "cache"
    cache.mkdir(parents=True)
    cache.chmod(0o700)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    parent.chmod(0o777)
    assert any(f"parent {parent}" in r for r in _cache(envinfo.collect(), "inductor")["risks"])
    parent.chmod(0o1777)
    assert _cache(envinfo.collect(), "inductor")["risks"] == []


def test_omp_num_threads_is_reported_with_its_value():
    info = _json(OMP_NUM_THREADS="1")
    var = _var(info, "OMP_NUM_THREADS")
    assert var["value"] == "1" and "cache key" in var["note"]
    assert info["threads"]["intra_op"] == 1


def test_unset_pythonhashseed_and_omp_are_flagged(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    info = envinfo.collect()
    for name in ("PYTHONHASHSEED", "OMP_NUM_THREADS"):
        var = _var(info, name)
        assert var["value"] is None and var["risky"]


@pytest.mark.parametrize(
    ("name", "value", "risky"),
    [
        ("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1", True),
        ("TORCH_COMPILE_DISABLE", "1", True),
        ("CUDA_LAUNCH_BLOCKING", "1", True),
        ("CUBLAS_WORKSPACE_CONFIG", ":4096:8", False),
        ("CUBLAS_WORKSPACE_CONFIG", ":0:0", True),
        ("NCCL_DEBUG", "INFO", False),
        ("TORCH_LOGS", "recompiles", False),
        ("WORLD_SIZE", "2", False),
    ],
)
def test_relevant_variables_are_listed(monkeypatch, name, value, risky):
    monkeypatch.setenv(name, value)
    var = _var(envinfo.collect(), name)
    assert var is not None and var["value"] == value and var["note"]
    assert var["risky"] is risky


def test_unrelated_variables_are_not_listed(monkeypatch):
    monkeypatch.setenv("TORCHREPRO_TEST_UNRELATED", "x")
    assert _var(envinfo.collect(), "TORCHREPRO_TEST_UNRELATED") is None


def test_fingerprint_follows_numerics_not_ranks_or_logging(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TORCH_LOGS", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_MAX_AUTOTUNE", raising=False)
    base = envinfo.collect()["env_fingerprint"]
    assert envinfo.collect()["env_fingerprint"] == base
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("TORCH_LOGS", "recompiles")
    assert envinfo.collect()["env_fingerprint"] == base
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "1")
    assert envinfo.collect()["env_fingerprint"] != base


def test_collect_is_fast_and_json_serialisable():
    envinfo.collect()
    start = time.perf_counter()
    info = envinfo.collect()
    assert time.perf_counter() - start < 1.0
    buf = io.StringIO()
    envinfo.write_json(info, buf)
    assert json.loads(buf.getvalue()) == info


def test_collect_does_not_import_inductor(run_python):
    proc = run_python(
        "import sys, torch\n"
        "from torchrepro.capture import environment as envinfo\n"
        "envinfo.collect()\n"
        "print('torch._dynamo' in sys.modules, torch.cuda.is_initialized())\n"
    )
    assert proc.stdout.split() == ["False", "False"]


def test_render_marks_switches_and_risks(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    buf = io.StringIO()
    render_env(envinfo.collect(), Console(file=buf, width=300))
    out = buf.getvalue()
    assert torch.__version__ in out
    assert "✗" in out and "Determinism switches" in out and str(shared) in out


def test_plain_env_prints_tables_and_exits_0():
    proc = _run()
    assert proc.returncode == 0, proc.stderr
    assert torch.__version__ in proc.stdout
    assert "Determinism switches" in proc.stdout and "Environment variables" in proc.stdout


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_env_says_which_step_codec_writes_the_logs_and_it_is_no_part_of_the_fingerprint():
    built = _json()
    pure = _json(TORCHREPRO_PURE_PYTHON_CODEC="1")
    from torchrepro.eventlog import stepstream

    assert built["step_codec"] == ("C" if stepstream._C is not None else stepstream.CODEC)
    assert pure["step_codec"].startswith("Python (") and "TORCHREPRO_PURE_PYTHON_CODEC" in pure["step_codec"]
    # the two codecs write the same bytes: which one ran changes no numerics and no cache key
    assert pure["env_fingerprint"] == built["env_fingerprint"]
    table = _run(TORCHREPRO_PURE_PYTHON_CODEC="1")
    assert table.returncode == 0 and "step codec" in table.stdout and "TORCHREPRO_PURE_PYTHON_CODEC" in table.stdout
