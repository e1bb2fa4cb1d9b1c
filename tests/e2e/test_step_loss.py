"""The loss of a step is what the script prints for it (docs/commands.md, "the loss of a step"), at the
precision the script computed it: real scripts with several backward() calls per step, run under
``torchrepro run``, their printed losses compared bit for bit with the step events and the report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

import torchrepro
from torchrepro.eventlog.event_reader import read_events
from torchrepro.eventlog.events import Step

SCRIPTS = Path(__file__).parents[1] / "scripts"
SRC = str(Path(torchrepro.__file__).parents[1])


def run(script: str, tmp_path: Path, *options: str) -> tuple[list[Step], str, dict]:
    """The script's step events, its output and ``torchrepro report``'s JSON."""
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": SRC}  # as the test runs (tests/conftest.py sets what its processes share)
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "run", *options, "--out", str(out), str(SCRIPTS / script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-m", "torchrepro", "report", str(out), "--json", str(report)],
        capture_output=True,
        env=env,
        timeout=300,
        check=True,
    )
    return read_events(out / "rank-0" / "events.jsonl").of(Step), proc.stdout, json.loads(report.read_text())


def printed(stdout: str, name: str) -> list[float]:
    return [float(v) for v in re.findall(rf"\b{name} (\S+)", stdout)]


def test_a_closure_step_records_what_step_returns_in_float64(tmp_path):
    """LBFGS evaluates the closure (and backward) up to 20 times a step; step(closure) returns
    the first loss, a float64 here: recorded exactly (a float32 would lose its last 29 bits)."""
    steps, stdout, report = run("lbfgs_closure.py", tmp_path)
    losses = printed(stdout, "loss")
    assert len(losses) == 3 and [s.loss for s in steps] == losses
    assert all(s.backward_calls > 1 and s.loss_last is not None and s.loss_last < s.loss for s in steps)
    assert any(float(np.float32(x)) != x for x in losses)  # not float32 values
    rank = report["steps"]["per_rank"]["0"]
    assert (rank["first_loss"], rank["last_loss"]) == (losses[0], losses[-1])


def test_a_closure_steps_gradients_are_those_its_closure_computed(tmp_path):
    """optimizer.step(closure) (Lightning's automatic optimization, LBFGS): the closure zeroes the gradients
    and calls backward() inside step(); the step's gradients are those, never the previous step's that the
    parameters still hold when step() begins (nor none at step 0)."""
    steps, stdout, _ = run("closure_grads.py", tmp_path, "--grads")
    norms = printed(stdout, "grad_norm")
    assert len(norms) == len(steps) == 4
    assert [s.grad_norm for s in steps] == [round(n, 9) for n in norms]
    assert len({s.grads_fp for s in steps}) == 4 and None not in {s.grads_fp for s in steps}


def test_an_accumulated_step_records_the_sum_of_its_scaled_micro_losses(tmp_path):
    """Two micro-batches, each loss divided by 2 before backward(): the step's loss is the sum
    the script prints (loss_accum), bit for bit; nanoGPT's lossf is the last value times 2."""
    steps, stdout, report = run("grad_accumulation.py", tmp_path)
    assert [s.loss for s in steps] == printed(stdout, "loss_accum") and len(steps) == 4
    assert [s.loss_last * 2 for s in steps] == printed(stdout, "lossf")
    assert all(s.backward_calls == 2 for s in steps)
    rank = report["steps"]["per_rank"]["0"]
    assert rank["first_loss"] == steps[0].loss and rank["last_loss"] == steps[-1].loss
