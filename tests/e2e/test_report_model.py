"""Typed reports (torchrepro.reports): real doctor, check and diff reports read back equal to what
was written, exit codes derived from the report agree with the command's, reports written with the
shared schema of before still load, and a broken report is refused (by the loader and the schema)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from support import BIT_EXACT_CHECK_GROUP, schema_problems
from synthetic_runs import drift_experiment

from torchrepro.render.paths import stored
from torchrepro.analysis.verdict import Ending, judge
from torchrepro.commands.check.comparison import diff
from torchrepro.cli import main
from torchrepro.errors import InputError
from torchrepro.render.html import render_html
from torchrepro.reports.check_report import CheckReport
from torchrepro.reports.doctor_report import DoctorReport
from torchrepro.reports.drift_report import DriftReport
from torchrepro.reports.findings import Verdict, comparison_exit_code
from torchrepro.reports.loader import load_report
from torchrepro.reports.schema import LEGACY_SCHEMA, SCHEMAS, schema_path
from torchrepro.eventlog.rundir import HTML_FILE, REPORT_FILE

SCRIPTS = Path(__file__).parents[1] / "scripts"
pytestmark = pytest.mark.xdist_group(BIT_EXACT_CHECK_GROUP)  # one worker builds the real runs below once
GRAPH_BREAK = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


@torch.compile(backend="eager")
def loss_of(x):
    y = model(x).sum()
    print("step")  # a graph break
    return y * 2


for step in range(3):
    loss = loss_of(torch.randn(8, 4))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _stored(directory: Path) -> dict:
    return json.loads((directory / REPORT_FILE).read_text())


@pytest.fixture(scope="session")  # built once: the tests using it share one worker (xdist_group)
def doctor_run(tmp_path_factory) -> tuple[Path, int]:
    """A real doctor run of a compiled script with a graph break, over a budget of none."""
    root = tmp_path_factory.mktemp("doctor")
    script = root / "train.py"
    script.write_text(GRAPH_BREAK)
    code = main(["doctor", "--out", str(root / "run"), "--max-graph-breaks", "0", str(script)])
    return root / "run", code


@pytest.fixture(scope="session")
def check_runs(tmp_path_factory, bit_exact_check) -> dict[str, tuple[Path, int]]:
    """Real checks: a deterministic script (bit-exact; made once for test_check.py too, conftest) and one
    nudged by a clock-seeded generator (diverged)."""
    root = tmp_path_factory.mktemp("check")
    proc, exact = bit_exact_check
    code = main(["check", "--out", str(root / "noisy"), "--no-localize", "--no-fixes", str(SCRIPTS / "tiny_noise.py")])
    return {"exact": (exact, proc.returncode), "noisy": (root / "noisy", code)}


def test_doctor_report_reads_back_equal_and_derives_the_commands_exit_code(doctor_run):
    run, code = doctor_run
    data = _stored(run)
    report = load_report(data)
    assert isinstance(report, DoctorReport) and data["schema"] == SCHEMAS["doctor"]
    assert report.to_json() == data
    assert code == report.exit_code == 1 and report.verdict is Verdict.FAILS_BUDGET
    assert report.verdict_line.startswith("FAILS BUDGET") and report.budget_failures
    assert report.steps.per_rank["0"].steps == 3 and report.run.ranks["0"].status == "ok"
    assert report.compile["graph_break_groups"][0]["count"] >= 1
    assert render_html(report) == (run / HTML_FILE).read_text()  # the page is the report's, not recomputed
    assert not schema_problems(run / REPORT_FILE)


def test_doctor_exit_code_follows_the_report(doctor_run):
    report = load_report(_stored(doctor_run[0]))
    passing = dataclasses.replace(report, budget_failures=[])
    assert passing.exit_code == (1 if passing.failing_findings else 0)
    failed = dataclasses.replace(report, run=dataclasses.replace(report.run, failed=True))
    assert failed.exit_code == 3
    stopped = dataclasses.replace(report, run=dataclasses.replace(report.run, meta={"stopped_by": "SIGTERM"}))
    assert stopped.exit_code == 143
    assert Verdict.of_doctor(passing.findings, []) in (Verdict.HEALTHY, Verdict.WARNINGS, Verdict.PROBLEMS)


def test_check_reports_read_back_equal_with_their_verdicts(check_runs):
    for name, verdict, code in (("exact", Verdict.BIT_EXACT, 0), ("noisy", Verdict.DIVERGED, 1)):
        out, exit_code = check_runs[name]
        data = _stored(out)
        report = load_report(data)
        assert isinstance(report, CheckReport) and data["schema"] == SCHEMAS["check"]
        assert report.to_json() == data
        assert report.verdict is verdict and exit_code == report.exit_code == code == data["exit_code"]
        assert data["determinism"]["exit_code"] == code and render_html(report) == (out / HTML_FILE).read_text()
    noisy = load_report(_stored(check_runs["noisy"][0]))
    # the nudge comes after step 0's update
    assert noisy.determinism.first_divergence.step == 1 and noisy.findings[0].code.startswith("DIVERGED_")


def test_diff_report_of_stored_runs_reads_back_equal(check_runs, tmp_path):
    out = check_runs["noisy"][0]
    report = diff(out / "run-1", out / "run-2")
    data = json.loads(json.dumps(report.to_json()))
    assert load_report(data).to_json() == data and report.unreadable_exit == 2
    assert report.verdict is Verdict.DIVERGED and report.exit_code == 1


def test_exit_code_per_verdict_agrees_with_the_judged_comparison():
    ended, crashed, unreadable = Ending("a"), Ending("b", ["rank 0: no end record"]), Ending("c", ["x"], True)
    for verdict in (
        Verdict.BIT_EXACT,
        Verdict.WITHIN_TOLERANCE,
        Verdict.DIVERGED,
        Verdict.INCOMPLETE,
        Verdict.NOTHING_COMPARED,
    ):
        expected = 0 if verdict in (Verdict.BIT_EXACT, Verdict.WITHIN_TOLERANCE) else 1
        expected = (
            3 if verdict is Verdict.INCOMPLETE else expected
        )  # runs that ended, a comparison that does not cover them
        assert comparison_exit_code(verdict, True, False, 3) == expected
        assert comparison_exit_code(verdict, False, False, 3) == 3
        assert comparison_exit_code(verdict, False, True, 2) == 2
    cases = [
        ((True, False, 4, [ended]), Verdict.DIVERGED),
        ((False, False, 0, [ended]), Verdict.NOTHING_COMPARED),
        ((False, False, 4, [crashed]), Verdict.INCOMPLETE),
        ((False, True, 4, [ended]), Verdict.WITHIN_TOLERANCE),
        ((False, False, 4, [ended]), Verdict.BIT_EXACT),
        ((True, False, 4, [unreadable]), Verdict.DIVERGED),
    ]
    for (diverged, within, steps, endings), verdict in cases:
        for unreadable_exit in (2, 3):
            judged, code = judge(diverged, within, steps, endings, unreadable_exit)
            assert Verdict(judged) is verdict
            assert code == comparison_exit_code(
                verdict, all(e.ok for e in endings), any(e.unreadable for e in endings), unreadable_exit
            )


def test_reports_of_the_shared_schema_of_before_still_load(doctor_run, check_runs):
    for directory in (doctor_run[0], check_runs["noisy"][0]):
        data = _stored(directory)
        old = {**data, "schema": LEGACY_SCHEMA}
        assert load_report(old).to_json() == data  # read as before, written with the schema of its kind
        assert not [p for p in schema_problems_of(old, directory)]


def schema_problems_of(data: dict, directory: Path) -> list[str]:
    path = directory / "legacy.json"
    path.write_text(json.dumps(data))
    try:
        return schema_problems(path)
    finally:
        path.unlink()


def test_a_drift_report_of_before_is_rerendered_with_its_own_exit_code(tmp_path, capsys):
    report = drift_experiment(tmp_path / "exp", "m")
    data = _stored(tmp_path / "exp")
    assert isinstance(report, DriftReport) and stored(report).to_json() == data and data["schema"] == SCHEMAS["drift"]
    assert report.exit_code == data["exit_code"] == 3 and report.verdict is Verdict.RUN_FAILED
    (tmp_path / "exp" / REPORT_FILE).write_text(json.dumps({**data, "schema": LEGACY_SCHEMA}))
    assert main(["report", str(tmp_path / "exp")]) == 3
    assert report.verdict_line.split(";")[0] in " ".join(capsys.readouterr().out.split())


def test_a_drift_report_is_typed_reads_back_equal_and_matches_its_schema(tmp_path):
    report = drift_experiment(tmp_path / "exp", "m")
    data = _stored(tmp_path / "exp")
    assert load_report(data).to_json() == data and not schema_problems(tmp_path / "exp" / REPORT_FILE)
    d = report.drift
    assert (
        d.metric.log_metric == "m"
        and report.run.levels_per_factor == 3
        and report.run.vary == ["init", "order", "compile"]
    )
    assert [r.status for r in d.runs].count("crashed") == 1 and d.excluded[0].status == "crashed"
    (effect,) = d.effects
    assert effect.factor == "compile" and effect.target_effect == 0.01 and len(effect.per_level) == 2
    # the verdict and exit code follow the typed content: no crash, then no real difference
    ran = dataclasses.replace(d, excluded=[])
    assert dataclasses.replace(report, drift=ran).exit_code == (1 if effect.real else 0)
    noise = dataclasses.replace(ran, effects=[dataclasses.replace(effect, p_value=0.5)])
    assert dataclasses.replace(report, drift=noise).verdict is Verdict.NOISE
    real = dataclasses.replace(ran, effects=[dataclasses.replace(effect, p_value=0.001)])
    assert dataclasses.replace(report, drift=real).exit_code == 1
    broken = json.loads(json.dumps(data))
    del broken["drift"]["effects"][0]["p_value"]
    broken["run"]["ran"] = -1
    problems = schema_problems_of(broken, tmp_path)
    assert any("/drift/effects/0" in p for p in problems) and any("/run/ran" in p for p in problems)
    with pytest.raises(InputError, match="damaged drift report"):
        load_report(broken)


def test_broken_reports_are_refused(doctor_run, tmp_path):
    data = _stored(doctor_run[0])
    with pytest.raises(InputError, match="not a torchrepro report"):
        load_report({"schema": "torchrepro.events/1"})
    with pytest.raises(InputError, match="damaged check report"):
        load_report({"schema": SCHEMAS["check"], "kind": "check"})
    broken = tmp_path / "broken.json"
    finding = {"code": "X", "severity": "fatal", "title": "t", "hint": "", "evidence": {}}
    broken.write_text(json.dumps({**data, "verdict": 7, "findings": [finding]}))
    problems = schema_problems(broken)
    broken.unlink()  # (the autouse check would refuse it too)
    assert any("/verdict" in p for p in problems) and any("/findings/0" in p for p in problems)


def test_every_kind_has_a_schema_shipped_in_the_package():
    for kind, name in SCHEMAS.items():
        schema = json.loads(schema_path(kind).read_text())
        assert schema["$schema"].endswith("2020-12/schema") and name in schema["properties"]["schema"]["enum"]
        assert LEGACY_SCHEMA in schema["properties"]["schema"]["enum"]
