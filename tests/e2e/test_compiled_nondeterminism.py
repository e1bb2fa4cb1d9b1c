"""Nondeterminism inside compiled code (issue 13): a GPT-style model compiled with inductor and
trained with 2 threads is not bit-exact on torch 2.13 CPU. `check` localises it to the compiled
graph, the parameter's gradient and the inductor kernel, and the fix ladder finds the fix that is
really bit-exact. Also the ladder's decision logic on recorded results (pure, no torch run)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import markupsafe
import pytest
import torch

from torchrepro.analysis.fix_ranking import (
    Candidate,
    FixRun,
    candidates,
    first_changing_stage,
    fix_hint,
    judge_fix,
    recommend,
    step_cost,
)
from torchrepro.analysis.verdict import ending
from torchrepro.capture.kernels import fused_ops, producers
from torchrepro.eventlog.event_reader import EventLog
from torchrepro.eventlog.events import End, Header, Step
from torchrepro.eventlog.payloads import ExplainedOutput, KernelCall, KernelSummary

from test_payloads import fits

SCRIPTS = Path(__file__).parents[1] / "scripts"
REPO = Path(__file__).resolve().parents[2]


# --- the ladder's decisions, on recorded results ---------------------------------------------


def _log(end: End | None = End(), times=(5.0, *[0.1] * 7)) -> EventLog:
    events = [Header(world_size=1), *(Step(index=i, time_s=t) for i, t in enumerate(times))]
    return EventLog(Path("rank-0/events.jsonl"), events + ([end] if end else []))


def _fix_run(meta: dict, log: EventLog) -> FixRun:
    """What the ladder makes of one recorded run (the same reading as fix_ladder._try)."""
    e = ending("fix", meta, [log])
    return FixRun(
        ok=e.ok,
        problems=e.problems,
        timed_out=bool(meta.get("stalled_after_s")),
        step_times={s.index: s.time_s for s in log.of(Step)},
    )


LADDER = {c.name: c for c in candidates(compiled=True, inductor=True, random_ops=False, frames=[0], function="forward")}


def test_candidates_apply_by_evidence():
    names = [c.name for c in LADDER.values() if c.applicable]
    assert names == ["threads_1", "deterministic", "aot_eager", "eager"]
    assert LADDER["aot_eager"].spec == "aot_eager:0" and "backend='aot_eager') for forward" in LADDER["aot_eager"].how
    assert not LADDER["fallback_random"].applicable and "random" in LADDER["fallback_random"].why_not
    with_rng = {c.name: c for c in candidates(compiled=True, inductor=True, random_ops=True)}
    assert with_rng["fallback_random"].applicable and with_rng["aot_eager"].spec == "aot_eager"
    eager_only = [c.name for c in candidates(compiled=False, inductor=False, random_ops=True) if c.applicable]
    assert eager_only == ["threads_1", "deterministic"]


BASELINE = {i: 0.1 for i in range(8)}


def test_a_cost_is_measured_on_the_same_steps_after_warm_up_or_not_shown():
    # the baseline's steps 1-3 wait for its DataLoader workers to start; the fix's runs stop after step 3
    starting = {0: 9.0, 1: 4.0, 2: 4.0, 3: 4.0, **{i: 0.1 for i in range(4, 10)}}
    early = step_cost(starting, [{i: 0.135 for i in range(4)}] * 2)
    assert isinstance(early, str) and early.startswith("cost not measured: 0 comparable steps after warm-up")
    # on steps 4-9 of both: one thread 1.35x slower, whatever the warm-up did; a step that compiled is absent
    fix = [{i: 0.135 for i in range(10) if i != 6}, {**{i: 0.135 for i in range(10)}, 5: 0.2, 7: 0.2, 8: 0.2}]
    cost = step_cost(starting, fix)
    assert not isinstance(cost, str)
    assert (cost["ratio"], cost["first"], cost["last"], cost["steps"]) == (1.35, 4, 9, 5)
    assert cost["low"] == 1.35 and cost["high"] > 1.5  # the spread shows the slow steps
    row = judge_fix(LADDER["threads_1"], [FixRun(ok=True, step_times=f) for f in fix], False, 10, starting)
    assert row["step_time_ratio"] == 1.35 and row["steps_timed"] == [4, 9, 5]
    short = judge_fix(
        LADDER["threads_1"], [FixRun(ok=True, step_times=dict(enumerate([0.1] * 4)))] * 2, False, 4, starting
    )
    assert short["step_time_ratio"] is None and short["cost_not_measured"].startswith("cost not measured")
    assert "cost not measured" in fix_hint([short])


def test_crash_and_timeout_are_reported_per_fix_and_the_others_still_shown():
    ok = {"exit_code": 0}
    crashed = [
        _fix_run(
            {"exit_code": 1},
            _log(End(exit_code=1, status="error", error="RuntimeError: no deterministic implementation")),
        ),
        _fix_run(ok, _log()),
    ]
    timed_out = [_fix_run({"exit_code": -15, "stalled_after_s": 301.0}, _log(None)), _fix_run(ok, _log())]
    exact_slow = [_fix_run(ok, _log(times=(5.0, *[0.3] * 7))), _fix_run(ok, _log(times=(5.0, *[0.3] * 7)))]
    exact_fast = [_fix_run(ok, _log(times=(5.0, *[0.12] * 7))), _fix_run(ok, _log(times=(5.0, *[0.12] * 7)))]
    not_exact = [_fix_run(ok, _log()), _fix_run(ok, _log())]
    rows = [
        judge_fix(LADDER["threads_1"], not_exact, True, 4, BASELINE),
        judge_fix(LADDER["deterministic"], crashed, None, 0, BASELINE),
        judge_fix(LADDER["fallback_random"], [], None, 0, BASELINE),
        judge_fix(LADDER["aot_eager"], timed_out, None, 0, BASELINE),
        judge_fix(LADDER["eager"], exact_slow, False, 4, BASELINE),
    ]
    status = {r["name"]: r["status"] for r in rows}
    assert status == {
        "threads_1": "not_bit_exact",
        "deterministic": "failed",
        "fallback_random": "not_applicable",
        "aot_eager": "timed_out",
        "eager": "bit_exact",
    }
    assert "no deterministic implementation" in " ".join(rows[1]["problems"])
    assert rows[0]["bit_exact"] is False and rows[1]["bit_exact"] is None and rows[4]["bit_exact"] is True
    assert rows[4]["step_time_ratio"] == 3.0
    best = recommend(rows)
    assert best["name"] == "eager"
    hint = fix_hint(rows)
    assert best["how"] in hint and "3.00x the step time (3.00-3.00 over steps 4-7)" in hint
    for failed in ("threads_1", "deterministic", "aot_eager"):  # said, never recommended
        assert failed in hint.split("Tried and not bit-exact or failed:")[1]
    # a cheaper bit-exact fix wins; equal cost falls back to the ladder's order
    rows.append(judge_fix(LADDER["threads_1"], exact_fast, False, 4, BASELINE) | {"name": "threads_1"})
    assert recommend(rows)["name"] == "threads_1"


def test_no_bit_exact_fix_recommends_nothing():
    rows = [judge_fix(LADDER["threads_1"], [FixRun(ok=True, step_times={0: 1, 1: 1})] * 2, True, 2, {0: 1.0})]
    assert recommend(rows) is None and fix_hint(rows).startswith("No candidate fix")
    assert judge_fix(Candidate("x", "x"), [FixRun(ok=True)] * 2, None, 0, None)["status"] == "nothing_compared"


def test_first_changing_backend_stage():
    stages = [
        {"name": "eager"},
        {"name": "aot_eager", "bit_exact_with_previous": True},
        {"name": "fallback-random", "bit_exact_with_previous": False},
        {"name": "inductor", "bit_exact_with_previous": False},
    ]
    assert first_changing_stage(stages) == {"stage": "fallback-random", "previous": "aot_eager"}
    assert first_changing_stage(stages[:2]) is None


WRAPPER = """
cpp_fused_add_embedding_dense_backward_0 = async_compile.cpp_pybinding(['const float*','const long*','float*'], r\'\'\'
extern "C" void kernel(const float* in_ptr0, const int64_t* in_ptr1, float* out_ptr0)
{ atomic_add(&out_ptr0[tmp0], tmp1); }
\'\'\')
cpp_fused_mul_1 = async_compile.cpp_pybinding(['const float*', 'float*'], r\'\'\'
extern "C" void kernel(const float* in_ptr0, float* out_ptr0) { out_ptr0[i] = in_ptr0[i] * 2; }
\'\'\')

class Runner:
    def call(self, args):
        primals_1, tangents_1 = args
        args.clear()
        buf0 = empty_strided_cpu((96, 64), (64, 1), torch.float32)
        cpp_fused_add_embedding_dense_backward_0(tangents_1, primals_1, buf0)
        buf1 = empty_strided_cpu((96, 64), (64, 1), torch.float32)
        extern_kernels.addmm(buf0, tangents_1, tangents_1, alpha=1, beta=1, out=buf1)
        buf2 = empty_strided_cpu((4, ), (1, ), torch.float32)
        cpp_fused_mul_1(tangents_1, buf2)
        return (buf1, None, reinterpret_tensor(buf2, (4, ), (1, ), 0), )
"""


def test_the_kernel_behind_an_output_is_found_in_inductors_wrapper_code():
    assert producers(WRAPPER, 0) == ["extern_kernels.addmm", "cpp_fused_add_embedding_dense_backward_0"]
    assert producers(WRAPPER, 2) == ["cpp_fused_mul_1"]
    assert producers(WRAPPER, 1) == []
    assert fused_ops(
        "cpp_fused_add_embedding_dense_backward_sum_0", ["add", "embedding_dense_backward", "sum", "embedding"]
    ) == ["add", "embedding_dense_backward", "sum"]
    assert fused_ops("cpp_fused__unsafe_view_clone_3", ["_unsafe_view", "clone"]) == ["_unsafe_view", "clone"]


# --- the patches of a kernel replay are undone -------------------------------------------------


def test_kernel_repeater_undoes_every_patch():
    import torch._functorch.config as functorch_config
    import torch._inductor.compile_fx as compile_fx_module

    from torchrepro.capture.kernels import KernelRepeater

    before = (compile_fx_module.compile_fx, functorch_config.enable_autograd_cache)
    repeater = KernelRepeater()
    assert repeater.install()
    assert compile_fx_module.compile_fx is not before[0] and functorch_config.enable_autograd_cache is False
    repeater.uninstall()
    assert (compile_fx_module.compile_fx, functorch_config.enable_autograd_cache) == before


def _repeat(real, threads=2):
    """KernelRepeater's repeats of ``real`` after the step's own call, at ``threads`` threads."""
    from torchrepro.capture.kernels import KernelRepeater

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.arange(4.0)
        return KernelRepeater()._repeat(real, [x], real([x]), "0/0", "backward")
    finally:
        torch.set_num_threads(before)


def test_repeats_go_on_until_a_race_shows_then_as_many_at_one_thread():
    threads = []

    def racy(args):  # the race shows in its 7th call only (the 6th repeat), and never at 1 thread
        threads.append(torch.get_num_threads())
        return (args[0] * 2 + (1e-3 if len(threads) == 7 and threads[-1] > 1 else 0),)

    result = _repeat(racy)
    assert result["repeats"] == 6 and set(result["repeat_differs"]) == {"0"}
    assert result["repeat_differs"]["0"] == pytest.approx(1e-3)
    assert threads[:7] == [2] * 7 and threads[7:] == [1] * 7  # the first at 1 thread, then 6 repeats
    assert result["one_thread_differs"] == {}


def test_repeats_of_an_exact_graph_stop_at_the_cap_or_the_time_budget(monkeypatch):
    from torchrepro.capture import kernels

    assert _repeat(lambda args: (args[0] * 2,))["repeats"] == kernels.MAX_REPEATS
    monkeypatch.setattr(kernels, "REPEAT_BUDGET_S", 0.05)

    def slow(args):
        time.sleep(0.03)
        return (args[0] * 2,)

    result = _repeat(slow, threads=1)  # the minimum, then the budget is spent; no one-thread pass
    assert result["repeats"] == kernels.MIN_REPEATS and result["one_thread_differs"] is None


# --- the GPT-style script: check localises it and the ladder finds a fix -----------------------

GPT = SCRIPTS / "gpt_tied.py"


def _line_of(text: str) -> int:
    return next(i for i, line in enumerate(GPT.read_text().splitlines(), 1) if text in line)


@pytest.fixture(scope="session")  # built once: its tests share one worker (xdist_group "gpt")
def gpt_check(tmp_path_factory):
    """One `check` of the GPT script (4 steps), trying two fixes: ~3-6 min on 2 loaded cores.

    The race behind this nondeterminism needs both intra-op threads running at once; on a machine
    busy with other tests they can take turns, and then the two runs truthfully agree. That is not
    what these tests are about: such a check (its probes name the race, but the fix ladder needs
    runs that differ) is run again (at most three times)."""
    for attempt in range(3):
        out = tmp_path_factory.mktemp("gpt") / "check"
        argv = ["check", "--out", str(out), "--only-fixes", "threads_1,deterministic", str(GPT), "--", "4"]
        proc = subprocess.run(
            [sys.executable, "-m", "torchrepro", *argv], capture_output=True, text=True, timeout=1500, cwd=out.parent
        )
        report = json.loads((out / "report.json").read_text())
        if report["determinism"].get("fixes"):  # the runs diverged (a race only the probes saw tries no fix)
            break
    return proc, report, out


@pytest.mark.inductor
@pytest.mark.xdist_group("gpt")
@pytest.mark.slow  # the GPT check (inductor, replays, two fix runs; minutes): make test-slow
def test_check_names_graph_parameter_kernel_and_source(gpt_check):
    proc, report, _ = gpt_check
    assert proc.returncode == 1, proc.stderr[-2000:]
    det = report["determinism"]
    fd = det["first_divergence"]
    # the race shows at the first step it happens to hit (step 0 on a quiet machine, later under load)
    assert det["verdict"] == "diverged" and fd["step"] in range(4) and fd["cause"] == "nondeterministic_op"
    assert (fd["compile_id"], fd["graph"], fd["parameter"]) == ("0/0", "backward", "tok.weight")
    assert fd["module"] == "tok"  # the parameter's owner: a backward node carries no module of its own
    assert fd["kernel"].startswith("cpp_fused_") and "embedding_dense_backward" in fd["kernel"]
    assert "aten.embedding_dense_backward" in fd["kernel_fuses"] and fd["op"] == "aten.embedding_dense_backward"
    assert fd["source"] == f"{GPT}:{_line_of('self.tok(idx)')}"
    assert fd["node"] and fd["evidence"]["kernel_atomic_add"] is True
    evidence = fd["evidence"]
    # what named it: two replays' graph calls compared across processes, or (supporting) the repeat
    # (or the runs' own probes, which make the replays unnecessary)
    said = {
        "replay_pair": "between two replays in separate processes",
        "in_process_repeat": "repeated in one process",
        "graph_probe": "called again on identical inputs in the run's own process",
    }
    assert said[evidence["named_by"]] in evidence["because"]  # the report says which evidence named it
    threads = evidence["thread_dependence"]
    assert threads["threads"] == 2 and threads["one_thread"] == "repeats bit for bit"
    assert "compiled-nondeterminism.md" in report["findings"][0]["hint"]
    replays = sorted(k for k in report["run"]["timings_s"] if k.startswith("replay"))
    pairs = evidence.get("replay_pairs", 0)  # no eager replay was needed; none at all after a probe named it
    assert replays == sorted(f"replay kernels-{s}{i if i > 1 else ''}" for i in range(1, pairs + 1) for s in "ab")


@pytest.mark.inductor
@pytest.mark.xdist_group("gpt")
@pytest.mark.slow  # shares the GPT check above
def test_the_ladder_finds_a_bit_exact_fix_and_recommends_only_that(gpt_check):
    proc, report, out = gpt_check
    det = report["determinism"]
    rows = {r["name"]: r for r in det["fixes"]}
    assert rows["deterministic"]["bit_exact"] is True
    for row in rows.values():  # 4 steps: none to time after the 4 warm-up steps, so no cost is claimed
        assert row["step_time_ratio"] is None and row["cost_not_measured"].startswith("cost not measured: 0 ")
    assert (out / "fix-baseline" / "run.json").exists()
    assert rows["threads_1"]["status"] in ("bit_exact", "not_bit_exact")
    assert set(rows) == {"threads_1", "deterministic"}  # --only-fixes
    best = det["fix_recommended"]
    assert best["bit_exact"] is True and rows[best["name"]]["status"] == "bit_exact"
    assert best["how"] in report["findings"][0]["hint"] and f"measured fix: {best['name']}" in report["verdict"]
    for row in det["fixes"]:
        if row["status"] == "not_bit_exact":
            assert row["how"] not in report["findings"][0]["hint"].split("Tried")[0]
    # the fix runs stopped cleanly two steps after the divergent step
    ends = [json.loads(p.read_text())["exit_code"] for p in out.glob("fix-*/run.json")]
    assert ends and all(code == 0 for code in ends)
    page = (out / "report.html").read_text()
    shown = str(markupsafe.escape(best["how"].split(" (")[0]))  # as the page escapes it (quotes too)
    assert "tok.weight" in page and shown in page and det["first_divergence"]["kernel"] in page


# --- every output a compiled graph can return; evidence from two processes ----------------------


def test_same_compares_every_kind_of_graph_output_bit_for_bit():
    from torchrepro.capture.fx_nodes import same

    m = torch.arange(12.0).reshape(3, 4)
    assert same(torch.tensor(1.5), torch.tensor(1.5)) == (True, 0.0)  # a 0-dim loss
    assert same(torch.tensor(1.5), torch.tensor(2.0)) == (False, 0.5)
    assert same(torch.tensor(True), torch.tensor(False)) == (False, 1.0)
    assert same(torch.tensor([3, 4]), torch.tensor([3, 6])) == (False, 2.0)
    assert same(torch.zeros(0, 3), torch.zeros(0, 3)) == (True, 0.0)
    assert same(torch.zeros(0, 3), torch.zeros(0, 2)) == (False, None)
    assert same(m.t(), m.t().contiguous()) == (True, 0.0)  # a non-contiguous view: its values count
    assert same(m[1:, ::2], m[1:, ::2] + 1)[0] is False
    c = torch.tensor([1 + 1j], dtype=torch.complex64)
    assert same(c, c.conj()) == (False, 2.0)
    assert same(torch.tensor(0.0), torch.tensor(-0.0))[0] is False  # bits, not ==
    assert same(torch.tensor(float("nan")), torch.tensor(float("nan")))[0] is True
    assert same((m, None, (2, torch.tensor(1.0))), (m, None, (2, torch.tensor(1.0)))) == (True, 0.0)
    assert same((m, None, (2, torch.tensor(1.0))), (m, None, (2, torch.tensor(3.0)))) == (False, 2.0)
    assert same((m, None), (m,))[0] is False and same(0.5, 0.5) == (True, 0.0) and same(1, 1.0)[0] is False


def _call(cid, inputs, outputs, graph="backward", **more):
    return {"compile_id": cid, "graph": graph, "inputs": inputs, "outputs": outputs, **more}


def test_two_processes_name_the_first_graph_call_whose_outputs_differ_on_equal_inputs():
    from torchrepro.commands.check.fix_ladder import first_cross_difference

    a = [_call("0/0", ["x"], ["f"], "forward"), _call("0/0", ["f", "t"], ["g1", "g2"])]
    b = [_call("0/0", ["x"], ["f"], "forward"), _call("0/0", ["f", "t"], ["g1", "G2"])]
    assert first_cross_difference(a, b) == ((a[1], 1), None)
    assert first_cross_difference(a, a) == (None, None)  # the race did not recur: no evidence
    outside = [_call("0/0", ["x"], ["f"], "forward"), _call("0/0", ["f", "T"], ["g1", "G2"])]
    hit, parted = first_cross_difference(a, outside)  # inputs parted before any output did
    assert hit is None and "outside compiled code" in parted and "graph call 2 (0/0 backward)" in parted
    other = [_call("1/0", ["x"], ["f"], "forward")]
    assert first_cross_difference(a, other) == (None, "graph call 1 (0/0 forward): the replays called different graphs")


def test_the_op_blamed_follows_the_cause_not_the_first_random_op():
    from torchrepro.analysis.graph_steps import GraphScope
    from torchrepro.analysis.nondeterminism import graph_evidence

    dropout = {"node": "x", "target": "dropout", "module": "drop (Dropout)", "source": "m.py:3"}
    graph = {
        "compile_id": "0/0",
        "first_differing_output": 0,
        "max_abs": 1e-7,
        "node": "logits",
        "target": "linear",
        "module": "head (Linear)",
        "source": "m.py:9",
        "depends_on_random": [dropout],
    }
    scope = GraphScope("loss", 0, None)
    numerics = graph_evidence({"graphs": [graph]}, scope, "numerics")
    assert numerics.op == "linear (FX node logits, compiled graph 0/0)" and numerics.module == "head (Linear)"
    rng = graph_evidence({"graphs": [graph]}, scope, "rng")
    assert rng.op == "dropout (FX node x, compiled graph 0/0)" and rng.module == "drop (Dropout)"


def test_a_failed_localisation_is_said_with_its_exception_and_what_was_concluded():
    from torchrepro.analysis.graph_steps import GraphScope
    from torchrepro.analysis.nondeterminism import cause_from_replays, graph_evidence
    from torchrepro.reports.check_report import Evidence
    from torchrepro.commands.check.runs import _why_no_record
    from torchrepro.commands.launcher import ChildResult

    why = _why_no_record(ChildResult(1, ["Traceback (most recent call last):", "RuntimeError: boom here", ""]), 3)
    assert why == "the replay exited with 1: RuntimeError: boom here"
    assert _why_no_record(ChildResult(0), 3) == "the replay ended (exit 0) before step 3"
    scope = GraphScope("loss", 3, None)
    evidence = graph_evidence(None, scope, "numerics", why)
    assert evidence.localisation == "not_localised" and evidence.facts["localisation_failed"] == why
    assert "RuntimeError: boom here" in evidence.localisation_note and "cause numerics" in evidence.localisation_note
    crashed = graph_evidence({"graphs": [{"compile_id": "0/1", "error": "ValueError: odd output"}]}, scope, "rng")
    assert "compiled graph 0/1: ValueError: odd output" in crashed.facts["localisation_failed"]
    cause, evidence = cause_from_replays("unknown", None, {"ops": []}, True, why)
    assert cause == "unknown" and "RuntimeError: boom here" in evidence.localisation_note
    from torchrepro.commands.check.comparison import _guarded

    assert _guarded("the graph replay", "numerics", lambda x: x + 1, 1) == (2, Evidence())
    result, evidence = _guarded("the graph replay", "numerics", lambda: {}["logits"])  # our own bug, not the run's
    assert result is None and evidence.facts["localisation_failed"] == "the graph replay: KeyError: 'logits'"
    assert "cause numerics" in evidence.localisation_note


@pytest.mark.inductor
def test_kernel_repeater_records_every_call_and_handles_odd_outputs():
    """A compiled graph returning a 0-dim tensor, a bool tensor, an integer tensor and a
    non-contiguous view: every call before the replayed step is digested, and the step's call is
    repeated without error."""
    from torchrepro.capture.kernels import KernelRepeater

    def fn(x):
        y = x * 2
        return y.sum(), y > 1, y.long(), y.t(), (x + 1)[:, ::2]

    repeater = KernelRepeater()
    assert repeater.install()
    try:
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="inductor")
        x = torch.arange(6.0).reshape(2, 3)
        compiled(x)
        compiled(x)
        repeater.active = True
        out = compiled(x)
        repeater.active = False
        summary = repeater.summary()
    finally:
        repeater.uninstall()
        torch._dynamo.reset()
    assert out[0].dim() == 0 and out[0].item() == 30.0
    assert len(summary["before"]) == 2 and summary["before"][0] == summary["before"][1]
    assert len(summary["calls"]) == 1 and not summary["errors"]
    call = summary["calls"][0]
    assert call["outputs"] == summary["before"][0]["outputs"] and not call["repeat_differs"]
    # the replay file's kernel part has the keys its TypedDicts declare (eventlog/payloads.py)
    assert fits(summary, KernelSummary) and all(fits(c, KernelCall) for c in summary["calls"] + summary["before"])
    explained = [e for outputs in summary["explained"].values() for e in outputs]
    assert explained and all(fits(e, ExplainedOutput) for e in explained)
    assert all(isinstance(d, str) for d in call["outputs"][:5])
