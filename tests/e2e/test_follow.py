"""The start-up hook of torchrepro.runtime.follow in single fresh interpreters: it chains to the user's own
sitecustomize, imports nothing where no capture is wanted, captures a process a launcher made a
rank (with its exit code) or one that joins a process group, and leaves helpers alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from torchrepro.runtime.run_options import RunOptions
from torchrepro.runtime.follow import CONFIG_VAR, SEEN_VAR, follow_env
from torchrepro.commands.launcher import child_env

PROBE = "import sys; print('torchrepro' in sys.modules, sys.modules['sitecustomize'].__file__)"


def child(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` as a process below a captured one (run dir tmp_path/run), with ``env``."""
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")}
    variables = follow_env(RunOptions(run_dir=tmp_path / "run"), root_pid=1, pythonpath=base.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**base, **variables, SEEN_VAR: "::", **env},
    )


def events(tmp_path: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "run" / f"rank-{rank}" / "events.jsonl").read_text().splitlines()]


def test_the_users_own_sitecustomize_runs_and_nothing_is_imported(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    proc = child(
        tmp_path,
        PROBE + "; import os; print(os.environ.get('USER_SITE_RAN'))",
        PYTHONPATH=os.pathsep.join(
            [follow_env(RunOptions(run_dir=tmp_path), 1)["PYTHONPATH"], str(own), os.environ.get("PYTHONPATH", "")]
        ),
    )
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
    code = (
        "import torch, torch.distributed as dist\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path / 'store'}', rank=0, world_size=1)\n"
        "dist.destroy_process_group()\n"
        "raise ValueError('after the group')\n"
    )
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


def test_the_whole_capture_configuration_travels(tmp_path, monkeypatch):
    """A replay's step and record, a fix and a drift run's factor levels reach the ranks the script starts."""
    from torchrepro.runtime import follow

    options = RunOptions(
        run_dir=Path("run"),
        seed=7,
        replay_step=2,
        replay_out=Path("replays/a.json"),
        replay_graphs=True,
        stop_after_step=4,
        fix="threads_1",
        factors={"init": 1},
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(CONFIG_VAR, follow_env(options, 1)[CONFIG_VAR])
    travelled, root_pid = follow._config()
    assert root_pid == 1
    assert travelled == replace(
        options, run_dir=(tmp_path / "run").resolve(), replay_out=(tmp_path / "replays" / "a.json").resolve()
    )


def test_a_replay_record_is_found_whatever_the_world(tmp_path):
    from torchrepro.eventlog.rundir import replay_file

    out = tmp_path / "a.json"
    assert replay_file(out, 0, 1) == out and replay_file(out, 1, 2) == tmp_path / "a.rank1.json"
    assert replay_file(out, 0) == out and replay_file(out, 1) == tmp_path / "a.rank1.json"
    (tmp_path / "a.rank0.json").write_text("{}")  # a world of several ranks the script started itself
    assert replay_file(out, 0) == tmp_path / "a.rank0.json"


SPAWNED = """
import os, sys, torch, torch.distributed as dist
from torchrepro.seed import active_plan, derive
seeded = torch.initial_seed() == derive(5, "global").torch
before = active_plan() and (active_plan().rank, active_plan().world_size)
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://{store}", rank=rank, world_size=2)
print(os.environ.get("{var}"), seeded, before, active_plan() and (active_plan().rank, active_plan().world_size))
dist.destroy_process_group()
"""


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_a_spawned_rank_is_seeded_at_start_and_its_plan_takes_the_groups_rank(tmp_path):
    """What torch.multiprocessing.spawn starts for the captured process (TORCHREPRO_FOLLOW_SPAWN) is
    seeded from --seed before the script runs, as torchrun ranks are; other processes are not."""
    from torchrepro.runtime.follow import SPAWN_VAR

    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")}
    results = {}
    for spawned in (True, False):
        store = tmp_path / f"store-{spawned}"
        config = RunOptions(run_dir=tmp_path / f"run-{spawned}", seed=5)
        env = {
            **base,
            **follow_env(config, 1, base.get("PYTHONPATH", "")),
            SEEN_VAR: "::",
            **({SPAWN_VAR: "1"} if spawned else {}),
        }
        code = SPAWNED.format(store=store, var=SPAWN_VAR)
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(rank)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=tmp_path,
                env=env,
            )
            for rank in (0, 1)
        ]
        outs = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        results[spawned] = [out.split() for out, _ in outs]
    assert results[True] == [["None", "True", "(0,", "1)", "(0,", "2)"], ["None", "True", "(0,", "1)", "(1,", "2)"]]
    assert [r[:3] for r in results[False]] == [["None", "False", "None"]] * 2
    assert sorted(p.name for p in (tmp_path / "run-True").iterdir()) == ["rank-0", "rank-1"]


def test_the_rank_whose_loss_differs_is_named_before_ranks_that_got_it_through_all_reduce():
    from torchrepro.analysis.divergence import Tolerance, first_divergence
    from torchrepro.eventlog.event_reader import EventLog
    from torchrepro.eventlog.events import Header, Step

    def run(loss1: float, grads: str) -> list[EventLog]:
        steps = [Step(rank=0, index=0, loss=1.0, grads_fp=grads), Step(rank=1, index=0, loss=loss1, grads_fp=grads)]
        return [EventLog(Path(f"rank-{s.rank}/events.jsonl"), [Header(rank=s.rank, world_size=2), s]) for s in steps]

    div, _ = first_divergence(run(2.0, "g"), run(2.5, "h"), Tolerance())
    assert (div.step, div.rank, div.what) == (0, 1, "loss")
    div, _ = first_divergence(run(2.0, "g"), run(2.0, "h"), Tolerance())  # no rank's loss differs: the lowest
    assert (div.step, div.rank, div.what) == (0, 0, "grads")
