"""The HTML page of a drift experiment, from a real one: what a user's run put in it escaped, the
page self-contained, and `report` rendering the stored experiment again (the other pages:
tests/unit/test_html.py)."""

from __future__ import annotations

import json
import re
from xml.etree import ElementTree

from markupsafe import escape
from synthetic_runs import drift_experiment

from hostile_text import MARKUP, assert_safe

from torchrepro.cli import main
from torchrepro.render.html import fmt_num, render_html
from torchrepro.render.paths import stored
from torchrepro.render.sanitize import visible
from torchrepro.reports.loader import load_report
from torchrepro.eventlog.rundir import HTML_FILE, REPORT_FILE


def test_drift_page_shows_the_experiment_escaped_and_self_contained(tmp_path):
    report = drift_experiment(tmp_path / "exp", MARKUP)
    page = (tmp_path / "exp" / HTML_FILE).read_text()  # drift writes it beside report.json, paths as stored
    assert page == render_html(stored(report))
    assert_safe(page)
    assert not re.search(r"<(script|link|iframe|object|embed|img)\b", page) and "onclick=x>" not in page
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) <= {"http://www.w3.org/2000/svg"}
    assert "default-src 'none'" in page and 'class="verdict bad"' in page  # a run crashed: exit code 3
    d = report.drift
    assert page.index(str(escape(d.verdict))) < page.index('id="plots"')  # the verdict first
    # one inline strip plot per factor, as drift wrote them to plot-*.svg; the crashed run is left out
    plots = re.findall(r"<svg xmlns.*?</svg>", page, re.S)
    assert len(plots) == len(d.plots) == 3
    for name, svg in zip(d.plots, plots):
        assert (tmp_path / "exp" / name).read_text().strip() == svg
    assert plots[2].count("<circle") == 2 * 8 and "paired over 8 seeds" in plots[2]
    assert "RuntimeError: &lt;img src=x" in page[page.index('id="excluded"') :]
    assert "&lt;b onclick=x&gt;train&amp;.py" in page
    (effect,) = d.effects
    assert f'<td class="num">{fmt_num(effect.p_value)}</td>' in page and effect.test in page
    assert "not separable" in page and str(escape(d.not_separable[0]["reason"])) in page
    assert page.count('<tr><td class="num">') == len(d.runs) + len(d.excluded)
    assert 'id="provenance"' in page and "not in a git repository" in page


def test_report_rerenders_a_stored_drift_experiment(tmp_path, capsys):
    drift_experiment(tmp_path / "exp", MARKUP)
    stored = (tmp_path / "exp" / REPORT_FILE).read_text()
    (tmp_path / "exp" / HTML_FILE).unlink()
    copy = tmp_path / "copy.html"
    assert main(["report", str(tmp_path / "exp"), "--html", str(copy)]) == 3  # the report's own exit code
    report = load_report(json.loads(stored))
    assert copy.read_text() == render_html(report)
    assert not (tmp_path / "exp" / HTML_FILE).exists()  # a stored experiment is read, never written
    assert (tmp_path / "exp" / REPORT_FILE).read_text() == stored  # re-rendered, not recomputed
    assert report.verdict_line.split(";")[0] in " ".join(capsys.readouterr().out.split())
    assert main(["report", str(tmp_path / "exp"), "--junit", str(tmp_path / "j.xml")]) == 3


def test_a_drift_junit_has_a_case_per_binary_factor_and_per_run_left_out(tmp_path, capsys):
    drift_experiment(tmp_path / "exp", MARKUP)
    report = load_report(json.loads((tmp_path / "exp" / REPORT_FILE).read_text()))
    assert main(["report", str(tmp_path / "exp"), "--junit", str(tmp_path / "j.xml")]) == report.exit_code == 3
    suite = ElementTree.parse(tmp_path / "j.xml").getroot()
    cases = {case.get("name"): case.find("failure") for case in suite.iter("testcase")}
    factor = cases["compile makes no real difference"]
    assert report.drift.effects[0].real and factor is not None and "p = 0.007812" in factor.get("message")
    [(crashed, failure)] = [(name, f) for name, f in cases.items() if name.startswith("run ")]
    [excluded] = report.drift.excluded
    assert crashed == f"run {excluded.index} ({excluded.dir})" and failure.get("message").startswith("crashed")
    assert failure.text.splitlines()[0] == visible(report.verdict_line)  # the body starts with the verdict
    assert suite.get("tests") == "2" and suite.get("failures") == "2"
