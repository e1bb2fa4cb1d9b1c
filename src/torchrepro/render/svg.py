"""Strip plots as self-contained SVG files, written by hand: every text made visible and escaped,
no scripts, no external references."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from xml.sax.saxutils import escape

from ..eventlog.rundir import write_text
from ..eventlog.payloads import JsonObject
from ..reports.drift_report import DriftRunResult, DriftSection, Summary
from .sanitize import visible

_WIDTH_PER_GROUP, _HEIGHT, _LEFT, _RIGHT, _TOP, _BOTTOM = 80, 300, 72, 16, 44, 58


def _text(value: object) -> str:
    """Visible (:func:`~torchrepro.render.sanitize.visible`: no control or bidirectional-override
    character, nothing XML 1.0 forbids), escaped XML text."""
    return escape(visible(value))


def _tick(x: float) -> str:
    return f"{x:.4g}"


Group = tuple[str, list[float], Summary]  # label, the runs' values, their summary (mean, ci95)


def strip_plot(title: str, ylabel: str, groups: Sequence[Group], subtitle: str = "") -> str:
    """One column of points per group (deterministic jitter), its mean as a bar and the 95 % interval
    of the mean as a whisker, both taken from the group's summary (nothing is computed here)."""
    width = _LEFT + _RIGHT + _WIDTH_PER_GROUP * max(len(groups), 3)
    values = [v for _, vs, _ in groups for v in vs]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    for _, _, s in groups:
        ci = s.get("ci95")
        if ci:
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
            jitter = ((k * 0.6180339887) % 1 - 0.5) * band * 0.45
            out.append(f'<circle cx="{cx + jitter:.1f}" cy="{y(v):.1f}" r="3" fill="#1f77b4" fill-opacity="0.6"/>')
        if ci := s.get("ci95"):
            out.append(
                f'<line x1="{cx:.1f}" y1="{y(ci[0]):.1f}" x2="{cx:.1f}" y2="{y(ci[1]):.1f}" '
                'stroke="#d62728" stroke-width="2"/>'
            )
        if (mean := s.get("mean")) is not None:
            out.append(
                f'<line x1="{cx - band * 0.3:.1f}" y1="{y(mean):.1f}" x2="{cx + band * 0.3:.1f}" '
                f'y2="{y(mean):.1f}" stroke="#d62728" stroke-width="2"/>'
            )
        out.append(
            f'<text x="{cx:.1f}" y="{_TOP + plot_h + 16}" text-anchor="middle">{_text(label)}</text>'
            f'<text x="{cx:.1f}" y="{_TOP + plot_h + 30}" text-anchor="middle" fill="#555">n={len(vs)}</text>'
        )
    out.append(f'<text x="{_LEFT}" y="{_HEIGHT - 8}" fill="#555">points: runs · red: mean and 95 % CI</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


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
        sub = f"variance share {100 * share:.0f} %" if share is not None else "not separable (see not_separable)"
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
                f"paired over {len(common)} seeds, p = {p:.2g}" if p is not None else "no complete pairs",
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
