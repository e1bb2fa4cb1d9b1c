"""The commands from the outside: ``--help`` lists them all, and a launched run gets its options
once, as a typed :class:`RunOptions` in one environment variable, not as flags (the command
layer's shape: tests/unit/test_commands.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from torchrepro.cli import COMMANDS, build_parser
from torchrepro.runtime.run_options import OPTIONS_VAR, RunOptions
from torchrepro.eventlog.event_reader import read_events
from torchrepro.eventlog.events import Step
from support import run_torchrepro


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


def header(run_dir: Path) -> dict:
    return json.loads((run_dir / "rank-0" / "events.jsonl").read_text().splitlines()[0])


def seen(path: Path) -> dict:
    return json.loads(path.read_text())


def steps(run_dir: Path) -> list[dict]:
    return [s.to_json() for s in read_events(run_dir / "rank-0" / "events.jsonl").of(Step)]


def test_help_lists_every_command(tmp_path):
    commands = list(COMMANDS)
    registered = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert sorted(registered) == sorted(commands)
    proc = run_torchrepro("--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    listed = [
        line.split()[0]
        for line in proc.stdout.split("\n  COMMAND ", 1)[1].split("\n\n")[0].splitlines()[1:]
        if line.startswith("    ") and not line.startswith("      ")
    ]
    assert sorted(listed) == sorted(commands)


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_a_launched_run_receives_its_options_as_run_options(tmp_path):
    script = tmp_path / "draws.py"
    script.write_text(DRAWS)
    proc = run_torchrepro(
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
    # no flags in the child, and the script's arguments after a -- (the script's, even where they look like options)
    assert head["argv"][1:] == ["run", "--", str(script), "--", str(tmp_path / "launched.txt")]
    assert head["config"]["seed"] == 7 and head["config"]["steps"]["fingerprint_every"] == 3
    launched = steps(tmp_path / "launched")
    assert [s["index"] for s in launched if s["params_fp"]] == [0, 3]  # every 3rd step
    # The same options given as flags to `torchrepro run` (as under a user's own torchrun) do the same.
    proc = run_torchrepro(
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
    proc = run_torchrepro(
        "run", "--seed", "8", "--out", "other", str(script), str(tmp_path / "other.txt"), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert seen(tmp_path / "other.txt")["draw"] != seen(tmp_path / "launched.txt")["draw"]


def test_the_cache_policy_reaches_the_child(tmp_path):
    script = tmp_path / "draws.py"
    script.write_text(DRAWS)
    root = tmp_path / "caches"
    proc = run_torchrepro(
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
    proc = run_torchrepro("run", "--seed", "1", str(script), cwd=tmp_path, env=RunOptions(seed=2).env())
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"torchrepro: error: {OPTIONS_VAR} holds this run's options")
    proc = run_torchrepro("run", str(script), cwd=tmp_path, env={OPTIONS_VAR: '{"seed": 1, "colour": 2}'})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"torchrepro: error: {OPTIONS_VAR}: not torchrepro run options")
    assert not (tmp_path / "torchrepro-runs").exists()
