"""Every chart of the reports, as hand-written SVG drawn here, on the server: inline in the HTML
page (:mod:`torchrepro.render.html`) or written as files (a drift experiment's strip plots). No
script, no external reference; every text made visible (:func:`~torchrepro.render.sanitize.visible`:
no control or bidirectional-override character, nothing XML 1.0 forbids) and escaped.

Nothing is computed here but where things are drawn: the figures are the report's own. A value
that is not finite (a NaN or infinite loss, gradient norm or time) is never placed on an axis: its
line has a gap there, and the first such point of each line is marked at the top of the plot and
named in words (``nan from step 2``), so that a curve that stops says why.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypedDict, TypeGuard

from jinja2 import ChainableUndefined
from markupsafe import Markup, escape

from ..analysis.rank_groups import ranks_label
from ..eventlog.payloads import JsonObject
from ..eventlog.rundir import write_text
from ..reports.check_report import CurvePoint, StepRow
from ..reports.doctor_report import TimelineRow
from ..reports.drift_report import DriftRunResult, DriftSection, Summary
from .sanitize import visible

MAX_ROWS = 40  # bars of a bar chart
MAX_LANES = 24  # lanes of the compile timeline

# --- text and numbers -------------------------------------------------------------------------


def _text(value: object) -> Markup:
    """Escaped, visible text (on one line) for SVG built here."""
    return escape(visible(value))


def finite(value: object) -> TypeGuard[float]:
    """Whether ``value`` is a number a chart can place (not None, not NaN, not infinite)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fmt_num(value: Any, digits: int = 3) -> str:
    """A number for people: 3 significant digits, exponent for tiny or huge values; ``nan`` and
    ``inf`` as they are; an absent value as a dash.

    >>> fmt_num(0.000012345), fmt_num(1234567), fmt_num(float("nan")), fmt_num(None)
    ('1.23e-05', '1,234,567', 'nan', '—')
    """
    if value is None or isinstance(value, ChainableUndefined):
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) < 1e-3 or abs(value) >= 1e6:
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}g}"


def fmt_seconds(value: Any, digits: int = 3) -> str:
    """Seconds as ``1.23 s`` or ``4.5 ms``; ``nan`` and ``inf`` as they are, an absent value a dash."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "—"
    if not math.isfinite(value):
        return str(value)
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


# --- axes and line charts --------------------------------------------------------------------

PALETTE = ("#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04", "#db2777")
_W, _H, _L, _R, _T, _B = 760, 250, 64, 16, 26, 36  # size and margins (left, right, top, bottom)


def _ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
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
    """Linear x, linear or log10 y, mapped into the plot area; only finite values (and, on a log
    axis, positive ones) set the range."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float], log_y: bool, zero: bool = True):
        self.log_y, self.width, self.height = log_y, _W, _H
        xs = [x for x in xs if finite(x)]
        self.x0, self.x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
        if self.x1 == self.x0:
            self.x1 = self.x0 + 1
        values = [self._fy(y) for y in ys if finite(y) and (y > 0 or not log_y)]
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

    def y(self, v: float | None) -> float | None:
        """Where ``v`` is drawn; None where it cannot be (absent, not finite, ≤ 0 on a log axis)."""
        if not finite(v) or (self.log_y and v <= 0):
            return None
        return self.height - _B - (self._fy(v) - self.y0) / (self.y1 - self.y0) * (self.height - _T - _B)

    @property
    def bottom(self) -> float:
        return float(self.height - _B)

    def frame(self, x_label: str, y_label: str, y_format: Callable[[float, int], str] = fmt_num) -> list[str]:
        parts = [
            (f'<rect class="plot" x="{_L}" y="{_T}" width="{self.width - _L - _R}" height="{self.height - _T - _B}"/>')
        ]
        y_ticks = [10.0**e for e in range(int(self.y0), int(self.y1) + 1)] if self.log_y else _ticks(self.y0, self.y1)
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
    points: list[tuple[float, float | None]]  # (x, y): a y of None or not finite leaves a gap


class Series(_Series, total=False):
    """A line of :func:`line_chart`: its points, marked points with their titles (``label``: the
    title also written beside the mark), how it is drawn."""

    marks: list[tuple[float, float | None, str]]
    label: str  # a mark's title written beside the first mark
    dashed: bool
    color: str


class Area(TypedDict):
    """A shaded band of :func:`line_chart`: per x, its lower and upper edge (a lower edge of None:
    the bottom of the plot)."""

    name: str
    points: list[tuple[float, float | None, float | None]]
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
    areas: Sequence[Area] = (),
) -> Markup:
    """Lines (``{"name", "points": [(x, y), ...], "marks": [(x, y, title), ...]}``) over shaded
    ``areas``, on shared axes, with a legend; points with y None, not finite or (on a log axis)
    ≤ 0 leave a gap, and the first point of a line that is not finite is marked at the top of the
    plot, in words."""
    xs = [p[0] for s in series for p in s["points"]] + [p[0] for a in areas for p in a["points"]]
    ys = [p[1] for s in series for p in s["points"] if p[1] is not None]
    ys += [y for a in areas for p in a["points"] for y in p[1:] if y is not None]
    if not xs:
        return Markup('<p class="muted">no data</p>')
    placeable = [y for y in ys if finite(y) and (y > 0 or not log_y)]
    if log_y and not placeable and all(finite(y) for y in ys):
        return Markup(f'<p class="muted">{_text(y_label)} is 0 at every step shown.</p>')
    ax = _Axes(xs, placeable, log_y, zero)
    parts = ax.frame(x_label, y_label, y_format)
    for area in areas:
        parts.append(_area(ax, area))
    for i, s in enumerate(series):
        color = s.get("color") or PALETTE[i % len(PALETTE)]
        parts += _line(ax, s, color, x_label)
    legend = [(a["name"], a["color"], ' fill-opacity="0.25"') for a in areas]
    legend += [(s["name"], s.get("color") or PALETTE[i % len(PALETTE)], "") for i, s in enumerate(series)]
    legend_x = _L + 8
    for name, color, opacity in legend:
        parts.append(
            f'<rect x="{legend_x}" y="{_T - 20}" width="10" height="10" fill="{color}"{opacity}/>'
            f'<text class="legend" x="{legend_x + 14}" y="{_T - 11}">{_text(name)}</text>'
        )
        legend_x += 24 + 7 * len(str(name))
    return _svg(parts, label)


def _line(ax: _Axes, s: Series, color: str, x_label: str) -> list[str]:
    parts, path, pen = [], [], "M"
    for x, y in s["points"]:
        py = ax.y(y)
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
    marks = s.get("marks", [])
    for k, (mx, my, title) in enumerate(marks):
        py = ax.y(my)
        if py is not None:
            parts.append(
                f'<circle class="mark" cx="{ax.x(mx):.1f}" cy="{py:.1f}" r="4" stroke="{color}">'
                f"<title>{_text(title)}</title></circle>"
            )
            if k == 0 and s.get("label"):
                below = py < _T + 24  # near the top edge: under the mark, clear of the legend
                parts.append(
                    f'<text class="legend mark-label" x="{ax.x(mx) + 7:.1f}" y="{py + 18 if below else py - 7:.1f}">'
                    f"{_text(s['label'])}</text>"
                )
    bad = next(((x, y) for x, y in s["points"] if y is not None and not finite(y)), None)
    if bad is not None:
        x = ax.x(bad[0])
        text = f"{s['name']}: {fmt_num(bad[1])} from {x_label} {fmt_num(bad[0])}"
        parts.append(
            f'<path class="nonfinite" d="M{x - 5:.1f},{_T + 2} L{x + 5:.1f},{_T + 2} L{x:.1f},{_T + 10} Z" '
            f'fill="{color}"><title>{_text(text)}</title></path>'
            f'<text class="legend nonfinite" x="{x + 8:.1f}" y="{_T + 12}" '
            f'text-anchor="{"end" if x > _W / 2 else "start"}" fill="{color}">{_text(text)}</text>'
        )
    return parts


def _area(ax: _Axes, area: Area) -> str:
    """The band between each x's lower and upper edge, in runs of x where both can be drawn."""
    runs: list[list[tuple[float, float, float]]] = [[]]
    for x, lo, hi in area["points"]:
        top, low = ax.y(hi), ax.bottom if lo is None else ax.y(lo)
        if top is None or low is None:
            runs.append([])
            continue
        runs[-1].append((ax.x(x), low, top))
    out = []
    for run in runs:
        if not run:
            continue
        if len(run) == 1:  # one step: a band one pixel either side
            x, low, top = run[0]
            run = [(x - 1, low, top), (x + 1, low, top)]
        edge = [f"{x:.1f},{top:.1f}" for x, _, top in run] + [f"{x:.1f},{low:.1f}" for x, low, _ in reversed(run)]
        out.append(
            f'<polygon class="band" points="{" ".join(edge)}" fill="{area["color"]}" fill-opacity="0.25" '
            f'stroke="none"><title>{_text(area["name"])}</title></polygon>'
        )
    return "".join(out)


# --- timelines and bars ------------------------------------------------------------------------

_CACHE_CLASS = {"hit": "hit", "miss": "miss", None: "nocache"}


def compile_timeline(lanes: Sequence[TimelineRow]) -> Markup:
    """One lane per rank group: a bar per compile from its start for its duration, coloured by
    its cache outcome, outlined when it was a recompile; hover for what and why."""
    lanes = list(lanes)[:MAX_LANES]
    bars = [(c["start_s"], c["start_s"] + c["duration_s"]) for lane in lanes for c in lane["compiles"]]
    bars = [(start, end) for start, end in bars if finite(start) and finite(end)]
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
            title = (
                f"{c['compile_id']} {c['function']} at step {fmt_num(c['step'])}: {fmt_seconds(c['duration_s'])}, "
                f"cache {c['cache'] or 'not looked up'}"
            )
            if c["recompile"]:
                title += f"; recompile: {c['recompile']}"
            cls = _CACHE_CLASS.get(c["cache"], "nocache") + (" recompile" if c["recompile"] else "")
            if finite(c["start_s"]) and finite(c["duration_s"]):
                x0, x1 = x(c["start_s"]), x(c["start_s"] + c["duration_s"])
            else:  # a compile whose time was not a number: a sliver at the start, still counted and named
                x0, x1 = label_w, label_w + 2
            parts.append(
                f'<rect class="bar {cls}" x="{x0:.1f}" y="{y + 4}" width="{max(x1 - x0, 2):.1f}" '
                f'height="{lane_h - 8}"><title>{_text(title)}</title></rect>'
            )
    return _svg(parts, "compile timeline", height=height)


def bar_chart(items: Sequence[tuple[str | None, float]], *, unit: str = "", label: str = "chart") -> Markup:
    """Horizontal bars, one per (name, value), largest scale at the longest bar; a value that is
    not a finite number has no bar and says what it is."""
    items = list(items)[:MAX_ROWS]
    if not items:
        return Markup('<p class="muted">no data</p>')
    row_h, label_w = 22, 220
    height = _T + 10 + row_h * len(items)
    top = max((v for _, v in items if finite(v)), default=0) or 1
    parts = []
    for i, (name, value) in enumerate(items):
        y = _T + i * row_h
        w = (value / top) * (_W - label_w - 90) if finite(value) else 0.0
        name = "other" if name is None else name  # a recompile whose guard fits no category
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


def per_rank_step_times(per_rank: dict[str, dict[str, Any]]) -> list[tuple[str | None, float]]:
    """(rank, median step time in ms) for the per-rank bar chart."""
    return [
        (f"rank {r}", v["median_step_s"] * 1e3)
        for r, v in sorted(per_rank.items(), key=lambda kv: int(kv[0]))
        if v.get("median_step_s") is not None
    ]


def loss_curves(losses: dict[str, list[list[float]]]) -> Markup:
    """A doctor report's loss curves (``steps.losses``): one line per rank it kept, by step."""
    series: list[Series] = [
        {"name": f"rank {rank}", "points": [(step, loss) for step, loss in points]}
        for rank, points in sorted(losses.items(), key=lambda kv: int(kv[0]))[: len(PALETTE)]
    ]
    return line_chart(series, x_label="step", y_label="loss", zero=False, label="loss per rank")


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


def _line_of(name: str, rows: Sequence[JsonObject], key: str, color: str, dashed: bool = False) -> Series:
    """The line of ``rows``' ``key`` by step."""
    line: Series = {"name": name, "points": [(r["step"], r.get(key)) for r in rows], "color": color}
    if dashed:
        line["dashed"] = True
    return line


def _b_line(name: str, rows: Sequence[JsonObject], key: str) -> Series:
    """B's line: each step the report judged out of A's band marked, the first one named beside it."""
    line = _line_of(name, rows, key, PALETTE[4])
    out = [r for r in rows if r.get("status") == "out"]
    line["marks"] = [
        (r["step"], r.get(key), f"{'first step out' if i == 0 else 'out'} of A's band: step {r['step']}")
        for i, r in enumerate(out)
    ]
    if out:
        line["label"] = line["marks"][0][2]
    return line


def band_loss_chart(series: Sequence[JsonObject]) -> Markup:
    """``compare``: the loss of A's two runs as a band (the area between them), B's as a line; the
    steps where B leaves the band (as the report judged each step) marked, the first one named."""
    rows = [r for r in series if "loss_a" in r]
    band: Area = {
        "name": "A's band",
        "points": [(r["step"], *_edges(r["loss_a"], r.get("loss_a2"))) for r in rows],
        "color": PALETTE[0],
    }
    lines = [
        _line_of("A run 1", rows, "loss_a", PALETTE[0]),
        _line_of("A run 2", rows, "loss_a2", PALETTE[0], dashed=True),
        _b_line("B", rows, "loss_b"),
    ]
    return line_chart(lines, areas=[band], x_label="step", y_label="loss", zero=False, label="loss: B and A's band")


def band_distance_chart(series: Sequence[JsonObject]) -> Markup:
    """``compare``: per step, how far B is from A (relative, log scale) against what the report
    allows there (shaded up to it), with A's own run-to-run distance dashed; steps out marked."""
    rows = [r for r in series if "loss_a" in r]
    allowed: Area = {
        "name": "allowed",
        "points": [(r["step"], None, r.get("allowed_rel")) for r in rows],
        "color": PALETTE[2],
    }
    lines = [
        _line_of("A run 2 − A run 1", rows, "loss_band_rel", PALETTE[0], dashed=True),
        _b_line("B − A", rows, "loss_diff_rel"),
    ]
    return line_chart(
        lines,
        areas=[allowed],
        x_label="step",
        y_label="|Δloss| (relative)",
        log_y=True,
        label="B's distance from A against the band",
    )


def _edges(a: float | None, b: float | None) -> tuple[float | None, float | None]:
    """The lower and upper of two values (one of them where the other is not a number)."""
    values = [v for v in (a, b) if v is not None and finite(v)]
    return (min(values), max(values)) if values else (None, None)


# --- strip plots: a drift experiment ---------------------------------------------------------

_WIDTH_PER_GROUP, _HEIGHT, _LEFT, _RIGHT, _TOP, _BOTTOM = 80, 300, 72, 16, 44, 58

Group = tuple[str, list[float], Summary]  # label, the runs' values, their summary (mean, ci95)


def strip_plot(title: str, ylabel: str, groups: Sequence[Group], subtitle: str = "") -> str:
    """One column of points per group (deterministic jitter), its mean as a bar and the 95 % interval
    of the mean as a whisker, both taken from the group's summary (nothing is computed here). A
    run whose value is not finite is left out of the column (its count says so)."""
    width = _LEFT + _RIGHT + _WIDTH_PER_GROUP * max(len(groups), 3)
    values = [v for _, vs, _ in groups for v in vs if finite(v)]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    for _, _, s in groups:
        ci = s.get("ci95")
        if ci and finite(ci[0]) and finite(ci[1]):
            lo, hi = min(lo, ci[0]), max(hi, ci[1])
    pad = (hi - lo) * 0.08 or max(abs(hi) * 0.01, 1e-9)
    lo, hi = lo - pad, hi + pad
    plot_h = _HEIGHT - _TOP - _BOTTOM
    band = (width - _LEFT - _RIGHT) / max(len(groups), 1)

    def y(v: float) -> float:
        return _TOP + plot_h * (hi - v) / (hi - lo)

    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{_HEIGHT}" '
            f'viewBox="0 0 {width} {_HEIGHT}" font-family="sans-serif" font-size="11">'
        ),
        f'<rect width="{width}" height="{_HEIGHT}" fill="white"/>',
        f'<text x="{_LEFT}" y="16" font-size="13" font-weight="bold">{_text(title)}</text>',
        f'<text x="{_LEFT}" y="32" fill="#555">{_text(subtitle)}</text>',
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + plot_h}" stroke="#333"/>',
        (
            f'<text transform="translate(14 {_TOP + plot_h / 2:.1f}) rotate(-90)" text-anchor="middle">'
            f"{_text(ylabel)}</text>"
        ),
    ]
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        out.append(
            f'<line x1="{_LEFT - 4}" y1="{y(v):.1f}" x2="{width - _RIGHT}" y2="{y(v):.1f}" stroke="#eee"/>'
            f'<text x="{_LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{_tick(v)}</text>'
        )
    for g, (label, vs, s) in enumerate(groups):
        cx = _LEFT + band * (g + 0.5)
        for k, v in enumerate(vs):
            if not finite(v):
                continue
            jitter = ((k * 0.6180339887) % 1 - 0.5) * band * 0.45
            out.append(f'<circle cx="{cx + jitter:.1f}" cy="{y(v):.1f}" r="3" fill="#1f77b4" fill-opacity="0.6"/>')
        ci = s.get("ci95")
        if ci and finite(ci[0]) and finite(ci[1]):
            out.append(
                f'<line x1="{cx:.1f}" y1="{y(ci[0]):.1f}" x2="{cx:.1f}" y2="{y(ci[1]):.1f}" '
                'stroke="#d62728" stroke-width="2"/>'
            )
        if finite(mean := s.get("mean")):
            assert mean is not None
            out.append(
                f'<line x1="{cx - band * 0.3:.1f}" y1="{y(mean):.1f}" x2="{cx + band * 0.3:.1f}" '
                f'y2="{y(mean):.1f}" stroke="#d62728" stroke-width="2"/>'
            )
        missing = sum(1 for v in vs if not finite(v))
        out.append(
            f'<text x="{cx:.1f}" y="{_TOP + plot_h + 16}" text-anchor="middle">{_text(label)}</text>'
            f'<text x="{cx:.1f}" y="{_TOP + plot_h + 30}" text-anchor="middle" fill="#555">n={len(vs)}'
            + (f", {missing} not finite" if missing else "")
            + "</text>"
        )
    out.append(f'<text x="{_LEFT}" y="{_HEIGHT - 8}" fill="#555">points: runs · red: mean and 95 % CI</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _tick(x: float) -> str:
    return f"{x:.4g}"


def drift_plots(drift: DriftSection) -> list[tuple[str, str]]:
    """``(plot-<factor>.svg, SVG text)`` per factor, drawn from the report's own ``drift`` section:
    random factors by seed level over the runs of the script as written, binary factors by level
    over the paired seeds; means and intervals are the report's ``per_level`` summaries."""
    from ..analysis.drift import BINARY_FACTORS

    metric = drift.metric.name
    ok = [_levels(r, r.metric) for r in drift.runs if r.status == "ok" and r.metric is not None]
    plots = []
    for comp in drift.factors:
        if "per_level" not in comp:  # the interaction/residual component has no levels
            continue
        name = comp["name"]
        base = [(m, seeds[name]) for m, seeds, _, settings in ok if not settings]
        groups = [(f"{name} {s['level']}", [m for m, lvl in base if lvl == s["level"]], s) for s in comp["per_level"]]
        share = comp["variance_share"]
        sub = f"variance share {100 * share:.0f} %" if finite(share) else "not separable (see not_separable)"
        plots.append(_plot(name, metric, groups, sub))
    for effect in drift.effects:
        name = effect.factor
        sides = [{key: m for m, _, key, settings in ok if settings == s} for s in BINARY_FACTORS[name].settings]
        common = sides[0].keys() & sides[1].keys()
        groups = [(str(s["level"]), [side[k] for k in sorted(common)], s) for s, side in zip(effect.per_level, sides)]
        p = effect.p_value
        plots.append(
            _plot(
                name,
                metric,
                groups,
                f"paired over {len(common)} seeds, p = {p:.2g}" if finite(p) else "no complete pairs",
            )
        )
    return plots


def _levels(
    run: DriftRunResult, metric: float
) -> tuple[float, dict[str, int], tuple[tuple[str, int], ...], JsonObject]:
    """A report's run with its ``metric`` as (metric, its seed levels, the same as a hashable key, its settings)."""
    seeds = {k: v for k, v in run.seed.items() if k != "root"}
    settings = {k: v for k, v in run.levels.items() if k not in seeds}
    return metric, seeds, tuple(sorted(seeds.items())), settings


def write_drift_plots(run_dir: Path, drift: DriftSection) -> list[str]:
    """Write :func:`drift_plots` into ``run_dir``; returns the file names."""
    for file, svg in (plots := drift_plots(drift)):
        write_text(run_dir / file, svg)
    return [file for file, _ in plots]


def _plot(name: str, metric: str, groups: Sequence[Group], subtitle: str) -> tuple[str, str]:
    file = f"plot-{re.sub(r'[^A-Za-z0-9_-]', '_', name)}.svg"
    return file, strip_plot(f"{metric} by {name}", metric, groups, subtitle)
