"""The HTML report without a browser: escaping of everything a user's run can put in it,
self-containment, the size bound at many ranks, and the rule that no user file is replaced
(a drift experiment's page: tests/e2e/test_html_drift.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from markupsafe import escape
from synthetic_runs import rank_events, write_run

from hostile_text import MARKUP, assert_safe

from torchrepro.analysis.rank_groups import rank_ranges
from torchrepro.commands.check.comparison import diff
from torchrepro.cli import main
from torchrepro.commands.doctor.job import analyse_run_dir
from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import CacheLookup, Compile, End, Header
from torchrepro.render.html import fmt_value, render_html, write_html
from torchrepro.render.svg import line_chart
from torchrepro.reports.findings import Verdict
from torchrepro.reports.loader import load_report
from torchrepro.eventlog.rundir import HTML_FILE, RUN_FILE, write_json


SCRIPT = "/tmp/<script>alert('name')</script>&.py"


def _marked_run(root: Path, loss_shift: float = 0.0) -> Path:
    """A two-rank run whose script name, guard text and exception message carry markup and ANSI codes."""
    for rank in (0, 1):
        events = rank_events(rank, 2, steps=6, odd=rank == 1)
        for e in events:
            if isinstance(e, Compile) and e.recompile_reasons:
                e.recompile_reasons = [f"tensor 'x' {MARKUP} size mismatch at index 0. expected 4, actual 5"]
            if hasattr(e, "loss") and e.loss is not None:
                e.loss += loss_shift * rank + loss_shift
            if isinstance(e, End) and rank == 1:
                e.status, e.exit_code, e.error = "error", 1, f"RuntimeError: {MARKUP}"
        write_all(root / f"rank-{rank}" / "events.jsonl", events)
    write_json(root / RUN_FILE, {"script": SCRIPT, "args": [MARKUP], "command": ["torchrepro", "doctor", SCRIPT]})
    return root


def test_doctor_page_escapes_script_names_guards_and_exceptions(tmp_path):
    report = analyse_run_dir(_marked_run(tmp_path / "run"))
    page = (tmp_path / "run" / HTML_FILE).read_text()  # written beside report.json
    assert page == render_html(report)
    assert_safe(page)
    assert "&lt;script&gt;alert(&#39;name&#39;)&lt;/script&gt;&amp;.py" in page
    assert "RuntimeError: &lt;img" in page  # the exception message, as text
    assert "SCRIPT_FAILED" in page and report.verdict_line.split(":")[0] in page


def test_diff_page_escapes_and_shows_both_runs(tmp_path):
    a = _marked_run(tmp_path / "a")
    b = _marked_run(tmp_path / "b", loss_shift=0.25)
    report = diff(a, b)
    page = render_html(report)
    assert_safe(page)
    assert report.verdict_line.startswith("DIVERGED") and "DIVERGED at step 0" in page
    assert page.count('class="side"') == 2
    assert len(report.step_comparison) == 6 and report.step_comparison[0]["loss_diff"] == pytest.approx(0.25)
    assert "loss of each run" in page and "|Δloss| per step" in page


def test_page_is_self_contained(tmp_path):
    page = render_html(analyse_run_dir(_marked_run(tmp_path / "run")))
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', page)
    assert csp and "default-src 'none'" in csp.group(1) and "script-src" not in csp.group(1)
    # nothing that could load: no script, stylesheet link, frame, image or font source
    assert not re.search(r"<(script|link|iframe|object|embed|img)\b", page)
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) <= {"http://www.w3.org/2000/svg"}
    assert not re.search(r"url\(|@import", page)


def test_ranks_that_agree_are_one_group(tmp_path):
    report = analyse_run_dir(write_run(tmp_path / "run", 12, odd=(7,), crashed=(10,)))
    groups = report.rank_groups["groups"]
    assert [g["ranks_text"] for g in groups] == ["0–6, 8–9, 11", "7", "10"]
    summary = report.rank_groups["summary"]
    assert (
        summary.startswith(
            "ranks 0–6, 8–9, 11 agree; rank 7 recompiled forward at step 5: tensor 'x' size mismatch at index 0"
        )
        and "rank 10 ended incomplete" in summary
    )
    assert str(escape(summary)) in render_html(report)
    assert rank_ranges([3, 1, 2, 9]) == "1–3, 9"


def test_size_grows_with_behaviours_not_ranks(tmp_path):
    small = render_html(analyse_run_dir(write_run(tmp_path / "small", 16, odd=(7,), crashed=(10,))))
    large_report = analyse_run_dir(write_run(tmp_path / "large", 1024, odd=(7,), crashed=(1000,)))
    large = render_html(large_report)
    assert len(large_report.rank_groups["groups"]) == 3
    assert len(large.encode()) < 5_000_000
    assert len(large) < 1.3 * len(small), (len(small), len(large))


def test_eight_ranks_fifty_compiles_fit_in_five_megabytes(tmp_path):
    run = write_run(tmp_path / "run", 8, steps=60, recompiles=49, odd=(3,))
    report = analyse_run_dir(run)
    assert all(r["compiles"] >= 50 for r in report.compile["per_rank"].values())
    size = (run / HTML_FILE).stat().st_size
    assert 10_000 < size < 5_000_000
    # every compile of the first rank group is drawn in the timeline
    page = (run / HTML_FILE).read_text()
    assert page.count('class="bar ') >= 50


def test_no_user_file_is_replaced(tmp_path, capsys):
    run = write_run(tmp_path / "run", 2)
    analyse_run_dir(run)
    mine = tmp_path / "notes.html"
    mine.write_text("my own notes")
    assert main(["report", str(run), "--html", str(mine)]) == 2
    assert "not a torchrepro report" in capsys.readouterr().err
    assert mine.read_text() == "my own notes"
    assert main(["report", str(run), "--html", str(mine), "--force"]) == 0
    assert "torchrepro" in mine.read_text()
    # a report written before is ours to replace
    assert main(["report", str(run), "--html", str(mine)]) == 0
    report = load_report(json.loads((run / "report.json").read_text()))
    write_html(report, run / HTML_FILE)  # beside report.json: replaced in place


def test_cache_misses_show_the_key_component_that_differed(tmp_path):
    run = tmp_path / "ddp"
    for rank in (0, 1):
        components = [
            {"hash": "g1", "what": "gm: GraphModule()"},
            {"hash": f"t{rank}", "what": f"cpp_runtime_thread_count: {rank + 1}"},
            {"hash": "m", "what": f"inductor_config[x]: {MARKUP}"},
        ]
        write_all(
            run / f"rank-{rank}" / "events.jsonl",
            [
                Header(rank=rank, world_size=2),
                CacheLookup(
                    rank=rank,
                    compile_id="0/0",
                    cache="fxgraph",
                    status="hit" if rank == 0 else "miss",
                    key=f"k{rank}",
                    components=components,
                ),
            ],
        )
    report = analyse_run_dir(run)
    [finding] = [f for f in report.findings if f.code == "CACHE_KEY_DIFFERS"]
    page = render_html(report)
    table = page[page.index('<table class="cache-keys">') :]
    table = table[: table.index("</table>")]
    assert "cpp_runtime_thread_count" in table and "rank 1 cannot reuse rank 0" in table
    assert str(escape(fmt_value(finding.evidence["a"]))) in table
    assert "fxgraph cache hits" in page


def test_identical_runs_say_so_instead_of_an_empty_chart(tmp_path):
    report = diff(write_run(tmp_path / "a", 1, steps=5), write_run(tmp_path / "b", 1, steps=5))
    assert report.verdict is Verdict.BIT_EXACT
    page = render_html(report)
    assert 'class="verdict ok"' in page and "|Δloss| is 0 at every step shown." in page


def test_ticks_of_a_narrow_range_read_apart():
    """A loss curve between 11.10 and 11.16: every y tick has a label of its own (not three "11.1")."""
    chart = str(
        line_chart(
            [{"name": "loss", "points": [[0, 11.10], [1, 11.13], [2, 11.16]]}],
            x_label="step",
            y_label="loss",
            zero=False,
        )
    )
    labels = re.findall(r'text-anchor="end">([^<]+)</text>', chart)
    assert len(labels) >= 3
    assert len(set(labels)) == len(labels), labels


def test_one_rank_is_rank_not_ranks(tmp_path):
    run = write_run(tmp_path / "run", 1)
    write_json(run / RUN_FILE, {"script": "train.py", "args": [], "command": ["torchrepro", "doctor", "train.py"]})
    page = render_html(analyse_run_dir(run))
    assert "· rank 0 ·" in page and "ranks 0" not in page
