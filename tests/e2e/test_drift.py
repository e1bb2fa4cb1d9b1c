"""`torchrepro drift` on real scripts: real child runs, real event logs, real signals.

Each experiment is kept small (a tiny full-batch model, backend="eager", 2-18 runs)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "tests" / "scripts" / "drift_toy.py"
PLANTED = REPO / "tests" / "scripts" / "drift_planted.py"


def drift(
    tmp: Path, *args: str, expect: int | None = None, timeout: float = 900
) -> tuple[subprocess.CompletedProcess, dict | None]:
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "drift", *args],
        capture_output=True,
        text=True,
        cwd=tmp,
        timeout=timeout,
        check=False,
    )
    if expect is not None:
        assert proc.returncode == expect, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = next((Path(b) for a, b in itertools.pairwise(args) if a == "--out"), None)
    if "--collect" in args:
        out = Path(args[args.index("--collect") + 1])
    report = tmp / out / "report.json" if out else None
    return proc, json.loads(report.read_text()) if report and report.exists() else None


@pytest.mark.slow  # 18 real runs (a factorial design needs them): make test-slow
def test_full_batch_init_explains_variance_and_a_planted_compile_change_is_found(tmp_path):
    # Full batch: the order seeds only permute rows inside the one batch. Compiled, the forward halves its logits.
    proc, report = drift(
        tmp_path,
        "--vary",
        "init,order,compile",
        "--runs",
        "3",
        "--jobs",
        "2",
        "--out",
        "exp",
        str(TOY),
        "--",
        "--planted",
        expect=1,
    )
    assert report["schema"] == "torchrepro.drift/1" and report["kind"] == "drift"
    d = report["drift"]
    assert len(d["runs"]) == 18 and all(r["status"] == "ok" for r in d["runs"])
    attempts = [json.loads(f.read_text()) for f in (tmp_path / "exp").rglob("attempt.json")]
    sharing = None if "OMP_WAIT_POLICY" in os.environ else {"OMP_WAIT_POLICY": "PASSIVE"}  # runs side by side
    assert len(attempts) == 18 and all(a.get("env_set") == sharing for a in attempts)
    assert d["not_separable"] == [] and d["metric"]["name"] == "final loss"
    shares = {f["name"]: f["variance_share"] for f in d["factors"]}
    assert shares["init"] > 0.99 and shares["order"] < 0.01, shares
    (compile_effect,) = d["effects"]
    assert compile_effect["levels"] == ["eager", "compiled"] and compile_effect["n"] == 9
    assert compile_effect["difference"] > 0 and compile_effect["ci95"][0] > 0  # halved logits: higher loss
    assert compile_effect["p_value"] < 0.05 and "sign-flip" in compile_effect["test"]
    assert "a real difference at N = 9" in d["verdict"] and "init explains" in d["verdict"]
    assert d["verdict"].split(";")[0] in " ".join(proc.stdout.split())  # the terminal shows the verdict
    for name in d["plots"]:
        root = ET.parse(tmp_path / "exp" / name).getroot()
        assert root.tag.endswith("svg") and len(root) > 5
    assert sorted(d["plots"]) == ["plot-compile.svg", "plot-init.svg", "plot-order.svg"]


@pytest.mark.slow  # 12 real runs (the sign-flip test needs 6 pairs): make test-slow
def test_compile_changing_only_rounding_is_not_significant(tmp_path):
    # No random factor named: every stream varies at once over 6 seed levels, each run eager and compiled.
    _, report = drift(
        tmp_path,
        "--vary",
        "compile",
        "--runs",
        "6",
        "--jobs",
        "2",
        "--out",
        "exp",
        "--metric-regex",
        r"^loss=([0-9.]+)$",
        "--observed",
        "0.01",
        "--target-effect",
        "0.001",
        str(TOY),
        "--",
        "--rounding",
        expect=0,
    )
    d = report["drift"]
    (effect,) = d["effects"]
    assert effect["n"] == 6 and effect["p_value"] > 0.05
    assert effect["std"] > 0 and abs(effect["difference"]) < 1e-5 and effect["mde"] < 1e-4  # rounding, not identical
    assert "not distinguishable from noise" in d["verdict"] or "identical" in d["verdict"]
    assert d["metric"]["regex"] == r"^loss=([0-9.]+)$"
    placed = d["observed"]
    assert placed["sigma"] > 0 and placed["sigmas"] == pytest.approx(0.01 / placed["sigma"])


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_order_from_the_global_stream_is_not_separable(tmp_path):
    _, report = drift(
        tmp_path,
        "--vary",
        "init,order",
        "--runs",
        "2",
        "--jobs",
        "2",
        "--out",
        "exp",
        "--metric",
        "acc",
        str(TOY),
        "--",
        "--global-order",
        expect=0,
    )
    d = report["drift"]
    assert [x["factors"] for x in d["not_separable"]] == [["init", "order"]]
    assert "global RNG" in d["not_separable"][0]["reason"]
    assert {f["name"]: f["variance_share"] for f in d["factors"]}["init"] is None
    assert all(0 <= r["metric"] <= 1 for r in d["runs"])  # the accuracy from torchrepro.log_metric("acc", ...)


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_plan_run_one_collect_and_a_constant_seed(tmp_path):
    proc, _ = drift(
        tmp_path, "--plan", "--vary", "init", "--runs", "2", "--out", "exp", str(TOY), "--", "--constant-seed", expect=0
    )
    plan = json.loads((tmp_path / "exp" / "plan.json").read_text())
    assert len(plan["cells"]) == 2 and "--run-one" in proc.stdout
    bad, _ = drift(tmp_path, "--out", "exp", "--run-one", "2", expect=2)
    assert bad.stderr.strip().splitlines() == ["torchrepro: error: --run-one 2: the plan has cells 0..1"]
    for index in ("0", "1"):
        drift(tmp_path, "--out", "exp", "--run-one", index, expect=0)
    _, report = drift(tmp_path, "--collect", "exp", expect=0)
    d = report["drift"]
    assert [x["factors"] for x in d["not_separable"]] == [["init"]]
    assert "torch.manual_seed" in d["not_separable"][0]["reason"]
    wrong, _ = drift(tmp_path, "--collect", "exp", "--metric", "nosuch", expect=2)
    assert "no run produced the metric: no torchrepro.log_metric('nosuch') in the run" in wrong.stderr


def _first_draws(levels: int) -> list[float]:
    """The script's first torch.rand() at each init level, derived as a drift run derives it."""
    import torch

    from torchrepro.seed import derive

    draws = []
    for level in range(levels):
        derive(0, "init", level=level).seed_globals()
        draws.append(torch.rand(()).item())
    return draws


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.mark.slow  # 4 runs, a SIGTERM and a resumed experiment: make test-slow
def test_crashed_run_is_excluded_and_an_interrupted_experiment_resumes(tmp_path):
    draws = sorted(_first_draws(4))
    crash_below = (draws[0] + draws[1]) / 2  # exactly one init level crashes
    args = [
        "--vary",
        "init",
        "--runs",
        "4",
        "--jobs",
        "1",
        "--out",
        "exp",
        str(TOY),
        "--",
        "--crash-below",
        str(crash_below),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchrepro", "drift", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def records() -> list[Path]:
        return sorted((tmp_path / "exp" / "runs").glob("*/drift-run.json"))

    deadline = time.time() + 300
    while len(records()) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert len(records()) >= 2, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    finished = {p: p.stat().st_mtime_ns for p in records()}
    assert proc.returncode == 143 and "run the same command again" in err, err
    assert len(finished) < 4
    for events in (tmp_path / "exp" / "runs").glob("*/rank-0/events.jsonl"):  # no run left behind
        pid = json.loads(events.read_text().splitlines()[0])["pid"]
        assert not _alive(pid), pid

    again, report = drift(tmp_path, *args, expect=3)
    assert report["run"]["reused"] == len(finished) and report["run"]["ran"] == 4 - len(finished)
    assert all(p.stat().st_mtime_ns == t for p, t in finished.items())  # finished runs were not rerun
    d = report["drift"]
    (crashed,) = d["excluded"]
    assert crashed["status"] == "crashed" and "planted crash" in crashed["error"]
    assert d["summary"]["n"] == 3 and [r["status"] for r in d["runs"]].count("ok") == 3
    assert "excluded (crashed)" in again.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--vary", "init,speed", str(TOY)], "unknown factor(s) speed"),
        (["--metric-regex", "loss=[0-9.]+", str(TOY)], "exactly one group"),
        (["--runs", "1", str(TOY)], "argument --runs: must be at least 2"),
        (["--runs", "0", str(TOY)], "argument --runs: must be an integer >= 1, got '0'"),
        (["--runs=-1", str(TOY)], "argument --runs: must be an integer >= 1, got '-1'"),
        (["--seed=-1", str(TOY)], "argument --seed: must be an integer >= 0"),
        (["--jobs", "0", str(TOY)], "argument --jobs: must be an integer >= 1, got '0'"),
        (["--vary", "", str(TOY)], "argument --vary: unknown factor(s) (none given)"),
        (["--vary", "init,init", str(TOY)], "argument --vary: names a factor twice"),
        (["--target-effect", "nan", str(TOY)], "argument --target-effect: must be a number > 0, got 'nan'"),
        (["--observed", "inf", str(TOY)], "argument --observed: must be a finite number, got 'inf'"),
        (["--runs", "1000000", str(TOY)], "plans 2,000,000,000,000 runs, more than 10,000: give fewer"),
        (["--runs", "101", "--vary", "init,order", "--plan", str(TOY)], "plans 10,201 runs, more than 10,000"),
        (["--collect", "nowhere"], "holds no plan.json"),
        (["--max-runs", "10", str(TOY)], "--max-runs is the budget of --until-clear"),
        (["--until-clear", "--max-runs", "0", str(TOY)], "argument --max-runs: must be an integer >= 1, got '0'"),
        (["--until-clear", "--vary", "init", str(TOY)], "--until-clear --vary init: nothing to decide"),
        (["--until-clear", "--max-runs", "7", "--runs", "4", "--vary", "compile", str(TOY)], "smaller than the first"),
        (["--until-clear", "--plan", str(TOY)], "argument --plan: not allowed with argument --until-clear"),
    ],
)
def test_bad_input_is_one_line_and_runs_nothing(tmp_path, args, message):
    proc, _ = drift(tmp_path, *args, expect=2)
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("torchrepro: error: ") and message in line
    assert not (tmp_path / "torchrepro-runs").exists()


def test_a_design_over_the_size_limit_runs_only_with_allow_large(tmp_path):
    args = ["--runs", "101", "--vary", "init,order", "--plan", "--out", "exp", str(TOY)]
    drift(tmp_path, *args, expect=2)
    assert not (tmp_path / "exp").exists()
    proc, _ = drift(tmp_path, "--allow-large", *args, expect=0)
    assert len(json.loads((tmp_path / "exp" / "plan.json").read_text())["cells"]) == 101 * 101
    assert "10201 runs planned" in proc.stdout


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_a_missing_metric_stops_the_experiment_after_the_first_run(tmp_path):
    args = ["--vary", "init", "--runs", "3", "--jobs", "1", "--metric", "acc\x1b", "--out", "exp", str(TOY)]
    proc, report = drift(tmp_path, *args, expect=2)
    assert "Traceback" not in proc.stderr and report is None
    assert proc.stderr.strip().splitlines()[-1] == (
        "torchrepro: error: --metric 'acc\\x1b': run 0 logged no such metric (it logged: 'acc'); "
        "stopped after it, finished runs are kept in exp"
    )
    assert len(list((tmp_path / "exp" / "runs").glob("*/drift-run.json"))) == 1  # the other runs never ran
    args[args.index("--metric") + 1] = "acc"
    _, report = drift(tmp_path, *args, expect=0)  # the finished run is reused
    assert report["run"]["reused"] == 1 and report["run"]["ran"] == 2


def test_an_existing_directory_is_never_taken_over(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    proc, _ = drift(tmp_path, "--out", "mine", str(TOY), expect=2)
    assert "not a drift directory" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


PROBE = """
import json, sys, torch
from torch._dynamo import register_backend
from torchrepro.runtime import factors
from torchrepro.seed import active_plan

calls = []

@register_backend
def probe(gm, example_inputs):
    calls.append(len(gm.graph.nodes))
    return gm.forward

levels = json.loads(sys.argv[1])
factors.apply(levels)
theirs = torch.Generator().manual_seed(0)
loader = torch.utils.data.DataLoader(list(range(32)), batch_size=32, shuffle=True, generator=theirs)
order = next(iter(loader)).tolist()
if levels.get("backend"):  # the script asks for inductor; the level wins
    torch.compile(lambda x: x * 2, backend="inductor", mode="max-autotune")(torch.ones(3))
print(json.dumps({"init": torch.rand(()).item(), "order": order, "augment": active_plan().root,
                  "threads": torch.get_num_threads(), "deterministic": torch.are_deterministic_algorithms_enabled(),
                  "forced_backend": bool(calls), "replaced": loader.generator is not theirs}))
"""


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_factor_levels_seed_their_own_streams_and_set_switches(tmp_path):
    def probe(**levels) -> dict:
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, json.dumps({"root": 0, **levels})],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.splitlines()[-1])

    base = probe(init=0, order=0, augment=0)
    init = probe(init=1, order=0, augment=0)
    order = probe(init=0, order=1, augment=0)
    rest = probe(init=0, order=0, augment=1, threads=1, deterministic=True, backend="probe")
    assert base["replaced"]
    assert init["init"] != base["init"] and init["order"] == base["order"] and init["augment"] == base["augment"]
    assert order["order"] != base["order"] and order["init"] == base["init"]  # the loader no longer draws globally
    assert rest["augment"] != base["augment"] and (rest["init"], rest["order"]) == (base["init"], base["order"])
    assert rest["threads"] == 1 and rest["deterministic"] and rest["forced_backend"]


def test_log_metric_outside_torchrepro_does_nothing(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", "import torchrepro; torchrepro.log_metric('acc', 0.5); print('ok')"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_strip_plot_is_valid_svg_with_escaped_text():
    from torchrepro.render.svg import strip_plot

    from torchrepro.analysis.drift import summarize

    groups = [("a", [0.1, 0.2, 0.3]), ("b", [0.5])]
    svg = strip_plot("<script>alert(1)</script> & \x1b[31m", "acc", [(g, v, summarize(v)) for g, v in groups])
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "<script>alert(1)</script> & \\x1b[31m" in texts and "<script>" not in svg
    assert len(list(root.iter("{http://www.w3.org/2000/svg}circle"))) == 4


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_plan_predicts_and_until_clear_finds_a_planted_compile_only_bug(tmp_path):
    # metric = seed noise + 2 sd of the paired difference on the compiled path only (no training)
    common = ["--vary", "compile", "--runs", "3", "--jobs", "2", "--metric", "acc", "--out", "exp"]
    script = [str(PLANTED), "--", "--effect", "2", "--sd", str(0.5**0.5)]
    _, pilot = drift(tmp_path, *common, *script, expect=0)  # a pilot of 3 pairs: not yet clear
    (plan,) = pilot["drift"]["planning"]
    assert plan["pairs"] == 3 and plan["basis"] == "difference measured" and plan["mde"] > 0
    assert "at N = 3 the smallest detectable difference is" in pilot["drift"]["verdict"]

    planned, _ = drift(tmp_path, "--plan", "--target-effect", "2", *common, *script, expect=0)
    line = next(x for x in planned.stdout.splitlines() if x.startswith("compile: "))
    predicted = int(line.split("--until-clear would stop after about ")[1].split()[0])  # pairs
    assert "would detect a difference of 2.0 (80 % power)" in line

    proc, report = drift(tmp_path, "--until-clear", "--max-runs", "40", *common, *script, expect=1)
    seq = report["drift"]["sequential"]
    (factor,) = seq["factors"]
    assert factor["decision"] == "difference" and seq["stop"] == "decided"
    assert report["run"]["reused"] == 6 and seq["runs_used"] == factor["decided_at_runs"] == len(
        report["drift"]["runs"]
    )
    pairs_used = seq["runs_used"] // 2
    assert predicted / 2 <= pairs_used <= 2 * predicted, (predicted, pairs_used)
    path = factor["path"]
    assert [p["runs"] for p in path] == [2 * n for n in seq["looks"]] and path[-1]["interval"][0] > 0
    assert report["drift"]["verdict"].startswith(f"compile: a real difference, decided after {seq['runs_used']} runs")
    assert f"--until-clear used {seq['runs_used']} runs of at most 40 (every factor decided)" in " ".join(
        proc.stdout.split()
    )


@pytest.mark.slow  # one real run and three commands (~25 s on 2 busy cores); the verdict logic: tests/unit
def test_collect_with_runs_of_the_plan_missing_is_incomplete_unless_allowed(tmp_path):
    """One of two planned runs finished: --collect says INCOMPLETE (exit 3), never a verdict over the
    plan; --allow-partial analyses the run that finished and says it is partial."""
    drift(tmp_path, "--plan", "--vary", "init", "--runs", "2", "--out", "exp", str(TOY), expect=0)
    drift(tmp_path, "--out", "exp", "--run-one", "1", expect=0)
    proc, report = drift(tmp_path, "--collect", "exp", expect=3)
    assert report["exit_code"] == 3 and report["verdict"].startswith("INCOMPLETE: 1 of 2 runs of the plan"), report[
        "verdict"
    ]
    assert "(run 0)" in report["verdict"] and "INCOMPLETE" in proc.stdout
    _, allowed = drift(tmp_path, "--collect", "exp", "--allow-partial", expect=0)
    assert allowed["exit_code"] == 0 and not allowed["verdict"].startswith("INCOMPLETE")
    assert allowed["run"]["allow_partial"] is True
    assert allowed["drift"]["notes"][0].startswith("partial (--allow-partial): 1 of 2 runs not run")
