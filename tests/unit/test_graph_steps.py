"""Which compiled graphs can explain a divergent quantity (analysis/graph_steps.py), on hand-built
event logs and probe records: a gradient or a loss is never blamed on a graph that ran only under
no_grad (an evaluation before the first training step, as nanoGPT's), whatever its outputs show;
the evidence of a verdict, one typed object, read back from report.json; and the graph `repro`
takes by default: the one the verdict names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from torchrepro.analysis.divergence import Divergence, Tolerance
from torchrepro.analysis.graph_steps import GraphScope, graph_scope, graphs_ran, step_scope
from torchrepro.analysis.nondeterminism import determinism_section, graph_evidence, probe_divergence
from torchrepro.analysis.verdict import ending
from torchrepro.commands import repro
from torchrepro.errors import InputError
from torchrepro.eventlog.event_reader import EventLog
from torchrepro.eventlog.events import End, GraphProbe, GraphsRan, Header, Step
from torchrepro.reports.check_report import CheckReport, CheckRun, Evidence, FirstDivergence
from torchrepro.reports.loader import load_report

# nanoGPT's step 0: estimate_loss() under no_grad (graph 0/0, an inference graph), then training (0/1)
EVAL_THEN_TRAIN = ["0/0/forward", "0/1/forward", "0/1/backward"]


def test_a_gradient_is_explained_only_by_graphs_whose_backward_ran_in_its_step():
    scope = graph_scope("grads", 0, EVAL_THEN_TRAIN)
    assert scope.graphs == (("0/1", "forward"), ("0/1", "backward")) and scope.left_out == ("0/0",)
    assert not scope.admits("0/0", "forward") and scope.admits("0/1", "forward") and scope.admits("0/1", "backward")
    assert scope.text() == (
        "the gradients of step 0 come from compiled graph 0/1 (forward and backward); graph 0/0 ran in step 0 "
        "without a backward (under no_grad): it made no gradient"
    )
    loss = graph_scope("loss", 0, EVAL_THEN_TRAIN)  # the loss backward() was called on: the training forward
    assert loss.graphs == (("0/1", "forward"),) and loss.left_out == ("0/0",)
    assert loss.text().startswith("the loss of step 0 comes from compiled graph 0/1 (forward); graph 0/0")


def test_parameters_are_also_explained_by_what_ran_after_the_last_backward():
    """A compiled optimizer step runs under no_grad after the backward: it can change the parameters;
    the evaluation before the training forward cannot."""
    ran = [*EVAL_THEN_TRAIN, "1/0/forward"]
    scope = graph_scope("params", 3, ran)
    assert scope.graphs == (("0/1", "forward"), ("0/1", "backward"), ("1/0", "forward")) and scope.left_out == ("0/0",)
    assert "graph 0/0 ran in step 3 without a backward before the step's last backward" in scope.text()


def test_without_a_record_of_the_step_every_graph_may_explain_it():
    for scope in (graph_scope("grads", 2, None), graph_scope("batch", 2, EVAL_THEN_TRAIN)):
        assert scope.graphs is None and scope.admits("0/0", "forward") and scope.text() is None
    nothing = graph_scope("grads", 1, ["0/0/forward"])  # only an evaluation ran: nothing made the gradient
    assert nothing.graphs == () and nothing.text() == (
        "no compiled graph that ran in step 1 can explain its gradients; graph 0/0 ran in step 1 without a backward "
        "(under no_grad): it made no gradient"
    )


def _log(*events: Any) -> EventLog:
    return EventLog(Path("rank-0/events.jsonl"), [Header(), *events, End()])


def test_which_graphs_a_step_ran_is_read_from_the_last_record_at_or_before_it():
    """The probe writes a step's graphs only when they change: the evaluation at step 0 and again at
    step 4 (nanoGPT's eval_interval), training alone in between."""
    log = _log(
        GraphsRan(step=0, graphs=EVAL_THEN_TRAIN),
        GraphsRan(step=1, graphs=EVAL_THEN_TRAIN[1:]),
        GraphsRan(step=4, graphs=EVAL_THEN_TRAIN),
    )
    assert graphs_ran(log, 0) == EVAL_THEN_TRAIN
    assert graphs_ran(log, 3) == EVAL_THEN_TRAIN[1:]
    assert graphs_ran(log, 4) == EVAL_THEN_TRAIN
    assert step_scope("grads", 3, [log], 0).left_out == () and step_scope("grads", 4, [log], 0).left_out == ("0/0",)
    late = _log(GraphsRan(step=2, graphs=["0/0/forward"]))
    assert graphs_ran(late, 1) == []  # before its first record the run called no probed graph
    # an older log without the record: its probes say which graphs had run by then
    probed = _log(
        GraphProbe(step=0, compile_id="0/0", graph="forward"),
        GraphProbe(step=0, compile_id="0/1", graph="backward"),
        GraphProbe(step=5, compile_id="1/0", graph="forward"),
    )
    assert graphs_ran(probed, 1) == ["0/0/forward", "0/1/backward"]
    assert graphs_ran(_log(Step(index=0)), 0) is None and step_scope("grads", 0, [probed], 1).graphs is None


def _probe(compile_id: str, graph: str, **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "run": "compiled",
        "rank": 0,
        "step": 0,
        "compile_id": compile_id,
        "graph": graph,
        "repeats": 4,
        "runs_differing": 0,
        "threads": 2,
        "differing": [],
        "max_abs": None,
        "explained": {},
        "eager_differing": [],
        "eager_explained": {},
        "one_thread": None,
        "accumulates": False,
        "time_s": 0.1,
        "error": None,
        "not_saved": None,
    }
    return {**record, **fields}


# what the probes of nanoGPT's compiled run showed against eager: the evaluation graph's logits (its only
# output) and, in the training graph, the first LayerNorm's statistics, saved for backward
EVAL_UNLIKE_EAGER = _probe(
    "0/0",
    "forward",
    eager_differing=[0],
    eager_explained={
        "node": "view_9",
        "op": "aten.mm.default",
        "module": "lm_head (Linear)",
        "source": "model.py:186",
        "output": "view_9 (view.default, lm_head (Linear))",
    },
)
TRAIN_UNLIKE_EAGER = _probe(
    "0/1",
    "forward",
    eager_differing=[0, 13],
    eager_explained={
        "node": "getitem_1",
        "op": "aten.var_mean.correction",
        "module": "transformer.h.0.ln_1 (LayerNorm)",
        "source": "model.py:104",
        "output": "getitem_1 (getitem, transformer.h.0.ln_1 (LayerNorm))",
    },
)
# the graph replay at step 0: both forwards' logits differ from their eager FX graphs
REPLAY = {
    "step": 0,
    "graphs": [
        {"compile_id": "0/0", "first_differing_output": 0, "target": "linear", "node": "logits", "max_abs": 6e-7},
        {"compile_id": "0/1", "first_differing_output": 0, "target": "linear", "node": "logits", "max_abs": 6e-7},
    ],
}


def test_a_gradient_divergence_names_the_training_graph_and_its_first_op_unlike_eager_never_the_evaluation():
    scope = graph_scope("grads", 0, EVAL_THEN_TRAIN)
    evidence = graph_evidence(REPLAY, scope, "numerics", None, [EVAL_UNLIKE_EAGER, TRAIN_UNLIKE_EAGER])
    assert (evidence.compile_id, evidence.graph, evidence.localisation) == ("0/1", "forward", "compiled_graph")
    assert evidence.op == "aten.var_mean.correction (FX node getitem_1, compiled graph 0/1, forward)"
    assert (evidence.module, evidence.strength) == ("transformer.h.0.ln_1 (LayerNorm)", "measured")
    assert evidence.scope == scope.text()
    # the same records with no account of which graphs ran: the first graph called that departs, as before
    unknown = graph_evidence(REPLAY, GraphScope("grads", 0, None), "numerics", None, [EVAL_UNLIKE_EAGER])
    assert unknown.compile_id == "0/0" and unknown.scope is None
    # the training graph's forward matches eager: its backward's first gradient unlike eager is named
    backward = _probe(
        "0/1",
        "backward",
        eager_differing=[2],
        eager_explained={"parameter": "lm_head.weight", "node": "mm_1", "op": "aten.mm.default", "max_abs": 3e-9},
    )
    replay = {"step": 0, "graphs": [REPLAY["graphs"][0], {"compile_id": "0/1", "outputs": 2}]}
    named = graph_evidence(replay, scope, "numerics", None, [EVAL_UNLIKE_EAGER, backward])
    assert (named.compile_id, named.graph, named.parameter, named.localisation) == (
        "0/1",
        "backward",
        "lm_head.weight",
        "backward_graph",
    )
    # nothing in the training graph departs: not localised there, and the evaluation is still not blamed
    plain = graph_evidence(replay, scope, "numerics", None, [EVAL_UNLIKE_EAGER])
    assert plain.compile_id is None and "arises in backward" in (plain.localisation or "")


def test_a_race_is_blamed_for_a_gradient_only_in_a_graph_that_made_it():
    race = {"parameter": None, "node": "sum_1", "op": "aten.sum", "source": "model.py:50"}
    eval_race = _probe("0/0", "forward", differing=[0], runs_differing=2, max_abs=1e-9, explained=race)
    train_race = _probe("0/1", "backward", step=1, differing=[1], runs_differing=1, max_abs=2e-9, explained=race)
    scope = graph_scope("grads", 3, EVAL_THEN_TRAIN)
    assert probe_divergence([eval_race], scope) is None
    div, cause, evidence = probe_divergence([eval_race, train_race], scope)
    assert (evidence.compile_id, evidence.graph, cause, evidence.scope) == (
        "0/1",
        "backward",
        "nondeterministic_op",
        scope.text(),
    )
    # where the runs agree (no quantity differs), any graph's race is the divergence
    assert probe_divergence([eval_race, train_race])[2].compile_id == "0/0"


def test_the_evidence_is_one_typed_object_that_round_trips_report_json():
    header = Header()
    logs_a = [EventLog(Path("a/rank-0/events.jsonl"), [header, Step(index=0, grads_fp="a"), End()])]
    logs_b = [EventLog(Path("b/rank-0/events.jsonl"), [header, Step(index=0, grads_fp="b"), End()])]
    scope = graph_scope("grads", 0, EVAL_THEN_TRAIN)
    evidence = Evidence("rounding", strength="inferred").but(
        graph_evidence(REPLAY, scope, "numerics", None, [TRAIN_UNLIKE_EAGER])
    )
    endings = [ending("a", {"exit_code": 0}, logs_a), ending("b", {"exit_code": 0}, logs_b)]
    det = determinism_section(
        Divergence(0, 0, "grads"), False, ("numerics", evidence), ["a", "b"], logs_a, logs_b, [], [], endings,
        Tolerance(), unreadable_exit=3,
    )  # fmt: skip
    report = CheckReport(CheckRun({"a": "a", "b": "b"}), det, [], "DIVERGED")
    data = json.loads(json.dumps(report.to_json()))
    fd = data["determinism"]["first_divergence"]
    # as report.json always said it: the place at the top, the localisation's names in both
    assert (fd["module"], fd["compile_id"], fd["graph"]) == ("transformer.h.0.ln_1 (LayerNorm)", "0/1", "forward")
    assert "module" not in fd["evidence"] and fd["evidence"]["compile_id"] == "0/1"
    assert fd["evidence"]["quantity"] == "grads" and fd["evidence"]["scope"] == scope.text()
    loaded = load_report(data)
    assert isinstance(loaded, CheckReport) and loaded.to_json() == data
    assert loaded.determinism.first_divergence == det.first_divergence


def test_a_first_divergence_written_before_the_evidence_was_typed_reads_back():
    old = {
        "step": 0,
        "rank": 0,
        "what": "grads",
        "module": "lm_head (Linear)",
        "op": "aten.mm.default (FX node view_9, compiled graph 0/0, forward)",
        "source": "model.py:186",
        "phase": None,
        "cause": "numerics",
        "detail": {"grad_norm_a": 0.5},
        "evidence": {
            "because": "rounding",
            "localisation": "compiled_graph",
            "compile_id": "0/0",
            "output_max_abs": 1e-7,
        },
        "compile_id": "0/0",
    }
    fd = FirstDivergence.from_json(old)
    assert (fd.evidence.op, fd.evidence.module, fd.evidence.compile_id) == (old["op"], old["module"], "0/0")
    assert fd.evidence.facts == {"output_max_abs": 1e-7} and fd.evidence.graph is None
    assert fd.to_json() == old


def _saved(run_dir: Path, run: str, graph_id: str, **probe: Any) -> None:
    compile_id, graph = graph_id.rsplit("/", 1)
    folder = run_dir / run / "rank-0" / "graphs" / f"{compile_id.replace('/', '_')}-{graph}"
    folder.mkdir(parents=True)
    meta = {"compile_id": compile_id, "graph": graph, "repeats": 4, "runs_differing": 0, "differing": [], **probe}
    (folder / "meta.json").write_text(json.dumps(meta))
    (folder / "graph.py").write_text("# the FX code\n")


def _check_dir(tmp_path: Path, evidence: Evidence | None) -> Path:
    run_dir = tmp_path / "check"
    for run in ("eager", "compiled"):
        (run_dir / run).mkdir(parents=True)
    for graph_id in ("0/0/forward", "0/1/forward", "0/1/backward"):
        _saved(run_dir, "compiled", graph_id)
    endings = [ending(label, {"exit_code": 0}, []) for label in ("eager", "compiled")]
    logs = [EventLog(Path("rank-0/events.jsonl"), [Header(), Step(index=0), End()])]
    decision = ("numerics", evidence) if evidence else None
    div = Divergence(0, 0, "grads") if evidence else None
    det = determinism_section(div, False, decision, ["eager", "compiled"], logs, logs, [], [], endings, Tolerance(), 3)
    report = CheckReport(CheckRun({"eager": "eager", "compiled": "compiled"}), det, [], "DIVERGED")
    (run_dir / "report.json").write_text(json.dumps(report.to_json()))
    return run_dir


NAMED = Evidence(
    run="compiled",
    compile_id="0/1",
    graph="forward",
    op="aten.var_mean.correction (FX node getitem_1, compiled graph 0/1, forward)",
)


def test_repro_takes_the_graph_the_verdict_names_where_no_probed_graph_differed(tmp_path):
    run_dir = _check_dir(tmp_path, NAMED)
    graph_id, folder, _ = repro.choose(run_dir, None)
    assert graph_id == "0/1/forward" and folder.relative_to(run_dir).parts[0] == "compiled"
    assert repro.choose(run_dir, "0/0/forward")[0] == "0/0/forward"  # --graph still chooses
    # no verdict naming a graph (the runs agreed): as before, none differed, so --graph must say which
    with pytest.raises(InputError, match="no probed graph differed: choose one with --graph"):
        repro.choose(_check_dir(tmp_path / "agreed", None), None)
    # the verdict's graph was not saved (too large): said, never another graph in its place
    gone = _check_dir(tmp_path / "gone", NAMED.but(Evidence(compile_id="2/0")))
    with pytest.raises(InputError, match="verdict names compiled graph 2/0/forward, which .* holds no saved copy"):
        repro.choose(gone, None)


def test_repro_says_where_the_bisection_and_the_verdict_part(tmp_path):
    run_dir = _check_dir(tmp_path, NAMED)
    agree = "backend inductor, subsystem lowerings, application 3 (aten.var_mean)"
    assert repro.apart_from_verdict(run_dir, "0/1/forward", agree) is None
    other = repro.apart_from_verdict(run_dir, "0/1/forward", "backend inductor, subsystem lowerings (aten.mm)")
    assert other is not None and other.startswith("the check's verdict names op aten.var_mean.correction, where")
    chosen = repro.apart_from_verdict(run_dir, "0/0/forward", agree)
    assert chosen == "the check's verdict names compiled graph 0/1/forward, not this one (--graph chose it)"
    fresh = repro.apart_from_verdict(run_dir, "0/1/forward", None)
    assert fresh is not None and "compiled afresh on its saved inputs it matches eager" in fresh
