"""`torchrepro check` and `diff` on real scripts in fresh processes: verdicts, causes decided by
evidence, localisation of the first divergent module and op, and bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import BIT_EXACT_CHECK_GROUP, NOISE_CHECK_GROUP

SCRIPTS = Path(__file__).parents[1] / "scripts"


def torchrepro(*args: str, cwd: Path, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "torchrepro", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def check(tmp_path: Path, script: str, *options: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = torchrepro("check", "--out", str(tmp_path / "check"), *options, str(SCRIPTS / script), cwd=tmp_path)
    report = json.loads((tmp_path / "check" / "report.json").read_text()) if proc.returncode in (0, 1) else {}
    return proc, report


@pytest.mark.xdist_group(BIT_EXACT_CHECK_GROUP)  # the worker that makes bit_exact_check once
def test_deterministic_script_is_bit_exact(bit_exact_check, tmp_path):
    proc, out = bit_exact_check  # `check deterministic.py`, shared with test_report_model.py (conftest)
    report = json.loads((out / "report.json").read_text()) if proc.returncode in (0, 1) else {}
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith("BIT-EXACT")
    det = report["determinism"]
    assert det["verdict"] == "bit_exact" and det["first_divergence"] is None and det["steps_compared"] == 5
    assert not report["findings"]
    commit = report["provenance"]["git"]["commit"]  # the script lives in this repository
    assert commit and [s["provenance"]["git"]["commit"] for s in report["sides"]] == [commit, commit]
    again = torchrepro("report", str(out), "--json", str(tmp_path / "again.json"), cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.splitlines()[0] == proc.stdout.splitlines()[0], again.stderr
    assert json.loads((tmp_path / "again.json").read_text()) == report  # re-rendered, not recomputed


def test_clock_seeded_data_order(tmp_path):
    proc, report = check(tmp_path, "clock_data_order.py", "--no-localize")
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[0].startswith("DIVERGED at step 0")
    fd = report["determinism"]["first_divergence"]
    assert (fd["step"], fd["what"], fd["cause"]) == (0, "batch", "data_order")
    assert report["findings"][0]["code"] == "DIVERGED_DATA_ORDER"


@pytest.mark.xdist_group(NOISE_CHECK_GROUP)  # the worker that makes noise_check once
def test_unseeded_generator_names_module_and_op(noise_check):
    proc, out = noise_check  # `check noise_module.py`, shared with test_html_browser.py (conftest)
    report = json.loads((out / "report.json").read_text()) if proc.returncode in (0, 1) else {}
    assert proc.returncode == 1, proc.stderr
    fd = report["determinism"]["first_divergence"]
    assert fd["step"] == 0 and fd["cause"] == "rng"
    assert fd["module"] == "Net.noise"
    assert fd["op"].startswith("aten.randn") and fd["phase"] == "forward"
    assert fd["source"].endswith("noise_module.py:9")  # the line that draws the noise
    assert "Net.noise" in proc.stdout.splitlines()[0]


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_workers_augmentation_diverges_unseeded_and_is_bit_exact_seeded(tmp_path):
    proc, report = check(tmp_path, "workers_augment.py", "--no-localize")
    assert proc.returncode == 1
    assert report["determinism"]["first_divergence"]["cause"] == "data_order"
    shutil.rmtree(tmp_path / "check")
    proc, report = check(tmp_path, "workers_augment.py", "--seed", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["determinism"]["verdict"] == "bit_exact" and report["determinism"]["steps_compared"] == 12


@pytest.mark.inductor
@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_inductor_dropout_against_eager_is_rng_and_remainder_is_numerics(tmp_path):
    proc, report = check(tmp_path, "inductor_dropout.py", "--against", "eager")
    assert proc.returncode == 1, proc.stderr
    det = report["determinism"]
    fd = det["first_divergence"]
    assert fd["cause"] == "rng" and fd["step"] == 0
    # localised inside the compiled graph: the dropout the differing output depends on
    assert fd["evidence"]["localisation"] == "compiled_graph" and fd["evidence"]["compile_id"] == "0/0"
    assert fd["op"].startswith("dropout") and "Dropout" in fd["module"]
    dec = det["decomposition"]
    assert not dec["rng"]["bit_exact"]
    numerics = dec["numerics"]
    # what fallback_random leaves is rounding: orders of magnitude below the RNG effect
    assert numerics["bit_exact"] or numerics["final_max_abs"] < dec["rng"]["final_max_abs"] / 100
    assert det["curve"] and det["curve"][0]["step"] == 0 and det["curve"][-1]["max_abs"] > 0
    # the backend ladder: aot_eager is eager's own kernels, so results first change at inductor
    stages = {s["name"]: s for s in det["backend_stages"]["stages"]}
    assert stages["aot_eager"]["bit_exact_with_previous"] is True
    assert stages["inductor"]["bit_exact_with_previous"] is False  # the RNG
    first = "fallback-random" if stages["fallback-random"]["bit_exact_with_previous"] is False else "inductor"
    assert det["backend_stages"]["first_change"]["stage"] == first and f"first change at {first}" in report["verdict"]


@pytest.mark.inductor
@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_compiled_gpt_with_a_scalar_loss_against_eager_names_graph_node_and_op_not_an_inert_dropout(tmp_path):
    """A GPT whose compiled forward returns (logits, 0-dim loss), with dropouts of p=0.0: compiled
    and eager part by rounding; the replay digests every output (the scalar loss too) and names the
    first differing output's own node, not a dropout it passes through, and the probe the op where
    the forward first departs from eager (the first LayerNorm's statistics, saved for backward)."""
    proc, report = check(tmp_path, "gpt_loss.py", "--against", "eager", "--no-fixes")
    assert proc.returncode == 1, proc.stderr[-2000:]
    fd = report["determinism"]["first_divergence"]
    assert fd["cause"] == "numerics" and fd["step"] == 0
    evidence = fd["evidence"]
    assert evidence["localisation"] == "compiled_graph", evidence
    assert evidence["compile_id"] == "0/0" and "localisation_failed" not in evidence
    assert evidence["output"].startswith("output 0 (linear, FX node logits)")  # the logits, as the script names them
    assert fd["op"] == "aten.var_mean.correction (FX node getitem_1, compiled graph 0/0, forward)"
    assert fd["module"] == "blocks.0.ln1 (LayerNorm)" and fd["source"].endswith("gpt_loss.py:25")
    assert evidence["first_differing"] == "getitem_1 (getitem, blocks.0.ln1 (LayerNorm))"
    assert "dropout" not in fd["op"] and "Dropout" not in fd["module"] and "Dropout" not in report["verdict"]
    assert not any("localisation failed" in n for n in report["determinism"]["notes"])


@pytest.mark.inductor
@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_an_evaluation_under_no_grad_before_training_is_never_blamed_for_what_training_computed(tmp_path):
    """eval_before_train.py evaluates under no_grad before its first training step, as nanoGPT does:
    Dynamo's graph 0/0 is the evaluation (no backward), 0/1 the training graph, and compiled and eager
    part by rounding in both. What differs first at step 0 (the gradients, or the loss) is named in
    the training graph, at the op where its forward first departs from eager (the first LayerNorm's
    statistics, saved for backward), never in the evaluation graph, which made neither; `repro`
    without --graph takes the graph the verdict names."""
    proc, report = check(tmp_path, "eval_before_train.py", "--against", "eager", "--no-fixes")
    assert proc.returncode == 1, proc.stderr[-2000:]
    det = report["determinism"]
    fd = det["first_divergence"]
    assert (fd["step"], fd["cause"]) == (0, "numerics") and fd["what"] in ("grads", "loss"), report["verdict"]
    assert (fd["compile_id"], fd["graph"]) == ("0/1", "forward"), report["verdict"]
    assert fd["op"] == "aten.var_mean.correction (FX node getitem_1, compiled graph 0/1, forward)"
    line = (SCRIPTS / "eval_before_train.py").read_text().splitlines().index("        return x + self.mlp(self.ln(x))")
    assert fd["module"] == "blocks.0.ln (LayerNorm)" and fd["source"].endswith(f"eval_before_train.py:{line + 1}")
    evidence = fd["evidence"]
    assert (evidence["quantity"], evidence["strength"], evidence["run"]) == (fd["what"], "measured", "compiled")
    assert "graph 0/0 ran in step 0 without a backward (under no_grad)" in evidence["scope"]
    assert "graph 0/0" not in report["verdict"] and "graphs: " in " ".join(proc.stdout.split())
    # the evaluation graph differs from eager too: left out for what it computed, not for matching
    probes = {(p["compile_id"], p["graph"]): p for p in det["graph_probes"]}
    assert probes["0/0", "forward"]["eager_differing"] and ("0/0", "backward") not in probes
    made = torchrepro("repro", str(tmp_path / "check"), "--out", str(tmp_path / "repro"), cwd=tmp_path)
    assert made.returncode == 0 and made.stdout.startswith("compiled graph 0/1/forward ("), made.stdout + made.stderr


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_a_fix_that_slows_steps_costs_more_than_one_and_every_ratio_is_the_recorded_step_times(tmp_path):
    """The fix ladder's step-time ratio divides by a baseline run as written in the same truncated
    configuration (run beside the fixes), after warm-up: a fix whose steps wait 0.2 s is far above
    1x, and each ratio is what the runs' own recorded step times give on the same steps after warm-up."""
    from torchrepro.analysis.fix_ranking import step_cost
    from torchrepro.commands.check.fix_ladder import step_times
    from torchrepro.eventlog.rundir import load_run

    proc, report = check(tmp_path, "slow_fix.py", "--no-localize", "--only-fixes", "deterministic,threads_1")
    assert proc.returncode == 1, proc.stderr[-2000:]
    out = tmp_path / "check"
    rows = {r["name"]: r for r in report["determinism"]["fixes"]}
    assert rows["deterministic"]["status"] == "bit_exact" and rows["deterministic"]["step_time_ratio"] > 10
    baseline = step_times(load_run(out / "fix-baseline"))
    assert max(t for i, t in baseline.items() if i >= 4) < 0.1  # the baseline's own steps: no 0.2 s wait
    for name, row in rows.items():
        cost = step_cost(baseline, [step_times(load_run(out / f"fix-{name}-{i}")) for i in (1, 2)])
        assert not isinstance(cost, str) and cost["first"] == 4
        assert (row["baseline_step_s"], row["step_time_s"]) == (cost["baseline_s"], cost["fix_s"])
        assert row["step_time_ratio"] == cost["ratio"] and row["step_time_spread"] == [cost["low"], cost["high"]]
    assert f"{rows['deterministic']['step_time_ratio']:.2f}x the step time" in report["verdict"]


@pytest.mark.inductor
@pytest.mark.slow  # inductor runs again (the --against eager test above stays in make test)
def test_inductor_dropout_against_fallback_random(tmp_path):
    proc, report = check(tmp_path, "inductor_dropout.py", "--against", "fallback-random")
    assert proc.returncode == 1, proc.stderr
    det = report["determinism"]
    assert det["first_divergence"]["cause"] == "rng"
    remaining = det["first_divergence"]["evidence"]["remaining_numerics"]
    assert remaining["between"] == ["eager", "fallback-random"]
    assert remaining["bit_exact"] or remaining["final_max_abs"] < 1e-4  # numerics, with its magnitude


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_diff_of_runs_with_different_lengths_and_a_crash(tmp_path):
    small = Path(__file__).parents[1] / "scripts" / "train_small.py"
    for name, extra in (("full", []), ("crashed", ["--steps-then-raise", "3"])):
        torchrepro("run", "--out", str(tmp_path / name), str(small), *extra, cwd=tmp_path)
    proc = torchrepro(
        "diff", "--json", str(tmp_path / "d.json"), str(tmp_path / "full"), str(tmp_path / "crashed"), cwd=tmp_path
    )
    assert proc.returncode == 3, proc.stderr  # the 3 common steps agree, but one run crashed
    det = json.loads((tmp_path / "d.json").read_text())["determinism"]
    assert det["steps_compared"] == 3 and det["verdict"] == "incomplete"
    assert any("10 vs 3 steps" in note for note in det["notes"])
    crashed = det["endings"][1]
    assert not crashed["ended_normally"] and any("planted failure" in p for p in crashed["problems"])


def test_diff_of_a_run_from_another_schema(tmp_path):
    torchrepro("run", "--out", str(tmp_path / "a"), str(SCRIPTS / "deterministic.py"), cwd=tmp_path)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    log = tmp_path / "b" / "rank-0" / "events.jsonl"
    log.write_text(log.read_text().replace("torchrepro.events/2", "torchrepro.events/9", 1))
    proc = torchrepro(
        "diff", "--json", str(tmp_path / "d.json"), str(tmp_path / "a"), str(tmp_path / "b"), cwd=tmp_path
    )
    assert proc.returncode == 2  # an input this torchrepro cannot read
    det = json.loads((tmp_path / "d.json").read_text())["determinism"]
    assert det["verdict"] == "nothing_compared"
    assert any("torchrepro.events/9" in note for note in det["notes"])


@pytest.mark.parametrize(
    "args", [["check", "--runs", "1", "x.py"], ["check", "missing.py"], ["diff", "nowhere", "nowhere"]]
)
def test_check_bad_input(tmp_path, args):
    (tmp_path / "x.py").write_text("print(1)\n")
    proc = torchrepro(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("torchrepro: error:")


def test_a_check_request_is_refused_before_anything_runs_or_is_created(tmp_path):
    from torchrepro.commands.check.comparison import CheckRequest, check
    from torchrepro.errors import InputError

    script = tmp_path / "x.py"
    script.write_text("print(1)\n")
    request = CheckRequest(script, [], runs=1, run_dir=tmp_path / "check")
    with pytest.raises(InputError, match="--runs must be at least 2"):
        check(request)
    assert not (tmp_path / "check").exists()
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.runs = 2  # type: ignore[misc]


def test_diff_hints_only_at_what_diff_and_run_have(tmp_path):
    """Two stored runs that part for no visible reason: the hint names `check` (not `--runs`, which diff
    lacks), and a note says which evidence the runs did not record."""
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from synthetic_runs import rank_events

    from torchrepro.commands.check.comparison import diff
    from torchrepro.eventlog.event_writer import write_all
    from torchrepro.eventlog.events import Step

    for name in ("a", "b"):
        events = rank_events(0, 1, steps=8)
        for e in events:
            if isinstance(e, Step) and e.step >= 3 and name == "b":
                e.loss += 1.0
        write_all(tmp_path / name / "rank-0" / "events.jsonl", events)
    report = diff(tmp_path / "a", tmp_path / "b")
    assert report.verdict_line.startswith("DIVERGED at step 3")
    hint = report.findings[0].hint
    assert "--runs" not in hint and "torchrepro check SCRIPT" in hint
    assert any("no gradient fingerprints (torchrepro run --grads" in n for n in report.determinism.notes)


def test_runs_that_diverge_and_then_run_for_different_lengths_both_ended_normally(tmp_path):
    """A loop until the loss is small (pytorch/examples' regression): unseeded, the runs part at once
    and stop after different numbers of steps. Both ended normally: DIVERGED, exit 1, no run blamed."""
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from synthetic_runs import rank_events

    from torchrepro.commands.check.comparison import diff
    from torchrepro.eventlog.event_writer import write_all
    from torchrepro.eventlog.events import Step

    for name, steps in (("a", 12), ("b", 30)):
        events = rank_events(0, 1, steps=steps)
        for e in events:
            if isinstance(e, Step) and name == "b":
                e.loss += 1.0
        write_all(tmp_path / name / "rank-0" / "events.jsonl", events)
    report = diff(tmp_path / "a", tmp_path / "b")
    assert report.verdict_line.startswith("DIVERGED at step 0") and report.exit_code == 1, report.verdict_line
    assert all(e.ended_normally for e in report.determinism.endings)
    assert "RUN_DID_NOT_END_NORMALLY" not in {f.code for f in report.findings}
