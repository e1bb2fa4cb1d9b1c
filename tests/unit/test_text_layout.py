"""How every command lays text out (``render/console.py``), on typed reports built from hand-written
event logs: off a terminal nothing is laid out for 80 columns; on a narrow one, names, guards,
reasons and paths wrap and are never cut; the verdict is printed once; an absent value is a dash,
never ``None``; a path is relative under the working directory and absolute elsewhere; Dynamo's
resume functions are named by their function and the break they follow; and every renderer
(terminal, HTML and its SVG charts, JUnit, OpenTelemetry attributes, drift text, the live view)
survives NaN, infinities and None. The same on a real terminal and in a pipe:
tests/e2e/test_terminal_width.py."""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from rich.console import Console
from synthetic_runs import LONG_GUARD, LONG_REASON, NONFINITE_LOSSES, long_text_run, loss_config

from torchrepro.analysis.compile import display_function
from torchrepro.analysis.equivalence import compare_report, judge
from torchrepro.analysis.kept_steps import MAX_POINTS, StepReducer
from torchrepro.commands.check.comparison import diff
from torchrepro.commands.doctor.job import analyse_run_dir
from torchrepro.eventlog.event_reader import step_columns
from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import Compile, End, GraphBreak, Header, Step
from torchrepro.eventlog.rundir import RUN_FILE, write_json
from torchrepro.render.console import OFF_TERMINAL_WIDTH, console
from torchrepro.render.html import render_html
from torchrepro.render.junit import junit_xml
from torchrepro.render.live_text import FollowedRun, render, status_line
from torchrepro.render.svg import band_distance_chart, band_loss_chart, line_chart, loss_curves
from torchrepro.render.terminal import render_check, render_compare, render_doctor
from torchrepro.telemetry.otel import _attrs

NAN, INF = float("nan"), float("inf")
GUARD, REASON = LONG_GUARD, LONG_REASON


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _doctor(root: Path, script: Path):
    return analyse_run_dir(long_text_run(root, script))


@pytest.fixture
def doctor_report(workdir):
    return _doctor(workdir / "run", workdir / "train.py")


def _printed(render_report, report, width: int | None = None) -> str:
    buf = io.StringIO()
    shown = console(file=buf) if width is None else Console(file=buf, width=width, color_system=None)
    render_report(report, shown)
    return buf.getvalue()


def _column(out: str, title: str, index: int) -> str:
    """The text of column ``index`` of the table titled ``title``, its rows' pieces joined."""
    lines = [line.rstrip() for line in out.splitlines()]
    start = lines.index(title)
    pieces = []
    for line in lines[start + 3 :]:
        if "│" not in line:
            break
        pieces.append(line.split("│")[index].strip())
    return "".join(pieces)


# --- the layout -------------------------------------------------------------------------------------


def test_off_a_terminal_nothing_is_laid_out_for_80_columns(doctor_report):
    shown = console(file=io.StringIO())
    assert not shown.is_terminal and shown.width == OFF_TERMINAL_WIDTH
    out = _printed(render_doctor, doctor_report)
    guard_rows = [line for line in out.splitlines() if GUARD in line]
    assert len(guard_rows) == 2  # the finding's title and the table's row, each whole on one line
    assert any(REASON in line and "train.py:72" in line for line in out.splitlines())
    assert "…" not in out


def test_on_a_narrow_terminal_names_guards_reasons_and_paths_wrap_and_are_never_cut(doctor_report):
    out = _printed(render_doctor, doctor_report, width=80)
    assert max(map(len, out.splitlines())) <= 80
    assert "…" not in out  # nothing cut
    squeeze = lambda text: re.sub(r"\s", "", text)  # noqa: E731 - a cell wraps at its spaces
    assert squeeze(GUARD) in squeeze(_column(out, "recompiles", 4))
    name = "Classifier.forward (resumed after the break at train.py:72)"
    assert squeeze(name) in squeeze(_column(out, "recompiles", 0))
    assert squeeze(REASON) in squeeze(_column(out, "graph breaks", 2))
    assert squeeze("train.py:72") in squeeze(_column(out, "graph breaks", 0))


def test_the_resume_function_is_named_by_its_function_and_the_break_it_follows(doctor_report):
    out = _printed(render_doctor, doctor_report)
    name = "Classifier.forward (resumed after the break at train.py:72)"
    assert f"{name} recompiled 1x (stride): {GUARD}" in out
    assert not re.search(r"(?<![.\w])forward\b(?! \(resumed)", out.replace("Classifier.forward", ""))
    functions = {g["function"] for g in doctor_report.compile["recompile_groups"]}
    assert functions == {f"Classifier.forward (resumed after the break at {Path('train.py').resolve()}:72)"}


def test_resume_names_nested_elsewhere_and_unknown():
    parent = Compile(function="Net.forward", file="/p/m.py", line=10)
    other = Compile(function="Other.forward", file="/p/other.py", line=5)
    later = Compile(function="Net.forward", file="/p/m.py", line=90)  # a forward defined after the break
    nested = Compile(function="torch_dynamo_resume_in_torch_dynamo_resume_in_forward_at_20_at_31", file="/p/m.py")
    assert display_function(nested, [other, parent, later]) == "Net.forward (resumed after the break at /p/m.py:31)"
    alone = Compile(function="torch_dynamo_resume_in_step_at_7", file=None)
    assert display_function(alone) == "step (resumed after the break at line 7)"
    assert display_function(Compile(function="Net.forward", file="/p/m.py", line=10)) == "Net.forward"


def test_the_verdict_is_printed_once_with_its_fix_under_it(workdir):
    a = _doctor_run_for_check(workdir / "a", [1.0, 0.9, 0.8])
    b = _doctor_run_for_check(workdir / "b", [1.0, 0.9, 0.7])
    report = diff(a, b)
    said = [f for f in report.findings if f.title == report.verdict_line]
    assert said, (report.verdict_line, [f.title for f in report.findings])
    out = _printed(render_check, report)
    lines = out.splitlines()
    assert sum(report.verdict_line in line for line in lines) == 1 and lines[0] == report.verdict_line
    if said[0].hint:
        assert lines[1] == f"   fix: {said[0].hint}"
    report.verdict_line += "; measured fix: threads_1 (bit-exact, 1.1x step time)"  # as check extends it
    lines = _printed(render_check, report).splitlines()
    assert lines[0] == report.verdict_line and sum(said[0].title in line for line in lines) == 1


def _doctor_run_for_check(root: Path, losses: list[float]) -> Path:
    steps = [Step(t=1.0 + i, step=i, index=i, loss=x, params_fp=f"{x}", batch_fp=f"b{i}") for i, x in enumerate(losses)]
    write_all(root / "rank-0" / "events.jsonl", [Header(world_size=1), *steps, End()])
    write_json(root / RUN_FILE, {"script": "train.py", "args": []})
    return root


def test_a_path_is_relative_under_the_working_directory_and_absolute_elsewhere(workdir, tmp_path_factory):
    inside = _printed(render_doctor, _doctor(workdir / "in", workdir / "sub" / "train.py"))
    assert " sub/train.py:72" in inside and str(workdir) not in inside
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "train.py"
    outside = _printed(render_doctor, _doctor(workdir / "out", elsewhere))
    assert f" {elsewhere}:72" in outside


# --- None: an absent value is a dash -----------------------------------------------------------------


def test_no_none_reaches_what_a_user_reads(workdir):
    events = [
        Header(rank=0, world_size=1),
        Compile(step=None, compile_id="0/0", function="f", file=None, line=None),
        Compile(step=None, compile_id="0/1", function="f", file=None, line=None, recompile_reasons=["x == 1"]),
        Compile(step=None, compile_id="1/0", function=None, fail_type="Unsupported", fail_reason=None),
        GraphBreak(step=None, compile_id="0/0", reason="r", gb_id=None, file=None, line=None),
        Step(step=0, index=0, loss=None, time_s=None),
        End(),
    ]
    write_all(workdir / "run" / "rank-0" / "events.jsonl", events)
    write_json(workdir / "run" / RUN_FILE, {"script": "train.py", "args": []})
    report = analyse_run_dir(workdir / "run")
    for width in (None, 80):
        out = _printed(render_doctor, report, width)
        assert "None" not in out, out
    assert "None" not in junit_xml(report).decode()
    assert ">None<" not in render_html(report)


# --- NaN and infinities: every renderer -------------------------------------------------------------


def test_the_doctor_report_with_nan_and_inf_renders_everywhere(doctor_report):
    assert [x for _, x in doctor_report.steps.losses["0"]] == pytest.approx(NONFINITE_LOSSES, nan_ok=True)
    for width in (None, 80):
        out = _printed(render_doctor, doctor_report, width)
        assert "loss 2 → 0.5" in out
    page = render_html(doctor_report)
    assert 'id="loss"' in page and "rank 0: nan from step 2" in page
    assert re.search(r'<path d="M[^"]+"', page[page.index('id="loss"') :])  # the finite part of the curve
    ET.fromstring(junit_xml(doctor_report))  # well-formed
    attributes = _attrs({"loss": NAN, "time": INF, "steps": 6, "ok": 0.5})
    assert attributes == {"steps": 6, "ok": 0.5}


def test_the_check_report_with_nan_renders_everywhere(workdir):
    report = diff(
        _doctor_run_for_check(workdir / "a", [1.0, NAN, INF]), _doctor_run_for_check(workdir / "b", [1.0, NAN, 2.0])
    )
    report.determinism.curve = [
        {"step": 0, "max_abs": NAN, "max_rel": INF, "l2": None, "loss_diff": NAN, "estimated": False},
        {"step": 1, "max_abs": 1e-3, "max_rel": None, "l2": NAN, "loss_diff": INF, "estimated": True},
    ]
    for width in (None, 80):
        out = _printed(render_check, report, width)
        assert "nan" in out and "None" not in out
    page = render_html(report)
    assert "<svg" in page


def test_compare_plots_b_against_as_band_and_marks_the_first_step_out(tmp_path):
    a1, a2 = [1.0, 0.9, 0.8, 0.7, 0.6], [1.0, 0.9000001, 0.8000001, 0.7, 0.6000001]
    section = judge(
        loss_config(tmp_path, "a-1", a1),
        loss_config(tmp_path, "a-2", a2),
        loss_config(tmp_path, "b", [1.0, 0.9, 0.85, 0.75, 0.6]),
    )
    report = compare_report(section, {}, {}, {})
    assert report.compare["first_out"]["step"] == 2
    page = render_html(report)
    band = page[page.index('id="band"') :]
    assert band.count('<polygon class="band"') >= 2  # A's band between its two runs; what is allowed
    assert "first step out of A&#39;s band: step 2" in band
    assert 'id="first-out"' in band
    chart = band_loss_chart(report.compare["series"])
    assert chart.count('class="mark"') == len([r for r in report.compare["series"] if r["status"] == "out"])


def test_the_compare_report_with_nan_renders_everywhere(tmp_path):
    losses = [1.0, NAN, INF, 0.5]
    section = judge(*(loss_config(tmp_path, label, losses) for label in ("a-1", "a-2", "b")))
    report = compare_report(section, {}, {}, {})
    for width in (None, 80):
        assert "None" not in _printed(render_compare, report, width)
    render_html(report)
    band_loss_chart([{"step": 0, "loss_a": NAN, "loss_a2": None, "loss_b": INF, "status": "out"}])
    band_distance_chart([{"step": 0, "loss_a": 1.0, "loss_diff_rel": NAN, "allowed_rel": None, "status": "within"}])


def test_charts_place_only_finite_values_and_name_the_first_that_is_not():
    chart = line_chart(
        [{"name": "loss", "points": [(0, 1.0), (1, NAN), (2, 0.5), (3, INF)]}], x_label="step", y_label="loss"
    )
    assert "loss: nan from step 1" in chart and "inf from" not in chart  # the first one only
    assert not re.search(r"\bnan\b|\binf\b", re.sub(r"<title>.*?</title>|<text[^>]*>.*?</text>", "", chart))
    assert line_chart([{"name": "l", "points": [(0, NAN)]}], x_label="s", y_label="y", log_y=True).count("<svg") == 1
    assert "rank 3" in loss_curves({"3": [[0, NAN], [1, 2.0]], "10": [[0, 1.0]]})


def test_the_live_view_survives_nan_and_none(tmp_path):
    followed = FollowedRun(long_text_run(tmp_path / "run", tmp_path / "train.py"))
    followed.poll()
    snap = followed.snapshot(now=2000.0)
    snap["recompiles_by_category"] = {None: 1}
    snap["ranks"]["0"]["steps_per_s"] = NAN
    line = status_line(snap)
    assert "None" not in line and "other 1" in line
    buf = io.StringIO()
    Console(file=buf, width=80).print(render(snap))
    assert "None" not in buf.getvalue()


def test_a_loss_series_keeps_the_first_step_that_is_not_finite():
    n = 5 * MAX_POINTS
    losses = [1.0] * n
    losses[1234] = NAN
    kept = StepReducer()([step_columns([Step(index=i, loss=x) for i, x in enumerate(losses)])])
    assert len(kept.losses) <= MAX_POINTS + 2 and kept.losses[-1][0] == n - 1
    assert [i for i, x in kept.losses if math.isnan(x)] == [1234]
