"""The text of golden runs and of a comparison's first divergence: the line ``golden record`` prints,
the terminal view of a golden check, and :func:`first_divergence_line`, the one line that says where
a check, a compare or a golden check first differs (step, rank, module, op, cause), which the pytest
plugin prints under a failing verdict. Each reads a typed report and computes nothing."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.text import Text

from ..eventlog.golden_dir import GoldenManifest
from ..eventlog.rundir import size_text
from ..reports.check_report import CheckReport
from ..reports.compare_report import CompareReport
from ..reports.findings import Verdict
from ..reports.golden_report import GoldenReport
from .console import console as make_console, shown
from .sanitize import visible
from .terminal import _says, _verdict, render_findings


def recorded_line(manifest: GoldenManifest, directory: str | Path) -> str:
    """``GOLDEN RECORDED in DIR: ...``: what ``golden record`` kept, under which environment, and its size."""
    sizes = manifest["sizes"]
    band = f"; run to run: {manifest['run_to_run']}" if manifest["run_to_run"] else ""
    return visible(
        f"GOLDEN RECORDED in {directory}: {manifest['steps']} step(s) of {manifest['script']}, "
        f"{manifest['world_size']} rank(s), torch {manifest['torch_version']} on {manifest['device']}; "
        f"{size_text(sizes['bytes'])}: {size_text(sizes['fixed'])} once, {size_text(sizes['per_step'])} a step "
        f"({sizes['per_parameter_step']:.0f} B a parameter tensor), {size_text(sizes['snapshot_bytes'])} of snapshots{band}"
    )


def first_divergence_line(report: CheckReport | CompareReport | GoldenReport) -> str | None:
    """Where the compared runs first differ, in one line (None: they do not, or nothing was compared)."""
    if isinstance(report, GoldenReport):
        report = report.check if report.check is not None else report
        if isinstance(report, GoldenReport):
            return None
    if isinstance(report, CompareReport):
        p = report.compare.get("first_out")
        if not p:
            return None
        where = f"rank {p['rank']}, " if p.get("rank") is not None else ""
        what = p.get("tensor") or p["quantity"]
        module = f"; module {p['module']}" if p.get("module") else ""
        return visible(f"first divergence: step {p['step']}, {where}{what}{module}: out of A's band")
    fd = report.determinism.first_divergence
    if fd is None:
        return None
    ev = fd.evidence
    parameter = ev.parameter or fd.detail.get("first_parameter")
    parts = [
        "before step 0" if fd.what == "init_params" else f"step {fd.step}",
        f"rank {fd.rank}",
        fd.what,
        f"module {ev.module or '—'}",
        f"op {ev.op or '—'}",
        f"cause {fd.cause or 'unknown'}",
    ]
    at = f", at {ev.source}" if ev.source else ""
    tensor = f" (parameter {parameter})" if parameter else ""
    return visible(f"first divergence: {', '.join(parts)}{at}{tensor}")


def render_golden(report: GoldenReport, console: Console | None = None, report_path: str | None = None) -> None:
    """Verdict on the first line; then what the comparison with the golden found (the divergence's fix
    under the verdict that says it, values that are not finite...), what is still possible under another
    environment (unless the line says it), the first divergence, the band, the golden's own findings (what
    differs from the recorded environment among them) and notes."""
    console = console or make_console()
    report = shown(report)
    _verdict(console, report.verdict_line, report.verdict.tone)
    check = report.check
    if check is not None:  # what the comparison found (a loss that is NaN, uninitialised parameters...): its
        # divergence's fix under the verdict, which says that divergence; that fix only where the golden's
        # verdict is it (not within the golden's band)
        diverged = report.verdict is Verdict.DIVERGED
        found = [f for f in check.findings if diverged or not _says(check.verdict_line, f.title)]
        render_findings(console, found, verdict=check.verdict_line if diverged else None)
    if report.still_possible and report.still_possible not in report.verdict_line:
        console.print(f"still possible: {report.still_possible}", highlight=False, markup=False)
    if (line := first_divergence_line(report)) is not None:
        console.print(line, highlight=False, markup=False)
    if report.band is not None:
        band = report.band
        console.print(
            Text(f"against the golden's band: {band['verdict']} ({band['reason']})", style="dim"), highlight=False
        )
    render_findings(console, report.findings, verdict=report.verdict_line)
    for note in [*report.notes, *(report.check.determinism.notes if report.check else [])][:5]:
        console.print(Text(f"note: {note}", style="dim"))
    if report_path:
        console.print(Text(f"report: {report_path}", style="dim"))
