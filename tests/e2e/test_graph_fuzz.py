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


def _npy_declaring(shape: tuple[int, ...], body: bytes) -> bytes:
    header = repr({"descr": "<f4", "fortran_order": False, "shape": shape}).encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + body


@pytest.fixture(scope="module")
def snapshotted(tmp_path_factory) -> Path:
    """A real run with parameter snapshots (``run --snapshots``), made once."""
    from test_hostile_input import torchrepro

    root = tmp_path_factory.mktemp("snapshotted")
    script = Path(__file__).parents[1] / "scripts" / "deterministic.py"
    made = torchrepro("run", "--snapshots", "--out", root / "a", script, cwd=root)
    assert made.returncode == 0, made.stderr[-2000:]
    return root / "a"


@pytest.mark.xdist_group("graph-fuzz-snapshotted")  # one worker makes the run once for every case
@pytest.mark.parametrize(
    "damage",
    ["zeros", "zeros, its sketch gone", "an array declaring 2^40 elements", "a link to /dev/zero", "a FIFO"],
)
def test_diff_of_a_damaged_or_replaced_snapshot_is_one_line_never_bit_exact(snapshotted, tmp_path, capsys, damage):
    """A copy of a real run, one of its snapshots made hostile: ``diff`` exits 2 in one line naming
    the file (zeros in place of the parameters read as BIT-EXACT before they were checked)."""
    import shutil
    import zipfile

    import numpy as np
    from test_hostile_input import cli, one_line_error

    a = snapshotted
    b = shutil.copytree(a, tmp_path / "b")
    assert cli(capsys, "diff", a, b)[0] == 0  # the copy as it was: bit-exact, its snapshots checked
    target = b / "rank-0" / "snapshots" / "step-0000004.npz"
    kept = dict(np.load(target))
    target.unlink()
    if damage.startswith("zeros"):
        np.savez(target, **{k: np.zeros_like(v) for k, v in kept.items()})
        if "sketch" in damage:  # the step log's own fingerprints still say what step 4 held
            (target.parent / "sketch-0000004.npz").unlink()
    elif damage.startswith("an array"):
        with zipfile.ZipFile(target, "w") as archive:
            for name, value in kept.items():
                archive.writestr(f"{name}.npy", _npy_declaring((1 << 40,), value.tobytes()))
    elif damage.startswith("a link"):
        target.symlink_to("/dev/zero")
    else:
        os.mkfifo(target)
    code, out, err = cli(capsys, "diff", a, b)
    line = one_line_error(err)
    assert code == 2 and "step-0000004.npz" in line and not out.startswith("BIT-EXACT"), line
