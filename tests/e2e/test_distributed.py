"""Two ranks on gloo under torchrun, through `torchrepro doctor --nproc 2`: merged reports,
cross-rank findings and faults. A teardown abort after a rank finished (FINDINGS.md: ~4 % of
2-rank CPU launches) must never fail these tests: ranks are judged by their last event."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchrepro._compat import installed_torch_version

SCRIPTS = Path(__file__).parents[1] / "scripts"
pytestmark = pytest.mark.distributed


def doctor(tmp_path: Path, script: str, *args: str, options: tuple[str, ...] = ()) -> tuple[int, dict]:
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchrepro",
            "doctor",
            "--nproc",
            "2",
            "--out",
            str(out),
            *options,
            str(SCRIPTS / script),
            "--",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=os.environ,
        timeout=300,
    )
    assert (out / "report.json").exists(), proc.stdout + proc.stderr
    return proc.returncode, json.loads((out / "report.json").read_text())


def codes(report: dict) -> list[str]:
    return [f["code"] for f in report["findings"]]


def finding(report: dict, code: str) -> dict:
    return next(f for f in report["findings"] if f["code"] == code)


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_ddp_compile_merged_report_and_recompile_asymmetry(tmp_path):
    code, report = doctor(tmp_path, "ddp_compile.py")
    assert code == 0, report["findings"]
    assert report["run"]["ranks_present"] == [0, 1] and report["run"]["world_size"] == 2
    assert set(report["compile"]["per_rank"]) == {"0", "1"}
    assert all(r["steps"] == 6 for r in report["steps"]["per_rank"].values())
    # the replicas stay identical: no parameter finding
    assert not {"REPLICAS_DIFFER_FROM_START", "REPLICAS_DIVERGE", "INIT_PARAMS_DIFFER"} & set(codes(report))
    asym = finding(report, "RANK_RECOMPILE_ASYMMETRY")
    assert asym["evidence"]["rank"] == 1 and asym["evidence"]["step"] == 4 and asym["evidence"]["others"] == [0]
    assert "size mismatch" in asym["evidence"]["reason"]
    assert report["compile"]["per_rank"]["1"]["recompiles"] == report["compile"]["per_rank"]["0"]["recompiles"] + 1


@pytest.mark.slow  # two 2-rank FSDP2 jobs: make test-slow
@pytest.mark.skipif(
    tuple(int(n) for n in installed_torch_version().split("+")[0].split(".")[:2]) < (2, 7),
    reason="torch 2.6's FSDP2 fails on CPU by itself (AttributeError: 'Stream' object has no attribute 'record_event')",
)
def test_fsdp2_ranks_seeded_differently_then_fixed(tmp_path):
    code, report = doctor(tmp_path, "fsdp2_init.py", "--seed-per-rank")
    assert code == 1
    init = finding(report, "INIT_PARAMS_DIFFER")
    assert init["evidence"]["ranks"] == [0, 1] and init["evidence"]["parameters"][0] == "weight"
    (tmp_path / "bad").mkdir()
    os.rename(tmp_path / "run", tmp_path / "bad" / "run")
    code, report = doctor(tmp_path, "fsdp2_init.py", "--broadcast")
    assert code == 0 and "INIT_PARAMS_DIFFER" not in codes(report)
    assert all(r["steps"] == 3 for r in report["steps"]["per_rank"].values())


def test_killed_rank_is_named_and_others_kept(tmp_path):
    code, report = doctor(tmp_path, "rank_killed.py")
    assert code == 3
    crashed = finding(report, "RANK_CRASHED")
    assert crashed["evidence"]["rank"] == 1 and crashed["evidence"]["exit_code"] == -9
    assert crashed["evidence"]["last_step"] == 2 and "SIGKILL" in crashed["title"]
    assert report["steps"]["per_rank"]["0"]["steps"] >= 3  # the surviving rank's events are kept


@pytest.mark.slow  # waits out a 20 s --timeout: make test-slow
def test_hanging_rank_is_ended_with_stacks(tmp_path):
    code, report = doctor(tmp_path, "rank_hangs.py", options=("--timeout", "20"))  # start-up alone can take 8 s
    assert code == 3
    hung = finding(report, "RANK_HUNG")
    where = hung["evidence"]["where"]
    assert "all_reduce" in where["0"] and "rank_hangs.py:18" in where["0"]
    assert "rank_hangs.py:20" in where["1"]
    assert (tmp_path / "run" / "rank-0" / "stacks.txt").read_text().strip()


@pytest.mark.slow  # two torchrun launchers: make test-slow
def test_two_nodes_launched_by_the_user_merge_into_one_report(tmp_path):
    """Two torchrun launchers (one per "node", static rendezvous on localhost), each running
    `-m torchrepro run`; the nodes' rank folders are copied together and reported as one run."""
    import shutil
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes = []
    for node in (0, 1):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--node-rank",
            str(node),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "-m",
            "torchrepro",
            "run",
            "--out",
            str(tmp_path / f"node{node}"),
            str(SCRIPTS / "ddp_compile.py"),
        ]
        nodes.append(subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for proc in nodes:
        proc.wait(timeout=300)
    merged = tmp_path / "merged"
    for node in (0, 1):
        shutil.copytree(tmp_path / f"node{node}" / f"rank-{node}", merged / f"rank-{node}")
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "report", "--json", str(tmp_path / "r.json"), str(merged)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["run"]["ranks_present"] == [0, 1] and report["run"]["world_size"] == 2
    assert finding(report, "RANK_RECOMPILE_ASYMMETRY")["evidence"]["rank"] == 1


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_compiling_the_ddp_wrapper_produces_no_graph_and_is_an_error(tmp_path):
    code, report = doctor(tmp_path, "ddp_compile.py", "--compile-outside")
    assert code == 1
    no_graph = finding(report, "NO_GRAPH_COMPILED")
    assert no_graph["severity"] == "error" and "DDP(torch.compile(model))" in no_graph["hint"]
    assert report["compile"]["unique_graphs"] == 0 and report["compile"]["compiles"] > 0


@pytest.mark.parametrize("command", ["doctor", "check"])
def test_a_timeout_shorter_than_the_start_up_is_said_as_such_never_blamed_on_the_script(tmp_path, command):
    """torchrun and two ranks take seconds to start: --timeout 0.2 ends the job before any rank ran the
    script. Its own outcome (exit 3), one line; not the script's failure, not torchrun's traceback."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchrepro",
            command,
            "--nproc",
            "2",
            "--timeout",
            "0.2",
            "--out",
            str(tmp_path / "run"),
        ]
        + [str(SCRIPTS / "train_small.py")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("torchrepro: error:")]
    assert (
        len(error) == 1
        and "no rank started within 0.2 s: --timeout 0.2 ended the job while it was starting" in error[0]
    )
    assert (
        "Traceback" not in proc.stderr
        and "SignalException" not in proc.stderr
        and "before capture started" not in proc.stderr
    )
    meta = json.loads(next((tmp_path / "run").rglob("run.json")).read_text())
    assert meta["not_started_within_s"] >= 0.2
