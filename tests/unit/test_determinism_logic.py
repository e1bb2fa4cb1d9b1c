"""The cause decision of `check` and `diff` on hand-built event logs and replays (no training, no
process): every cause, its hint and the evidence it names; the --against decomposition; the
tolerance; two runs that agree. Each input also carries evidence for another cause, so a change
in the order the evidence is weighed changes the decided cause and fails the test."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from torchrepro.analysis.nondeterminism import (
    CAUSE_HINTS,
    FIXABLE,
    cause_from_decomposition,
    cause_from_kernels,
    cause_from_replays,
    compare,
    decide,
    determinism_section,
    divergence_findings,
    graph_evidence,
    hint_key,
    name_the_race,
    numerics_of_modes,
    numerics_without_inductor,
    probe_divergence,
    uses_inductor,
)
from torchrepro.analysis.divergence import Divergence, Tolerance
from torchrepro.analysis.graph_steps import GraphScope
from torchrepro.analysis.verdict import ending
from torchrepro.eventlog.event_reader import EventLog
from torchrepro.eventlog.events import Compile, End, Event, Header, InitParams, Setting, Step
from torchrepro.reports.check_report import Determinism, Evidence

ENV = {
    "versions": {"torch": "2.13.0", "python": "3.12.3"},
    "threads": {"num_threads": 4},
    "determinism": [{"name": "fallback_random", "value": False}],
    "env_vars": [],
}


def step(i: int, **changes: Any) -> Step:
    """Step ``i`` of a run that fingerprinted everything, with ``changes`` applied."""
    values = {
        "index": i,
        "loss": 1.0 / (i + 1),
        "batch_fp": f"batch{i}",
        "grads_fp": f"grads{i}",
        "grad_norm": 0.5,
        "params_fp": f"params{i}",
        "rng_fps": {"torch_cpu": f"rng{i}"},
        "rng_at": "batch",
    }
    return Step(**{**values, **changes})


def logs(
    steps: int = 4,
    changed: dict[int, dict[str, Any]] | None = None,
    env: dict[str, Any] | None = None,
    events: tuple[Event, ...] = (),
) -> list[EventLog]:
    """One rank's log: header (``env``), ``events`` (compiles, settings, ...), the steps, a normal end."""
    changed = changed or {}
    body = [step(i, **changed.get(i, {})) for i in range(steps)]
    return [EventLog(Path("rank-0/events.jsonl"), [Header(env=env or ENV), *events, *body, End()])]


def env_with(**threads: int) -> dict[str, Any]:
    out = copy.deepcopy(ENV)
    out["threads"].update(threads)
    return out


def graphs(*ops: int, inductor: bool = False) -> tuple[Compile, ...]:
    return tuple(
        Compile(compile_id=f"{i}/0", function="forward", graph_ops=n, inductor_s=0.5 if inductor else None)
        for i, n in enumerate(ops)
    )


def decided(a: list[EventLog], b: list[EventLog], same_config: bool = True) -> tuple[Divergence, str, Evidence]:
    """Compare bit for bit, then decide the first divergence's cause."""
    div, within, _ = compare(a, b, Tolerance())
    assert div is not None and not within
    return (div, *decide(div, a, b, same_config=same_config))


def section(
    div: Divergence | None,
    cause: str | None,
    evidence: Evidence,
    a: list[EventLog],
    b: list[EventLog],
    within: bool = False,
    tol: Tolerance | None = None,
    curve: list | None = None,
) -> Determinism:
    endings = [ending("a", {"exit_code": 0}, a), ending("b", {"exit_code": 0}, b)]
    decision = (cause, evidence) if cause is not None else None
    return determinism_section(
        div, within, decision, ["a", "b"], a, b, curve or [], [], endings, tol or Tolerance(), unreadable_exit=3
    )


def unrestricted(step: int) -> GraphScope:
    """Where it is not known which compiled graphs ran in ``step``: any may explain its loss."""
    return GraphScope("loss", step, None)


def finding(det: Determinism, key: str | None) -> Any:
    (first, *_) = divergence_findings(det, key)
    return first


# --- what the steps prove ---------------------------------------------------------------------


def test_data_order_the_batch_differs_before_anything_else_is_weighed():
    a = logs(events=graphs(10))
    b = logs(
        changed={2: {"batch_fp": "other", "loss": 9.0, "rng_fps": {"torch_cpu": "x"}}},
        env=env_with(num_threads=8),
        events=graphs(12),
    )  # the RNG, the environment and the graphs differ too
    div, cause, evidence = decided(a, b)
    assert (div.step, div.what, cause) == (2, "batch", "data_order")
    assert evidence.because == "the batches of step 2 differ"
    assert hint_key(cause, None, b, evidence) == "data_order"
    det = section(div, cause, evidence, a, b)
    assert det.verdict == "diverged" and det.exit_code(3) == 1
    f = finding(det, hint_key(cause, None, b, evidence))
    assert f.code == "DIVERGED_DATA_ORDER" and f.hint == CAUSE_HINTS["data_order"] and "at step 2" in f.title


def test_rng_the_state_a_step_started_with_differs():
    a = logs()
    b = logs(
        changed={1: {"loss": 9.0, "rng_fps": {"torch_cpu": "x", "generator:loader": "y"}}}, env=env_with(num_threads=8)
    )
    div, cause, evidence = decided(a, b)
    assert (div.step, div.what, cause) == (1, "rng", "rng")
    assert evidence.facts["streams"] == ["generator:loader", "torch_cpu"]
    assert "step 1" in evidence.because and "when its first batch was fetched" in evidence.because
    assert "torch_cpu" in evidence.because and "generator:loader" in evidence.because
    assert hint_key(cause, None, b, evidence) == "rng"
    assert finding(section(div, cause, evidence, a, b), "rng").hint == CAUSE_HINTS["rng"]


def test_rng_read_at_backward_between_configurations_is_a_consequence_not_the_cause():
    a, b = (
        logs(changed={1: {"rng_at": "backward"}}),
        logs(changed={1: {"loss": 9.0, "rng_fps": {"torch_cpu": "x"}, "rng_at": "backward"}}),
    )
    assert decided(a, b, same_config=True)[1] == "rng"
    div, cause, evidence = decided(a, b, same_config=False)  # inductor drew its seed in the forward pass
    assert (div.what, cause, evidence) == ("rng", "unknown", Evidence(strength="unexplained"))


def test_environment_differences_are_weighed_before_the_graphs():
    a = logs(events=graphs(10))
    b = logs(changed={1: {"loss": 9.0}}, env=env_with(num_threads=8), events=graphs(12))
    div, cause, evidence = decided(a, b)
    assert (div.what, cause) == ("loss", "environment")
    assert evidence.facts["differences"] == ["threads.num_threads: 4 vs 8"]
    assert hint_key(cause, None, b, evidence) == "environment"
    assert finding(section(div, cause, evidence, a, b), "environment").hint == CAUSE_HINTS["environment"]


def test_a_configurations_own_switch_is_no_environment_difference():
    fallback = copy.deepcopy(ENV)
    fallback["determinism"] = [{"name": "fallback_random", "value": True}]
    a, b = logs(), logs(changed={1: {"loss": 9.0}}, env=fallback)
    assert decided(a, b, same_config=True)[2].facts["differences"] == ["switch fallback_random: False vs True"]
    assert decided(a, b, same_config=False)[1:] == ("unknown", Evidence(strength="unexplained"))


def test_recompile_the_runs_compiled_different_graphs():
    a, b = logs(events=graphs(10, 4)), logs(changed={3: {"loss": 9.0}}, events=graphs(12, 4))
    div, cause, evidence = decided(a, b)
    assert (div.step, cause) == (3, "recompile")
    assert evidence.facts["differences"] == [
        "rank 0: compile #0 differs: forward (10 ops, first) vs forward (12 ops, first)"
    ]
    assert hint_key(cause, None, b, evidence) == "recompile"
    # different configurations are expected to compile differently
    assert decided(a, b, same_config=False)[1] == "unknown"


def test_unknown_when_only_what_the_step_computed_differs():
    a, b = logs(), logs(changed={2: {"loss": 0.25}})
    div, cause, evidence = decided(a, b)
    assert (div.step, div.what, cause, evidence) == (2, "loss", "unknown", Evidence(strength="unexplained"))
    assert hint_key(cause, None, b, evidence) == "unknown" and "unknown" in FIXABLE
    det = section(div, cause, evidence, a, b)
    fd = det.first_divergence.to_json()
    assert (fd["cause"], fd["step"], fd["what"], fd["detail"]["loss_b"]) == ("unknown", 2, "loss", 0.25)
    f = finding(det, "unknown")
    assert f.code == "DIVERGED_UNKNOWN" and f.hint == CAUSE_HINTS["unknown"]


def test_init_params_before_the_first_step():
    init = lambda *fps: InitParams(
        source="first_forward",
        module="Net",
        names=["fc.weight", "fc.bias"],  # noqa: E731
        fps=list(fps),
    )
    a = logs(events=(init("w", "b"),))
    b = logs(changed={0: {"batch_fp": "other"}}, events=(init("w2", "b"),))  # step 0's batch differs too
    div, cause, evidence = decided(a, b)
    assert (div.what, cause) == ("init_params", "init_params")
    assert evidence.because == "the parameters differ before the first forward (1 tensor(s), first fc.weight)"
    assert hint_key(cause, None, b, evidence) == "init_params"
    det = section(div, cause, evidence, a, b)
    fd = det.first_divergence.to_json()
    assert (fd["module"], fd["before_step"], fd["detail"]["first_parameter"]) == ("Net", 0, "fc.weight")
    assert finding(det, "init_params").title.startswith("DIVERGED before step 0")


# --- what runs beyond the two show ------------------------------------------------------------


def ops(*changed: dict[str, Any]) -> dict[str, Any]:
    base = [
        {
            "i": 0,
            "op": "aten.addmm.default",
            "inputs": ["x0"],
            "outputs": ["y0"],
            "module": "fc",
            "phase": "forward",
            "source": "train.py:10",
        },
        {
            "i": 1,
            "op": "aten.native_dropout.default",
            "inputs": ["y0"],
            "outputs": ["d0"],
            "module": "drop",
            "phase": "forward",
            "source": "train.py:11",
        },
        {
            "i": 2,
            "op": "aten.sum.default",
            "inputs": ["d0"],
            "outputs": ["s0"],
            "module": "head",
            "phase": "forward",
            "source": "train.py:12",
        },
    ]
    return {"ops": [{**op, **(changed[op["i"]] if op["i"] < len(changed) else {})} for op in base]}


def test_nondeterministic_op_same_inputs_different_outputs_in_replay():
    same = {}
    cause, evidence = cause_from_replays("unknown", ops(), ops(same, same, {"outputs": ["s1"]}), same_config=True)
    assert cause == "nondeterministic_op"
    assert (evidence.localisation, evidence.op, evidence.module, evidence.source) == (
        "nondeterministic_op",
        "aten.sum.default",
        "head",
        "train.py:12",
    )
    assert hint_key(cause, None, logs(), evidence) == "nondeterministic_op"
    a, b = logs(), logs(changed={1: {"loss": 9.0}})
    det = section(Divergence(1, 0, "loss"), cause, evidence, a, b)
    fd = det.first_divergence.to_json()
    assert (fd["op"], fd["module"], fd["source"]) == ("aten.sum.default", "head", "train.py:12")
    f = finding(det, "nondeterministic_op")
    assert f.hint == CAUSE_HINTS["nondeterministic_op"] and "op aten.sum.default" in f.title


def test_replays_name_a_random_op_rng_and_an_outside_input_leaves_the_cause():
    same = {}
    cause, evidence = cause_from_replays("unknown", ops(), ops(same, {"outputs": ["d1"]}), same_config=True)
    assert (cause, evidence.localisation, evidence.op) == ("rng", "rng", "aten.native_dropout.default")
    cause, evidence = cause_from_replays("unknown", ops(), ops({"inputs": ["x1"], "outputs": ["y1"]}), True)
    assert (cause, evidence.localisation, evidence.op) == (
        "unknown",
        "input_from_outside_torch",
        "aten.addmm.default",
    )
    # a divergence of the initial parameters stays one, whatever op shows it first
    assert cause_from_replays("init_params", ops(), ops(same, same, {"outputs": ["s1"]}), True)[0] == "init_params"


def test_eager_replays_that_agree_put_the_divergence_inside_compiled_code():
    assert cause_from_replays("unknown", ops(), ops(), same_config=True) == (
        "nondeterministic_op",
        Evidence(localisation="inside compiled code (the eager replays agree)"),
    )
    assert cause_from_replays("unknown", ops(), ops(), same_config=False) == (
        "unknown",
        Evidence(localisation="not reproduced in replay"),
    )
    cause, evidence = cause_from_replays("unknown", ops(), None, True, "the replay ended (exit 0) before step 3")
    assert cause == "unknown" and evidence.localisation == "not_localised"
    assert evidence.facts["localisation_failed"] == "the replay ended (exit 0) before step 3"


KERNEL = {
    "localisation": "compiled_kernel",
    "because": "compiled graph 0/0 (forward): gradient of emb.weight differs "
    "when repeated in one process on identical inputs",
    "compile_id": "0/0",
    "graph": "backward",
    "parameter": "emb.weight",
    "kernel": "cpp_fused_embedding_dense_backward_0",
    "kernel_atomic_add": True,
}


def test_nondeterministic_kernel_an_atomic_add_kernel():
    cause, evidence = cause_from_kernels(Evidence("earlier"), Evidence.from_json(KERNEL))
    assert cause == "nondeterministic_op" and evidence.because == KERNEL["because"]
    on = logs(events=(Setting(name="deterministic_algorithms", value=True),))
    assert hint_key(cause, None, on, evidence) == "nondeterministic_kernel"  # named kernel before the switch
    det = section(Divergence(0, 0, "grads"), cause, evidence, logs(), logs(changed={0: {"grads_fp": "x"}}))
    fd = det.first_divergence.to_json()
    assert (fd["compile_id"], fd["graph"], fd["parameter"], fd["kernel"]) == (
        "0/0",
        "backward",
        "emb.weight",
        "cpp_fused_embedding_dense_backward_0",
    )
    assert finding(det, "nondeterministic_kernel").hint == CAUSE_HINTS["nondeterministic_kernel"]
    # the fix ladder ran: its measured fix leads, the kernel's explanation follows
    det.more["fixes"] = [
        {
            "name": "threads_1",
            "how": "torch.set_num_threads(1)",
            "status": "bit_exact",
            "bit_exact": True,
            "step_time_ratio": 1.5,
        }
    ]
    hint = finding(det, "nondeterministic_kernel").hint
    assert hint.startswith("Measured fix: torch.set_num_threads(1)") and hint.endswith(
        CAUSE_HINTS["nondeterministic_kernel"]
    )
    assert "atomic" not in finding(det, "nondeterministic_op").hint


def test_nondeterministic_op_with_deterministic_algorithms_already_on():
    no_atomic = {k: v for k, v in KERNEL.items() if k != "kernel_atomic_add"}
    cause, evidence = cause_from_kernels(Evidence(), Evidence.from_json(no_atomic))
    on = logs(events=(Setting(name="deterministic_algorithms", value=True),))
    off = logs(events=(Setting(name="deterministic_algorithms", value=False),))
    assert hint_key(cause, None, on, evidence) == "nondeterministic_op_deterministic_on"
    assert hint_key(cause, None, off, evidence) == "nondeterministic_op"
    det = section(Divergence(0, 0, "grads"), cause, evidence, off, on)
    assert (
        finding(det, "nondeterministic_op_deterministic_on").hint == CAUSE_HINTS["nondeterministic_op_deterministic_on"]
    )


# --- --against: eager, compiled and fallback_random side by side ----------------------------


def decomposition(rng_abs: float | None, numerics_abs: float | None) -> dict[str, Any]:
    row = lambda x, y, d: {"between": [x, y], "bit_exact": not d, "final_max_abs": d, "final_max_rel": d}  # noqa: E731
    return {
        "rng": row("fallback-random", "compiled", rng_abs),
        "numerics": row("eager", "fallback-random", numerics_abs),
        "total": row("eager", "compiled", (rng_abs or 0) + (numerics_abs or 0)),
    }


def test_rng_compiled_fallback_random_removes_the_difference():
    eager, compiled = logs(), logs(changed={0: {"loss": 9.0}}, events=graphs(10, inductor=True))
    div, cause, evidence = decided(eager, compiled, same_config=False)
    assert cause == "unknown" and uses_inductor(compiled) and not uses_inductor(eager)
    dec = decomposition(1e-2, None)
    cause, evidence = cause_from_decomposition(dec, "eager")
    assert cause == "rng"
    assert evidence == Evidence(
        "with fallback_random=True the compiled run matches eager bit for bit",
        strength="inferred",
        facts={"remaining_numerics": dec["numerics"]},
    )
    assert hint_key(cause, "eager", compiled, evidence) == "rng_compiled"
    assert hint_key(cause, None, compiled, evidence) == "rng"
    det = section(div, cause, evidence, eager, compiled)
    f = finding(det, hint_key(cause, "eager", compiled, evidence))
    assert f.code == "DIVERGED_RNG" and f.hint == CAUSE_HINTS["rng_compiled"]


def test_rng_compiled_when_most_of_the_difference_goes_with_fallback_random():
    cause, evidence = cause_from_decomposition(decomposition(1e-4, 1e-6), "eager")  # more than 10x
    assert cause == "rng" and evidence.because == (
        "fallback_random=True removes most of the difference; 1e-06 remains (numerics)"
    )
    cause, evidence = cause_from_decomposition(decomposition(1e-6, 1e-2), "fallback-random")  # by construction
    assert cause == "rng" and "only in inductor's RNG implementation" in evidence.because


def test_numerics_fallback_random_does_not_remove_the_difference():
    dec = decomposition(5e-6, 1e-6)  # under 10x: rounding
    cause, evidence = cause_from_decomposition(dec, "eager")
    assert cause == "numerics" and evidence == Evidence(
        "fallback_random=True does not remove the difference: rounding, not RNG",
        strength="inferred",
        facts={"magnitude": dec["numerics"]},
    )
    assert hint_key(cause, "eager", logs(), evidence) == "numerics" and "numerics" in FIXABLE
    assert (
        finding(
            section(Divergence(0, 0, "loss"), cause, evidence, logs(), logs(changed={0: {"loss": 9.0}})), "numerics"
        ).hint
        == CAUSE_HINTS["numerics"]
    )


def test_numerics_without_inductor_and_between_stored_runs_of_two_modes():
    assert numerics_without_inductor() == (
        "numerics",
        Evidence("compiled without inductor RNG: the difference is rounding", strength="inferred"),
    )
    assert numerics_of_modes("eager", None) == (
        "numerics",
        Evidence("compile modes differ (eager vs None)", strength="inferred"),
    )
    assert numerics_of_modes("eager", "eager") is None


def test_graph_evidence_names_the_compiled_graph_and_the_random_op_behind_the_output():
    replay = {
        "graphs": [
            {"compile_id": "0/0"},
            {
                "compile_id": "1/0",
                "first_differing_output": 0,
                "target": "aten.mul",
                "node": "mul_1",
                "max_abs": 0.5,
                "depends_on_random": [
                    {"target": "aten.bernoulli_", "node": "bernoulli", "module": "drop", "source": "train.py:11"}
                ],
            },
        ]
    }
    evidence = graph_evidence(replay, unrestricted(3), "rng")  # the random op is blamed when the cause is RNG
    assert (evidence.compile_id, evidence.module, evidence.source) == ("1/0", "drop", "train.py:11")
    assert evidence.op == "aten.bernoulli_ (FX node bernoulli, compiled graph 1/0)"
    assert evidence.output == "output 0 (aten.mul, FX node mul_1)" and evidence.facts["random_nodes"]
    assert (
        "2 compiled graph call(s) of step 3 match"
        in graph_evidence({"graphs": replay["graphs"][:1] * 2}, unrestricted(3)).localisation
    )


def test_graph_evidence_names_where_a_forward_first_departs_from_eager_when_the_cause_is_rounding():
    replay = {"graphs": [{"compile_id": "0/0", "first_differing_output": 0, "target": "linear", "node": "logits"}]}
    named = {
        "node": "getitem_1",
        "output": "getitem_1 (getitem, h.0.ln_1 (LayerNorm))",
        "op": "aten.var_mean.correction",
        "module": "h.0.ln_1 (LayerNorm)",
        "source": "train.py:25",
        "kernel": "cpp_fused_native_layer_norm_0",
    }
    forward = {"graph": "forward", "compile_id": "0/0", "eager_differing": [0, 21], "eager_explained": named}
    other = {**forward, "compile_id": "1/0"}
    evidence = graph_evidence(replay, unrestricted(0), "numerics", probes=[other, forward])
    assert evidence.op == "aten.var_mean.correction (FX node getitem_1, compiled graph 0/0, forward)"
    assert (evidence.module, evidence.source) == ("h.0.ln_1 (LayerNorm)", "train.py:25")
    assert evidence.output == "output 0 (linear, FX node logits)"  # the graph's output, still said
    assert evidence.facts["first_differing"] == named["output"] and evidence.kernel == named["kernel"]
    # no probe of that forward, one that matched eager, or a random op behind an RNG cause: the output's node
    for probes in ([other], [{**forward, "eager_differing": []}]):
        assert (
            graph_evidence(replay, unrestricted(0), "numerics", probes=probes).op
            == "linear (FX node logits, compiled graph 0/0)"
        )
    random = [{"target": "aten.bernoulli_", "node": "bernoulli", "module": "drop", "source": "train.py:11"}]
    rng = graph_evidence(
        {"graphs": [{**replay["graphs"][0], "depends_on_random": random}]}, unrestricted(0), "rng", probes=[forward]
    )
    assert rng.op == "aten.bernoulli_ (FX node bernoulli, compiled graph 0/0)" and "first_differing" not in rng.facts


def test_against_eager_a_compiled_run_that_races_is_named_by_the_graph_its_probe_found():
    """The decomposition says the compiled run is not reproducible (nondeterministic_op); its probe
    found the backward graph whose gradient differs on identical inputs: that graph and kernel are
    named, not the forward op where compiled departs from eager (kept under against_eager)."""
    decided = cause_from_decomposition(
        {
            "rng": {"bit_exact": False, "final_max_abs": 1e-8},
            "numerics": {"bit_exact": False, "final_max_abs": 1e-7},
            "run_to_run": {"bit_exact": False, "final_max_abs": 1e-11, "between": ["compiled", "compiled-again"]},
        },
        "eager",
    )
    assert decided[0] == "nondeterministic_op"
    replay = {"graphs": [{"compile_id": "0/0", "first_differing_output": 0, "target": "linear", "node": "logits"}]}
    evidence = decided[1].but(graph_evidence(replay, unrestricted(0), "nondeterministic_op"))
    probe = {
        "run": "compiled",
        "rank": 0,
        "step": 0,
        "compile_id": "0/1",
        "graph": "backward",
        "repeats": 2,
        "runs_differing": 1,
        "threads": 2,
        "differing": [1],
        "max_abs": 2e-9,
        "explained": {
            "parameter": "transformer.wte.weight",
            "node": "embedding_dense_backward",
            "op": "aten.embedding_dense_backward.default",
            "source": "model.py:177",
            "kernel": "cpp_fused_embedding_dense_backward_3",
            "kernel_atomic_add": True,
        },
    }
    race = probe_divergence([probe])
    assert race is not None
    named = name_the_race(evidence, race[2])
    assert (named.compile_id, named.graph, named.parameter) == ("0/1", "backward", "transformer.wte.weight")
    assert (named.op, named.source, named.named_by) == (
        "aten.embedding_dense_backward.default",
        "model.py:177",
        "graph_probe",
    )
    assert named.kernel_atomic_add and hint_key("nondeterministic_op", "eager", [], named) == "nondeterministic_kernel"
    assert named.because.startswith("the compiled run is not reproducible run to run")
    assert "compiled graph 0/1 (backward) of compiled: gradient of transformer.wte.weight differs" in named.because
    assert named.facts["run_to_run"]["final_max_abs"] == 1e-11  # the decomposition's evidence stays
    assert named.facts["against_eager"]["op"] == "linear (FX node logits, compiled graph 0/0)"
    assert named.facts["against_eager"]["localisation"] == "compiled_graph" and named.localisation is None


# --- tolerance and agreement ------------------------------------------------------------------


def test_within_tolerance_when_losses_and_parameters_are_close():
    a = logs()
    b = logs(changed={2: {"loss": 1 / 3 + 1e-9, "grads_fp": "g", "params_fp": "p"}, 3: {"params_fp": "q"}})
    tol = Tolerance(atol=1e-6)
    div, within, notes = compare(a, b, tol, params_within=lambda: True)
    assert (div, within, notes) == (None, True, [])
    det = section(div, None, Evidence(), a, b, within=True, tol=tol, curve=[{"step": 3, "max_abs": 2e-7}])
    assert (det.verdict, det.exit_code(3), det.first_divergence) == ("within_tolerance", 0, None)
    assert det.more["largest_difference"]["params_max_abs"] == 2e-7
    assert det.more["largest_difference"]["loss_max_abs"] == pytest.approx(1e-9, rel=1e-3)
    assert divergence_findings(det, None) == []
    # the final parameters beyond the tolerance: the first (exact) divergence stands
    div, within, _ = compare(a, b, tol, params_within=lambda: False)
    assert (div.step, div.what, within) == (2, "loss", False)
    # without snapshots the note says what was held to the tolerance
    assert compare(a, b, tol)[2] == [
        "no parameter snapshots: only losses and gradient norms were held to the tolerance"
    ]
    # bit for bit, the same runs diverge
    assert compare(a, b, Tolerance(), params_within=lambda: True)[0].step == 2
    # beyond the tolerance, they diverge too
    assert compare(a, b, Tolerance(atol=1e-12), params_within=lambda: True)[0].step == 2


def test_runs_that_agree_bit_for_bit():
    a, b = logs(), logs()
    div, within, notes = compare(a, b, Tolerance(atol=1e-3), params_within=lambda: False)  # never consulted
    assert (div, within, notes) == (None, False, [])
    det = section(None, None, Evidence(), a, b)
    assert (det.verdict, det.exit_code(3), det.steps_compared, det.first_divergence) == (
        "bit_exact",
        0,
        4,
        None,
    )
    assert divergence_findings(det, None) == []


def test_agreeing_runs_of_different_environments_say_so():
    a, b = logs(), logs(env=env_with(num_threads=8))
    det = section(None, None, Evidence(), a, b)
    assert det.verdict == "bit_exact" and det.environment_differences == ["threads.num_threads: 4 vs 8"]
    assert det.notes == ["the environments differ (threads.num_threads: 4 vs 8), yet the compared steps agree"]


def test_every_cause_has_a_hint():
    keys = {
        "data_order",
        "rng",
        "rng_compiled",
        "numerics",
        "nondeterministic_op",
        "nondeterministic_kernel",
        "nondeterministic_op_deterministic_on",
        "init_params",
        "environment",
        "recompile",
        "unknown",
        "unknown_diff",  # diff of two stored runs: no --runs to suggest
        "shared_files",  # a file one run wrote and a later one read
    }
    assert set(CAUSE_HINTS) == keys and all(CAUSE_HINTS.values())
