"""One sanitiser (``render/sanitize.py``) for text from the user's script, used by every renderer:
a hostile string (terminal escape sequences, C0 and C1 controls, NUL, DEL, bidirectional
overrides, a newline) goes through each of them, and only its visible escapes come out (the views
of ``cache status`` and ``env``: tests/e2e/test_sanitised_views.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from synthetic_runs import rank_events

from hostile_text import HOSTILE, assert_shown, assert_svg_shown, text_console

from torchrepro.commands.check.comparison import diff
from torchrepro.commands.doctor.job import analyse_run_dir
from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import Compile, End, GraphBreak
from torchrepro.eventlog.rundir import RUN_FILE, write_json
from torchrepro.render import sanitize
from torchrepro.render.html import render_html
from torchrepro.render.junit import junit_xml
from torchrepro.render.live_text import FollowedRun, render, status_line
from torchrepro.render.sanitize import visible, visible_tree
from torchrepro.render.svg import strip_plot
from torchrepro.render.terminal import render_check, render_doctor
from torchrepro.telemetry.otel import _attrs


SRC = Path(__file__).resolve().parents[2] / "src" / "torchrepro"


def _hostile_run(root: Path) -> Path:
    """A two-rank run: rank 1 fails with HOSTILE as its exception message, its recompile guard,
    graph-break reason, file and source line carry HOSTILE too, and so do the script's arguments."""
    for rank in (0, 1):
        events = rank_events(rank, 2, steps=6, odd=rank == 1)
        for e in events:
            if isinstance(e, Compile) and e.recompile_reasons:
                e.recompile_reasons = [f"tensor 'x' {HOSTILE} size mismatch at index 0. expected 4, actual 5"]
            if isinstance(e, GraphBreak):
                e.reason, e.file, e.source = f"reason {HOSTILE}", f"/src/{HOSTILE}.py", f"if x: # {HOSTILE}"
            if isinstance(e, End) and rank == 1:
                e.status, e.exit_code, e.error = "error", 1, f"RuntimeError: {HOSTILE}"
        write_all(root / f"rank-{rank}" / "events.jsonl", events)
    write_json(root / RUN_FILE, {"script": f"/tmp/{HOSTILE}.py", "args": [HOSTILE]})
    return root


@pytest.fixture(scope="module")
def doctor_report(tmp_path_factory):
    return analyse_run_dir(_hostile_run(tmp_path_factory.mktemp("run") / "run"))


@pytest.fixture(scope="module")
def check_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("check")
    return diff(_hostile_run(root / "a"), _hostile_run(root / "b"))


def test_visible_escapes_every_unsafe_character_and_keeps_the_rest():
    assert visible(HOSTILE) == (
        "boom\\x1b[2J\\x1b]0;title\\x07 nul\\x00 del\\x7f csi\\x9b bs\\x08 "
        "\\u202eevil\\u2066iso\\u2069 \\u200fmark two\\nlines"
    )
    assert visible(HOSTILE, newlines=True).endswith("two\nlines")
    assert visible("tab\tünïcode — C:\\path") == "tab\tünïcode — C:\\path"  # nothing else changes
    assert visible("\u061c\u200e\u2028\ud800\ufffe") == "\\u061c\\u200e\\u2028\\ud800\\ufffe"
    assert visible(visible(HOSTILE, newlines=True)) == visible(HOSTILE)  # idempotent
    tree = visible_tree({HOSTILE: [HOSTILE, 1, None], "n": (2.5, True)})
    assert tree == {visible(HOSTILE): [visible(HOSTILE), 1, None], "n": [2.5, True]}


def test_terminal_summary_of_a_doctor_report(doctor_report):
    console, buf = text_console()
    render_doctor(doctor_report, console)
    out = buf.getvalue()
    assert_shown(out)
    (title,) = [line for line in out.splitlines() if "rank 1: the script exited with code 1" in line]
    assert title.endswith("two\\nlines")  # the finding stays on its line


def test_terminal_summary_of_a_check_report(check_report):
    console, buf = text_console()
    render_check(check_report, console)
    assert_shown(buf.getvalue())


@pytest.mark.parametrize("kind", ["doctor", "check"])
def test_html_page(kind, doctor_report, check_report):
    report = {"doctor": doctor_report, "check": check_report}[kind]
    page = render_html(report)
    assert_shown(page, one_line=False)  # newlines stay in a page (lines in a <pre>, else a space)
    assert "<img" not in page


def test_svg_plot():
    assert_svg_shown(strip_plot(f"<b>{HOSTILE}</b>", HOSTILE, [(HOSTILE, [0.1, 0.2], {"mean": 0.15})], HOSTILE))


def test_junit_xml(doctor_report, tmp_path):
    path = tmp_path / "junit.xml"
    path.write_bytes(junit_xml(doctor_report))
    assert_shown(path.read_text(), one_line=False)
    failures = {case.get("name"): case.find("failure") for case in ET.parse(path).getroot().iter("testcase")}
    failure = failures["SCRIPT_FAILED"]
    assert_shown(failure.get("message"))  # the one-line message: the newline as \n
    assert failure.text.endswith("two\nlines")  # the failure's body keeps its lines


def test_otel_attributes():
    attributes = _attrs({"torchrepro.finding.title": HOSTILE, "code.lineno": 3, "none": None})
    assert_shown(attributes["torchrepro.finding.title"])
    assert attributes["code.lineno"] == 3 and "none" not in attributes


def test_live_view_status_line_and_render(tmp_path):
    followed = FollowedRun(_hostile_run(tmp_path / "run"))
    followed.poll()
    snap = followed.snapshot()
    snap["recompiles_by_category"] = {HOSTILE: 1, **snap["recompiles_by_category"]}
    line = status_line(snap)
    assert_shown(line)
    assert "\n" not in line
    console, buf = text_console()
    console.print(render(snap))
    out = buf.getvalue()
    assert_shown(out)
    assert f"reason {visible(HOSTILE)}" in out  # the latest graph break, on its line


def _defines_its_own_sanitiser(path: Path) -> list[str]:
    """What in ``path`` looks like a sanitiser of its own: a string literal holding a character
    class over control characters (``[\\x00-...``, ``\\x7f-\\x9f``, ``\\u202a``), or a use of
    ``unicodedata.category``."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if re.search(r"\[[^\]]*(\x00|\\x00|\x1f|\\x1f|\x7f|\\x7f|\x9f|\\x9f|\u202a|\\u202a)", text):
                found.append(f"{path.name}:{node.lineno}: {text[:40]!r}")
        elif isinstance(node, ast.Attribute) and node.attr == "category" and ast.unparse(node.value) == "unicodedata":
            found.append(f"{path.name}:{node.lineno}: unicodedata.category")
    return found


def test_no_module_but_sanitize_defines_a_control_character_class():
    assert _defines_its_own_sanitiser(Path(sanitize.__file__))  # the check finds the one there is
    others = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "sanitize.py"
        for hit in _defines_its_own_sanitiser(path)
    ]
    assert others == []
