"""One self-contained HTML file per report: inline CSS and SVG, no script, nothing loaded from
the network (a Content-Security-Policy meta forbids it), readable offline and small enough to
attach to an issue.

The page is rendered from the report dict exactly as ``report.json`` holds it: Jinja2 templates
with autoescape, and charts drawn here as hand-written SVG from the report's own series. Every
string from the user's run (script names, guard texts, exception messages), in a template or a
chart, first passes through :func:`~torchrepro.render.sanitize.visible` (control and
bidirectional-override characters show as escapes such as ``\\x1b``), then is escaped. Nothing is
recomputed: what a chart needs, the analysis put into the report.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypedDict

from jinja2 import ChainableUndefined, Environment, PackageLoader
from markupsafe import Markup, escape

from .. import __version__
from ..errors import InputError
from ..eventlog.rundir import write_text
from ..eventlog.payloads import JsonObject
from .fix_table import FIX_COLUMNS, fix_cells, fix_recommendation
from ..reports.check_report import CurvePoint, StepRow
from ..reports.doctor_report import TimelineRow
from ..reports.drift_report import DriftSection
from ..reports.loader import Report
from .sanitize import visible
from ..analysis.rank_groups import ranks_label

GENERATOR = f"torchrepro {__version__}"
MAX_FINDINGS = 60  # and "n more in report.json": the page stays small whatever the run did
MAX_ROWS = 40
MAX_LANES = 24
MAX_RUNS = 500  # rows of a drift experiment's run table


def _finalize(value: Any) -> Any:
    """Every ``{{ value }}``: None as a dash, strings made visible (then autoescaped); newlines
    stay (a ``<pre>`` shows them as lines, any other element as a space)."""
    if value is None or isinstance(value, ChainableUndefined):
        return "—"
    if isinstance(value, Markup):
        return value
    return visible(value, newlines=True)


def _text(value: Any) -> Markup:
    """Escaped, visible text (on one line) for SVG built here."""
    return escape(visible(value))


def fmt_num(value: Any, digits: int = 3) -> str:
    """A number for people: 3 significant digits, exponent for tiny or huge values."""
    if value is None or isinstance(value, ChainableUndefined):
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if value == 0:
        return "0"
    if abs(value) < 1e-3 or abs(value) >= 1e6:
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}g}"


def fmt_seconds(value: Any, digits: int = 3) -> str:
    """Seconds as ``1.23 s`` or ``4.5 ms``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "—"
    return f"{value * 1e3:.{digits}g} ms" if abs(value) < 1 else f"{value:.{digits}g} s"


def distinct_labels(values: Sequence[float], fmt: Callable[[float, int], str]) -> list[str]:
    """``values`` formatted with the fewest significant digits (3 at least) that tell them apart: the
    ticks of a narrow range (11.10, 11.12, 11.14) must not all read "11.1"."""
    labels = [fmt(v, 3) for v in values]
    for digits in range(4, 16):
        if len(set(labels)) == len(labels):
            break
        labels = [fmt(v, digits) for v in values]
    return labels


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


# --- charts: hand-written SVG ---------------------------------------------------------------

PALETTE = ("#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04", "#db2777")
_W, _H, _L, _R, _T, _B = 760, 250, 64, 16, 26, 36  # size and margins (left, right, top, bottom)


def _ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    if not math.isfinite(hi - lo) or hi <= lo:  # (a span past the largest float: one tick)
        return [lo] if math.isfinite(lo) else []
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for mult in (1, 2, 5, 10):
        if (hi - lo) / (step * mult) <= n:
            step *= mult
            break
    if integer:
        step = max(step, 1)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


class _Axes:
    """Linear x, linear or log10 y, mapped into the plot area."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float], log_y: bool, zero: bool = True):
        self.log_y, self.width, self.height = log_y, _W, _H
        xs = [x for x in xs if math.isfinite(x)]
        self.x0, self.x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
        if self.x1 == self.x0:
            self.x1 = self.x0 + 1
        values = [self._fy(y) for y in ys if y is not None and math.isfinite(y) and (y > 0 or not log_y)]
        self.y0, self.y1 = (min(values), max(values)) if values else (0.0, 1.0)
        if log_y:
            self.y0, self.y1 = math.floor(self.y0), math.ceil(self.y1)
        elif zero:
            self.y0 = min(self.y0, 0.0)
        else:  # a margin around the data, so that close curves stay apart
            pad = (self.y1 - self.y0) * 0.08 or abs(self.y1) * 0.01 or 1.0
            self.y0, self.y1 = self.y0 - pad, self.y1 + pad
        if self.y1 == self.y0:
            self.y1 = self.y0 + 1

    def _fy(self, y: float) -> float:
        return math.log10(y) if self.log_y else y

    def x(self, v: float) -> float:
        return _L + (v - self.x0) / (self.x1 - self.x0) * (self.width - _L - _R)

    def y(self, v: float) -> float | None:
        if self.log_y and v <= 0:
            return None
        return self.height - _B - (self._fy(v) - self.y0) / (self.y1 - self.y0) * (self.height - _T - _B)

    def frame(self, x_label: str, y_label: str, y_format: Callable[[float, int], str] = fmt_num) -> list[str]:
        parts = [
            (f'<rect class="plot" x="{_L}" y="{_T}" width="{self.width - _L - _R}" height="{self.height - _T - _B}"/>')
        ]
        powers = range(int(self.y0), min(int(self.y1), sys.float_info.max_10_exp) + 1)
        y_ticks = [10.0**e for e in powers] if self.log_y else _ticks(self.y0, self.y1)
        y_ticks = [t for t in y_ticks if self.y(t) is not None]
        for t, label in zip(y_ticks, distinct_labels(y_ticks, y_format)):
            y = self.y(t)
            assert y is not None
            parts.append(
                f'<line class="grid" x1="{_L}" x2="{self.width - _R}" y1="{y:.1f}" y2="{y:.1f}"/>'
                f'<text class="tick" x="{_L - 6}" y="{y + 4:.1f}" text-anchor="end">'
                f"{_text(label)}</text>"
            )
        for t in _ticks(self.x0, self.x1, 8, integer=all(float(v).is_integer() for v in (self.x0, self.x1))):
            x = self.x(t)
            label = fmt_num(int(t)) if float(t).is_integer() else fmt_num(t)
            parts.append(
                f'<text class="tick" x="{x:.1f}" y="{self.height - _B + 16}" text-anchor="middle">{_text(label)}</text>'
            )
        parts.append(
            f'<text class="axis" x="{(_L + self.width - _R) / 2}" y="{self.height - 4}" '
            f'text-anchor="middle">{_text(x_label)}</text>'
            f'<text class="axis" x="12" y="{(self.height - _B + _T) / 2}" text-anchor="middle" '
            f'transform="rotate(-90 12 {(self.height - _B + _T) / 2})">{_text(y_label)}</text>'
        )
        return parts


def _svg(parts: Iterable[str], label: str, width: int = _W, height: int = _H) -> Markup:
    body = "".join(parts)
    return Markup(
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{_text(label)}" '
        f'xmlns="http://www.w3.org/2000/svg">{body}</svg>'
    )


class _Series(TypedDict):
    name: str
    points: list[tuple[float, float | None]]  # (x, y): a y of None leaves a gap


class Series(_Series, total=False):
    """A line of :func:`line_chart`: its points, marked points with their titles, how it is drawn."""

    marks: list[tuple[float, float | None, str]]
    dashed: bool
    color: str


def line_chart(
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    log_y: bool = False,
    zero: bool = True,
    y_format: Callable[[float, int], str] = fmt_num,
    label: str = "chart",
) -> Markup:
    """Lines (``{"name", "points": [(x, y), ...], "marks": [(x, y, title), ...]}``) on shared axes,
    with a legend; points with y None, NaN or infinite (or ≤ 0 on a log axis) leave a gap."""
    xs = [p[0] for s in series for p in s["points"] if math.isfinite(p[0])]
    ys = [p[1] for s in series for p in s["points"] if p[1] is not None and math.isfinite(p[1])]
    if not xs:
        return Markup('<p class="muted">no data</p>')
    if log_y and not any(y > 0 for y in ys):
        return Markup(f'<p class="muted">{_text(y_label)} is 0 at every step shown.</p>')
    ax = _Axes(xs, ys, log_y, zero)
    parts = ax.frame(x_label, y_label, y_format)
    for i, s in enumerate(series):
        color = s.get("color") or PALETTE[i % len(PALETTE)]
        path, pen = [], "M"
        for x, y in s["points"]:
            py = None if y is None or not math.isfinite(x + y) else ax.y(y)
            if py is None:
                pen = "M"
                continue
            path.append(f"{pen}{ax.x(x):.1f},{py:.1f}")
            pen = "L"
        dash = ' stroke-dasharray="5 3"' if s.get("dashed") else ""
        if len(path) == 1:
            cx, cy = path[0][1:].split(",")
            parts.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>')
        parts.append(
            f'<path d="{"".join(path)}" fill="none" stroke="{color}" stroke-width="1.8"{dash}>'
            f"<title>{_text(s['name'])}</title></path>"
        )
        for mx, my, title in s.get("marks", []):
            py = ax.y(my) if my is not None and math.isfinite(mx + my) else None
            if py is not None:
                parts.append(
                    f'<circle class="mark" cx="{ax.x(mx):.1f}" cy="{py:.1f}" r="4" stroke="{color}">'
                    f"<title>{_text(title)}</title></circle>"
                )
    legend_x = _L + 8
    for i, s in enumerate(series):
        color = s.get("color") or PALETTE[i % len(PALETTE)]
        parts.append(
            f'<rect x="{legend_x}" y="{_T - 20}" width="10" height="10" fill="{color}"/>'
            f'<text class="legend" x="{legend_x + 14}" y="{_T - 11}">{_text(s["name"])}</text>'
        )
        legend_x += 24 + 7 * len(str(s["name"]))
    return _svg(parts, label)


_CACHE_CLASS = {"hit": "hit", "miss": "miss", None: "nocache"}


def compile_timeline(lanes: Sequence[TimelineRow]) -> Markup:
    """One lane per rank group: a bar per compile from its start for its duration, coloured by
    its cache outcome, outlined when it was a recompile; hover for what and why."""
    lanes = [
        {**lane, "compiles": [c for c in lane["compiles"] if math.isfinite(c["start_s"] + c["duration_s"])]}
        for lane in list(lanes)[:MAX_LANES]
    ]  # (a time that is no number has no place on the axis)
    bars = [(c["start_s"], c["start_s"] + c["duration_s"]) for lane in lanes for c in lane["compiles"]]
    if not bars:
        return Markup('<p class="muted">no compiles</p>')
    lane_h, label_w = 26, 150
    height = _T + _B + lane_h * len(lanes)
    span = max(end for _, end in bars) or 1.0

    def x(seconds: float) -> float:
        return label_w + seconds / span * (_W - label_w - _R)

    parts = [f'<rect class="plot" x="{label_w}" y="{_T}" width="{_W - label_w - _R}" height="{lane_h * len(lanes)}"/>']
    for t in _ticks(0.0, span, 8):
        parts.append(
            f'<line class="grid" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{_T}" y2="{height - _B}"/>'
            f'<text class="tick" x="{x(t):.1f}" y="{height - _B + 16}" text-anchor="middle">'
            f"{_text(fmt_num(t))}</text>"
        )
    parts.append(
        f'<text class="axis" x="{(label_w + _W) / 2}" y="{height - 4}" text-anchor="middle">'
        "seconds since the rank started</text>"
    )
    for i, lane in enumerate(lanes):
        y = _T + i * lane_h
        parts.append(
            f'<text class="tick" x="{label_w - 8}" y="{y + lane_h / 2 + 4}" text-anchor="end">'
            f"{_text(ranks_label(lane['ranks_text']))}</text>"
        )
        for c in lane["compiles"]:
            x0, x1 = x(c["start_s"]), x(c["start_s"] + c["duration_s"])
            cls = _CACHE_CLASS.get(c["cache"], "nocache") + (" recompile" if c["recompile"] else "")
            title = (
                f"{c['compile_id']} {c['function']} at step {c['step']}: {fmt_seconds(c['duration_s'])}, "
                f"cache {c['cache'] or 'not looked up'}"
            )
            if c["recompile"]:
                title += f"; recompile: {c['recompile']}"
            parts.append(
                f'<rect class="bar {cls}" x="{x0:.1f}" y="{y + 4}" width="{max(x1 - x0, 2):.1f}" '
                f'height="{lane_h - 8}"><title>{_text(title)}</title></rect>'
            )
    return _svg(parts, "compile timeline", height=height)


def bar_chart(items: Sequence[tuple[str, float]], *, unit: str = "", label: str = "chart") -> Markup:
    """Horizontal bars, one per (name, value), largest scale at the longest bar."""
    items = list(items)[:MAX_ROWS]
    if not items:
        return Markup('<p class="muted">no data</p>')
    row_h, label_w = 22, 220
    height = _T + 10 + row_h * len(items)
    top = max(v for _, v in items) or 1
    parts = []
    for i, (name, value) in enumerate(items):
        y = _T + i * row_h
        w = (value / top) * (_W - label_w - 90)
        parts.append(
            f'<text class="tick" x="{label_w - 8}" y="{y + 15}" text-anchor="end">{_text(name)}</text>'
            f'<rect class="bar neutral" x="{label_w}" y="{y + 3}" width="{max(w, 1):.1f}" height="{row_h - 6}">'
            f"<title>{_text(name)}: {_text(fmt_num(value))}{_text(unit)}</title></rect>"
            f'<text class="tick" x="{label_w + w + 6:.1f}" y="{y + 15}">{_text(fmt_num(value))}'
            f"{_text(unit)}</text>"
        )
    return _svg(parts, label, height=height)


# --- the report's series as chart input (no new figures: only the report's own) -------------


def step_time_chart(lanes: Sequence[TimelineRow]) -> Markup:
    """Host time per step of each rank group's first rank (log scale); steps that compiled marked."""
    series: list[Series] = [
        {
            "name": ranks_label(lane["ranks_text"]),
            "points": [(i, t) for i, t, _ in lane["steps"]],
            "marks": [(i, t, f"step {i}: {fmt_seconds(t)}, {n} compile(s)") for i, t, n in lane["steps"] if n],
        }
        for lane in list(lanes)[: len(PALETTE)]
    ]
    return line_chart(
        series, x_label="step", y_label="step time", log_y=True, y_format=fmt_seconds, label="step time per rank group"
    )


def per_rank_step_times(per_rank: dict[str, dict[str, Any]]) -> list[tuple[str, float]]:
    """(rank, median step time in ms) for the per-rank bar chart."""
    return [
        (f"rank {r}", v["median_step_s"] * 1e3)
        for r, v in sorted(per_rank.items(), key=lambda kv: int(kv[0]))
        if v.get("median_step_s") is not None
    ]


def divergence_chart(curve: Sequence[CurvePoint]) -> Markup:
    """The report's divergence curve: max |Δparam| and max relative difference per step (where
    known: both runs kept the step's parameters), and the L2 norm of the difference (estimated
    from sketches elsewhere)."""
    return line_chart(
        [
            {"name": "max |Δparam|", "points": [(p["step"], p["max_abs"]) for p in curve]},
            {"name": "max relative", "points": [(p["step"], p["max_rel"]) for p in curve], "dashed": True},
            {"name": "‖Δparam‖ (L2)", "points": [(p["step"], p.get("l2")) for p in curve]},
        ],
        x_label="step",
        y_label="difference",
        log_y=True,
        label="divergence curve",
    )


def loss_chart(rows: Sequence[StepRow], labels: Sequence[str]) -> Markup:
    """Both runs' losses per step."""
    names = list(labels) + ["A", "B"]
    return line_chart(
        [
            {"name": names[0], "points": [(r["step"], r["loss_a"]) for r in rows]},
            {"name": names[1], "points": [(r["step"], r["loss_b"]) for r in rows], "dashed": True},
        ],
        x_label="step",
        y_label="loss",
        zero=False,
        label="loss of each run",
    )


def loss_diff_chart(rows: Sequence[StepRow]) -> Markup:
    """|Δloss| per step (log scale; steps with equal losses leave a gap), steps whose parameters
    differ marked."""
    marks: list[tuple[float, float | None, str]] = [
        (r["step"], r["loss_diff"], f"step {r['step']}: parameters differ")
        for r in rows
        if r["same_params"] is False and r["loss_diff"]
    ]
    return line_chart(
        [
            {
                "name": "|Δloss|",
                "points": [(r["step"], r["loss_diff"]) for r in rows],
                "marks": marks,
                "color": PALETTE[4],
            }
        ],
        x_label="step",
        y_label="|Δloss|",
        log_y=True,
        label="loss difference",
    )


def drift_plots(drift: JsonObject) -> list[Markup]:
    """The drift report's strip plots (:func:`torchrepro.render.svg.drift_plots`, which escapes
    every text it draws), inline, from the page's ``drift`` section (read back typed)."""
    from .svg import drift_plots as plots

    return [Markup(svg) for _, svg in plots(DriftSection.from_json(drift))]


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
    env.filters.update(num=fmt_num, seconds=fmt_seconds, value=fmt_value, ranks=ranks_label)
    env.globals.update(
        compile_timeline=compile_timeline,
        bar_chart=bar_chart,
        step_time_chart=step_time_chart,
        per_rank_step_times=per_rank_step_times,
        divergence_chart=divergence_chart,
        loss_chart=loss_chart,
        loss_diff_chart=loss_diff_chart,
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
