"""Every location shown to the user names the user's code, never torchrepro's own frames: one
script (tests/scripts/entry_points.py) enters torch.compile each way there is — a torch module
compiled directly, a user's module, a function, a decorator, a method — and recompiles each once
with a short last batch, under ``torchrepro run`` (its module wrapper sits between every
compiled module and its caller)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import torchrepro
from torchrepro.analysis.compile import display_function
from torchrepro.eventlog.event_reader import read_events
from torchrepro.eventlog.events import Compile, GraphBreak

SCRIPT = Path(__file__).parents[1] / "scripts" / "entry_points.py"
OURS = str(Path(torchrepro.__file__).parent)
pytestmark = pytest.mark.xdist_group("locations")  # one worker makes the run below once for every test


def line_of(mark: str) -> int:
    hits = [n for n, text in enumerate(SCRIPT.read_text().splitlines(), 1) if text.rstrip().endswith(f"# {mark}")]
    assert len(hits) == 1, f"{mark!r} marks {hits}"
    return hits[0]


def def_line(name: str) -> int:
    hits = [n for n, text in enumerate(SCRIPT.read_text().splitlines(), 1) if f"# DEF {name}" in text]
    assert len(hits) == 1, f"DEF {name!r} marks {hits}"
    return hits[0]


@pytest.fixture(scope="module")
def events(tmp_path_factory):
    out = tmp_path_factory.mktemp("locations") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "run", "--out", str(out), str(SCRIPT)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(OURS).parent)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_events(out / "rank-0" / "events.jsonl")


@pytest.mark.parametrize(
    "entry, shown, defined",
    [
        ("torch module", "Sequential.forward called at {script}:{site}", None),
        ("user module", "Net.forward", "user module"),
        ("function", "plain", "function"),
        ("decorator", "decorated", "decorator"),
        ("method", "method", "method"),
    ],
)
def test_a_recompile_names_the_users_code_and_call_site(events, entry, shown, defined):
    site = line_of(f"ENTRY {entry}")
    recompiles = [c for c in events.of(Compile) if c.recompile_reasons and c.call_site == f"{SCRIPT}:{site}"]
    assert [display_function(c) for c in recompiles] == [shown.format(script=SCRIPT, site=site)], [
        (c.function, c.file, c.call_site) for c in events.of(Compile)
    ]
    if defined is not None:
        assert (recompiles[0].file, recompiles[0].line) == (str(SCRIPT), def_line(defined))


def test_no_location_points_into_torchrepro(events):
    compiles, breaks = events.of(Compile), events.of(GraphBreak)
    assert len(compiles) == 12 and len(breaks) == 2  # 6 frames (one a graph break's resume), each compiled twice
    places = [c.file for c in compiles] + [c.call_site for c in compiles] + [b.file for b in breaks]
    assert all(p and not p.startswith(OURS) for p in places), places
    assert {(b.file, b.line) for b in breaks} == {(str(SCRIPT), line_of("BREAK"))}
