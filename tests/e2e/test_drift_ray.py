"""`torchrepro drift --launcher ray` against a real Ray cluster the tests start: a head node on
loopback (127.0.0.1 only, token authentication with a token of its own), shared by the module and
stopped at its end. A sequential (--until-clear) experiment runs its batches as Ray tasks while a Ray
worker is killed in the middle of a cell: the cell runs again, nothing is counted twice, the report
says so."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (the torchrepro[ray] extra; make test installs it)")

pytestmark = pytest.mark.xdist_group("ray")  # one worker starts the cluster once
REPO = Path(__file__).resolve().parents[2]
PLANTED = REPO / "tests" / "scripts" / "drift_planted.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster():
    """The environment of a process that uses the cluster: RAY_ADDRESS and its token."""
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths are length-limited
    token = temp / "token"
    token.write_text(secrets.token_hex(32))
    port = _free_port()
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # Ray's own switch for "this node's address is loopback"
        "RAY_ADDRESS": f"127.0.0.1:{port}",
    }
    head = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp}",
        ],
        # the cluster's processes (and the runs its workers start) carry a marker of their own instead of
        # the test session's: they outlive each test by design, and this fixture checks they end with it
        env={**{k: v for k, v in env.items() if k not in ("RAY_ADDRESS", SESSION)}, MARKER: str(temp)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                assert head.poll() is None and time.time() < deadline, "the Ray head did not start"
                time.sleep(0.5)
        yield env
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops what it started
        try:
            head.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        deadline = time.time() + 30
        while (left := _cluster_processes(str(temp))) and time.time() < deadline:
            time.sleep(0.5)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)
        assert not left, f"Ray processes outlived the cluster: {left}"


SESSION, MARKER = "TORCHREPRO_TEST_SESSION", "TORCHREPRO_TEST_RAY_CLUSTER"


def _cluster_processes(temp: str) -> list[int]:
    """The live processes of the cluster started with marker ``temp`` (Ray renames its workers)."""
    mark = f"{MARKER}={temp}".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and mark in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                if Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry))
        except (OSError, IndexError):
            continue
    return found


def _attempts(out: Path) -> list[dict]:
    found = []
    for path in (out / "runs").glob("*/attempt.json"):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass  # being written
    return found


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_sequential_batches_on_ray_and_a_killed_worker_reruns_its_cell_once(tmp_path, cluster):
    # --runs 2 then one batch of --jobs 2 runs: 4 runs, then 6 (the --max-runs budget), as Ray tasks
    cmd = [
        sys.executable,
        "-m",
        "torchrepro",
        "drift",
        "--launcher",
        "ray",
        "--vary",
        "compile",
        "--runs",
        "2",
        "--jobs",
        "2",
        "--until-clear",
        "--max-runs",
        "6",
        "--metric",
        "acc",
        "--out",
        "exp",
        str(PLANTED),
        "--",
        "--sleep",
        "3",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=cluster, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (started := _attempts(tmp_path / "exp")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert started, proc.communicate()
    time.sleep(1.0)  # its `torchrepro run` child is under way
    victim = started[0]["pid"]  # the Ray worker running that cell (not the driver, not the child)
    assert victim != proc.pid
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    report = json.loads((tmp_path / "exp" / "report.json").read_text())
    d, run = report["drift"], report["run"]

    assert len(d["runs"]) == 6 and all(r["status"] == "ok" for r in d["runs"])
    assert run["ran"] == 6 and run["planned"] == 6  # the killed attempt is not a run of its own
    rerun = [r for r in d["runs"] if r["attempts"] > 1]
    assert len(rerun) == 1 and rerun[0]["attempts"] == 2
    assert any(f"run {rerun[0]['index']} (2 attempts)" in note and "counted once" in note for note in d["notes"])
    assert d["summary"]["n"] == 3 and d["effects"][0]["n"] == 3  # 3 pairs, each counted once
    seq = d["sequential"]
    assert seq["looks"] == [2, 3] and seq["runs_used"] == 6 and seq["stop"] == "budget"
    assert [p["runs"] for p in seq["factors"][0]["path"]] == [4, 6]
    assert "--until-clear used 6 runs of at most 6 (the budget is spent)" in d["verdict"]
    assert "counted once" in " ".join(out.split())  # the terminal says so too
