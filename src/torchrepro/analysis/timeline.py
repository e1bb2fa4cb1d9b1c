"""When things happened, per group of ranks that behaved alike: each compile (start, duration,
cache hit or miss) and each step's host time. Drawn by the HTML report; bounded in size by the
number of distinct rank behaviours, not by the number of ranks. Nothing here imports torch.
"""

from __future__ import annotations

import statistics
from ..eventlog.event_reader import EventLog
from ..eventlog.events import CacheLookup, Compile
from .categories import guard_text
from .compile import display_function
from .kept_steps import KeptSteps
from ..reports.doctor_report import RankGroup, StepSpread, TimelineCompile, TimelineRow


def _cache_status(statuses: list[str]) -> str | None:
    if not statuses:
        return None
    return "miss" if "miss" in statuses else "hit" if "hit" in statuses else statuses[0]


def _start(log: EventLog, kept: KeptSteps) -> float:
    """When the rank started: its header's time, else its earliest event's (steps included)."""
    if log.header:
        return log.header.t
    return min([e.t for e in log.events] + ([] if kept.first_t is None else [kept.first_t]), default=0.0)


def _compiles(log: EventLog, kept: KeptSteps) -> list[TimelineCompile]:
    start = _start(log, kept)
    lookups: dict[str, list[str]] = {}
    for x in log.of(CacheLookup):
        lookups.setdefault(x.compile_id, []).append(x.status)
    out: list[TimelineCompile] = []
    compiles = log.of(Compile)
    for c in compiles:
        duration = c.dynamo_s or 0.0
        statuses = lookups.get(c.compile_id) or [s for counts in c.cache.values() for s, n in counts.items() if n]
        out.append(
            {
                "compile_id": c.compile_id,
                "function": display_function(c, compiles),
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


def timeline(logs: list[EventLog], groups: list[RankGroup], kept: dict[int, KeptSteps]) -> list[TimelineRow]:
    """One entry per rank group: its representative rank's compiles and step times, and the
    spread over the group's ranks of their median times of the steps that did not compile (with
    the slowest rank)."""
    by_rank = {log.rank: log for log in logs}
    out: list[TimelineRow] = []
    for group in groups:
        log = by_rank[group["representative"]]
        medians_of = [(m, r) for r in group["ranks"] if (m := kept[r].quiet_median_s) is not None]
        spread: StepSpread | None = None
        if medians_of:
            values = sorted(m for m, _ in medians_of)
            slowest = max(medians_of)
            spread = {
                "min_s": round(values[0], 6),
                "median_s": round(statistics.median(values), 6),
                "max_s": round(slowest[0], 6),
                "slowest_rank": slowest[1],
            }
        out.append(
            {
                "ranks_text": group["ranks_text"],
                "rank": group["representative"],
                "compiles": _compiles(log, kept[log.rank]),
                "steps": kept[log.rank].series,
                "median_step": spread,
            }
        )
    return out
