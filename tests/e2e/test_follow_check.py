"""`check` and `drift` see every rank of a job whose ranks the script starts itself: Lightning's own
launcher and torch.multiprocessing.spawn (torchrepro.runtime.follow). Two runs with two rank logs each, the
rank that diverged named and its step replayed on that rank, spawned ranks seeded by --seed, and
drift's runs with both ranks' metric."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from torchrepro.eventlog.event_reader import read_events
from torchrepro.eventlog.events import Step

SCRIPTS = Path(__file__).parents[1] / "scripts"
pytestmark = pytest.mark.distributed


def torchrepro(tmp_path: Path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", *args[:1], "--out", str(out), *args[1:]],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=900,
        env={**os.environ, "LAUNCH_DIGESTS": str(tmp_path / "digests")},
    )
    assert (out / "report.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads((out / "report.json").read_text())


def rank_steps(run: Path) -> dict[str, int]:
    """Each rank folder of a run and its number of steps."""
    return {d.name: len(read_events(d / "events.jsonl").of(Step)) for d in sorted(run.glob("rank-*"))}


def assert_rank1_noise_found(code: int, report: dict, runs: list[Path]) -> None:
    """Both runs hold both ranks; the divergence is rank 1's, and its replay on rank 1 names the op."""
    assert code == 1, report["findings"]
    for run in runs:
        assert rank_steps(run) == {"rank-0": 3, "rank-1": 3}
    fd = report["determinism"]["first_divergence"]
    assert (fd["step"], fd["rank"], fd["what"]) == (0, 1, "loss"), fd
    assert fd["op"].startswith("aten.randn") and fd["phase"] == "forward", fd  # from the replays of rank 1
    assert fd["cause"] == "rng"


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_spawned_ranks_unseeded_script_is_bit_exact_with_seed(tmp_path):
    """The script draws its model and batches from the global generators and never seeds them:
    --seed seeds the ranks torch.multiprocessing.spawn starts, as it seeds torchrun's."""
    code, report = torchrepro(tmp_path, "check", "--seed", "3", str(SCRIPTS / "spawn_ranks.py"), "--", "--unseeded")
    assert code == 0, report["findings"]
    assert report["verdict"].startswith("BIT-EXACT") and report["determinism"]["steps_compared"] == 3
    for run in ("run-1", "run-2"):
        assert rank_steps(tmp_path / "out" / run) == {"rank-0": 3, "rank-1": 3}


@pytest.mark.slow  # two 2-rank runs and four replays: make test-slow
def test_spawned_rank_that_diverges_is_named_and_replayed(tmp_path):
    code, report = torchrepro(tmp_path, "check", "--no-fixes", str(SCRIPTS / "spawn_ranks.py"), "--", "--noise-rank1")
    out = tmp_path / "out"
    assert_rank1_noise_found(code, report, [out / "run-1", out / "run-2"])
    assert fd_source(report).endswith("spawn_ranks.py:24")
    assert sorted(p.name for p in (out / "replays").glob("*.json")) == [
        "a.rank0.json",
        "a.rank1.json",
        "b.rank0.json",
        "b.rank1.json",
    ]


@pytest.mark.slow  # Lightning's 2-rank runs and four replays: make test-slow
def test_lightning_rank_that_diverges_is_named_and_replayed(tmp_path):
    """Lightning starts rank 1 below rank 0; the replay ends rank 0 only once rank 1 recorded its step."""
    code, report = torchrepro(
        tmp_path, "check", "--no-fixes", str(SCRIPTS / "lightning_ranks.py"), "--", "--noise-rank1"
    )
    out = tmp_path / "out"
    assert_rank1_noise_found(code, report, [out / "run-1", out / "run-2"])
    assert fd_source(report).endswith("lightning_ranks.py:23")
    assert (out / "replays" / "a.rank1.json").exists() and (out / "replays" / "b.rank1.json").exists()


def fd_source(report: dict) -> str:
    return report["determinism"]["first_divergence"]["source"] or ""


@pytest.mark.slow  # two 2-rank runs: make test-slow (bit-exact with --seed stays in make test)
def test_drift_on_spawned_ranks_sees_both_ranks(tmp_path):
    """One factor (init), two levels: the levels reach the spawned ranks (the unseeded script's two
    ranks draw the same first batch from the level's stream, the two levels different ones); each
    rank logs its loss, rank 0's is the run's metric."""
    code, report = torchrepro(
        tmp_path,
        "drift",
        "--runs",
        "2",
        "--vary",
        "init",
        "--jobs",
        "1",
        "--metric",
        "loss",
        str(SCRIPTS / "spawn_ranks.py"),
        "--",
        "--unseeded",
    )
    assert code in (0, 1), report
    runs = report["drift"]["runs"]
    assert len(runs) == 2 and all(r["status"] == "ok" for r in runs), runs
    first_batches = []
    for run in runs:
        logs = [
            [e.to_json() for e in read_events(tmp_path / run["dir"] / f"rank-{rank}" / "events.jsonl").events]
            for rank in (0, 1)
        ]
        losses = [[e["value"] for e in log if e["kind"] == "metric" and e["name"] == "loss"] for log in logs]
        assert [len(x) for x in losses] == [1, 1] and run["metric"] == losses[0][0]
        batches = {next(e["batch_fp"] for e in log if e["kind"] == "step") for log in logs}
        assert len(batches) == 1, "the two ranks were not seeded alike"
        first_batches.append(batches.pop())
    assert first_batches[0] != first_batches[1]


@pytest.mark.slow  # a full run and a resumed one, two spawned ranks each: make test-slow
def test_check_resume_on_spawned_ranks_is_bit_exact(tmp_path):
    """Each spawned rank saves and loads its own RNG states and position (the group's rank)."""
    code, report = torchrepro(tmp_path, "check-resume", "--at", "3", str(SCRIPTS / "spawn_resume.py"))
    assert code == 0, report["findings"]
    assert report["verdict"].startswith("BIT-EXACT RESUME")
    saved = tmp_path / "out" / "checkpoint"
    assert sorted(p.name for p in saved.glob("position-rank*.json")) == ["position-rank0.json", "position-rank1.json"]
    assert rank_steps(tmp_path / "out" / "resumed") == {"rank-0": 5, "rank-1": 5}
