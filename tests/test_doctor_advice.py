"""Findings read their own evidence before advising: the compile-time finding does not advise warming
a cache that every lookup hit."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchrepro.analysis.doctor import analyse
from torchrepro.eventlog.events import CacheLookup, Compile, End, Header, Step, write_all
from torchrepro.eventlog.rundir import load_run


def slow_compile_run(root: Path, status: str) -> Path:
    """One rank whose single compile took most of the run, its cache lookup a ``status``."""
    events = [
        Header(t=0.0, rank=0, world_size=1, argv=["train.py"]),
        Compile(t=4.0, rank=0, step=0, compile_id="0/0", function="forward", file="train.py", line=3, dynamo_s=4.0),
        CacheLookup(t=4.0, rank=0, step=0, compile_id="0/0", cache="fxgraph", status=status, key="k"),
    ]
    events += [Step(t=4.0 + s, rank=0, step=s, index=s, loss=1.0, time_s=0.1) for s in range(3)]
    events.append(End(t=5.0, rank=0, duration_s=5.0))
    write_all(root / "rank-0" / "events.jsonl", events)
    return root


@pytest.mark.parametrize(("status", "warm_advice"), [("hit", False), ("miss", True)])
def test_compile_time_advice_reads_the_cache_evidence(tmp_path, status, warm_advice):
    run = load_run(slow_compile_run(tmp_path, status))
    findings = {f.code: f for f in analyse(run.meta, run.logs, run.problems).findings}
    hint = findings["COMPILE_TIME_SHARE"].hint
    assert ("warm the compile cache" in hint) is warm_advice, hint
    if not warm_advice:
        assert "already warm (1 hit, no miss)" in hint
