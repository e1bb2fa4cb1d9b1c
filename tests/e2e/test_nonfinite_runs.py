"""Runs whose values are not finite and models built on the meta device, end to end: a NaN loss is
a value (bit-identical NaN runs are BIT-EXACT, runs that differ in where NaN appears DIVERGED at
that step), reported as a finding with its step, rank and tensor; parameters that to_empty() left
uninitialised are named; every capture path (op replay, fingerprints, snapshots, the graph probe)
works on a model built on meta, in one process and under FSDP2 on 2 gloo ranks. The judgements on
hand-built logs: tests/unit/test_nonfinite.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchrepro._compat import installed_torch_version

SCRIPTS = Path(__file__).parents[1] / "scripts"


def torchrepro(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchrepro", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def report_of(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


def findings(report: dict) -> dict[str, dict]:
    return {f["code"]: f for f in report["findings"]}


def test_check_of_a_nan_run_is_bit_exact_names_the_nan_and_prints_its_verdict(tmp_path):
    """The 9-line eager script whose loss is NaN from step 0, checked: the two runs hold the same bits
    at every step, so BIT-EXACT (no divergence, no fix ladder), with the NaN loss and gradients as
    findings; the verdict reaches the terminal and the command exits 0, without a traceback."""
    proc = torchrepro("check", "--out", str(tmp_path / "check"), str(SCRIPTS / "nan_loss.py"), cwd=tmp_path)
    report = report_of(tmp_path / "check")
    det = report["determinism"]
    assert det["verdict"] == "bit_exact" and det["first_divergence"] is None and det["steps_compared"] == 4
    assert "fixes" not in det and sorted(
        p.name for p in (tmp_path / "check").iterdir() if p.name.startswith("run-")
    ) == [
        "run-1",
        "run-2",
    ]
    found = findings(report)
    assert found["NONFINITE_LOSS"]["evidence"]["step"] == 0 and found["NONFINITE_LOSS"]["evidence"]["value"] == "NaN"
    assert found["NONFINITE_LOSS"]["evidence"]["runs"] == ["run-1", "run-2"]  # alike in both runs: said once
    grad = found["NONFINITE_GRAD"]
    assert grad["evidence"]["step"] == 0 and grad["evidence"]["tensor"] == "weight" and grad["evidence"]["rank"] == 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0].startswith("BIT-EXACT")
    assert "the loss is NaN at step 0 (rank 0)" in proc.stdout


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_runs_that_differ_in_where_nan_appears_diverge_at_that_step(tmp_path):
    """NaN from step 2 in one run, from step 3 in the other: the same bits up to step 1, then a NaN
    against a number at step 2, in the loss: diff says DIVERGED there."""
    for name, nan_at in (("a", "2"), ("b", "3")):
        proc = torchrepro(
            "run", "--out", str(tmp_path / name), "--grads", str(SCRIPTS / "nan_loss.py"), nan_at, cwd=tmp_path
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    proc = torchrepro(
        "diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json", str(tmp_path / "diff.json"), cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads((tmp_path / "diff.json").read_text())
    fd = report["determinism"]["first_divergence"]
    assert (fd["step"], fd["what"]) == (2, "loss")
    assert proc.stdout.splitlines()[0].startswith("DIVERGED at step 2 (rank 0, loss)")
    losses = {
        f["title"].split(":")[0]: f["evidence"]["step"] for f in report["findings"] if f["code"] == "NONFINITE_LOSS"
    }
    assert losses == {"A": 2, "B": 3}


def test_doctor_names_the_parameters_to_empty_left_uninitialised(tmp_path):
    """A model built on meta and given memory with to_empty(): without an initialisation after it,
    doctor names every parameter as never initialised and fails the run; with reset_parameters() on
    every submodule, no such finding and the run is healthy."""
    proc = torchrepro("doctor", "--out", str(tmp_path / "bare"), str(SCRIPTS / "meta_init.py"), cwd=tmp_path)
    report = report_of(tmp_path / "bare")
    uninit = findings(report)["UNINITIALISED_PARAMETERS"]
    assert uninit["evidence"]["parameters"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert uninit["evidence"]["modules"] == ["0", "2"] and uninit["evidence"]["module"] == "Sequential"
    assert uninit["evidence"]["ranks"] == [0] and "reset_parameters()" in uninit["hint"]
    assert proc.returncode == 1 and "UNINITIALISED_PARAMETERS" in report["failing_findings"]
    saved = {name: tmp_path / f"{name}.pt" for name in ("plain", "doctor")}
    plain = subprocess.run(
        [sys.executable, str(SCRIPTS / "meta_init.py"), "--init", "--save", str(saved["plain"])],
        cwd=tmp_path,
        timeout=300,
    )
    assert plain.returncode == 0
    proc = torchrepro(
        "doctor",
        "--out",
        str(tmp_path / "init"),
        str(SCRIPTS / "meta_init.py"),
        "--init",
        "--save",
        str(saved["doctor"]),
        cwd=tmp_path,
    )
    report = report_of(tmp_path / "init")
    assert proc.returncode == 0, report["findings"]
    assert not {"UNINITIALISED_PARAMETERS", "NONFINITE_PARAMETER", "NONFINITE_LOSS"} & set(findings(report))
    # observing to_empty() and the first forward's values changes nothing the script computes
    a, b = (torch.load(saved[name], weights_only=True) for name in ("plain", "doctor"))
    assert a.keys() == b.keys() and all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)


def test_check_of_a_model_built_on_meta_replays_the_step_and_names_the_op(tmp_path):
    """The op replay of step 0 starts with the script, so it records the model being built on the meta
    device: it no longer fails there, and names the op, module and line that differ."""
    proc = torchrepro(
        "check",
        "--no-fixes",
        "--out",
        str(tmp_path / "check"),
        str(SCRIPTS / "meta_init.py"),
        "--init",
        "--noise",
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    fd = report_of(tmp_path / "check")["determinism"]["first_divergence"]
    assert (fd["step"], fd["cause"], fd["module"], fd["phase"]) == (0, "rng", "Sequential.2", "forward")
    assert fd["op"].startswith("aten.randn") and fd["source"].endswith("meta_init.py:25")
    assert "localisation_note" not in fd["evidence"]


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_compare_of_a_nan_reference_abstains(tmp_path):
    """A reference whose loss turns NaN at step 2: no band of NaN judges B, so ABSTAIN, with the reason
    and the NaN as a finding, never DIFFERENT "by inf"."""
    script = str(SCRIPTS / "nan_loss.py")
    proc = torchrepro("compare", "--out", str(tmp_path / "cmp"), script, "2", "::", script, "2", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = report_of(tmp_path / "cmp")
    assert report["compare"]["verdict"] == "abstain" and "inf" not in report["compare"]["reason"]
    assert report["compare"]["first_nonfinite"]["step"] == 2
    assert proc.stdout.splitlines()[0].startswith("ABSTAIN: A's loss is NaN at step 2")
    assert findings(report)["NONFINITE_LOSS"]["evidence"]["runs"] == ["a-1", "a-2", "b"]


FSDP2_OK = pytest.mark.skipif(
    tuple(int(n) for n in installed_torch_version().split("+")[0].split(".")[:2]) < (2, 7),
    reason="torch 2.6's FSDP2 fails on CPU by itself (AttributeError: 'Stream' object has no attribute 'record_event')",
)


@pytest.mark.slow  # two 2-rank FSDP2 jobs and a replay: make test-slow
@pytest.mark.distributed
@FSDP2_OK
def test_fsdp2_blocks_left_uninitialised_are_named_and_the_replay_records_the_step(tmp_path):
    """FSDP2 the way PyTorch's example builds it (meta, fully_shard, to_empty, the root's own
    reset_parameters): the blocks' parameters are named as never initialised on both ranks; with every
    submodule initialised, no finding. The op replay of step 0 records the sharded model being built
    and trained on both ranks (it failed on meta tensors and then on DTensors)."""
    script = str(SCRIPTS / "fsdp2_meta.py")
    proc = torchrepro("doctor", "--nproc", "2", "--out", str(tmp_path / "bare"), script, cwd=tmp_path)
    report = report_of(tmp_path / "bare")
    uninit = findings(report)["UNINITIALISED_PARAMETERS"]
    assert uninit["evidence"]["ranks"] == [0, 1] and uninit["evidence"]["count"] == 8 and uninit["evidence"]["of"] == 10
    assert uninit["evidence"]["modules"] == ["layers.0.norm", "layers.0.ffn", "layers.1.norm", "layers.1.ffn"]
    assert proc.returncode == 1
    proc = torchrepro("doctor", "--nproc", "2", "--out", str(tmp_path / "init"), script, "--init-all", cwd=tmp_path)
    report = report_of(tmp_path / "init")
    assert not {"UNINITIALISED_PARAMETERS", "NONFINITE_PARAMETER", "NONFINITE_LOSS"} & set(findings(report))
    replay = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        + ["-m", "torchrepro", "run", "--replay-step", "0", "--out", str(tmp_path / "replay"), script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert replay.returncode == 0, replay.stderr[-3000:]
    for rank in (0, 1):
        ops = json.loads((tmp_path / "replay" / f"rank-{rank}" / f"replay.rank{rank}.json").read_text())["ops"]
        assert any(o["op"] == "aten.empty.memory_format" for o in ops)  # the model built on meta, recorded
        assert {o["phase"] for o in ops} == {"forward", "backward"}
        assert any(o["module"] and o["module"].startswith("FSDPModel.layers.0") for o in ops)


@pytest.mark.slow  # an inductor compile: make test-slow
@pytest.mark.inductor
def test_graph_probe_and_snapshots_of_a_compiled_model_built_on_meta(tmp_path):
    """Compiled with inductor after to_empty(): check's runs probe each compiled graph and keep parameter
    snapshots (--rtol), and agree bit for bit."""
    proc = torchrepro(
        "check",
        "--rtol",
        "1e-6",
        "--out",
        str(tmp_path / "check"),
        str(SCRIPTS / "meta_init.py"),
        "--init",
        "--compile",
        "inductor",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    det = report_of(tmp_path / "check")["determinism"]
    probes = det["graph_probes"]
    assert probes and not any(p.get("error") for p in probes), probes
    assert det["curve"] and det["curve"][-1]["max_abs"] == 0


def test_a_replay_that_failed_under_torchrun_is_said_with_its_ranks_exception():
    """Under torchrun the launcher's own stderr ends in ChildFailedError; what the note says is the
    replayed rank's exception (as it was before replays worked on meta tensors)."""
    from torchrepro.commands.check.runs import _why_no_record
    from torchrepro.commands.launcher import ChildResult

    launcher = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "fsdp2_meta.py FAILED"]
    rank = ["[rank0]: Traceback (most recent call last):", "[rank0]: TypeError: cannot fingerprint a tensor on meta"]
    failed = ChildResult(1, launcher, rank_stderr_tails={0: rank, 1: ["[rank1]: RuntimeError: peer gone"]})
    assert _why_no_record(failed, 0) == "the replay exited with 1: TypeError: cannot fingerprint a tensor on meta"
    assert _why_no_record(failed, 0, rank=1) == "the replay exited with 1: RuntimeError: peer gone"
