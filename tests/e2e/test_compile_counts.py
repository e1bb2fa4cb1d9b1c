"""doctor's compile counts against what a plain run of the same script logs with
``TORCH_LOGS=graph_breaks,recompiles`` (one record per graph break, one "Recompiling function" per
recompile, the attempt that hits the recompile limit included) and against Dynamo's own bookkeeping
(realworld/dynamo_counters.py), run without torchrepro:

- tests/scripts/compile_counts.py: a break Dynamo logs twice (a break in a loop: the frame skipped,
  the helper traced on its own), a failed compile, a shape recompile on idx's dimension 1, and a
  recompile after the last step;
- tests/scripts/hf_gpt2_lengths.py (slow): Hugging Face GPT-2 from its config, sequence lengths that
  vary, and breaks Dynamo "cannot resume from"."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support import run_torchrepro

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "scripts"


def torch_logs(script: Path, cwd: Path) -> dict[str, int]:
    """What ``TORCH_LOGS=graph_breaks,recompiles`` logs in a plain run of ``script``: its break
    records and its "Recompiling function" records."""
    proc = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "TORCH_LOGS": "graph_breaks,recompiles"},
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {
        "graph_breaks": len(re.findall(r"\[__graph_breaks\] Graph break", proc.stderr)),
        "recompiling": len(re.findall(r"\[__recompiles\] Recompiling function", proc.stderr)),
    }


def doctor(tmp_path: Path, script: Path) -> tuple[subprocess.CompletedProcess, dict]:
    proc = run_torchrepro("doctor", "--out", str(tmp_path / "d"), str(script), cwd=tmp_path, timeout=300)
    return proc, json.loads((tmp_path / "d" / "report.json").read_text())


def test_counts_equal_torch_logs_and_dynamos_and_events_are_placed_and_named(tmp_path):
    script = SCRIPTS / "compile_counts.py"
    plain = tmp_path / "counters.json"
    subprocess.run(
        [sys.executable, str(REPO / "realworld" / "dynamo_counters.py"), str(plain), str(script)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    dynamo = json.loads(plain.read_text())
    logged = torch_logs(script, tmp_path)
    proc, report = doctor(tmp_path, script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    c = report["compile"]
    ours = {k: c[k] for k in ("compiles", "recompiles", "graph_breaks", "unique_graphs")}
    # torch 2.6 records the failed compile without a fail_type: Dynamo's bookkeeping counts it, doctor too
    failed_counted = tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 7)
    expected = {"compiles": 6 if failed_counted else 5, "recompiles": 2, "graph_breaks": 2, "unique_graphs": 4}
    assert ours == {k: dynamo[k] for k in ours} == expected
    # the loop's frame skip and the helper's own break: two records, two breaks, as TORCH_LOGS says
    assert c["graph_breaks"] == logged["graph_breaks"] == 2
    assert c["recompiles"] + len(c["recompile_limit_hits"]) == logged["recompiling"]
    assert sum(e["count"] for e in c["graph_break_events"]) == c["graph_breaks"]
    by_category = {e["category"]: e for e in c["recompile_events"]}
    assert by_category["grad_mode"]["step"] == 3 and by_category["grad_mode"]["after_step"] is True  # not "step 4"
    assert by_category["shape"]["step"] == 2 and "after_step" not in by_category["shape"]
    shape = next(f for f in report["findings"] if f["code"] == "RECOMPILE_SHAPE")
    assert "torch._dynamo.mark_dynamic(idx, 1)" in shape["hint"] and "mark_dynamic(x, 0)" not in shape["hint"]


@pytest.mark.slow  # transformers' import and GPT-2's compiles, twice (~1 min on 2 busy cores)
def test_hf_gpt2_graph_breaks_equal_torch_logs_cannot_resume_breaks_included(tmp_path):
    pytest.importorskip("transformers")
    script = SCRIPTS / "hf_gpt2_lengths.py"
    logged = torch_logs(script, tmp_path)
    proc, report = doctor(tmp_path, script)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert report["verdict"].startswith("WARNINGS"), report["verdict"]
    c = report["compile"]
    assert c["graph_breaks"] == logged["graph_breaks"], (c["graph_breaks"], logged)
    assert c["recompiles"] + len(c["recompile_limit_hits"]) == logged["recompiling"], (c, logged)
    reasons = [e["reason"] for e in c["graph_break_events"] for _ in range(e["count"])]
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        # transformers 5 (torch 2.13, 2.14) breaks where Dynamo cannot resume: 7 breaks, 2 of them that kind;
        # transformers 4.49 with torch 2.6 (transformers 5 needs a newer torch) breaks once, recompiles twice
        assert (c["graph_breaks"], logged["recompiling"]) == (7, 5)
        assert sum("(Encountered graph break that we cannot resume from." in r for r in reasons) == 2
    assert f"{c['graph_breaks']} graph break(s)" in report["verdict"]
