"""What ``repro`` and ``diff`` read from someone else's run directory, and the folder ``repro``
writes into, survive a structure-aware fuzz (tests/graph_fuzz.py: saved graph folders, parameter
snapshots, the output folder; links, FIFOs, sizes, shapes, dtypes, nesting, code) in a child process
under a memory limit and a time bound: every case read cleanly or refused in one line, no
traceback, no hang, nothing of a graph.py run, no damaged snapshot taken as evidence, no file
outside the output folder changed."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).parents[1] / "graph_fuzz.py"
MEMORY = 2 << 30  # address space of the fuzzing process (torch imported): a 2^40-element array would need far more


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


@pytest.mark.parametrize(("kind", "cases"), [("graph", 1500), ("snapshot", 800), ("output", 400)])
def test_hostile_graph_folders_snapshots_and_output_folders_are_refused_in_one_line(kind, cases):
    seed = int(os.environ.get("TORCHREPRO_FUZZ_SEED", str(int.from_bytes(os.urandom(4), "little"))))
    try:
        proc = subprocess.run(
            [sys.executable, FUZZ, kind, str(cases), str(seed)],
            capture_output=True,
            text=True,
            timeout=240,  # each case is bounded too (graph_fuzz.CASE_S): a hang fails there, naming it
            preexec_fn=_limited,
            cwd=FUZZ.parent,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"seed {seed} (TORCHREPRO_FUZZ_SEED={seed}): the fuzz took over 240 s")
    assert proc.returncode == 0, f"seed {seed} (TORCHREPRO_FUZZ_SEED={seed}):\n{proc.stderr[-3000:]}"
    counts = json.loads(proc.stdout)
    assert sum(v for k, v in counts.items() if k != "seconds") == cases
    assert counts["clean"] and counts["damage"]  # both outcomes reached: the fuzz can fail either way
