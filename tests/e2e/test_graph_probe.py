"""Probing each compiled graph in the run itself: called again on copies of its first call's
inputs, a graph whose outputs are not bit for bit the same is named (compile id, graph, output,
source line), and `check` says DIVERGED even where its two runs agree. A planted nondeterministic
custom op (tests/scripts/probe_planted.py: a call counter) makes the two runs agree every time
while every repeat in one process differs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchrepro.analysis.nondeterminism import graph_probes, probe_divergence
from torchrepro.analysis.verdict import verdict_line
from torchrepro.eventlog.event_reader import EventLog, read_events
from torchrepro.eventlog.events import GraphProbe, Header, Step
from torchrepro.render.terminal import probe_lines
from torchrepro.reports.check_report import Determinism, Evidence, FirstDivergence
from torchrepro.reports.findings import Verdict

SCRIPTS = Path(__file__).parents[1] / "scripts"
PLANTED = SCRIPTS / "probe_planted.py"


def _line_of(text: str) -> int:
    return next(i for i, line in enumerate(PLANTED.read_text().splitlines(), 1) if text in line)


def _probe(graph: str, differing: list[int], step: int | None = 0, rank: int = 0) -> GraphProbe:
    explained = {
        "compile_id": "0/0",
        "graph": graph,
        "output_index": 0,
        "parameter": "w",
        "node": "mm_1",
        "op": "aten.mm",
        "source": "train.py:7",
        "kernel": "cpp_fused_0",
        "kernel_atomic_add": True,
    }
    return GraphProbe(
        step=step,
        rank=rank,
        compile_id="0/0",
        graph=graph,
        repeats=8,
        threads=2,
        runs_differing=3 if differing else 0,
        differing=differing,
        max_abs=1e-8 if differing else None,
        explained=explained if differing else {},
    )


def test_a_differing_probe_is_a_divergence_named_by_its_graph():
    logs = {
        "run-1": [EventLog(Path("rank-0/events.jsonl"), [Header(), _probe("forward", []), _probe("backward", [2])])],
        "run-2": [EventLog(Path("rank-0/events.jsonl"), [Header(), _probe("forward", [])])],
    }
    probes = graph_probes(logs)
    assert [(p["run"], p["graph"], p["differing"]) for p in probes] == [
        ("run-1", "forward", []),
        ("run-1", "backward", [2]),
        ("run-2", "forward", []),
    ]
    div, cause, evidence = probe_divergence(probes)
    assert (div.step, div.rank, div.what, cause) == (0, 0, "compiled_graph", "nondeterministic_op")
    assert evidence.named_by == "graph_probe" and evidence.kernel == "cpp_fused_0" and evidence.run == "run-1"
    assert (evidence.compile_id, evidence.graph, evidence.parameter) == ("0/0", "backward", "w")
    assert "3 of 8 repeats at 2 thread(s)" in evidence.because
    lines = probe_lines(probes)
    assert (
        lines[0].startswith("graph probes: 3 compiled graph(s) called 8 more times") and "1 not bit for bit" in lines[0]
    )
    assert "compiled graph 0/0 (backward), 3 of 8 repeats differ: parameter w" in lines[1]


def test_probes_that_repeat_bit_for_bit_are_no_divergence():
    logs = {"run-1": [EventLog(Path("rank-0/events.jsonl"), [Header(), _probe("forward", []), _probe("backward", [])])]}
    assert probe_divergence(graph_probes(logs)) is None
    assert probe_divergence([]) is None


def test_verdict_line_says_the_graph_and_that_the_runs_agreed_to_nothing_else():
    first = FirstDivergence(
        0,
        0,
        "compiled_graph",
        "nondeterministic_op",
        Evidence(op="aten.mm", source="train.py:7"),
        {"run": "run-1", "compile_id": "0/0", "graph": "backward"},
    )
    det = Determinism(Verdict.DIVERGED, ["run-1", "run-2"], 3, [], first)
    assert verdict_line(det) == (
        "DIVERGED when repeated at step 0 (rank 0, compiled graph 0/0 (backward) of run-1): cause "
        "nondeterministic_op — op aten.mm, at train.py:7"
    )


def _run(tmp_path: Path, name: str, *args: str) -> list:
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "run", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return read_events(out / "rank-0" / "events.jsonl").events


@pytest.mark.inductor
@pytest.mark.slow
def test_probing_does_not_change_the_run(tmp_path):
    """The same script with and without the probe: every step's loss, gradients and parameters
    bit for bit the same, and the probe found its graphs deterministic."""
    plain = _run(tmp_path, "plain", str(PLANTED), "3", "none")
    probed = _run(tmp_path, "probed", "--probe-repeats", "4", str(PLANTED), "3", "none")
    steps = lambda events: [(s.index, s.loss, s.grads_fp, s.params_fp) for s in events if isinstance(s, Step)]
    assert steps(plain) == steps(probed) and len(steps(plain)) == 3
    probes = [e for e in probed if isinstance(e, GraphProbe)]
    assert {(p.graph, p.repeats, tuple(p.differing), p.error) for p in probes} == {
        ("forward", 4, (), None),
        ("backward", 4, (), None),
    }
    assert not [e for e in plain if isinstance(e, GraphProbe)]


@pytest.mark.inductor
@pytest.mark.slow
def test_check_names_a_forward_race_the_two_runs_did_not_show(tmp_path):
    out = tmp_path / "check"
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "check", "--no-fixes", "--out", str(out), str(PLANTED), "--", "3", "fwd"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    det = report["determinism"]
    fd = det["first_divergence"]
    assert det["verdict"] == "diverged" and fd["what"] == "compiled_graph" and fd["cause"] == "nondeterministic_op"
    assert fd["evidence"]["named_by"] == "graph_probe"
    assert (fd["compile_id"], fd["graph"]) == ("0/0", "forward")
    assert fd["source"].endswith(f"probe_planted.py:{_line_of('h = jitter(h)')}")
    assert fd["op"] == "probe_planted.jitter.default" and fd["evidence"]["eager_node"] == "jitter"
    probed = {(p["run"], p["graph"]): p for p in det["graph_probes"]}
    assert set(probed) == {(r, g) for r in ("run-1", "run-2") for g in ("forward", "backward")}
    assert all(p["differing"] for (_, g), p in probed.items() if g == "forward")
    assert not any(p["differing"] for (_, g), p in probed.items() if g == "backward")
    # the two runs themselves agree: no step differs
    assert "BIT-EXACT" not in proc.stdout + proc.stderr
    assert "DIVERGED when repeated at step 0 (rank 0, compiled graph 0/0 (forward) of run-" in " ".join(
        proc.stdout.split()
    )
    page = (out / "report.html").read_text()
    assert '<section id="graph-probes">' in page and "probe_planted.py:" in page


def test_where_the_forward_matches_eager_the_backward_probe_names_the_node():
    from torchrepro.analysis.graph_steps import graph_scope
    from torchrepro.analysis.nondeterminism import graph_evidence

    replay = {"step": 0, "graphs": [{"compile_id": "0/0", "outputs": 2, "random_nodes": []}]}
    probe = {
        "graph": "backward",
        "compile_id": "0/0",
        "eager_differing": [0, 3],
        "eager_explained": {
            "parameter": "head.weight",
            "node": "mm_1",
            "op": "aten.mm.default",
            "source": "gpt.py:43",
            "output": "mm_1 (mm.default)",
            "max_abs": 3.7e-9,
        },
    }
    scope = graph_scope("grads", 0, ["0/0/forward", "0/0/backward"])
    evidence = graph_evidence(replay, scope, "numerics", None, [probe])
    assert evidence.localisation == "backward_graph" and evidence.strength == "measured"
    assert (evidence.graph, evidence.parameter, evidence.node, evidence.source) == (
        "backward",
        "head.weight",
        "mm_1",
        "gpt.py:43",
    )
    assert evidence.because == (
        "the 1 compiled graph call(s) of step 0 match their eager FX graphs in the forward pass; in backward, "
        "compiled graph 0/0 differs from the same FX graph run eagerly on the same inputs (2 output(s)), first at "
        "the gradient of head.weight, by up to 3.7e-09"
    )
    assert evidence.scope == "the gradients of step 0 come from compiled graph 0/0 (forward and backward)"
    plain = graph_evidence(replay, scope, "numerics", None, [dict(probe, eager_differing=[])])
    assert plain.localisation == (
        "the 1 compiled graph call(s) of step 0 match their eager FX graphs in the forward pass "
        "(the difference arises in backward)"
    )


@pytest.mark.inductor
@pytest.mark.slow
def test_doctor_probe_reports_the_graph_that_differs(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "doctor", "--probe", "--probe-repeats", "3", "--out", "run"]
        + ["--json", "doctor.json", str(PLANTED), "2", "bwd"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    report = json.loads((tmp_path / "doctor.json").read_text())
    (finding,) = [f for f in report["findings"] if f["code"] == "NONDETERMINISTIC_COMPILED_GRAPH"]
    assert finding["severity"] == "error" and report["verdict"].startswith("PROBLEMS"), proc.stderr[-2000:]
    evidence = finding["evidence"]
    assert (evidence["graph"], evidence["parameter"], evidence["graphs_probed"]) == ("backward", "w", 2)
    # a backward node carries the stack of the forward call it differentiates: scale(h, self.w)
    assert evidence["source"].endswith(f"probe_planted.py:{_line_of('return self.fc2(scale(h, self.w))')}")
    assert evidence["op"] == "probe_planted.jitter.default" and evidence["eager_node"].startswith("jitter")
    assert "torchrepro repro RUN_DIR" in finding["hint"]


def test_probe_repeats_without_probe_is_a_usage_error(tmp_path):
    (tmp_path / "train.py").write_text("print('ran')\n")
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "doctor", "--probe-repeats", "3", "train.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "torchrepro: error: --probe-repeats says how often --probe calls each graph: give --probe too"
    )


@pytest.mark.inductor
@pytest.mark.slow
def test_check_against_eager_names_the_backward_node_where_the_forward_matches(tmp_path):
    """The planted script without jitter: its compiled forward (addmm, relu) is eager's bit for bit,
    its backward (inductor's sum for a bias gradient) is not."""
    out = tmp_path / "check"
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "check", "--against", "eager", "--no-fixes", "--out", str(out)]
        + [str(PLANTED), "--", "2", "none"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    fd = json.loads((out / "report.json").read_text())["determinism"]["first_divergence"]
    evidence = fd["evidence"]
    assert fd["cause"] == "numerics" and evidence["localisation"] == "backward_graph"
    assert (evidence["compile_id"], evidence["graph"], evidence["parameter"]) == ("0/0", "backward", "fc2.bias")
    assert fd["op"] == "aten.sum.dim_IntList"
    assert fd["source"].endswith(f"probe_planted.py:{_line_of('return self.fc2(scale(h, self.w))')}")
    assert (
        "match their eager FX graphs in the forward pass; in backward, compiled graph 0/0 differs"
        in (evidence["because"])
    )


@pytest.mark.inductor
@pytest.mark.slow
def test_a_graph_that_adds_atomically_is_probed_longer(tmp_path):
    """A race between threads shows only when they run at the same moment: a backward graph that
    adds atomically at 2 threads and repeats bit for bit is called more than the repeats asked for,
    and the report says so; its forward graph (no atomic adds) is called as often as asked."""
    from torchrepro.capture.graph_probe import ACCUMULATING_FACTOR

    events = _run(tmp_path, "run", "--probe-repeats", "2", str(SCRIPTS / "probe_unique_rows.py"))
    probes = {p.graph: p for p in events if isinstance(p, GraphProbe)}
    forward, backward = probes["forward"], probes["backward"]
    assert (forward.accumulates, forward.repeats, forward.differing) == (False, 2, [])
    assert backward.accumulates and not backward.differing and backward.error is None
    assert 2 < backward.repeats <= 2 * ACCUMULATING_FACTOR
    log = EventLog(Path("rank-0/events.jsonl"), [Header(), *probes.values()])
    lines = probe_lines(graph_probes({"run-1": [log]}))
    assert lines[0].startswith("graph probes: 2 compiled graph(s) called 2 more times") and "0 not bit" in lines[0]
    assert lines[1] == (
        f"  run-1 rank 0: compiled graph 0/0 (backward) adds atomically at 2 threads and repeated bit for bit "
        f"{backward.repeats} times (its threads may still race at other timings)"
    )


@pytest.mark.inductor
@pytest.mark.slow
def test_a_graph_too_large_to_save_is_probed_and_said_not_saved(tmp_path):
    """A graph whose inputs take over 256 MiB (the forward, given the weight) is probed like any other
    and not saved for repro: the report says it was not saved and why, never that it was not probed;
    the backward (the input and the output's gradient) is saved."""
    from torchrepro.capture.graph_probe import MAX_SAVED_BYTES, graph_dir_name

    events = _run(tmp_path, "run", "--probe-repeats", "1", str(SCRIPTS / "probe_large_inputs.py"))
    probes = {p.graph: p for p in events if isinstance(p, GraphProbe)}
    assert sorted(probes) == ["backward", "forward"]
    for p in probes.values():
        assert p.repeats == 1 and p.error is None and p.differing == []
    assert probes["forward"].not_saved == f"ValueError: its inputs take more than {MAX_SAVED_BYTES >> 20} MiB"
    assert probes["backward"].not_saved is None
    graphs = tmp_path / "run" / "rank-0" / "graphs"
    assert sorted(p.name for p in graphs.iterdir()) == [graph_dir_name("0/0", "backward")]
    log = EventLog(Path("rank-0/events.jsonl"), [Header(), *probes.values()])
    assert probe_lines(graph_probes({"run-1": [log]})) == [
        "graph probes: 2 compiled graph(s) called 1 more times on identical inputs; 0 not bit for bit the same; "
        "1 not saved for torchrepro repro (ValueError: its inputs take more than 256 MiB)"
    ]


@pytest.mark.inductor
@pytest.mark.slow
def test_a_graph_served_from_the_cache_names_this_runs_source_file(tmp_path):
    """Two copies of one script (two checkouts, or a module a run imports from its copy of the
    working directory) share an inductor cache: the second is served the first one's graphs, and
    its probe still names its own file, not the first copy's."""
    from torchrepro._compat import aot_cache_loading
    from torchrepro.eventlog.events import CacheLookup

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    events = {}
    for copy in ("first", "second"):
        (tmp_path / copy).mkdir()
        shutil.copy(PLANTED, tmp_path / copy / "train.py")
        out = tmp_path / copy / "out"
        proc = subprocess.run(
            [sys.executable, "-m", "torchrepro", "run", "--out", str(out), "--probe-repeats", "2"]
            + [str(tmp_path / copy / "train.py"), "2", "fwd"],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path / copy,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        events[copy] = read_events(out / "rank-0" / "events.jsonl").events
    served = {(e.cache, e.status) for e in events["second"] if isinstance(e, CacheLookup)}
    # where the probe can load graphs from the AOTAutograd cache it keeps that cache on (the first copy's
    # graph served); elsewhere (torch 2.6) it turns it off, and the second copy traces its own graph
    assert (("aotautograd" if aot_cache_loading() is not None else "fxgraph"), "hit") in served, served
    for copy, evs in events.items():
        forward = next(e for e in evs if isinstance(e, GraphProbe) and e.graph == "forward")
        assert forward.differing, forward
        assert forward.explained["source"] == f"{tmp_path / copy / 'train.py'}:{_line_of('h = jitter(h)')}"
