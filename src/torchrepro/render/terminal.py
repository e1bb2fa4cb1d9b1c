"""A one-screen rich summary of a report. Every string of the report passes through
:func:`~torchrepro.render.sanitize.visible_tree` first and is printed without markup: text from the
user's script (exception messages, guards, file names) cannot style or control the terminal, and a
newline in it shows as ``\\n``, so each finding stays on its line."""

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
from .fix_table import FIX_COLUMNS, fix_cells, fix_recommendation
from .sanitize import visible_tree

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_MARK = {"error": "✗", "warning": "!", "info": "·"}
_TONE = {"ok": "bold green", "warn": "bold yellow", "bad": "bold red"}  # the verdict's colour, by Verdict.tone


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _short(path: str | None, width: int = 48) -> str:
    if not path:
        return "?"
    return path if len(path) <= width else "…" + path[-(width - 1) :]


def _row(table: Table, *cells: str) -> None:
    table.add_row(*(Text(cell) for cell in cells))  # plain text: no markup in a guard or reason


def render_findings(console: Console, findings: list[Finding], limit: int = 8) -> None:
    """The first ``limit`` findings, each with its fix."""
    findings = visible_tree(findings)
    for f in findings[:limit]:
        console.print(
            Text(f" {_MARK[f.severity]} ", style=_STYLE[f.severity]) + Text(f.title), highlight=False, markup=False
        )
        if f.hint:
            console.print(Text(f"   fix: {f.hint}", style="dim"), highlight=False, markup=False)
    if len(findings) > limit:
        console.print(Text(f"   … {len(findings) - limit} more in report.json", style="dim"))


def render_doctor(report: DoctorReport, console: Console | None = None, report_path: str | None = None) -> None:
    """Verdict, top findings with fixes, recompiles by function, category and guard, graph breaks by location."""
    console = console or Console()
    report = visible_tree(report)
    console.print(Text(report.verdict_line, style=_TONE[report.verdict.tone]), highlight=False, markup=False)
    c = report.compile
    if report.findings:
        render_findings(console, report.findings)
    if c["recompile_groups"]:
        table = Table(title="recompiles", title_justify="left", show_edge=False, pad_edge=False)
        for col in ("function", "category", "count", "first step", "guard"):
            table.add_column(col, overflow="fold")
        for row in c["recompile_groups"][:8]:
            _row(
                table,
                str(row["function"]),
                str(row["category"]),
                str(row["count"]),
                str(row["steps"][0]),
                row["guard"][:60],
            )
        console.print(table)
    if c["graph_break_groups"]:
        table = Table(title="graph breaks", title_justify="left", show_edge=False, pad_edge=False)
        for col in ("location", "count", "reason", "id"):
            table.add_column(col, overflow="fold")
        for group in c["graph_break_groups"][:8]:
            where = f"{_short(group['file'])}:{group['line']}" + (
                f" ({ranks_label(group['ranks_text'])})" if len(report.run.ranks) > 1 else ""
            )
            _row(table, where, str(group["count"]), group["reason"][:60], group["gb_id"] or "")
        console.print(table)
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
            loss = f"loss {s.first_loss:.4g} → {s.last_loss:.4g}" if s.first_loss is not None else "no loss seen"
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
    columns = ("status", "steps", "compiles", "recompiles", "breaks", "compile s", "ms/step")
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("ranks" if grouped else "rank", justify="left" if grouped else "right")
    for col in columns:
        table.add_column(col, justify="right")
    if grouped:
        table.add_column("behaviour", overflow="fold")
    for label, rank, difference in rows[:RANK_ROWS]:
        figures: Mapping[str, object] = per_rank.get(rank, {})
        outcome, rank_steps = report.run.ranks.get(rank), report.steps.per_rank.get(rank)
        ms = rank_steps.median_step_s if rank_steps else None
        cells = [
            label,
            outcome.status if outcome else "?",
            str(rank_steps.steps if rank_steps else 0),
            *(str(figures.get(k, 0)) for k in ("compiles", "recompiles", "graph_breaks")),
            f"{figures.get('compile_time_s', 0.0):.2f}",
            "" if ms is None else f"{ms * 1e3:.1f}",
        ]
        _row(table, *cells, *([difference] if grouped else []))
    console.print(table)
    if len(rows) > RANK_ROWS:
        console.print(f"… {len(rows) - RANK_ROWS} more {unit}(s): see the report", highlight=False, markup=False)


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
    for p in longer[:4]:
        lines.append(
            f"  {p['run']} rank {p['rank']}: compiled graph {p['compile_id']} ({p['graph']}) adds atomically at "
            f"{p['threads']} threads and repeated bit for bit {p['repeats']} times (its threads may still race "
            "at other timings)"
        )
    for p in differing[:4]:
        e = p["explained"] or {}
        where = ", ".join(
            f"{k} {e[k]}" for k in ("parameter", "node", "op", "kernel", "source") if e.get(k) is not None
        )
        lines.append(
            f"  {p['run']} rank {p['rank']}: compiled graph {p['compile_id']} ({p['graph']}), "
            f"{p['runs_differing']} of {p['repeats']} repeats differ" + (f": {where}" if where else "")
        )
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


def render_check(report: CheckReport, console: Console | None = None, report_path: str | None = None) -> None:
    """Verdict on the first line, then the divergence, its cause, and the curve."""
    console = console or Console()
    report = visible_tree(report)
    det = report.determinism
    console.print(Text(report.verdict_line, style=_TONE[report.verdict.tone]), highlight=False, markup=False)
    render_findings(console, report.findings)
    if (evidence := evidence_line(det)) is not None:
        console.print(f"steps compared per kind of evidence: {evidence}", highlight=False, markup=False)
        for line in det.more.get("not_compared", [])[:5]:
            console.print(f"  {line}", highlight=False, markup=False)
    fd = det.first_divergence
    if fd:
        because = fd["evidence"].get("because")
        if because:
            console.print(f"evidence: {because}", highlight=False, markup=False)
        for line in fd["evidence"].get("differences", [])[:6]:
            console.print(f"  {line}", highlight=False, markup=False)
        if fd.get("phase"):
            console.print(f"phase: {fd['phase']}", highlight=False, markup=False)
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
                else f"max |Δparam| {_num(d['final_max_abs'])} ({d.get('final_parameter') or '?'}); "
                f"‖Δparam‖/‖param‖ {_num(d.get('final_l2_rel'))}"
            )
            console.print(f"{name:>8}: {' vs '.join(d['between'])}: {size}", highlight=False, markup=False)
    if det.curve:
        table = Table(title="divergence curve", title_justify="left", show_edge=False, pad_edge=False)
        for col in ("step", "max |Δparam|", "max rel", "‖Δparam‖", "|Δloss|"):
            table.add_column(col, justify="right")
        curve = det.curve
        shown = curve if len(curve) <= 8 else curve[:4] + curve[-4:]
        for point in shown:
            loss = "" if point["loss_diff"] is None else f"{point['loss_diff']:.3g}"
            l2 = point.get("l2")
            norm = "" if l2 is None else ("≈" if point.get("estimated") else "") + f"{l2:.3g}"
            _row(table, str(point["step"]), _num(point["max_abs"]), _num(point["max_rel"]), norm, loss)
        console.print(table)
    for note in det.notes[:5]:
        console.print(Text(f"note: {note}", style="dim"))
    if report_path:
        console.print(Text(f"report: {report_path}", style="dim"))


def render_compare(report: CompareReport, console: Console | None = None, report_path: str | None = None) -> None:
    """Verdict on the first line, the findings, the tolerance B was held to, each rank's first
    divergence with the strength of its evidence, and the steps around the first one out of band."""
    console = console or Console()
    report = visible_tree(report)
    c = report.compare
    console.print(Text(report.verdict_line, style=_TONE[report.verdict.tone]), highlight=False, markup=False)
    render_findings(console, report.findings)
    tol, band = c["tolerance"], c["band"]
    console.print(
        Text(
            f"compared {c['steps_compared']} step(s), {c['tensors_compared']} tensor comparisons; band "
            f"{'zero (A bit-exact)' if band['zero'] else _num(band['loss_rel']) + ' (loss, relative)'}; "
            f"tolerance {tol['safety']:g}*eps({tol['dtype']})*sqrt({tol['reduction_size']})*(step+1)",
            style="dim",
        ),
        highlight=False,
    )
    table = Table(title="first divergence per rank (bit for bit)", title_justify="left", show_edge=False)
    for col in ("rank", "status", "evidence", "step", "what", "tensor"):
        table.add_column(col)
    for r in c["per_rank"]:
        cells = (r["rank"], r["status"], r["evidence"], r["step"], r["what"], r["tensor"])
        _row(table, *("" if x is None else str(x) for x in cells))
    console.print(table)
    for note in c.get("notes", [])[:5]:
        console.print(Text(f"note: {note}", style="dim"))
    if report_path:
        console.print(Text(f"report: {report_path}", style="dim"))
