"""The terminal view of a drift report: the verdict, effects of binary factors, variance shares,
what could not be separated, excluded runs. Every text passes through
:func:`~torchrepro.render.console.shown` and is shown without markup; an absent figure is a dash,
NaN and infinities as the runs produced them."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..analysis.drift import fmt_number
from ..analysis.sequential import plan_sentence
from ..reports.drift_report import DriftReport, Sequential
from .console import ABSENT, clip, console as make_console, figure, figure_columns, shown, text_columns


def _num(x: float | None) -> str:
    return figure(x, 4)


def _ci(ci: list[float] | None, scale: float = 1.0, fmt: str = "{:.4g}") -> str:
    return ABSENT if not ci else "[" + ", ".join(fmt.format(v * scale) for v in ci) + "]"


def render_drift(report: DriftReport, console: Console | None = None, report_path: str | None = None) -> None:
    """Verdict first, then one table per kind of factor and every run that was left out."""
    console = console or make_console()
    report = shown(report)  # metric, labels and errors come from the user's script
    drift = report.drift
    console.print(Text(report.verdict_line, style="bold"), highlight=False)
    console.print(
        Text(f"metric: {drift.metric.source} · design: {drift.design}", style="dim"),
        highlight=False,
    )
    summary = drift.summary
    if summary["n"]:
        console.print(
            Text(
                f"as written: mean {_num(summary['mean'])}, std {_num(summary['std'])}, 95 % CI "
                f"{_ci(summary['ci95'])} over {summary['n']} runs",
                style="dim",
            ),
            highlight=False,
        )
    if drift.effects:
        table = Table(title="binary factors (paired on the same seeds)", title_justify="left")
        text_columns(table, "factor", "levels")
        figure_columns(table, "difference", "95 % CI", "p", "MDE", "pairs")
        for e in drift.effects:
            table.add_row(
                e.factor,
                f"{e.levels[1]} − {e.levels[0]}",
                _num(e.difference),
                _ci(e.ci95),
                _num(e.p_value),
                _num(e.mde),
                str(e.n),
            )
        console.print(table)
        console.print(
            Text(f"test: {drift.effects[0].test}; MDE: {drift.effects[0].mde_method}", style="dim"),
            highlight=False,
        )
    if drift.factors:
        table = Table(title="random factors (variance components, crossed design)", title_justify="left")
        text_columns(table, "factor")
        figure_columns(table, "levels", "std", "share", "95 % CI")
        for f in drift.factors:
            share = f["variance_share"]
            table.add_row(
                f["name"],
                str(f["levels"] or ""),
                _num(f["std"]),
                "not separable" if f.get("not_separable") else ABSENT if share is None else f"{100 * share:.0f} %",
                _ci(f["ci95"], 100, "{:.0f}"),
            )
        console.print(table)
    if drift.sequential:
        _render_path(console, drift.sequential)
    for item in drift.not_separable:
        console.print(
            Text(f" ! not separable: {', '.join(item['factors'])} — {item['reason']}", style="yellow"), highlight=False
        )
    for plan in drift.planning:
        console.print(Text(f" → {plan_sentence(plan, fmt_number)}", style="cyan"), highlight=False)
    for note in drift.notes:
        console.print(Text(f" · {note}", style="cyan"), highlight=False)
    for run in drift.excluded:
        console.print(
            Text(clip(f" ✗ run {run.index} excluded ({run.status}): {run.error or ABSENT}", 240), style="red"),
            highlight=False,
        )
    if report_path:
        plots = ", ".join(drift.plots or [])
        console.print(
            Text(f"report: {report_path}" + (f" · plots: {plots}" if plots else ""), style="dim"), highlight=False
        )


def _render_path(console: Console, seq: Sequential) -> None:
    """``--until-clear``: each factor's estimate and interval at every look, and its decision."""
    table = Table(
        title=f"--until-clear: {seq['runs_used']} runs of at most {seq['max_runs']}, the path as runs were added",
        title_justify="left",
    )
    text_columns(table, "factor")
    figure_columns(table, "runs", "estimate", "interval", "evidence")
    text_columns(table, "decision")
    for f in seq["factors"]:
        for i, step in enumerate(f["path"]):
            last = i == len(f["path"]) - 1
            share = f["kind"] == "random"
            scale, fmt = (100, "{:.0f}") if share else (1, "{:.4g}")
            estimate = step["estimate"]
            table.add_row(
                f["factor"] if i == 0 else "",
                str(step["runs"]),
                ABSENT if estimate is None else (f"{100 * estimate:.0f} %" if share else _num(estimate)),
                _ci(step["interval"], scale, fmt) if step["interval"] else "unbounded",
                f"p {step['p_value']:.2g} < {step['alpha_spent']:.2g}?" if share else f"wealth {step['wealth']:.3g}",
                f["decision"].replace("_", " ") if last else "",
            )
    console.print(table)
    tests = {f["kind"]: f["test"] for f in seq["factors"]}
    console.print(Text("; ".join(f"{kind}: {test}" for kind, test in tests.items()), style="dim"), highlight=False)
