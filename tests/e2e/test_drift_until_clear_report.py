"""The report of `drift --until-clear` on a real experiment: typed, of its schema, and its exit code
the sequential decision's (the statistics themselves: tests/unit/test_drift_sequential.py)."""

from __future__ import annotations

import json

import numpy as np

from torchrepro.analysis import drift as d


def test_an_until_clear_report_is_typed_matches_its_schema_and_exits_by_the_sequential_decision(tmp_path, capsys):
    from support import schema_problems
    from rich.console import Console

    from torchrepro.commands.drift.experiment import MetricSpec, build_report, cells_of, make_plan
    from torchrepro.eventlog.rundir import REPORT_FILE
    from torchrepro.render.drift_text import render_drift
    from torchrepro.reports.loader import load_report

    script = tmp_path / "train.py"
    script.write_text("print('acc=1.0')\n")
    metric = MetricSpec(name="acc")
    looks = [4, 6, 8, 10, 12]
    plan = make_plan(script, [], ["compile"], 12, 0, metric, sequential={"looks": looks, "max_runs": 40})
    rng = np.random.default_rng(12)
    runs = [
        d.DriftRun(c.index, c.seeds, c.settings, float(rng.normal()) + (0 if c.settings else 3.0), "ok")
        for c in cells_of(plan)
    ]
    report = build_report(tmp_path, plan, runs, metric, observed=None, target_effect=None)
    data = json.loads((tmp_path / REPORT_FILE).read_text())
    assert load_report(data).to_json() == data and not schema_problems(tmp_path / REPORT_FILE)
    seq = report.drift.sequential
    assert seq["looks"] == looks and seq["factors"][0]["decision"] == "difference" and report.exit_code == 1
    assert [p["runs"] for p in seq["factors"][0]["path"]] == [2 * n for n in looks]
    assert report.drift.planning[0]["factor"] == "compile" and data["drift"]["planning"] == report.drift.planning
    render_drift(report, Console(width=200))
    shown = capsys.readouterr().out
    assert f"--until-clear: {seq['runs_used']} runs of at most 40, the path as runs were added" in shown
    assert "wealth" in shown and "difference" in shown
