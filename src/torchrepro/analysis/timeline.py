"""When things happened, per group of ranks that behaved alike: each compile (start, duration,
cache hit or miss) and each step's host time. Drawn by the HTML report; bounded in size by the
number of distinct rank behaviours, not by the number of ranks. Nothing here imports torch.
"""

from __future__ import annotations

import statistics
from typing import Any

from ..events import CacheLookup, Compile, EventLog, Step
from .categories import guard_text
from .compile import display_function

MAX_POINTS = 400  # per series: longer runs are thinned evenly, steps that compiled are always kept


def _cache_status(statuses: list[str]) -> str | None:
    if not statuses:
        return None
    return "miss" if "miss" in statuses else "hit" if "hit" in statuses else statuses[0]


def _compiles(log: EventLog) -> list[dict[str, Any]]:
    start = log.header.t if log.header else min((e.t for e in log.events), default=0.0)
    lookups: dict[str, list[str]] = {}
    for x in log.of(CacheLookup):
        lookups.setdefault(x.compile_id, []).append(x.status)
    out = []
    for c in log.of(Compile):
        duration = c.dynamo_s or 0.0
        statuses = lookups.get(c.compile_id) or [s for counts in c.cache.values() for s, n in counts.items() if n]
        out.append(
            {
                "compile_id": c.compile_id,
                "function": display_function(c),
                "step": c.step,
                "start_s": round(max(0.0, c.t - start - duration), 4),
                "duration_s": round(duration, 4),
                "backward_s": c.backward_s,
                "cache": _cache_status(statuses),
                "recompile": guard_text(c.recompile_reasons[0]) if c.recompile_reasons else None,
                "limit_hit": c.limit_hit,
                "failed": c.fail_type,
            }
        )
    return out


def _thin(steps: list[Step]) -> list[Step]:
    if len(steps) <= MAX_POINTS:
        return steps
    stride = len(steps) / MAX_POINTS
    keep = {int(i * stride) for i in range(MAX_POINTS)} | {i for i, s in enumerate(steps) if s.compiles}
    return [s for i, s in enumerate(steps) if i in keep]


def quiet_step_times(steps: list[Step]) -> list[float]:
    """The host times of the steps that did not compile (that have one)."""
    return [s.time_s for s in steps if not s.compiles and s.time_s is not None]


def median_steps(logs: list[EventLog]) -> dict[int, float | None]:
    """Each rank's median host time of the steps that did not compile (None without one): one
    pass per rank, shared by the steps summary and the timeline (10 000 steps x 1024 ranks)."""
    medians = {}
    for log in logs:
        times = quiet_step_times(log.of(Step))
        medians[log.rank] = statistics.median(times) if times else None
    return medians


def timeline(
    logs: list[EventLog], groups: list[dict[str, Any]], medians: dict[int, float | None]
) -> list[dict[str, Any]]:
    """One entry per rank group: its representative rank's compiles and step times, and the
    spread of median step times (``medians``: :func:`median_steps`) over the group's ranks (with
    the slowest rank)."""
    by_rank = {log.rank: log for log in logs}
    out = []
    for group in groups:
        log = by_rank[group["representative"]]
        medians_of = [(m, r) for r in group["ranks"] if (m := medians[r]) is not None]
        spread = None
        if medians_of:
            values = sorted(m for m, _ in medians_of)
            slowest = max(medians_of)
            spread = {
                "min_s": round(values[0], 6),
                "median_s": round(statistics.median(values), 6),
                "max_s": round(slowest[0], 6),
                "slowest_rank": slowest[1],
            }
        steps = [s for s in log.of(Step) if s.time_s is not None]
        out.append(
            {
                "ranks_text": group["ranks_text"],
                "rank": group["representative"],
                "compiles": _compiles(log),
                "steps": [[s.index, round(s.time_s, 6), s.compiles] for s in _thin(steps)],
                "median_step": spread,
            }
        )
    return out
