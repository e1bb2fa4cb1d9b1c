"""`torchrepro watch`: snapshots of a run while real training processes write it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from pathlib import Path

from torchrepro.analysis import compile as compile_analysis
from torchrepro.eventlog.event_reader import read_events
from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import End, GraphBreak, Header, Step
from torchrepro.eventlog.tail import RunFollower
from torchrepro.render.live_text import FollowedRun

TRAIN = Path(__file__).parents[1] / "scripts" / "otel_train.py"


def _rank(run_dir: Path, rank: int, world: int, *args: str) -> subprocess.Popen:
    """One rank of a job (no process group: the script does not need one) writing ``run_dir``."""
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
    return subprocess.Popen(
        [sys.executable, "-m", "torchrepro", "run", "--out", str(run_dir), str(TRAIN), "--", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _snapshot(run_dir: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "watch", str(run_dir), "--once", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _wait_for(run_dir: Path, predicate, snapshots: list[dict], timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = _snapshot(run_dir)
        snapshots.append(snap)
        if predicate(snap):
            return snap
        time.sleep(0.3)
    raise AssertionError(f"no snapshot satisfied the condition; last: {snapshots[-1] if snapshots else None}")


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_snapshots_follow_ranks_steps_recompiles_and_lag(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    snapshots: list[dict] = []
    fast = _rank(run_dir, 0, 2, "--epochs", "4", "--sleep", "0.3")
    slow = None
    try:
        first = _wait_for(run_dir, lambda s: s["ranks"].get("0", {}).get("steps", 0) >= 1, snapshots)
        assert first["ranks_seen"] == 1 and first["world_size"] == 2 and not first["finished"]
        slow = _rank(run_dir, 1, 2, "--epochs", "1", "--sleep", "1.0")  # a new rank directory appears later
        lag = _wait_for(run_dir, lambda s: s["lagging_ranks"], snapshots)
        assert lag["lagging_ranks"] == [1] and lag["ranks_seen"] == 2
        assert lag["ranks"]["0"]["steps"] - lag["ranks"]["1"]["steps"] >= 2
        assert fast.wait(timeout=300) == 0, fast.stderr.read()
        assert slow.wait(timeout=300) == 0, slow.stderr.read()
    finally:
        for proc in (fast, slow):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    final = _snapshot(run_dir)
    assert final["finished"] and final["lagging_ranks"] == []
    # successive snapshots only ever move forward
    for rank in ("0", "1"):
        seen = [s["ranks"][rank]["steps"] for s in snapshots if rank in s["ranks"]] + [final["ranks"][rank]["steps"]]
        assert seen == sorted(seen)
    assert not any(s["finished"] for s in snapshots)
    # the final snapshot agrees with the complete logs
    logs = [read_events(run_dir / f"rank-{r}" / "events.jsonl") for r in (0, 1)]
    section, _ = compile_analysis.summarize(logs)
    for log in logs:
        info = final["ranks"][str(log.rank)]
        assert info["steps"] == len(log.of(Step)) and info["status"] == "ok"
        assert info["steps_per_s"] > 0
    assert final["compiles"] == section["compiles"] and final["recompiles"] == section["recompiles"] >= 2
    assert final["recompiles_by_category"] == section["recompiles_by_category"]
    last_break = max((b for log in logs for b in log.of(GraphBreak)), key=lambda b: b.t)
    assert final["latest_graph_break"]["line"] == last_break.line
    assert final["latest_graph_break"]["source"] == last_break.source
    assert {f["code"] for f in final["findings"]} >= {"GRAPH_BREAK", "RECOMPILE_SHAPE"}
    # findings appear while the run is written, not only at its end
    assert any(s["findings"] and not s["finished"] for s in snapshots)


def test_watch_ends_when_the_run_ends(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    watch = subprocess.Popen(
        [sys.executable, "-m", "torchrepro", "watch", str(run_dir), "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    train = _rank(run_dir, 0, 1, "--epochs", "1", "--sleep", "0.2")
    try:
        assert train.wait(timeout=300) == 0, train.stderr.read()
        out, err = watch.communicate(timeout=60)  # a watch that did not end would time out here
    finally:
        for proc in (watch, train):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert watch.returncode == 0, err
    assert "finished" in out and "graph break" in out


def test_follower_keeps_a_partial_last_line_until_it_is_complete(tmp_path):
    log = tmp_path / "rank-0" / "events.jsonl"
    write_all(log, [Header(world_size=1), Step(index=0, time_s=0.1)])
    line = json.dumps(Step(index=1, time_s=0.1).to_json()) + "\n"
    with open(log, "a") as fp:
        fp.write(line[:10])
    follower = RunFollower(tmp_path)
    assert [(rank, type(e).__name__) for rank, e in follower.poll()] == [(0, "Header"), (0, "Step")]
    with open(log, "a") as fp:
        fp.write(line[10:] + "garbled\n")
    assert [(rank, type(e).__name__) for rank, e in follower.poll()] == [(0, "Step")]
    assert follower.unreadable == 1 and follower.poll() == []


def test_followed_run_feeds_the_live_analysis(tmp_path):
    log = tmp_path / "rank-0" / "events.jsonl"
    write_all(log, [Header(world_size=1), Step(index=0, time_s=0.1)])
    with open(log, "a") as fp:
        fp.write("garbled\n")
    followed = FollowedRun(tmp_path)
    assert followed.poll() == 2 and followed.poll() == 0
    snap = followed.snapshot()
    assert snap["run_dir"] == str(tmp_path) and snap["ranks"]["0"]["steps"] == 1
    assert snap["unreadable_lines"] == 1 and not snap["finished"] and not followed.finished


def test_watch_names_a_damaged_log_and_a_rank_that_ended_without_its_end_record(tmp_path):
    """Rank 0's log has a line that is no event and a step log cut inside a record; rank 1's log
    stops without its end record although run.json says the run ended: neither reads as ``ok``."""
    for rank in (0, 1):
        steps = [Step(rank=rank, index=i, time_s=0.1) for i in range(40)]
        write_all(tmp_path / f"rank-{rank}" / "events.jsonl", [Header(rank=rank, world_size=2), *steps, End(rank=rank)])
    log = tmp_path / "rank-0" / "events.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join([lines[0], '{"kind": "compile", "cache": {"fxgraph": 5}}\n', *lines[1:]]))
    steps_bin = tmp_path / "rank-0" / "steps.bin"
    steps_bin.write_bytes(steps_bin.read_bytes()[:-3])  # cut inside its last record
    cut = tmp_path / "rank-1" / "events.jsonl"
    cut.write_text("".join(cut.read_text().splitlines(keepends=True)[:-1]))  # its end record lost
    (tmp_path / "run.json").write_text(json.dumps({"script": "train.py", "world_size": 2, "exit_code": 0}))
    snap = _snapshot(tmp_path)
    assert snap["finished"] and snap["state"] == "finished"
    zero, one = snap["ranks"]["0"], snap["ranks"]["1"]
    assert zero["damage"][0] == "1 unreadable line(s) in events.jsonl", zero
    (records,) = zero["damage"][1:]
    assert records.startswith("1 damaged record(s) in steps.bin (byte ") and records.endswith(
        ": truncated last step record)"
    ), zero
    assert one["status"] == "no end record" and one["damage"] == []
    view = subprocess.run(
        [sys.executable, "-m", "torchrepro", "watch", str(tmp_path), "--once"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},  # (each cell on one line)
    ).stdout
    text = " ".join(view.split())
    assert "ok, damaged" in text and "no end record" in text
    assert "rank 0: damaged log: 1 unreadable line(s) in events.jsonl; 1 damaged record(s) in steps.bin" in text


def test_watch_bad_input_is_one_line_exit_2(tmp_path):
    for args in ([str(tmp_path / "missing")], [str(tmp_path), "--json"]):
        proc = subprocess.run(
            [sys.executable, "-m", "torchrepro", "watch", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 2
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("torchrepro: error:")


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_doctor_shows_a_status_line_on_a_terminal_only(tmp_path):
    import pty
    import re

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torchrepro",
            "doctor",
            "--out",
            str(tmp_path / "run"),
            str(TRAIN),
            "--",
            "--epochs",
            "2",
            "--sleep",
            "0.3",
            "--print",
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
        cwd=tmp_path,
    )
    os.close(slave)
    raw = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal closed: doctor and its children exited
            break
        if not chunk:
            break
        raw += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw.decode("utf-8", "replace"))
    assert re.search(r"torchrepro · 1/1 rank\(s\) · step \d+", text)  # the live status line was drawn
    script_lines = (tmp_path / "run" / "logs" / "stdout.log").read_text().splitlines()
    assert [line.split(",")[0] for line in script_lines] == ["epoch 0 done", "epoch 1 done"]
    for line in script_lines:  # the script's own lines reach the terminal whole, on lines of their own
        assert re.search(rf"(^|[\r\n]){re.escape(line)}\r?\n", text)
    assert "report:" in text.rsplit("torchrepro ·", 1)[-1]  # the line is gone before the report prints


def test_the_follower_only_reads_files():
    """``eventlog/tail.py`` reads the run directory; what the events mean is analysis's (fed by
    ``render/live_text.py``): it imports neither ``analysis/`` nor ``report/``."""
    import ast

    import torchrepro.eventlog.tail as tail

    tree = ast.parse(Path(tail.__file__).read_text())
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert "events" in imported and not [m for m in imported if "analysis" in m or "report" in m]
