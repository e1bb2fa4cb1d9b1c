"""The terminal view of a doctor report, as `torchrepro report` prints it: every rank while they
fit on a screen, the groups of ranks alike beyond that."""

from __future__ import annotations

import os
import subprocess
import sys

from synthetic_runs import write_run


def report_screen(run_dir) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "torchrepro", "report", str(run_dir)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode in (0, 1, 3) and not proc.stderr, proc.stderr  # 3: a rank crashed
    return proc.stdout.splitlines()


def table_after(lines: list[str], title: str) -> list[list[str]]:
    """The rows of the table whose title line contains ``title``, as lists of cells."""
    start = next(i for i, line in enumerate(lines) if title in line)
    rows = []
    for line in lines[start + 3 :]:
        if "│" not in line:
            break
        rows.append([cell.strip() for cell in line.split("│")])
    return rows


def test_a_few_ranks_show_one_row_each(tmp_path):
    rows = table_after(report_screen(write_run(tmp_path / "run", 3, odd=(1,))), "per rank")
    assert [r[0] for r in rows] == ["0", "1", "2"], rows
    assert rows[1][1:5] == ["ok", "30", "2", "1"] and rows[0][1:5] == ["ok", "30", "1", "0"]  # rank 1 recompiled


def test_many_ranks_show_as_the_groups_of_ranks_alike(tmp_path):
    lines = report_screen(write_run(tmp_path / "run", 40, odd=(7,), crashed=(12, 30)))
    rows = table_after(lines, "40 ranks in 3 group(s) alike")
    assert [r[0] for r in rows] == ["0–6, 8–11, 13–29, 31–39", "12, 30", "7"], rows  # largest group first
    assert rows[0][1:3] == ["ok", "30"] and rows[0][-1] == "the reference"
    assert rows[1][1:3] == ["incomplete", "11"] and rows[1][-1] == "ended incomplete after 11 step(s)"
    assert rows[2][1:5] == ["ok", "30", "2", "1"] and rows[2][-1].startswith("recompiled forward at step 5: tensor 'x'")
    assert not any(line.strip().startswith("39 ") for line in lines)  # no row per rank
