"""A one-screen rich summary of a report. Every string of the report passes through
:func:`~torchrepro.render.console.shown` first and is printed without markup: text from the
user's script (exception messages, guards, file names) cannot style or control the terminal, a
newline in it shows as ``\\n``, so each finding stays on its line, and a path is shown by the one
rule (relative under the working directory). The layout (:mod:`torchrepro.render.console`): the
verdict once, names, guards, reasons and paths wrapped and never cut, an absent value a dash."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..analysis.rank_groups import ranks_label
from ..reports.check_report import CheckReport, Determinism, GraphProbeRecord
from ..reports.compare_report import CompareReport
from ..reports.doctor_report import DoctorReport, RankCompiles
from ..reports.findings import Finding
from .console import (
    ABSENT,
    cell,
    console as make_console,
    figure,
    figure_columns,
    location,
    shown,
    text_columns,
)
from .fix_table import FIX_COLUMNS, fix_cells, fix_recommendation

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_MARK = {"error": "✗", "warning": "!", "info": "·"}
_TONE = {"ok": "bold green", "warn": "bold yellow", "bad": "bold red"}  # the verdict's colour, by Verdict.tone


def _row(table: Table, *cells: str) -> None:
    table.add_row(*(Text(cell) for cell in cells))  # plain text: no markup in a guard or reason


def _verdict(console: Console, line: str, tone: str) -> None:
    console.print(Text(line, style=_TONE[tone]), highlight=False, markup=False)


def render_findings(console: Console, findings: list[Finding], limit: int = 8, verdict: str | None = None) -> None:
    """The first ``limit`` findings, each with its fix. A finding that says what the ``verdict``
    line above it says (a comparison's divergence, which the verdict may extend after a ``;``: the
    measured fix, the backend stage) shows its fix only, under the verdict: the verdict is printed
    once."""
    findings = shown(findings)
    said = [f for f in findings if verdict is not None and _says(verdict, f.title)]
    for f in said:
        if f.hint:
            console.print(Text(f"   fix: {f.hint}", style="dim"), highlight=False, markup=False)
    findings = [f for f in findings if f not in said]
    for f in findings[:limit]:
        console.print(
            Text(f" {_MARK[f.severity]} ", style=_STYLE[f.severity]) + Text(f.title), highlight=False, markup=False
        )
        if f.hint:
            console.print(Text(f"   fix: {f.hint}", style="dim"), highlight=False, markup=False)
    if len(findings) > limit:
        console.print(Text(f"   … {len(findings) - limit} more in report.json", style="dim"))


TABLE_ROWS = 8  # rows of the recompile and graph-break tables; the report holds them all


def _says(verdict: str, title: str) -> bool:
    """Whether the ``verdict`` line says what a finding's ``title`` says (the same, or extended)."""
    return verdict == title or verdict.startswith(f"{title}; ")


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", show_edge=False, pad_edge=False)


def _more_rows(console: Console, rows: int, shown: int) -> None:
    if rows > shown:
        console.print(Text(f"… {rows - shown} more in report.json", style="dim"), highlight=False)


def render_doctor(report: DoctorReport, console: Console | None = None, report_path: str | None = None) -> None:
    """Verdict, top findings with fixes, recompiles by function, category and guard, graph breaks by location."""
    console = console or make_console()
    report = shown(report)
    _verdict(console, report.verdict_line, report.verdict.tone)
    c = report.compile
    if report.findings:
        render_findings(console, report.findings, verdict=report.verdict_line)
    if c["recompile_groups"]:
        table = _table("recompiles")
        text_columns(table, "function", "category")
        figure_columns(table, "count", "first step")
        text_columns(table, "guard")
        for row in c["recompile_groups"][:TABLE_ROWS]:
            first = row["steps"][0] if row["steps"] else None
            _row(table, row["function"], row["category"] or "other", str(row["count"]), cell(first), row["guard"])
        console.print(table)
        _more_rows(console, len(c["recompile_groups"]), TABLE_ROWS)
    if c["graph_break_groups"]:
        table = _table("graph breaks")
        text_columns(table, "location")
        figure_columns(table, "count")
        text_columns(table, "reason", "id")
        for group in c["graph_break_groups"][:TABLE_ROWS]:
            where = location(group["file"], group["line"]) + (
                f" ({ranks_label(group['ranks_text'])})" if len(report.run.ranks) > 1 else ""
            )
            _row(table, where, str(group["count"]), group["reason"], group["gb_id"] or "")
        console.print(table)
        _more_rows(console, len(c["graph_break_groups"]), TABLE_ROWS)
        if c.get("graph_breaks_relogged"):
            console.print(
                f"({c['graph_breaks_relogged']} more record(s) of these breaks, logged again when Dynamo restarted or "
                "skipped a frame, counted once, as Dynamo's counters do)",
                style="dim",
                highlight=False,
            )
    if report.compile_fixes is not None:
        _render_fixes(console, report)
    steps = report.steps.per_rank
    if len(c["per_rank"]) > 1:
        _render_ranks(console, report, c["per_rank"])
    cache = ", ".join(f"{name} {v['hit']} hit/{v['miss']} miss" for name, v in c["cache"].items()) or "no lookups"
    console.print(
        f"compile time {c['compile_time_s']:.2f} s · unique graphs {c['unique_graphs']} · cache: {cache}",
        highlight=False,
        markup=False,
    )
    for rank, s in steps.items() if len(c["per_rank"]) <= 1 else ():
        if s.steps:
            loss = (
                f"loss {figure(s.first_loss, 4)} → {figure(s.last_loss, 4)}"
                if s.first_loss is not None
                else "no loss seen"
            )
            ms = "no step times" if s.median_step_s is None else f"median {s.median_step_s * 1e3:.1f} ms/step"
            console.print(f"rank {rank}: {s.steps} steps, {ms}, {loss}", highlight=False, markup=False)
    for cap in report.capabilities:
        if not cap["available"]:
            console.print(Text(f"not observed: {cap['name']} ({cap['note']})", style="dim"))
    if report_path:
        console.print(Text(f"report: {report_path}", style="dim"))


def _render_fixes(console: Console, report: DoctorReport) -> None:
    """``doctor --fixes``: each fix tried (or not) on two lines, its figures before → after, then
    the recommendation (a table of nine columns does not fit a terminal)."""
    rows = report.compile_fixes or []
    if rows:
        console.print(Text("compile fixes", style="italic"), highlight=False, markup=False)
    for row in rows:
        cells = dict(zip(FIX_COLUMNS, fix_cells(row)))
        head = f" {cells['fix']} → {cells['applied to']}: {cells['status']}"
        if row.get("before") is None:
            console.print(Text(head + f" ({cells['compiles']})"), highlight=False, markup=False)
            continue
        console.print(Text(head + f", numerics {cells['numerics']}"), highlight=False, markup=False)
        figures = " · ".join(f"{k} {cells[k]}" for k in FIX_COLUMNS[2:7])
        console.print(Text(f"   {figures}", style="dim"), highlight=False, markup=False)
    if report.compile_fix_note:
        console.print(Text(f"fixes: {report.compile_fix_note}", style="dim"), highlight=False, markup=False)
    if any(r["status"] not in ("expected", "not_tried") for r in rows):
        console.print(Text(fix_recommendation(report.compile_fix_recommended)), highlight=False, markup=False)


# More ranks than this show as the groups of ranks that behaved alike (the HTML report's lanes),
# each by its first rank: a terminal table of 1024 rows is read by nobody (and took 2 s to draw).
RANK_ROWS = 16


def _render_ranks(console: Console, report: DoctorReport, per_rank: dict[str, RankCompiles]) -> None:
    groups = report.rank_groups.get("groups") or []
    grouped = len(per_rank) > RANK_ROWS and bool(groups)
    rows: list[tuple[str, str, str]]  # label, rank, how the group differs (grouped only)
    if grouped:
        rows = [(g["ranks_text"], str(g["representative"]), g["difference"] or "the reference") for g in groups]
        title, unit = f"{len(per_rank)} ranks in {len(groups)} group(s) alike, each shown by its first rank", "group"
    else:
        rows, title, unit = [(rank, rank, "") for rank in sorted(per_rank, key=int)], "per rank", "rank"
    table = _table(title)
    if grouped:
        text_columns(table, "ranks")
    else:
        figure_columns(table, "rank")
    text_columns(table, "status")
    figure_columns(table, "steps", "compiles", "recompiles", "breaks", "compile s", "ms/step")
    if grouped:
        text_columns(table, "behaviour")
    for label, rank, difference in rows[:RANK_ROWS]:
        figures: Mapping[str, object] = per_rank.get(rank, {})
        outcome, rank_steps = report.run.ranks.get(rank), report.steps.per_rank.get(rank)
        ms = rank_steps.median_step_s if rank_steps else None
        cells = [
            label,
            outcome.status if outcome else ABSENT,
            str(rank_steps.steps if rank_steps else 0),
            *(str(figures.get(k, 0)) for k in ("compiles", "recompiles", "graph_breaks")),
            f"{figures.get('compile_time_s', 0.0):.2f}",
            ABSENT if ms is None else f"{ms * 1e3:.1f}",
        ]
        _row(table, *cells, *([difference] if grouped else []))
    console.print(table)
    if len(rows) > RANK_ROWS:
        console.print(f"… {len(rows) - RANK_ROWS} more {unit}(s): see the report", highlight=False, markup=False)


PROBES_SHOWN = 4  # of the graphs that differed, and of those that add atomically


def probe_lines(probes: list[GraphProbeRecord]) -> list[str]:
    """``determinism.graph_probes`` in lines: how many graphs were probed, then each that was not
    bit for bit the same on identical inputs (what its first differing output is)."""
    differing = [p for p in probes if p["differing"]]
    failed = [p for p in probes if p.get("error")]
    unsaved = [p for p in probes if p.get("not_saved")]
    longer = [p for p in probes if p.get("accumulates") and not p["differing"] and not p.get("error")]
    repeats = max((p["repeats"] for p in probes if p not in longer), default=0)
    lines = [
        f"graph probes: {len(probes)} compiled graph(s) called {repeats} more times on identical inputs; "
        f"{len(differing)} not bit for bit the same"
        + (f", {len(failed)} not probed" if failed else "")
        + (f"; {len(unsaved)} not saved for torchrepro repro ({unsaved[0]['not_saved']})" if unsaved else "")
    ]
    for p in longer[:PROBES_SHOWN]:
        lines.append(
            f"  {p['run']} rank {p['rank']}: compiled graph {p['compile_id']} ({p['graph']}) adds atomically at "
            f"{p['threads']} threads and repeated bit for bit {p['repeats']} times (its threads may still race "
            "at other timings)"
        )
    for p in differing[:PROBES_SHOWN]:
        e = p["explained"] or {}
        where = ", ".join(
            f"{k} {e[k]}" for k in ("parameter", "node", "op", "kernel", "source") if e.get(k) is not None
        )
        lines.append(
            f"  {p['run']} rank {p['rank']}: compiled graph {p['compile_id']} ({p['graph']}), "
            f"{p['runs_differing']} of {p['repeats']} repeats differ" + (f": {where}" if where else "")
        )
    hidden = max(len(longer) - PROBES_SHOWN, 0) + max(len(differing) - PROBES_SHOWN, 0)
    if hidden:
        lines.append(f"  … {hidden} more in report.json")
    return lines


def _render_probes(console: Console, probes: list[GraphProbeRecord]) -> None:
    if probes:
        for line in probe_lines(probes):
            console.print(Text(line, style="dim" if line.startswith("graph probes") else ""), highlight=False)


def evidence_line(det: Determinism) -> str | None:
    """``params 5, grads 0, loss 60, rng 60, batch 60``: the steps at which each kind of evidence
    was compared (None in a report written before it was said)."""
    compared = det.more.get("evidence_compared")
    return ", ".join(f"{kind} {n}" for kind, n in compared.items()) if isinstance(compared, dict) else None


def _more(console: Console, lines: list[str], limit: int, prefix: str = "  ", style: str = "") -> None:
    """The first ``limit`` of ``lines``, and how many more the report holds."""
    for line in lines[:limit]:
        console.print(Text(f"{prefix}{line}", style=style), highlight=False, markup=False)
    if len(lines) > limit:
        console.print(Text(f"{prefix}… {len(lines) - limit} more in report.json", style="dim"), highlight=False)


def render_check(report: CheckReport, console: Console | None = None, report_path: str | None = None) -> None:
    """Verdict on the first line, then the divergence, its cause, and the curve."""
    console = console or make_console()
    report = shown(report)
    det = report.determinism
    _verdict(console, report.verdict_line, report.verdict.tone)
    render_findings(console, report.findings, verdict=report.verdict_line)
    if (evidence := evidence_line(det)) is not None:
        console.print(f"steps compared per kind of evidence: {evidence}", highlight=False, markup=False)
        _more(console, det.more.get("not_compared", []), 5)
    fd = det.first_divergence
    if fd:
        said = fd.evidence
        if said.because:
            console.print(f"evidence: {said.because}", highlight=False, markup=False)
        _more(console, said.facts.get("differences", []), 6)
        if said.scope:
            console.print(f"graphs: {said.scope}", highlight=False, markup=False)
        if said.phase:
            console.print(f"phase: {said.phase}", highlight=False, markup=False)
    _render_probes(console, det.more.get("graph_probes") or [])
    dec = det.more.get("decomposition")
    if dec:
        for name in ("total", "rng", "numerics", "run_to_run"):
            d = dec.get(name)
            if d is None:
                continue
            size = (
                "bit-exact"
                if d["bit_exact"]
                else (f"max |Δparam| {figure(d['final_max_abs'])} (rel {figure(d['final_max_rel'])})")
            )
            console.print(f"{name:>8}: {' vs '.join(d['between'])}: {size}", highlight=False, markup=False)
    if det.curve:
        table = _table("divergence curve")
        figure_columns(table, "step", "max |Δparam|", "max rel", "‖Δparam‖", "|Δloss|")
        curve = det.curve
        points = curve if len(curve) <= 8 else curve[:4] + curve[-4:]
        for point in points:
            l2 = point.get("l2")
            norm = figure(l2) if l2 is None else ("≈" if point.get("estimated") else "") + figure(l2)
            _row(
                table,
                str(point["step"]),
                figure(point["max_abs"]),
                figure(point["max_rel"]),
                norm,
                figure(point["loss_diff"]),
            )
        console.print(table)
        if len(curve) > len(points):
            console.print(Text(f"({len(curve) - len(points)} steps between in report.json)", style="dim"))
    _more(console, det.notes, 5, prefix="note: ", style="dim")
    if report_path:
        console.print(Text(f"report: {report_path}", style="dim"))


def render_compare(report: CompareReport, console: Console | None = None, report_path: str | None = None) -> None:
    """Verdict on the first line, the findings, the tolerance B was held to, each rank's first
    divergence with the strength of its evidence, and the steps around the first one out of band."""
    console = console or make_console()
    report = shown(report)
    c = report.compare
    _verdict(console, report.verdict_line, report.verdict.tone)
    render_findings(console, report.findings, verdict=report.verdict_line)
    tol, band = c["tolerance"], c["band"]
    console.print(
        Text(
            f"compared {c['steps_compared']} step(s), {c['tensors_compared']} tensor comparisons; band "
            f"{'zero (A bit-exact)' if band['zero'] else figure(band['loss_rel']) + ' (loss, relative)'}; "
            f"tolerance {tol['safety']:g}*eps({tol['dtype']})*sqrt({tol['reduction_size']})*(step+1)",
            style="dim",
        ),
        highlight=False,
    )
    table = _table("first divergence per rank (bit for bit)")
    figure_columns(table, "rank")
    text_columns(table, "status", "evidence")
    figure_columns(table, "step")
    text_columns(table, "what", "tensor")
    for r in c["per_rank"]:
        _row(table, *(cell(r[key]) for key in ("rank", "status", "evidence", "step", "what", "tensor")))
    console.print(table)
    _more(console, c.get("notes", []), 5, prefix="note: ", style="dim")
    if report_path:
        console.print(Text(f"report: {report_path}", style="dim"))
