"""``torchrepro compare`` end to end on tests/scripts/equivalence.py: one process accumulating
micro-batches, DDP and FSDP2 on gloo, a sampler repeating data, a resumed run (the verdict logic
on event logs built in memory: tests/unit/test_compare.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "equivalence.py"


def compare(tmp_path: Path, *argv: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "compare", "--out", str(tmp_path / "c"), *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=os.environ,
        timeout=600,
    )
    path = tmp_path / "c" / "report.json"
    assert path.exists(), proc.stderr[-3000:]
    return proc.returncode, json.loads(path.read_text())["compare"]


S = str(SCRIPT)


@pytest.mark.slow  # three launches of one rank: ~20-30 s on two shared cores
def test_accumulation_matches_one_large_batch_until_the_loss_is_averaged_over_the_wrong_count(tmp_path):
    """A: one batch of 16 per step; B: two micro-batches of 8 accumulated, from step 2 divided by 3."""
    one_batch = [S, "--accum", "1", "--epochs", "1"]
    code, c = compare(tmp_path, *one_batch, "::", S, "--accum", "2", "--epochs", "1", "--wrong-count-from", "2")
    assert code == 1 and c["verdict"] == "different"
    assert (c["first_out"]["step"], c["first_out"]["quantity"]) == (2, "loss")
    assert [r["status"] for r in c["series"]] == ["within", "within", "out", "out"]  # accumulation: same training
    assert c["steps_compared"] == 4 and c["band"]["zero"] and c["tensors_compared"] == 16
    (rank,) = c["per_rank"]  # the bits part at step 0 already: sums taken in another order
    assert (rank["status"], rank["step"]) == ("diverged", 0) and rank["what"] in ("loss", "grads")


@pytest.mark.slow  # three launches, one of two ranks: ~30 s
def test_ddp_on_two_ranks_is_equivalent_to_one_rank_accumulating(tmp_path):
    code, c = compare(tmp_path, "--nproc-b", "2", S, "--accum", "2", "::", S, "--mode", "ddp")
    assert code == 0 and c["verdict"] == "equivalent", c["reason"]
    assert c["steps_compared"] == 8 and c["tensors_compared"] == 32
    assert [(r["rank"], r["evidence"]) for r in c["per_rank"]][1] == (1, "absent")  # rank 1 has no counterpart in A


@pytest.mark.slow  # three launches of two ranks: ~40 s
def test_ddp_and_fsdp2_are_equivalent(tmp_path):
    code, c = compare(tmp_path, "--nproc", "2", S, "--mode", "ddp", "::", S, "--mode", "fsdp2")
    assert code == 0 and c["verdict"] == "equivalent", c["reason"]
    assert c["tensors_compared"] == 32  # FSDP2's shards joined into full tensors
    # the parameters are DTensor shards in B, plain tensors in A: their fingerprints cannot be compared
    assert {r["evidence"] for r in c["per_rank"]} == {"absent"} and not c["bit_exact"]


@pytest.mark.slow  # three launches of two ranks each: ~40 s each
@pytest.mark.parametrize(
    ("flag", "step", "kind"), [("--wrong-rank", 0, "same_batch_on_ranks"), ("--no-set-epoch", 4, "batch_repeated")]
)
def test_a_sampler_that_repeats_data_is_different_and_named(tmp_path, flag, step, kind):
    code, c = compare(tmp_path, "--nproc", "2", S, "--mode", "ddp", "::", S, "--mode", "ddp", flag)
    assert code == 1 and c["verdict"] == "different"
    assert (c["first_out"]["quantity"], c["first_out"]["step"]) == ("batch", step)
    assert c["data_order"]["b"][0]["kind"] == kind and c["data_order"]["a-1"] == []


@pytest.mark.slow  # four launches: ~45 s
def test_a_resumed_run_is_equivalent_to_the_continuous_one_on_the_steps_it_ran(tmp_path):
    code, c = compare(tmp_path, "--resume-b-at", "3", S, "--accum", "2", "::", S, "--accum", "2")
    assert code == 0 and c["verdict"] == "equivalent" and c["bit_exact"]
    assert (c["first_step"], c["last_step"]) == (3, 7)
    assert any("steps 0-2 of A were not compared" in n for n in c["notes"])


@pytest.mark.slow  # three launches of one rank: ~20-30 s
def test_steps_b_ran_and_a_did_not_are_never_equivalent(tmp_path):
    """A trains one epoch (4 steps), B the same two epochs (8): they agree bit for bit on A's 4 steps,
    and B's last 4 were compared with nothing."""
    code, c = compare(tmp_path, S, "--epochs", "1", "::", S, "--epochs", "2")
    assert code == 1 and c["verdict"] == "abstain", c["reason"]
    assert (c["steps_compared"], c["steps_a"], c["steps_b"]) == (4, 4, 8)
    assert "b recorded 4 step(s) (steps 4-7) that a-1 and a-2 did not" in c["reason"]
