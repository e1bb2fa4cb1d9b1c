"""What a command prints, on a real terminal and off one (tests/unit/test_text_layout.py: the
rules on typed reports). On a pseudo-terminal of 200 columns, text wraps at 200 and nothing is cut;
in a pipe (a CI log), whatever ``COLUMNS`` says, nothing is laid out for 80 columns: a line is never
wrapped. A training script whose loss turns NaN is reported, its page drawn, the verdict printed."""

from __future__ import annotations

import dataclasses
import fcntl
import io
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

from rich.console import Console
from support import run_torchrepro
from synthetic_runs import LONG_GUARD, LONG_REASON, drift_experiment, long_text_run

from torchrepro.render.console import console
from torchrepro.render.drift_text import render_drift
from torchrepro.render.html import render_html
from torchrepro.render.svg import strip_plot

SCRIPTS = Path(__file__).parents[1] / "scripts"
RESUMED = "Classifier.forward (resumed after the break at train.py:72)"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _on_a_terminal(args: list[str], cwd: Path, columns: int) -> str:
    """``python -m torchrepro ARGS`` with a pseudo-terminal of ``columns`` x 50 as stdout and stderr
    (``COLUMNS`` says the same, as a shell sets it); what it printed, colours removed."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm-256color"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchrepro", *args], cwd=cwd, stdin=child, stdout=child, stderr=child, env=env
    )
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(parent, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=120) == 0
    os.close(parent)
    return ANSI.sub("", out.decode()).replace("\r\n", "\n")


def _column(out: str, title: str, index: int) -> str:
    lines = [line.rstrip() for line in out.splitlines()]
    pieces = []
    for line in lines[lines.index(title) + 3 :]:
        if "│" not in line:
            break
        pieces.append(line.split("│")[index].strip())
    return re.sub(r"\s", "", "".join(pieces))


def test_on_a_terminal_of_200_columns_text_wraps_at_200_and_nothing_is_cut(tmp_path):
    long_text_run(tmp_path / "run", tmp_path / "train.py")
    out = _on_a_terminal(["report", "run"], tmp_path, 200)
    lines = out.splitlines()
    assert max(map(len, lines)) <= 200 and max(map(len, lines)) > 150  # the terminal's width is used
    assert "…" not in out and "None" not in out
    assert _column(out, "recompiles", 4) == re.sub(r"\s", "", LONG_GUARD)  # a row wider than 200: wrapped
    assert _column(out, "recompiles", 0) == re.sub(r"\s", "", RESUMED)
    assert LONG_REASON in out
    assert sum(line.startswith("WARNINGS") for line in lines) == 1


def test_in_a_pipe_nothing_is_laid_out_for_80_columns(tmp_path):
    long_text_run(tmp_path / "run", tmp_path / "train.py")
    proc = run_torchrepro("report", "run", cwd=tmp_path, env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("WARNINGS") and sum(line.startswith("WARNINGS") for line in lines) == 1
    (row,) = [line for line in lines if line.startswith(RESUMED) and "│" in line]
    assert row.rstrip().endswith(LONG_GUARD)  # the table's row whole on one line
    assert f" ! {RESUMED} recompiled 1x (stride): {LONG_GUARD}" in lines
    assert "…" not in proc.stdout and "None" not in proc.stdout and "\x1b" not in proc.stdout


def test_a_nan_loss_is_reported_and_drawn_not_a_traceback(tmp_path):
    proc = run_torchrepro("doctor", "--out", "run", str(SCRIPTS / "nan_loss.py"), cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stdout.splitlines()
    verdict = json.loads((tmp_path / "run" / "report.json").read_text())["verdict"]
    assert lines[0] == verdict and lines.count(verdict) == 1
    assert "rank 0: 6 steps" in proc.stdout and "loss 0.3066 → nan" in proc.stdout
    page = (tmp_path / "run" / "report.html").read_text()
    assert "rank 0: nan from step 2" in page


def test_the_drift_report_with_nan_renders_everywhere(tmp_path):
    nan, inf = float("nan"), float("inf")
    report = drift_experiment(tmp_path / "exp", "metric")
    drift = report.drift
    drift.summary.update(mean=nan, std=inf, ci95=[nan, inf])
    drift.effects[0] = dataclasses.replace(drift.effects[0], difference=nan, p_value=None, mde=inf, ci95=None)
    drift.factors[0].update(std=nan, variance_share=None, ci95=None)
    drift.runs[0] = dataclasses.replace(drift.runs[0], metric=nan)
    drift.runs[1] = dataclasses.replace(drift.runs[1], metric=inf)
    for shown in (console(file=io.StringIO()), Console(file=io.StringIO(), width=80)):
        render_drift(report, shown)
        out = shown.file.getvalue()
        assert "nan" in out and "inf" in out and "None" not in out
    assert render_html(report).count("<svg") >= 2
    svg = strip_plot("t", "y", [("a", [1.0, nan, inf], {"mean": nan, "ci95": [nan, 1.0]})])
    assert "n=3, 2 not finite" in svg and svg.count("<circle") == 1
