"""The table of compile fixes ``doctor --fixes`` tried, as text: the same cells in the terminal and
the HTML report, and the recommendation under it."""

from __future__ import annotations

from typing import Literal

from ..reports.doctor_report import CompileFixRow, FixMeasure, FixRecommendation
from .console import ABSENT

FIX_COLUMNS = ("fix", "applied to", "compiles", "recompiles", "breaks", "compile s", "ms/step", "numerics", "status")


FixFigure = Literal["compiles", "recompiles", "graph_breaks", "compile_time_s", "step_time_s"]  # FixMeasure's, shown


def fix_cells(row: CompileFixRow) -> list[str]:
    """One ``compile_fixes`` row as the text of the fix table's cells (:data:`FIX_COLUMNS`), the
    same in the terminal and the HTML report: each figure as ``before → after``; a fix not run
    (a code change, an expected recompile) shows its note instead."""
    if row["before"] is None:
        status = row["status"].replace("_", " ")
        return [row["name"], row.get("applied_to") or "", row.get("note") or "", "", "", "", "", "", status]
    before, after = row["before"], row["after"]

    def figure(key: FixFigure, scale: float = 1.0, digits: int = 0) -> str:
        def one(m: FixMeasure | None) -> str:
            value = None if m is None else m.get(key)
            return ABSENT if value is None else f"{value * scale:.{digits}f}"

        return f"{one(before)} → {one(after)}"

    return [
        row["name"],
        row.get("applied_to") or "",
        figure("compiles"),
        figure("recompiles"),
        figure("graph_breaks"),
        figure("compile_time_s", digits=2),
        figure("step_time_s", 1e3, 1),
        (row.get("numerics") or "not compared").replace("_", " "),
        row["status"].replace("_", " "),
    ]


def fix_recommendation(recommended: FixRecommendation | None) -> str:
    """The recommendation under the fix table: the fix and the exact line for the script, and how
    the recommended set did tried together."""
    if recommended is None:
        return (
            "no fix recommended: none removed recompiles or graph breaks without changing the numbers or the step time"
        )
    text = (
        f"recommended: {recommended['name']} ({recommended['applied_to']}), {recommended['removed']} "
        f"recompile(s)/break(s) fewer: put `{recommended['line']}` in the script before the first compiled call"
    )
    together = recommended.get("combined")
    if together:
        after = together["after"]
        text += (
            f"; together ({' + '.join(recommended['set'])}): recompiles {together['before']['recompiles']} → "
            f"{after.get('recompiles', ABSENT) if after else ABSENT}, breaks {together['before']['graph_breaks']} → "
            f"{after.get('graph_breaks', ABSENT) if after else ABSENT}, {together['status'].replace('_', ' ')}, "
            f"numerics {(together['numerics'] or 'not compared').replace('_', ' ')}"
        )
    return text
