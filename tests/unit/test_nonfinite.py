"""Values that are not finite, on event logs built in memory: NaN and infinities compared bit for bit
by check, diff and compare (the same bits equal, NaN against a number a difference), and the
findings that say where a run first holds them: NONFINITE_LOSS, NONFINITE_GRAD, NONFINITE_PARAMETER,
UNINITIALISED_PARAMETERS (real runs: tests/e2e/test_nonfinite_runs.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from torchrepro.analysis.divergence import (
    Tolerance,
    compare_steps,
    distance,
    first_divergence,
    param_difference,
    same_value,
)
from torchrepro.analysis.doctor import analyse
from torchrepro.analysis.equivalence import Config, compare_report, judge
from torchrepro.analysis.kept_steps import kept_steps
from torchrepro.analysis.nondeterminism import compare
from torchrepro.analysis.nonfinite import nonfinite_findings, of_runs
from torchrepro.analysis.sides import step_comparison
from torchrepro.analysis.verdict import Ending, ending
from torchrepro.eventlog.event_reader import EventLog, read_events
from torchrepro.eventlog.event_writer import EventWriter
from torchrepro.eventlog.events import End, Event, Header, InitParams, NonFinite, Params, Step

from test_determinism_logic import step  # a step that fingerprinted everything

NAN, INF = math.nan, math.inf
NAMES = ["0.weight", "0.bias", "2.weight", "2.bias"]


def log(
    losses: list[float], rank: int = 0, events: tuple[Event, ...] = (), root: Path = Path("."), **each: Any
) -> EventLog:
    """One rank's log: a header, ``events``, a step per loss (``each``: fields of every step), a normal end."""
    body = [step(i, rank=rank, loss=loss, **each) for i, loss in enumerate(losses)]
    return EventLog(root / f"rank-{rank}" / "events.jsonl", [Header(rank=rank), *events, *body, End(rank=rank)])


# --- one value against another -------------------------------------------------------------------


def test_values_are_the_same_bit_for_bit():
    assert same_value(NAN, NAN) and same_value(INF, INF) and same_value(-INF, -INF)
    assert not same_value(NAN, 1.0) and not same_value(INF, -INF) and not same_value(0.0, -0.0)
    assert same_value(None, None) and not same_value(None, NAN)
    assert distance(NAN, NAN) == 0 and distance(INF, INF) == 0
    assert distance(NAN, 2.0) == INF and distance(INF, -INF) == INF and distance(3.0, 1.0) == 2.0


def test_a_tolerance_holds_a_value_that_is_not_finite_only_to_itself():
    tol = Tolerance(rtol=0.5, atol=1.0)
    assert tol.close(NAN, NAN) and tol.close(INF, INF)
    assert not tol.close(1.0, INF) and not tol.close(INF, 1.0) and not tol.close(NAN, 1.0)
    assert not tol.close(INF, -INF)
    assert tol.close(1.0, 1.4)


@pytest.mark.parametrize("tol", [Tolerance(), Tolerance(rtol=1e-3)])
def test_steps_whose_loss_is_nan_alike_agree_and_nan_against_a_number_differs(tol):
    assert compare_steps(step(0, loss=NAN), step(0, loss=NAN), tol) is None
    assert compare_steps(step(0, loss=INF), step(0, loss=INF), tol) is None
    what, detail = compare_steps(step(0, loss=NAN), step(0, loss=2.0), tol) or ("", {})
    assert what == "loss" and detail["abs_diff"] == INF and math.isnan(detail["loss_a"])
    assert compare_steps(step(0, loss=INF), step(0, loss=-INF), tol) is not None


def test_bit_identical_runs_whose_loss_is_nan_are_bit_exact():
    a = [log([NAN] * 4)]
    b = [log([NAN] * 4)]
    div, within, _ = compare(a, b, Tolerance())
    assert div is None and not within
    rows = step_comparison(a[0], b[0])
    assert [r["loss_diff"] for r in rows] == [0.0] * 4


def test_runs_that_differ_only_in_where_nan_appears_diverge_at_that_step():
    a = [log([1.0, 0.5, NAN, NAN])]
    b = [log([1.0, 0.5, 0.25, NAN])]
    div, _ = first_divergence(a, b, Tolerance())
    assert div is not None and (div.step, div.what) == (2, "loss")
    later = [log([1.0, 0.5, 0.25, NAN])]
    div, _ = first_divergence(later, a, Tolerance())
    assert div is not None and div.step == 2


def test_parameter_snapshots_compare_nan_bit_for_bit():
    a = {"w": np.array([1.0, NAN, INF], dtype=np.float32)}
    same = param_difference(a, {"w": a["w"].copy()})
    assert same["max_abs"] == 0 and same["l2"] == 0
    other = param_difference(a, {"w": np.array([1.0, 2.0, INF], dtype=np.float32)})
    assert other["max_abs"] == INF and other["parameter"] == "w"
    finite = param_difference({"w": np.array([1.0, 2.0])}, {"w": np.array([1.5, 2.0])})
    assert finite["max_abs"] == 0.5 and finite["max_rel"] == 0.25


# --- compare: a band that is not finite ------------------------------------------------------------


def config(root: Path, label: str, losses: list[float], **each: Any) -> Config:
    layout = Params(names=NAMES[:2], shapes=[[4, 8], [4]], dtypes=["float32"] * 2, kinds=["tensor"] * 2)
    one = log(losses, events=(layout,), root=root / label, param_fps=["p0", "p1"], **each)
    return Config(label, [one], Ending(label))


LOSSES = [1.0, 0.9, 0.8, 0.7, 0.6]


def test_compare_abstains_where_the_reference_is_not_finite_never_different_by_inf(tmp_path):
    # the reference's two runs: NaN at step 2 in one, a number in the other (uninitialised memory)
    a1 = config(tmp_path, "a-1", [1.0, 0.9, NAN, NAN, NAN])
    a2 = config(tmp_path, "a-2", [1.0, 0.9, 0.8, NAN, NAN])
    b = config(tmp_path, "b", [1.0, 0.9, 0.8, 0.7, NAN])
    section = judge(a1, a2, b)
    assert section["verdict"] == "abstain", section["reason"]
    assert "A's loss is NaN at step 2" in section["reason"] and "inf" not in section["reason"]
    assert section["first_nonfinite"]["step"] == 2 and section["first_out"] is None
    report = compare_report(section, {}, {}, {}, [a1, a2, b])
    assert report.exit_code == 1 and "ABSTAIN" in report.verdict_line
    codes = [f.code for f in report.findings]
    assert "COMPARE_ABSTAIN" in codes and "NONFINITE_LOSS" in codes
    # all three bit for bit NaN: the values agree, and still no band of NaN judges B
    nan = [config(tmp_path, x, [NAN] * 5) for x in ("n1", "n2", "n3")]
    section = judge(*nan)
    assert section["verdict"] == "abstain" and section["bit_exact"]


def test_compare_b_that_is_nan_where_a_is_finite_is_different_and_says_so(tmp_path):
    a1, a2 = config(tmp_path, "a-1", LOSSES), config(tmp_path, "a-2", LOSSES)
    b = config(tmp_path, "b", [1.0, 0.9, NAN, NAN, NAN])
    section = judge(a1, a2, b)
    assert section["verdict"] == "different" and section["first_out"]["step"] == 2
    assert section["reason"] == "step 2: loss is NaN in B, 0.8 in A"
    # a reference that turns NaN after B has already left it: B's difference stands
    late = config(tmp_path, "a-2", [1.0, 0.9, 0.8, 0.7, NAN])
    section = judge(a1, late, config(tmp_path, "b2", [1.0, 0.9, 0.5, 0.7, NAN]))
    assert section["verdict"] == "different" and section["first_out"]["step"] == 2


def test_compare_of_nan_parameter_snapshots(tmp_path):
    from torchrepro.analysis.equivalence import _Band, _tensor_points

    x = {"w": np.array([1.0, 2.0], dtype=np.float32)}
    nan = {"w": np.array([1.0, NAN], dtype=np.float32)}
    (within,) = _tensor_points(0, x, x, x, {}, 1e-6)
    (out,) = _tensor_points(0, x, x, nan, {}, 1e-6)
    (unjudged,) = _tensor_points(0, nan, nan, nan, {"param:w": _Band()}, 1e-6)
    assert (within["status"], out["status"], unjudged["status"]) == ("within", "out", "nonfinite")
    assert out["finite"] == {"reference": True, "b": False}


# --- the findings -------------------------------------------------------------------------------------


def test_a_nan_loss_is_a_finding_with_its_first_step_and_ranks():
    logs = [log([1.0, NAN, NAN], rank=0), log([1.0, 2.0, INF], rank=1)]
    (loss,) = nonfinite_findings(logs)
    assert loss.code == "NONFINITE_LOSS" and loss.severity == "error"
    assert loss.evidence["step"] == 1 and loss.evidence["ranks"] == [0] and loss.evidence["value"] == "NaN"
    assert loss.evidence["first_step_per_rank"] == {"0": 1, "1": 2}
    assert "NaN at step 1 (rank 0)" in loss.title
    assert nonfinite_findings([log([1.0, 0.5])]) == []


def test_a_gradient_norm_that_is_not_finite_names_its_gradient():
    grads = NonFinite(rank=0, step=2, what="gradients", names=["fc.weight"], count=1, of=4)
    logs = [log([1.0, 0.9, 0.8, NAN], events=(grads,), grad_norm=0.5)]
    logs[0].of(Step)[2].grad_norm = INF
    codes = {f.code: f for f in nonfinite_findings(logs)}
    grad = codes["NONFINITE_GRAD"]
    assert grad.evidence["step"] == 2 and grad.evidence["tensor"] == "fc.weight" and grad.evidence["module"] == "fc"
    assert "the gradient norm is inf at step 2 (rank 0)" in grad.title and "1 of 4 gradients" in grad.title
    assert codes["NONFINITE_LOSS"].evidence["step"] == 3


def test_parameters_never_written_after_to_empty_are_named_with_their_modules():
    init = InitParams(
        rank=0, step=0, source="first_forward", module="Transformer", names=NAMES, fps=["x"] * 4, unwritten=NAMES[2:]
    )
    bad = NonFinite(rank=0, step=0, what="parameters", names=["2.bias"], count=1, of=4)
    logs = [log([NAN, NAN], events=(init, bad)), log([NAN, NAN], rank=1, events=(init,))]
    found = {f.code: f for f in nonfinite_findings(logs)}
    assert list(found) == ["UNINITIALISED_PARAMETERS", "NONFINITE_PARAMETER", "NONFINITE_LOSS"]
    uninit = found["UNINITIALISED_PARAMETERS"]
    assert uninit.evidence["parameters"] == ["2.weight", "2.bias"] and uninit.evidence["modules"] == ["2"]
    assert uninit.evidence["ranks"] == [0, 1] and uninit.evidence["of"] == 4
    assert "2 of 4 parameters of Transformer were never initialised" in uninit.title
    assert "reset_parameters()" in uninit.hint and "broadcast_from_rank0" in uninit.hint
    assert "never initialised" in found["NONFINITE_PARAMETER"].hint
    assert "UNINITIALISED_PARAMETERS" in found["NONFINITE_LOSS"].hint
    initialised = InitParams(rank=0, step=0, source="first_forward", module="M", names=NAMES, fps=["x"] * 4)
    assert nonfinite_findings([log([1.0], events=(initialised,))]) == []


def test_findings_every_run_has_alike_are_said_once():
    a, b = nonfinite_findings([log([NAN, NAN])]), nonfinite_findings([log([NAN, NAN])])
    (once,) = of_runs({"run-1": a, "run-2": b})
    assert once.evidence["runs"] == ["run-1", "run-2"] and not once.title.startswith("run-")
    apart = of_runs({"run-1": a, "run-2": nonfinite_findings([log([1.0, NAN])])})
    assert [f.title.split(":")[0] for f in apart] == ["run-1", "run-2"]


def test_doctor_fails_a_run_that_trains_on_nan(tmp_path):
    report = analyse({"exit_code": 0}, [log([NAN, NAN])], [])
    assert "NONFINITE_LOSS" in report.failing_findings and report.exit_code == 1
    assert report.verdict_line.startswith("PROBLEMS")
    healthy = analyse({"exit_code": 0}, [log([1.0, 0.5])], [])
    assert not healthy.failing_findings


def test_the_first_nonfinite_values_survive_the_step_log(tmp_path):
    """Written and read back through steps.bin (kept as read: the doctor report's path), a NaN loss and
    an infinite gradient norm are found at their steps; so are the events that name the tensors."""
    with EventWriter(tmp_path / "rank-0" / "events.jsonl") as writer:
        writer.write(Header())
        for i, (loss, norm) in enumerate([(1.0, 0.5), (2.0, INF), (NAN, NAN)]):
            writer.write(step(i, loss=loss, grad_norm=norm))
        writer.write(NonFinite(step=1, what="gradients", names=["w"], count=1, of=1))
        writer.write(End())
    logs = [read_events(tmp_path / "rank-0" / "events.jsonl")]
    kept = kept_steps(logs)
    assert kept[0].nonfinite_loss is not None and kept[0].nonfinite_loss[0] == 2
    assert kept[0].nonfinite_grad_norm == (1, INF)
    assert [f.code for f in nonfinite_findings(logs, kept)] == ["NONFINITE_GRAD", "NONFINITE_LOSS"]
    assert ending("a", {"exit_code": 0}, logs).ok


def test_runs_that_differ_before_step_0_because_of_uninitialised_memory_say_so():
    """Parameters to_empty() left unwritten differ run to run: the cause is init_params, and its hint is
    the initialisation, not a seed."""
    from torchrepro.analysis.nondeterminism import CAUSE_HINTS, decide, hint_key

    def run(fp: str, unwritten: list[str]) -> list[EventLog]:
        init = InitParams(source="first_forward", module="M", names=["w"], fps=[fp], unwritten=unwritten)
        return [log([1.0, 0.5], events=(init,))]

    div, _ = first_divergence(run("a", ["w"]), run("b", ["w"]), Tolerance())
    assert div is not None and div.what == "init_params"
    cause, _ = decide(div, run("a", ["w"]), run("b", ["w"]))
    assert hint_key(cause, None, run("b", ["w"])) == "init_params_uninitialised"
    assert "reset_parameters()" in CAUSE_HINTS["init_params_uninitialised"]
    assert hint_key(cause, None, run("b", [])) == "init_params"  # initialised, from an unseeded RNG
