"""Checkpoints and bit-exact resume: `torchrepro.checkpoint` and `torchrepro check-resume`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchrepro import checkpoint, seed_everything
from torchrepro.errors import RngStateError

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "tests" / "scripts" / "resume_small.py"


def check_resume(tmp_path: Path, script: Path, *args: str, options: tuple[str, ...] = ()):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchrepro",
            "check-resume",
            "--out",
            str(tmp_path / "r"),
            *options,
            str(script),
            "--",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=os.environ,
        timeout=600,
    )
    report = (
        json.loads((tmp_path / "r" / "report.json").read_text()) if (tmp_path / "r" / "report.json").exists() else None
    )
    return proc, report


@pytest.mark.inductor
@pytest.mark.distributed
@pytest.mark.slow  # inductor on two ranks, run twice: make test-slow
def test_example_resumes_bit_exact_compiled_two_ranks(tmp_path):
    proc, report = check_resume(tmp_path, ROOT / "examples" / "resume_ddp.py", options=("--nproc", "2", "--at", "5"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    det = report["determinism"]
    assert det["verdict"] == "bit_exact" and det["steps_compared"] == 13 and det["resume_at"] == 5
    assert proc.stdout.startswith("BIT-EXACT RESUME")
    assert sorted(p.name for p in (tmp_path / "r" / "checkpoint").glob("*rank*.json")) == [
        "position-rank0.json",
        "position-rank1.json",
        "rng-rank0.json",
        "rng-rank1.json",
    ]


@pytest.mark.parametrize(
    "forget, cause",
    [
        ("nothing", None),
        ("rng", "rng"),
        # each case is a full run and a resumed one; deciding the cause: test_determinism_logic.py
        pytest.param("data", "data_order", marks=pytest.mark.slow),
        pytest.param("optimizer", "unknown", marks=pytest.mark.slow),
    ],
)
@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_a_forgotten_piece_of_state_is_named(tmp_path, forget, cause):
    proc, report = check_resume(tmp_path, SMALL, "--forget", forget, options=("--at", "11"))
    fd = report["determinism"]["first_divergence"]
    if cause is None:
        assert proc.returncode == 0 and fd is None
        return
    assert proc.returncode == 1
    assert fd["step"] == 11 and fd["cause"] == cause
    hint = report["findings"][0]["hint"]
    assert {"rng": "RNG", "data_order": "batches", "unknown": "optimizer"}[cause] in hint


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_a_script_without_checkpoint_calls_is_a_clear_error(tmp_path):
    proc, _ = check_resume(tmp_path, ROOT / "tests" / "scripts" / "deterministic.py", options=("--at", "2"))
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("torchrepro: error:") and "saved no checkpoint after step 2" in last
    assert "Traceback" not in proc.stderr


def test_checkpoint_refuses_another_world_size_unless_rederived(tmp_path, monkeypatch):
    seed_everything(4)
    checkpoint.save(tmp_path, step=7, epoch=1, batch=3)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RngStateError, match="world size 1"):
        checkpoint.load(tmp_path)
    resume = checkpoint.load(tmp_path, rederive=True)
    assert (resume.step, resume.epoch, resume.batch, resume.rng) == (7, 1, 3, None)
    resume.apply()
    first = torch.rand(2)
    checkpoint.load(tmp_path, rederive=True).apply()
    assert torch.equal(first, torch.rand(2))  # re-derived streams are reproducible


def test_checkpoint_round_trip_restores_streams(tmp_path):
    seed_everything(4)
    torch.rand(3)
    checkpoint.save(tmp_path, step=2)
    expected = torch.rand(4)
    torch.rand(100)
    resume = checkpoint.load(tmp_path)
    resume.apply()
    assert torch.equal(torch.rand(4), expected)
    (tmp_path / "position-rank0.json").write_text("{broken")
    with pytest.raises(RngStateError, match="not a readable checkpoint"):
        checkpoint.load(tmp_path)
