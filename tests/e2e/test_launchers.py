"""Every rank, however it is launched: Lightning's own launcher, torch.multiprocessing.spawn and
`accelerate launch` start ranks below the process `torchrepro doctor` runs; each captures itself
(torchrepro.runtime.follow), the report merges them, and capture does not change what they compute."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parents[1] / "scripts"
ACCELERATE = Path(sys.executable).with_name("accelerate")
# On CPU, `--cpu --num_processes 2` starts one process (accelerate wants mpirun for more);
# `--multi_gpu` runs torchrun in-process, and Accelerator(cpu=True) trains on gloo.
ACCELERATE_LAUNCH = [
    str(ACCELERATE),
    "launch",
    "--multi_gpu",
    "--num_processes",
    "2",
    "--num_machines",
    "1",
    "--mixed_precision",
    "no",
    "--dynamo_backend",
    "no",
]
pytestmark = pytest.mark.distributed


def doctor(tmp_path: Path, *command: str, options: tuple[str, ...] = ()) -> tuple[int, dict, str]:
    """`torchrepro doctor` on a command; parameter digests go to tmp_path/digests-captured."""
    out = tmp_path / "run"
    env = {**os.environ, "LAUNCH_DIGESTS": str(tmp_path / "digests-captured")}
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "doctor", "--out", str(out), *options, *command],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=400,
    )
    assert (out / "report.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads((out / "report.json").read_text()), proc.stderr


TEARDOWN_ABORT = "terminate called without an active exception"  # after the work is done (FINDINGS.md)


def plain(tmp_path: Path, *command: str) -> None:
    """The same command without torchrepro; digests go to tmp_path/digests-plain."""
    env = {**os.environ, "LAUNCH_DIGESTS": str(tmp_path / "digests-plain")}
    proc = subprocess.run([*command], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=400)
    assert proc.returncode == 0 or TEARDOWN_ABORT in proc.stderr, proc.stderr[-3000:]


def digests(tmp_path: Path, kind: str) -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted((tmp_path / f"digests-{kind}").glob("rank*.sha"))}


def codes(report: dict) -> list[str]:
    return [f["code"] for f in report["findings"]]


def finding(report: dict, code: str) -> dict:
    return next(f for f in report["findings"] if f["code"] == code)


def assert_two_ranks_with_planted_recompile(report: dict, run: Path) -> None:
    assert report["run"]["ranks_present"] == [0, 1] and report["run"]["world_size"] == 2
    assert report["run"]["ranks_missing"] == [] and "RANKS_MISSING" not in codes(report)
    assert sorted(p.name for p in run.glob("rank-*")) == ["rank-0", "rank-1"]
    assert all(r["steps"] == 6 for r in report["steps"]["per_rank"].values()), report["steps"]
    asym = finding(report, "RANK_RECOMPILE_ASYMMETRY")
    assert asym["evidence"]["rank"] == 1 and asym["evidence"]["step"] == 3 and asym["evidence"]["others"] == [0]
    assert "size mismatch" in asym["evidence"]["reason"]
    for rank in (0, 1):  # the world as the process group said it, in each rank's log
        worlds = [
            json.loads(line)
            for line in (run / f"rank-{rank}" / "events.jsonl").read_text().splitlines()
            if '"kind":"world"' in line
        ]
        assert [(w["group_rank"], w["world_size"], w["backend"]) for w in worlds] == [(rank, 2, "gloo")]


def assert_not_perturbed(tmp_path: Path) -> None:
    captured, reference = digests(tmp_path, "captured"), digests(tmp_path, "plain")
    assert set(captured) == {"rank0", "rank1"} and captured == reference
    assert captured["rank0"] == captured["rank1"]  # DDP replicas


@pytest.mark.slow  # Lightning's own 2-rank launcher, captured and plain: make test-slow
def test_lightning_ddp_ranks_are_all_captured(tmp_path):
    script = str(SCRIPTS / "launch_lightning.py")
    code, report, _ = doctor(tmp_path, script)
    assert code == 0, report["findings"]
    assert_two_ranks_with_planted_recompile(report, tmp_path / "run")
    assert report["run"]["ranks"]["1"]["local_rank"] == 1 and report["run"]["ranks"]["1"]["node"] == 0
    plain(tmp_path, sys.executable, script)
    assert_not_perturbed(tmp_path)


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_mp_spawn_ranks_are_captured_and_the_launcher_is_no_rank(tmp_path):
    script = str(SCRIPTS / "launch_spawn.py")
    code, report, _ = doctor(tmp_path, script, "--", "--helper")
    assert code == 0, report["findings"]
    run = tmp_path / "run"
    assert_two_ranks_with_planted_recompile(report, run)
    # the process doctor launched spawned the ranks and ran a helper; it is neither, and its log moved aside
    launcher = [json.loads(line) for line in (run / "launcher" / "events.jsonl").read_text().splitlines()]
    assert launcher[0]["argv"][1] == "run" and launcher[-1]["kind"] == "end" and launcher[-1]["status"] == "ok"
    plain(tmp_path, sys.executable, script, "--helper")
    assert_not_perturbed(tmp_path)

    # the same run with one rank's folder lost: never healthy, and `report` fails (exit 1)
    partial = tmp_path / "partial"
    shutil.copytree(run / "rank-0", partial / "rank-0")
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "report", "--json", str(tmp_path / "p.json"), str(partial)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "p.json").read_text())
    missing = finding(report, "RANKS_MISSING")
    assert missing["severity"] == "error" and missing["evidence"]["missing"] == [1]
    assert missing["evidence"]["world_size"] == 2 and "RANKS_MISSING" in report["failing_findings"]
    assert not report["verdict"].startswith("HEALTHY")


@pytest.mark.skipif(not ACCELERATE.exists(), reason="accelerate is not installed")
@pytest.mark.slow  # accelerate launch + torchrun, captured and plain: make test-slow
def test_accelerate_launch_ranks_are_all_captured(tmp_path):
    command = [*ACCELERATE_LAUNCH, str(SCRIPTS / "launch_accelerate.py")]
    code, report, _ = doctor(tmp_path, *command)
    assert code == 0, report["findings"]
    assert_two_ranks_with_planted_recompile(report, tmp_path / "run")
    assert (tmp_path / "run" / "launcher" / "events.jsonl").exists()
    plain(tmp_path, *command)
    assert_not_perturbed(tmp_path)


@pytest.mark.skipif(not ACCELERATE.exists(), reason="accelerate is not installed")
@pytest.mark.slow  # accelerate launch, captured and plain (~1 min on 2 busy cores)
def test_accelerate_launch_cpu_runs_the_script_in_a_child_that_is_captured(tmp_path):
    """The documented `accelerate launch --cpu --num_processes 2` form: on CPU, without mpirun, accelerate's
    simple launcher runs the script in one child process of its own, no rank variables, no process group.
    That child is captured as rank 0 (never a healthy report of the launcher alone), unperturbed."""
    command = [str(ACCELERATE), "launch", "--cpu", "--num_processes", "2", str(SCRIPTS / "launch_accelerate.py")]
    code, report, _ = doctor(tmp_path, *command)
    assert code == 0 and report["verdict"].startswith(("HEALTHY", "WARNINGS")), report["verdict"]
    assert report["run"]["ranks_present"] == [0] and report["steps"]["per_rank"]["0"]["steps"] == 6
    assert report["compile"]["compiles"] >= 1 and "NOTHING_OBSERVED" not in codes(report)
    run = tmp_path / "run"
    header = json.loads((run / "rank-0" / "events.jsonl").read_text().splitlines()[0])
    assert header["config"]["rank_from"] == "launcher_child"
    launcher = [json.loads(line) for line in (run / "launcher" / "events.jsonl").read_text().splitlines()]
    assert launcher[-1]["kind"] == "end" and launcher[-1]["status"] == "ok"
    plain(tmp_path, *command)
    captured, reference = digests(tmp_path, "captured"), digests(tmp_path, "plain")
    assert set(captured) == {"rank0"} and captured == reference


@pytest.mark.slow  # a 2-rank job; a rank killed under torchrun: test_distributed.py in make test
def test_spawned_rank_that_dies_is_reported_as_crashed(tmp_path):
    code, report, _ = doctor(tmp_path, str(SCRIPTS / "launch_spawn.py"), "--", "--kill-rank1")
    assert code == 3
    crashed = finding(report, "RANK_CRASHED")
    assert crashed["evidence"]["rank"] == 1 and crashed["evidence"]["last_step"] == 2
    assert report["run"]["ranks"]["1"]["status"] == "incomplete"
    assert report["run"]["ranks_present"] == [0, 1]


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_a_launcher_that_fails_after_its_ranks_finished_fails_the_run(tmp_path):
    code, report, _ = doctor(tmp_path, str(SCRIPTS / "launch_spawn.py"), "--", "--fail-after")
    assert code == 3 and report["run"]["failed"]
    assert all(r["status"] == "ok" for r in report["run"]["ranks"].values())
    failed = finding(report, "SCRIPT_FAILED")
    assert failed["evidence"]["launcher"]["status"] == "error" and "evaluation failed" in failed["title"]


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_processes_a_rank_starts_are_not_ranks(tmp_path):
    """torchrun ranks start a Python helper and spawn-started DataLoader workers; both inherit
    RANK/WORLD_SIZE and import torch, and neither is captured."""
    code, report, stderr = doctor(tmp_path, str(SCRIPTS / "launch_helper.py"), options=("--nproc", "2"))
    assert code == 0, report["findings"]
    assert report["run"]["ranks_present"] == [0, 1] and report["run"]["world_size"] == 2
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith(("rank-", "launcher"))) == [
        "rank-0",
        "rank-1",
    ]
    logs = stderr + "".join(p.read_text() for p in (tmp_path / "run" / "torchrun").rglob("stderr.log"))
    assert "torchrepro: note" not in logs
    assert all(r["steps"] == 2 for r in report["steps"]["per_rank"].values())
