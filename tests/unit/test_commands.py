"""The command layer: every command is one module with ``add_parser``/``run``, and the shared
modules beside them (``--help`` and a launched run's options: tests/e2e/test_commands_launched.py)."""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
from dataclasses import replace
from pathlib import Path

import pytest

import torchrepro.commands
from torchrepro.cli import COMMANDS
from torchrepro.errors import InputError
from torchrepro.runtime.run_options import OPTIONS_VAR, RunOptions


# what the commands share (the launcher, the option layer, the output guard): modules without a sub-command
SHARED = [
    name
    for _, name, _ in pkgutil.iter_modules(torchrepro.commands.__path__)
    if name not in {module.split(".")[0] for module in COMMANDS.values()}
]


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
