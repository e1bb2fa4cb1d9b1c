"""doctor's compile counts against Dynamo's own (realworld/dynamo_counters.py, run without torchrepro)
on a script with a break Dynamo logs twice (a break in a loop: the frame skipped, the helper traced
on its own), a failed compile, a shape recompile on idx's dimension 1, and a recompile after the
last step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import run_torchrepro

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "scripts" / "compile_counts.py"


def test_counts_equal_dynamos_and_events_are_placed_and_named(tmp_path):
    plain = tmp_path / "counters.json"
    subprocess.run(
        [sys.executable, str(REPO / "realworld" / "dynamo_counters.py"), str(plain), str(SCRIPT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    dynamo = json.loads(plain.read_text())
    proc = run_torchrepro("doctor", "--out", str(tmp_path / "d"), str(SCRIPT), cwd=tmp_path, timeout=300)
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    c = report["compile"]
    ours = {k: c[k] for k in ("compiles", "recompiles", "graph_breaks", "unique_graphs")}
    assert (
        ours == {k: dynamo[k] for k in ours} == {"compiles": 5, "recompiles": 2, "graph_breaks": 1, "unique_graphs": 4}
    )
    assert c["graph_breaks_relogged"] == 1  # the loop's frame skip, the same break as the helper's
    assert "logged again when Dynamo restarted or skipped a frame" in " ".join(proc.stdout.split())
    by_category = {e["category"]: e for e in c["recompile_events"]}
    assert by_category["grad_mode"]["step"] == 3 and by_category["grad_mode"]["after_step"] is True  # not "step 4"
    assert by_category["shape"]["step"] == 2 and "after_step" not in by_category["shape"]
    shape = next(f for f in report["findings"] if f["code"] == "RECOMPILE_SHAPE")
    assert "torch._dynamo.mark_dynamic(idx, 1)" in shape["hint"] and "mark_dynamic(x, 0)" not in shape["hint"]
