"""One self-contained HTML file per report: inline CSS and SVG, no script, nothing loaded from
the network (a Content-Security-Policy meta forbids it), readable offline and small enough to
attach to an issue.

The page is rendered from the report dict exactly as ``report.json`` holds it: Jinja2 templates
with autoescape, and charts drawn as hand-written SVG (:mod:`torchrepro.render.svg`) from the
report's own series. Every string from the user's run (script names, guard texts, exception
messages), in a template or a chart, first passes through :func:`~torchrepro.render.sanitize.visible` (control and
bidirectional-override characters show as escapes such as ``\\x1b``), then is escaped. Nothing is
recomputed: what a chart needs, the analysis put into the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2 import ChainableUndefined, Environment, PackageLoader
from markupsafe import Markup

from .. import __version__
from ..errors import InputError
from ..eventlog.rundir import write_text
from ..eventlog.payloads import JsonObject
from .fix_table import FIX_COLUMNS, fix_cells, fix_recommendation
from ..reports.drift_report import DriftSection
from ..reports.loader import Report
from .sanitize import visible
from .svg import (
    MAX_LANES,
    MAX_ROWS,
    band_distance_chart,
    band_loss_chart,
    bar_chart,
    compile_timeline,
    divergence_chart,
    drift_plots as svg_drift_plots,
    fmt_num,
    fmt_seconds,
    loss_chart,
    loss_curves,
    loss_diff_chart,
    per_rank_step_times,
    step_time_chart,
)
from ..analysis.rank_groups import ranks_label

GENERATOR = f"torchrepro {__version__}"
MAX_FINDINGS = 60  # and "n more in report.json": the page stays small whatever the run did
MAX_RUNS = 500  # rows of a drift experiment's run table


def _finalize(value: Any) -> Any:
    """Every ``{{ value }}``: None as a dash, strings made visible (then autoescaped); newlines
    stay (a ``<pre>`` shows them as lines, any other element as a space)."""
    if value is None or isinstance(value, ChainableUndefined):
        return "—"
    if isinstance(value, Markup):
        return value
    return visible(value, newlines=True)


def fmt_value(value: Any, limit: int = 400) -> str:
    """A piece of evidence as one line of text, cut at ``limit`` characters."""
    if isinstance(value, (list, tuple)):
        text = ", ".join(fmt_value(v, limit) for v in value)
    elif isinstance(value, dict):
        text = "; ".join(f"{k}: {fmt_value(v, limit)}" for k, v in value.items())
    elif isinstance(value, float):
        text = fmt_num(value)
    else:
        text = "—" if value is None else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def fmt_list(values: Sequence[Any] | None, separator: str = ", ") -> str:
    """Items joined, an absent one as a dash (``[3, None]`` → ``3, —``)."""
    return separator.join("—" if v is None else str(v) for v in values or [])


def drift_plots(drift: JsonObject) -> list[Markup]:
    """The drift report's strip plots (:func:`torchrepro.render.svg.drift_plots`, which escapes
    every text it draws), inline, from the page's ``drift`` section (read back typed)."""
    return [Markup(svg) for _, svg in svg_drift_plots(DriftSection.from_json(drift))]


def fmt_ci(ci: Sequence[float] | None, scale: float = 1.0, unit: str = "") -> str:
    """An interval as ``[lo, hi]`` (times ``scale``), or a dash."""
    return f"[{fmt_num(ci[0] * scale)}, {fmt_num(ci[1] * scale)}]{unit}" if ci else "—"


def fmt_percent(share: float | None) -> str:
    """A share as ``42 %``, or a dash."""
    return "—" if share is None or isinstance(share, ChainableUndefined) else f"{100 * share:.0f} %"


# --- rendering ------------------------------------------------------------------------------


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("torchrepro.render", "templates"),
        autoescape=True,
        undefined=ChainableUndefined,
        finalize=_finalize,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=fmt_num, seconds=fmt_seconds, value=fmt_value, ranks=ranks_label, listed=fmt_list)
    env.globals.update(
        compile_timeline=compile_timeline,
        bar_chart=bar_chart,
        step_time_chart=step_time_chart,
        per_rank_step_times=per_rank_step_times,
        divergence_chart=divergence_chart,
        loss_chart=loss_chart,
        loss_diff_chart=loss_diff_chart,
        loss_curves=loss_curves,
        band_loss_chart=band_loss_chart,
        band_distance_chart=band_distance_chart,
        drift_plots=drift_plots,
        ci=fmt_ci,
        percent=fmt_percent,
        max_runs=MAX_RUNS,
        generator=GENERATOR,
        max_findings=MAX_FINDINGS,
        max_rows=MAX_ROWS,
        max_lanes=MAX_LANES,
        fix_columns=FIX_COLUMNS,
        fix_cells=fix_cells,
        fix_recommendation=fix_recommendation,
    )
    return env


_ENV: Environment | None = None


def render_html(report: Report, title: str | None = None) -> str:
    """The HTML page for a ``doctor``, ``check``/``check-resume``/``diff`` or ``drift`` report: the
    template of its kind, over its JSON document, the verdict banner coloured by its verdict."""
    global _ENV
    _ENV = _ENV or _environment()
    template = _ENV.get_template(f"{report.kind}.html.j2")
    return template.render(report=report.to_json(), tone=report.verdict.tone, title=title)


def is_torchrepro_html(path: Path) -> bool:
    """Whether ``path`` is a page this module wrote (those may be replaced; nothing else is)."""
    try:
        with open(path, "rb") as fp:
            head = fp.read(2048)
    except OSError:
        return False
    return b'<meta name="generator" content="torchrepro' in head


def write_html(report: Report, path: Path, *, title: str | None = None) -> Path:
    """Render ``report`` into ``path`` atomically, beside the report it shows in a run directory
    (a file named by the user is written by :mod:`torchrepro.commands.outputs`). An existing file
    that is not a torchrepro report is never replaced: :class:`InputError` instead."""
    path = Path(path)
    if path.exists() and (path.is_dir() or not is_torchrepro_html(path)):
        raise InputError(f"{path} exists and is not a torchrepro report: choose another file")
    write_text(path, render_html(report, title))
    return path
