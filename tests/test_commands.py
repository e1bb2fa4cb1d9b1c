"""The command layer and the options a child run receives: every command is one module with
``add_parser``/``run``, ``--help`` lists them all, and a launched run gets its options once, as a
typed :class:`RunOptions` in one environment variable, not as flags."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import torchrepro.commands
from torchrepro.cli import COMMANDS, build_parser
from torchrepro.errors import InputError
from torchrepro.runtime.run_options import OPTIONS_VAR, RunOptions
from torchrepro.eventlog.event_reader import read_events
from torchrepro.eventlog.events import Step

# what the commands share (the launcher, the option layer, the output guard): modules without a sub-command
SHARED = [
    name
    for _, name, _ in pkgutil.iter_modules(torchrepro.commands.__path__)
    if name not in {module.split(".")[0] for module in COMMANDS.values()}
]

# Python's own RNG is seeded from the OS at start: the value differs between runs unless torchrepro seeds.
DRAWS = """\
import json, os, random, sys
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    loss = model(torch.ones(2, 4)).sum()
    opt.zero_grad(); loss.backward(); opt.step()
open(sys.argv[1], "w").write(json.dumps({"draw": random.random(), "cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}))
"""


def torchrepro(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchrepro", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def header(run_dir: Path) -> dict:
    return json.loads((run_dir / "rank-0" / "events.jsonl").read_text().splitlines()[0])


def seen(path: Path) -> dict:
    return json.loads(path.read_text())


def steps(run_dir: Path) -> list[dict]:
    return [s.to_json() for s in read_events(run_dir / "rank-0" / "events.jsonl").of(Step)]


def test_the_commands_folder_holds_the_commands_and_what_they_share():
    assert {"launcher", "options"} <= set(SHARED)
    for name in SHARED:
        assert not hasattr(importlib.import_module(f"torchrepro.commands.{name}"), "add_parser"), name


@pytest.mark.parametrize(("command", "name"), COMMANDS.items())
def test_every_command_module_registers_itself_and_runs(command, name):
    module = importlib.import_module(f"torchrepro.commands.{name}")
    assert callable(module.add_parser) and callable(module.run)
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    module.add_parser(sub)
    assert list(sub.choices) == [command]
    assert sub.choices[command].get_default("func") in (module.run, None)  # cache: each sub-command sets its own


def test_help_lists_every_command(tmp_path):
    commands = list(COMMANDS)
    registered = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert sorted(registered) == sorted(commands)
    proc = torchrepro("--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    listed = [
        line.split()[0]
        for line in proc.stdout.split("COMMAND\n", 1)[1].split("\n\n")[0].splitlines()
        if line.startswith("    ") and not line.startswith("      ")
    ]
    assert sorted(listed) == sorted(commands)


def test_run_options_json_round_trip():
    options = RunOptions(
        run_dir=Path("runs/a"),
        seed=2**100,
        compile_mode="eager",
        fingerprint_every=3,
        grads=True,
        snapshots=True,
        replay_step=4,
        replay_out=Path("r.json"),
        replay_graphs=True,
        replay_kernels=True,
        stop_after_step=7,
        fix="aot_eager:0,2",
        factors={"root": 1, "init": 2, "threads": 1, "backend": "aot_eager"},
        cache_policy="per-rank",
        cache_root="/tmp/c",
        warm_from="/tmp/w.tar",
        analysis_only=True,
    )
    text = options.to_json()
    assert json.loads(text)["run_dir"] == "runs/a"
    assert RunOptions.from_json(text) == options
    assert RunOptions.from_json(RunOptions().to_json()) == RunOptions()
    environ = {**options.env(), "OTHER": "x"}
    assert RunOptions.from_env(environ) == options and environ == {"OTHER": "x"}  # read once, not inherited
    assert RunOptions.from_env(environ) is None
    for bad in ("[1]", '{"seeed": 1}', "not json"):
        with pytest.raises(InputError, match=OPTIONS_VAR):
            RunOptions.from_json(bad)


def test_followed_ranks_get_every_option_with_absolute_paths(tmp_path):
    options = RunOptions(
        run_dir=Path("rel"),
        seed=1,
        fingerprint_every=2,
        replay_step=3,
        replay_out=Path("r.json"),
        stop_after_step=4,
        fix="threads_1",
        factors={"init": 1},
        cache_policy="shared",
    )
    assert options.absolute() == replace(options, run_dir=Path("rel").resolve(), replay_out=Path("r.json").resolve())


def test_a_launched_run_receives_its_options_as_run_options(tmp_path):
    script = tmp_path / "draws.py"
    script.write_text(DRAWS)
    proc = torchrepro(
        "doctor",
        "--seed",
        "7",
        "--fingerprint-every",
        "3",
        "--out",
        "launched",
        str(script),
        str(tmp_path / "launched.txt"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    head = header(tmp_path / "launched")
    assert head["argv"][1:] == ["run", "--", str(script), str(tmp_path / "launched.txt")]  # no flags in the child
    assert head["config"]["seed"] == 7 and head["config"]["steps"]["fingerprint_every"] == 3
    launched = steps(tmp_path / "launched")
    assert [s["index"] for s in launched if s["params_fp"]] == [0, 3]  # every 3rd step
    # The same options given as flags to `torchrepro run` (as under a user's own torchrun) do the same.
    proc = torchrepro(
        "run",
        "--seed",
        "7",
        "--fingerprint-every",
        "3",
        "--out",
        "direct",
        str(script),
        str(tmp_path / "direct.txt"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert seen(tmp_path / "direct.txt")["draw"] == seen(tmp_path / "launched.txt")["draw"]  # seeded alike
    assert [s["params_fp"] for s in steps(tmp_path / "direct")] == [s["params_fp"] for s in launched]
    proc = torchrepro("run", "--seed", "8", "--out", "other", str(script), str(tmp_path / "other.txt"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert seen(tmp_path / "other.txt")["draw"] != seen(tmp_path / "launched.txt")["draw"]


def test_the_cache_policy_reaches_the_child(tmp_path):
    script = tmp_path / "draws.py"
    script.write_text(DRAWS)
    root = tmp_path / "caches"
    proc = torchrepro(
        "doctor",
        "--cache-policy",
        "per-rank",
        "--cache-root",
        "caches",
        "--out",
        "run",
        str(script),
        str(tmp_path / "seen.json"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert seen(tmp_path / "seen.json")["cache"] == str(root / "rank-0")
    assert (root / "rank-0").is_dir()


def test_run_refuses_flags_beside_handed_options_and_bad_options(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    proc = torchrepro("run", "--seed", "1", str(script), cwd=tmp_path, env=RunOptions(seed=2).env())
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"torchrepro: error: {OPTIONS_VAR} holds this run's options")
    proc = torchrepro("run", str(script), cwd=tmp_path, env={OPTIONS_VAR: '{"seed": 1, "colour": 2}'})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"torchrepro: error: {OPTIONS_VAR}: not torchrepro run options")
    assert not (tmp_path / "torchrepro-runs").exists()
