"""``doctor --trace`` on the recorded corpus of ``TORCH_TRACE`` logs (``tests/data/torch_traces``,
made by ``tests/e2e/compat/record_traces.py``): for every torch version recorded, each scenario's log
gives the counts and recompile categories the live run that wrote it reported. Torch versions this
machine does not have are read too; a change in the trace format fails here instead of reading as 0.
No torch is needed: nothing is compiled."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from torchrepro.analysis.doctor import Budgets
from torchrepro.commands.doctor.job import doctor_from_trace

from record_traces import NONE_OFFSET  # this directory, as pytest imports it

CORPUS = Path(__file__).resolve().parents[2] / "data" / "torch_traces"
RECORDED = sorted(p.parent for p in CORPUS.glob("*/*/live.json"))
# the torch versions the corpus must hold: the oldest and newest tested, and the pinned one
VERSIONS = {"2.6.0", "2.13.0", "2.14.1"}


def test_the_corpus_holds_every_tested_torch_version():
    recorded = {p.parent.name for p in RECORDED}
    assert recorded == VERSIONS
    scenarios = {v: {p.name for p in RECORDED if p.parent.name == v} for v in VERSIONS}
    assert len({frozenset(s) for s in scenarios.values()}) == 1, scenarios  # the same scenarios on each


@pytest.mark.parametrize("recorded", [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in RECORDED])
def test_doctor_trace_gives_what_the_live_run_reported(recorded: Path, tmp_path: Path) -> None:
    live = json.loads((recorded / "live.json").read_text())
    if live.get("none_offset", NONE_OFFSET) != NONE_OFFSET and "python_value" in live["categories"]:
        pytest.skip("recorded by another CPython build, whose None a torch 2.6 log cannot be told by here")
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "trace.log").write_bytes(gzip.decompress((recorded / "trace.log.gz").read_bytes()))
    report, _ = doctor_from_trace(trace, tmp_path / "run", Budgets())
    c = report.to_json()["compile"]
    assert c["compiles"] == live["compiles"]
    assert c["recompiles"] == live["recompiles"]
    assert c["graph_breaks"] == live["graph_breaks"]
    assert c["unique_graphs"] == live["unique_graphs"] == live["dynamo"]["stats"].get("unique_graphs", 0)
    assert [e["category"] for e in c["recompile_events"]] == live["categories"]
    assert [h["limit"] for h in c["recompile_limit_hits"]] == live["limit_hits"]
    findings = [f for f in report.to_json()["findings"] if f["code"] == "RECOMPILE_LIMIT_HIT"]
    assert len(findings) == len(live["limit_hits"]) and all(f["severity"] == "error" for f in findings)
