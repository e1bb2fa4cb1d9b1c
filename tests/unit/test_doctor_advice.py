"""Findings read their own evidence before advising: the compile-time finding does not advise warming
a cache that every lookup hit."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchrepro.analysis.doctor import analyse
from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import CacheLookup, Compile, End, Header, Step
from torchrepro.eventlog.rundir import load_run


def slow_compile_run(root: Path, status: str, scale: float = 1.0) -> Path:
    """One rank whose single compile took most of the run (4 s of 5, times ``scale``), its cache lookup a
    ``status``."""
    events = [
        Header(t=0.0, rank=0, world_size=1, argv=["train.py"]),
        Compile(
            t=4.0, rank=0, step=0, compile_id="0/0", function="forward", file="train.py", line=3, dynamo_s=4.0 * scale
        ),
        CacheLookup(t=4.0, rank=0, step=0, compile_id="0/0", cache="fxgraph", status=status, key="k"),
    ]
    events += [Step(t=4.0 + s, rank=0, step=s, index=s, loss=1.0, time_s=0.1) for s in range(3)]
    events.append(End(t=5.0, rank=0, duration_s=5.0 * scale))
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


@pytest.mark.parametrize(("scale", "severity"), [(1.0, "info"), (30.0, "warning")])
def test_compiling_most_of_a_run_is_a_warning_once_it_costs_a_minute(tmp_path, scale, severity):
    """80 % of a 5 s run spent compiling is what a short run is (info); 80 % of 150 s is 2 minutes to win back."""
    run = load_run(slow_compile_run(tmp_path, "miss", scale))
    (finding,) = [f for f in analyse(run.meta, run.logs, run.problems).findings if f.code == "COMPILE_TIME_SHARE"]
    assert finding.severity == severity and "80% of the run" in finding.title, finding


def eval_recompiles(root: Path, evaluations: int) -> Path:
    """One rank compiled once for training, then ``evaluations`` times under ``no_grad``."""
    events: list = [Header(t=0.0, rank=0, world_size=1, argv=["train.py"])]
    for n in range(evaluations + 1):
        reasons = ["GLOBAL_STATE changed: grad_mode "] if n else []
        events.append(
            Compile(
                t=1.0 + n,
                rank=0,
                step=n,
                compile_id=f"0/{n}",
                function="forward",
                file="train.py",
                line=3,
                dynamo_s=0.01,
                recompile_reasons=reasons,
            )
        )
    events += [Step(t=10.0 + s, rank=0, step=s, index=s, loss=1.0, time_s=1.0) for s in range(4)]
    events.append(End(t=20.0, rank=0, duration_s=20.0))
    write_all(root / "rank-0" / "events.jsonl", events)
    return root


@pytest.mark.parametrize(("evaluations", "severity"), [(1, "info"), (3, "warning")])
def test_one_evaluation_graph_is_expected_not_a_problem(tmp_path, evaluations, severity):
    run = load_run(eval_recompiles(tmp_path, evaluations))
    report = analyse(run.meta, run.logs, run.problems)
    (finding,) = [f for f in report.findings if f.code == "RECOMPILE_GRAD_MODE"]
    assert finding.severity == severity and finding.evidence["expected"] is (evaluations == 1)
    assert report.verdict_line.startswith("HEALTHY" if evaluations == 1 else "WARNINGS"), report.verdict_line
    # the title does not say which graph is the evaluation one: a script may evaluate before it trains
    assert ("one graph with gradients and one without" in finding.title) is (evaluations == 1), finding.title
    assert "the evaluation graph" not in finding.title


def test_a_tolerance_says_it_does_not_cover_the_initial_parameters(tmp_path):
    """Initial parameters are fingerprints: `--atol` cannot apply to them, and the comparison says so."""
    from torchrepro.analysis.divergence import Tolerance, first_divergence
    from torchrepro.eventlog.event_reader import read_events
    from torchrepro.eventlog.events import InitParams

    logs = []
    for name, fp in (("a", "00"), ("b", "01")):
        path = tmp_path / name / "events.jsonl"
        write_all(
            path,
            [
                Header(t=0.0, rank=0, world_size=1, argv=["train.py"]),
                InitParams(t=0.1, rank=0, source="first_forward", module="net", names=["w"], fps=[fp]),
            ],
        )
        logs.append(read_events(path))
    exact, exact_notes = first_divergence([logs[0]], [logs[1]], Tolerance())
    tolerant, notes = first_divergence([logs[0]], [logs[1]], Tolerance(atol=1e-3))
    assert exact.what == tolerant.what == "init_params"
    assert not exact_notes and any("--rtol/--atol do not apply" in n for n in notes)
