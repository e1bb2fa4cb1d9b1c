"""No green word without the evidence for it, on hand-built event logs: a run in which nothing was
observed, a step log cut at a record boundary that its end record contradicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchrepro.analysis.doctor import analyse
from torchrepro.eventlog.event_reader import EventLog, read_events
from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import Capability, Compile, End, Header, Step
from torchrepro.eventlog.rundir import load_run
from torchrepro.reports.doctor_report import DoctorReport
from torchrepro.reports.drift_report import (
    DriftMetric,
    DriftReport,
    DriftRunResult,
    DriftSection,
    DriftSettings,
    Excluded,
)
from torchrepro.reports.findings import Verdict


def _log(events: list) -> EventLog:
    return EventLog(Path("run/rank-0/events.jsonl"), [Header(rank=0, world_size=1), *events])


def test_a_run_with_no_step_and_no_compile_is_nothing_observed_and_fails():
    report = analyse({}, [_log([End(step=0)])], [])
    assert report.verdict is Verdict.NOTHING_OBSERVED and report.exit_code == 1
    assert report.verdict_line.startswith("NOTHING OBSERVED: no training step and no compile seen in 1 captured")
    assert "NOTHING_OBSERVED" in report.failing_findings
    again = DoctorReport.from_json(report.to_json())  # `report` reads the same verdict back
    assert again.verdict is Verdict.NOTHING_OBSERVED and again.exit_code == 1


def test_a_script_that_failed_before_its_first_step_keeps_exit_3():
    report = analyse({}, [_log([End(step=0, exit_code=1, status="error", error="ImportError: x")])], [])
    assert report.verdict is Verdict.NOTHING_OBSERVED and report.exit_code == 3
    finding = next(f for f in report.findings if f.code == "NOTHING_OBSERVED")
    assert "ended before its first step" in finding.title


def test_a_step_or_a_compile_is_something_observed():
    stepped = analyse({}, [_log([Step(index=0), End(step=1)])], [])
    compiled = analyse({}, [_log([Compile(compile_id="0/0", function="f"), End(step=0)])], [])
    for report in (stepped, compiled):
        assert report.verdict is Verdict.HEALTHY and report.exit_code == 0, report.verdict_line


def _write(tmp_path: Path, steps: int, end_step: int, *extra) -> Path:
    run = tmp_path / "run"
    events = [Header(rank=0, world_size=1), *extra, *(Step(index=i, loss=1.0) for i in range(steps))]
    write_all(run / "rank-0" / "events.jsonl", [*events, End(step=end_step)])
    return run


def test_a_step_log_cut_at_a_record_boundary_is_damage_its_end_record_shows(tmp_path):
    run = _write(tmp_path, 10, 10)
    assert read_events(run / "rank-0" / "events.jsonl").steps_lost == 0
    stream = run / "rank-0" / "steps.bin"
    whole = stream.read_bytes()
    for n in range(len(whole) - 1, 0, -1):  # the longest prefix that reads cleanly: a record boundary
        stream.write_bytes(whole[:n])
        log = read_events(run / "rank-0" / "events.jsonl")
        if not log.bad_lines and len(log.of(Step)) < 10:
            break
    kept = len(log.of(Step))
    assert log.bad_lines == 0 and log.steps_lost == 10 - kept and log.damage, log.problems
    report = analyse({}, load_run(run).logs, load_run(run).problems)
    lost = next(f for f in report.findings if f.code == "STEPS_LOST")
    assert lost.severity == "error" and lost.evidence["steps_lost"] == {"0": 10 - kept}
    assert report.verdict is Verdict.PROBLEMS and report.exit_code == 1
    assert "EVENT_LOG_DAMAGED" not in [f.code for f in report.findings]  # one account of the one fact


def test_a_log_that_ends_where_its_end_record_says_is_not_damaged(tmp_path):
    run = _write(tmp_path, 10, 10)
    report = analyse({}, load_run(run).logs, load_run(run).problems)
    assert report.verdict is Verdict.HEALTHY and report.exit_code == 0


def test_a_capture_that_stopped_recording_steps_is_said_once_not_as_lost_steps(tmp_path):
    stopped = Capability(name="capture_error", available=False, note="step capture stopped", step=4)
    run = _write(tmp_path, 4, 10, stopped)
    log = read_events(run / "rank-0" / "events.jsonl")
    assert log.steps_lost == 0 and not log.damage


def _drift(finished: int, allow_partial: bool) -> DriftReport:
    """A drift report over a plan of 4 runs of which ``finished`` ran (the others missing)."""
    runs = [
        DriftRunResult(i, {"init": i}, {"root": 0, "init": i}, 1.0 + 0.01 * i if i < finished else None, "ok")
        for i in range(4)
    ]
    for run in runs[finished:]:
        run.status, run.error = "missing", "not run (or interrupted)"
    section = DriftSection(
        metric=DriftMetric("loss", "the final loss"),
        design="4 init levels",
        runs=runs,
        effects=[],
        excluded=[Excluded(r.index, r.status, error=r.error) for r in runs[finished:]],
        verdict="init explains 100 % of the variance",
        summary={},  # type: ignore[typeddict-item]
    )
    settings = DriftSettings("train.py", [], "exp", 0, ["init"], allow_partial=allow_partial)
    return DriftReport(run=settings, drift=section)


def test_drift_collect_with_runs_missing_is_incomplete_unless_partial_is_allowed():
    report = _drift(1, allow_partial=False)
    assert report.verdict is Verdict.INCOMPLETE and report.exit_code == 3
    assert report.verdict_line.startswith("INCOMPLETE: 3 of 4 runs of the plan not run or interrupted (run 1, 2, 3)")
    assert report.verdict_line.endswith("from the 1 that finished: init explains 100 % of the variance")
    allowed = _drift(1, allow_partial=True)
    assert allowed.verdict is Verdict.NOISE and allowed.exit_code == 0
    again = DriftReport.from_json(report.to_json())  # the setting and the verdict read back
    assert again.verdict is Verdict.INCOMPLETE and DriftReport.from_json(allowed.to_json()).exit_code == 0
    whole = _drift(4, allow_partial=False)
    assert whole.verdict is Verdict.NOISE and whole.exit_code == 0 and not whole.missing


def test_a_relative_difference_is_relative_to_the_scale_of_the_tensor_it_is_in():
    """A bias whose values are all near zero differs by 96 % of itself, by less than the weights do in
    absolute terms: the relative figure is the weights' own (the same tensor as the largest absolute
    difference), and the norm ratio is the whole difference against the whole model's."""
    import numpy as np

    from torchrepro.analysis.divergence import param_difference

    a = {"weight": np.array([[0.5, -1.0], [2.0, 0.25]]), "bias": np.array([1.7e-5, 0.0])}
    b = {"weight": np.array([[0.5, -1.0], [2.0 + 4e-5, 0.25]]), "bias": np.array([0.06e-5, 0.0])}
    d = param_difference(a, b)
    assert d["parameter"] == "weight" and d["max_abs"] == pytest.approx(4e-5)
    assert d["max_rel"] == pytest.approx(4e-5 / (2.0 + 4e-5)), d  # not the bias's 1.64e-5 / 1.7e-5
    assert d["l2_rel"] == pytest.approx(np.hypot(4e-5, 1.64e-5) / np.linalg.norm([0.5, 1, 2 + 4e-5, 0.25, 0.06e-5]))


def _tried(name: str, status: str, removed: int, after: int) -> dict:
    measure = {"recompiles": 2, "graph_breaks": 0, "step_time_s": 0.01, "step_time_tail_s": 0.012}
    return {
        "name": name,
        "spec": name,
        "applied_to": "int module attribute self.scale",
        "line": f"torch._dynamo.config.{name} = True",
        "status": status,
        "removed": removed,
        "numerics": "same",
        "expected_removed": 1,
        "before": measure,
        "after": {**measure, "recompiles": after},
    }


def test_a_fix_measured_without_effect_is_no_longer_the_findings_advice():
    from torchrepro.analysis.compile import RECOMPILE_HINTS
    from torchrepro.analysis.compile_fixes import advise
    from torchrepro.reports.findings import Finding

    name = "allow_unspec_int_on_nn_module"
    found = Finding("RECOMPILE_MODULE_ATTRIBUTE", "warning", "recompiled", hint=RECOMPILE_HINTS["module_attribute"])
    other = Finding("RECOMPILE_SHAPE", "warning", "recompiled", hint=RECOMPILE_HINTS["shape"])
    (advised, untouched) = advise([found, other], [_tried(name, "no_effect", 0, 2)])
    assert untouched == other  # no dynamic_shapes run: its advice stands
    assert advised.hint.startswith(f"Measured by doctor --fixes: torch._dynamo.config.{name} = True was tried and")
    assert "had no effect (2 recompile(s) and graph break(s) before, 2 after" in advised.hint
    assert f"(set torch._dynamo.config.{name} = True" not in advised.hint and "tensor buffer" in advised.hint
    assert advised.evidence["fix_measured"]["status"] == "no_effect"
    assert advise([advised], [_tried(name, "no_effect", 0, 2)]) == [advised]  # advised again: the same account
    (works,) = advise([found], [_tried(name, "fixed", 2, 0)])
    assert works.hint.startswith(found.hint) and works.hint.endswith(
        "was tried and removed 2 (2 recompile(s) and graph break(s) before, 0 after, numbers same)."
    )


def _lookups(*rows: tuple[float, str, str | None], step_at: float) -> list:
    """A rank's events: the AOTAutograd lookups (time, status, reason) of compile 0/0, then a step ending at ``step_at``."""
    from torchrepro.eventlog.events import CacheLookup

    return [
        *(CacheLookup(t=t, compile_id="0/0", cache="aotautograd", status=s, key="K", reason=r) for t, s, r in rows),
        Step(t=step_at, index=0),
        End(t=step_at + 1),
    ]


def test_misses_check_itself_caused_blame_no_cache_setup():
    from torchrepro.analysis.cache_misses import explain_misses, key_findings
    from torchrepro.eventlog.events import PROBE_MISS

    a = _lookups((10.0, "miss", None), step_at=20.0)  # run-1 looked up K at 10 s; its entry was saved by 20 s
    beside = _lookups((12.0, "miss", None), step_at=22.0)  # run-2 looked K up while run-1 still compiled it
    later = _lookups((25.0, "miss", None), step_at=30.0)  # run-2 looked after run-1 had saved K: another cache
    probed = _lookups((25.0, "miss", PROBE_MISS), step_at=30.0)  # K was there: the probe made the miss
    counts = {
        name: {k: explain_misses(a, b)[k] for k in ("same_key_misses", "beside_misses", "probe_misses")}
        for name, b in (("beside", beside), ("later", later), ("probed", probed))
    }
    assert counts == {
        "beside": {"same_key_misses": 0, "beside_misses": 1, "probe_misses": 0},
        "later": {"same_key_misses": 1, "beside_misses": 0, "probe_misses": 0},
        "probed": {"same_key_misses": 0, "beside_misses": 0, "probe_misses": 1},
    }
    codes = {name: [f.code for f in key_findings(a, b)] for name, b in (("beside", beside), ("later", later))}
    assert codes == {"beside": ["CACHE_MISSED_BY_TORCHREPRO"], "later": ["CACHE_SAME_KEY_MISSED"]}
    (ours,) = key_findings(a, probed, "run-1 rank 0", "run-2 rank 0")
    assert "1 that torchrepro's graph probe made misses" in ours.title and ours.severity == "info"
    assert "cache setup is to blame" in ours.hint


def test_doctor_says_which_misses_its_probe_made():
    from torchrepro.eventlog.events import PROBE_MISS, CacheLookup

    probe = CacheLookup(compile_id="0/0", cache="aotautograd", status="miss", key="K", reason=PROBE_MISS)
    report = analyse({}, [_log([probe, Compile(compile_id="0/0", function="f"), Step(index=0), End(step=1)])], [])
    (miss,) = [f for f in report.findings if f.code == "CACHE_MISS"]
    assert miss.title == "aotautograd cache: 1 miss(es), 0 hit(s); 1 of the misses made by --probe"
    assert "Nothing in your cache setup is to blame" in miss.hint and miss.evidence["probe_misses"] == 1
