"""The start-up hook of torchrepro.follow in single fresh interpreters: it chains to the user's own
sitecustomize, imports nothing where no capture is wanted, captures a process a launcher made a
rank (with its exit code) or one that joins a process group, and leaves helpers alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from torchrepro.run_options import RunOptions
from torchrepro.follow import CONFIG_VAR, SEEN_VAR, follow_env
from torchrepro.launch import child_env

PROBE = "import sys; print('torchrepro' in sys.modules, sys.modules['sitecustomize'].__file__)"


def child(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` as a process below a captured one (run dir tmp_path/run), with ``env``."""
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")}
    variables = follow_env(RunOptions(run_dir=tmp_path / "run"), root_pid=1, pythonpath=base.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**base, **variables, SEEN_VAR: "::", **env})


def events(tmp_path: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "run" / f"rank-{rank}" / "events.jsonl").read_text().splitlines()]


def test_the_users_own_sitecustomize_runs_and_nothing_is_imported(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    proc = child(tmp_path, PROBE + "; import os; print(os.environ.get('USER_SITE_RAN'))",
                 PYTHONPATH=os.pathsep.join([follow_env(RunOptions(run_dir=tmp_path), 1)["PYTHONPATH"], str(own),
                                             os.environ.get("PYTHONPATH", "")]))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", str(own / "sitecustomize.py"), "1"]
    assert not (tmp_path / "run").exists()


def test_a_helper_that_inherits_its_ranks_variables_is_not_captured(tmp_path):
    proc = child(tmp_path, PROBE + "; import torch", RANK="1", WORLD_SIZE="2", **{SEEN_VAR: "1::2"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "False" and not (tmp_path / "run").exists()


def test_a_process_a_launcher_made_a_rank_is_captured_with_its_exit_code(tmp_path):
    proc = child(tmp_path, "import sys, torch; sys.exit(3)", LOCAL_RANK="1", WORLD_SIZE="2", NODE_RANK="0")
    assert proc.returncode == 3, proc.stderr
    log = events(tmp_path, 1)
    assert log[0]["kind"] == "header" and log[0]["rank"] == 1 and log[0]["world_size"] == 2
    assert log[0]["config"]["rank_from"] == "env"
    assert (log[-1]["kind"], log[-1]["exit_code"], log[-1]["status"]) == ("end", 3, "error")


def test_a_process_that_joins_a_group_is_captured_then(tmp_path):
    code = ("import torch, torch.distributed as dist\n"
            f"dist.init_process_group('gloo', init_method='file://{tmp_path / 'store'}', rank=0, world_size=1)\n"
            "dist.destroy_process_group()\n"
            "raise ValueError('after the group')\n")
    proc = child(tmp_path, code)
    assert proc.returncode == 1 and "ValueError: after the group" in proc.stderr
    log = events(tmp_path, 0)
    assert log[0]["config"]["rank_from"] == "process_group"
    world = next(e for e in log if e["kind"] == "world")
    assert (world["group_rank"], world["world_size"], world["backend"]) == (0, 1, "gloo")
    assert (log[-1]["status"], log[-1]["error"]) == ("error", "ValueError: after the group")


def test_a_new_launch_does_not_inherit_a_capture_around_it(monkeypatch):
    monkeypatch.setenv(CONFIG_VAR, "{}")
    monkeypatch.setenv(SEEN_VAR, "::")
    env = child_env()
    assert CONFIG_VAR not in env and SEEN_VAR not in env
