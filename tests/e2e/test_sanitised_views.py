"""The sanitiser (``report/sanitize.py``) in the views that need torch or a real run: ``cache status``
and ``env`` (a hostile path or environment value), and a drift experiment whose script crashes with a
hostile message (its terminal view, page and plots): only visible escapes come out (the other
renderers: tests/unit/test_sanitiser.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_text import HOSTILE, assert_shown, assert_svg_shown, text_console
from synthetic_runs import drift_experiment

from torchrepro.render.cache_text import render_status
from torchrepro.render.drift_text import render_drift
from torchrepro.render.html import render_html
from torchrepro.render.env_text import render_env

PATH_SAFE = HOSTILE.replace("\x00", "")  # what a file name or an environment variable can hold


def test_cache_status_view(tmp_path):
    from torchrepro.cache.inventory import status

    cache = tmp_path / PATH_SAFE
    entry = cache / "fxgraph" / "ab" / ("fab" + "c" * 49) / "entry"
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b"\x80\x04" + f"# torch version: {PATH_SAFE}\n".encode() + b".")
    console, buf = text_console()
    render_status(status(cache), console)
    assert_shown(buf.getvalue(), nul=False)


def test_env_view(monkeypatch):
    from torchrepro.capture.environment import collect

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", f"/tmp/{PATH_SAFE}")
    console, buf = text_console()
    render_env(collect(), console)
    assert_shown(buf.getvalue(), nul=False)


DRIFT_DIR: list[Path] = []  # where the drift experiment wrote its plots


@pytest.fixture(scope="module")
def drift_report(tmp_path_factory):
    DRIFT_DIR[:] = [tmp_path_factory.mktemp("drift") / "exp"]
    return drift_experiment(DRIFT_DIR[0], HOSTILE)


def test_drift_terminal_view(drift_report):
    console, buf = text_console()
    render_drift(drift_report, console)
    out = buf.getvalue()
    assert_shown(out)
    assert "metric: " in out and "excluded (crashed): exit 1: RuntimeError: boom\\x1b[2J" in out


def test_drift_page_and_plots(drift_report):
    page = render_html(drift_report)
    assert_shown(page, one_line=False)  # newlines stay in a page (lines in a <pre>, else a space)
    assert "<img" not in page
    plots = [(DRIFT_DIR[0] / name).read_text() for name in drift_report.drift.plots]
    assert plots  # drift's own plots: the metric, named by the script, in their titles and axes
    for svg in plots:
        assert_svg_shown(svg)
