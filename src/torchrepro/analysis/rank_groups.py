"""Ranks that behaved alike, as groups: a report of 1024 ranks shows as many entries as there are
distinct behaviours ("ranks 0–1021 agree; rank 1022 recompiled forward at step 5: ...").

A rank's behaviour is what it compiled (function, guard, category, step, limit hit), where its
graphs broke, how its cache lookups went and how it ended; timings are not part of it.
Nothing here imports torch.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from ..eventlog.event_reader import EventLog
from ..eventlog.events import CacheLookup, Compile, GraphBreak
from ..reports.doctor_report import (
    GraphBreakEvent,
    GraphBreakGroup,
    RankGroup,
    RankGroups,
    RecompileEvent,
    RecompileGroup,
)
from .categories import category_of, guard_text
from .compile import display_function
from .kept_steps import KeptSteps


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0–2, 5, 7–8"``.

    >>> rank_ranges([0, 1, 2, 5])
    '0–2, 5'
    """
    parts: list[str] = []
    ordered = sorted(ranks)
    start = prev = ordered[0] if ordered else 0
    for rank in ordered[1:] + [None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        parts.append(str(start) if start == prev else f"{start}–{prev}")
        if rank is not None:
            start = prev = rank
    return ", ".join(parts) if ordered else ""


def ranks_label(ranks: list[int] | str) -> str:
    """``"rank 3"`` for one rank, ``"ranks 0–2, 5"`` for several (a list, or :func:`rank_ranges` text).

    >>> ranks_label([0]), ranks_label([0, 1, 2, 5]), ranks_label("4–7")
    ('rank 0', 'ranks 0–2, 5', 'ranks 4–7')
    """
    text = ranks if isinstance(ranks, str) else rank_ranges(ranks)
    return ("rank " if text.isdigit() else "ranks ") + text


# what a rank compiled: function, guard, category, step, limit hit
_CompileKey = tuple[str, str | None, str | None, int | None, str | None]
# how it ended, steps, what it compiled, its graph breaks and cache lookups (with their counts)
_Behaviour = tuple[
    str,
    int,
    tuple[_CompileKey, ...],
    tuple[tuple[tuple[str | None, int | None, str], int], ...],
    tuple[tuple[tuple[str, str], int], ...],
]


def _compile_key(c: Compile, compiles: list[Compile]) -> _CompileKey:
    guard = guard_text(c.recompile_reasons[0]) if c.recompile_reasons else None
    return (display_function(c, compiles), guard, category_of(c), c.step, c.limit_hit)


def _behaviour(log: EventLog, steps: int) -> _Behaviour:
    end = log.end
    breaks = Counter((b.file, b.line, b.reason) for b in log.of(GraphBreak))
    cache = Counter((x.cache, x.status) for x in log.of(CacheLookup))
    compiles = log.of(Compile)
    return (
        end.status if end else "incomplete",
        steps,
        tuple(_compile_key(c, compiles) for c in compiles),
        tuple(sorted(breaks.items(), key=repr)),
        tuple(sorted(cache.items())),
    )


def _difference(odd: _Behaviour, ref: _Behaviour) -> str:
    """What a group did that the largest group did not, in one line."""
    status, steps, compiles, breaks, cache = odd
    for i in range(max(len(compiles), len(ref[2]))):
        mine = compiles[i] if i < len(compiles) else None
        theirs = ref[2][i] if i < len(ref[2]) else None
        if mine == theirs:
            continue
        if mine is None:
            assert theirs is not None  # the two differ, and only one may be missing
            return f"did not compile {theirs[0]} (the others did at step {theirs[3]})"
        function, guard, _category, step, limit = mine
        what = "hit the recompile limit for" if limit else "recompiled" if guard else "compiled"
        return f"{what} {function} at step {step}" + (f": {guard}" if guard else "")
    if status != ref[0]:
        return f"ended {status} after {steps} step(s)"
    if breaks != ref[3]:
        return f"broke graphs elsewhere ({sum(n for _, n in breaks)} graph break(s) vs {sum(n for _, n in ref[3])})"
    if cache != ref[4]:
        return "cache: " + ", ".join(f"{name} {status} {n}" for (name, status), n in cache) or "no cache lookups"
    return f"ran {steps} step(s) (the others {ref[1]})"


def rank_groups(logs: list[EventLog], kept: dict[int, KeptSteps]) -> RankGroups:
    """The ``rank_groups`` section: ``groups`` (largest first: ranks, their ranges as text, a
    representative rank, and what differs from the largest group) and a one-line ``summary``."""
    by_behaviour: dict[_Behaviour, list[int]] = {}
    for log in logs:
        by_behaviour.setdefault(_behaviour(log, kept[log.rank].count), []).append(log.rank)
    ordered = sorted(by_behaviour.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    if not ordered:
        return {"groups": [], "summary": "no ranks"}
    reference = ordered[0][0]
    groups: list[RankGroup] = []
    for behaviour, ranks in ordered:
        ranks.sort()
        groups.append(
            {
                "ranks": ranks,
                "ranks_text": rank_ranges(ranks),
                "representative": ranks[0],
                "size": len(ranks),
                "difference": None if behaviour is reference else _difference(behaviour, reference),
            }
        )
    return {"groups": groups, "summary": _summary(groups)}


def _summary(groups: list[RankGroup]) -> str:
    def name(group: RankGroup) -> str:
        return f"rank{'s' if group['size'] > 1 else ''} {group['ranks_text']}"

    first = groups[0]
    if len(groups) == 1:
        return "one rank" if first["size"] == 1 else f"all {first['size']} ranks agree ({first['ranks_text']})"
    head = f"{name(first)} {'agree' if first['size'] > 1 else 'is the reference'}"
    return "; ".join([head] + [f"{name(g)} {g['difference']}" for g in groups[1:]])


def recompile_groups(events: list[RecompileEvent]) -> list[RecompileGroup]:
    """The report's ``recompile_events`` merged over ranks: one row per function, category and
    guard, with its count, steps, compile ids and the ranks (as ranges), most frequent first."""
    rows: dict[tuple[str, str | None, str], RecompileGroup] = {}
    ranks: dict[tuple[str, str | None, str], set[int]] = defaultdict(set)
    for e in events:
        key = (e["function"], e["category"], e["guard"])
        row = rows.setdefault(
            key,
            {
                "function": e["function"],
                "category": e["category"],
                "guard": e["guard"],
                "location": f"{e['file']}:{e['line']}" if e.get("file") else None,
                "count": 0,
                "ranks": 0,
                "steps": [],
                "compile_ids": [],
                "ranks_text": "",
            },
        )
        row["count"] += 1
        ranks[key].add(e["rank"])
        if e["step"] not in row["steps"] and len(row["steps"]) < 20:
            row["steps"].append(e["step"])
        if e["compile_id"] not in row["compile_ids"] and len(row["compile_ids"]) < 10:
            row["compile_ids"].append(e["compile_id"])
    for key, row in rows.items():
        row["ranks"], row["ranks_text"] = len(ranks[key]), rank_ranges(list(ranks[key]))
    return sorted(rows.values(), key=lambda r: -r["count"])


def graph_break_groups(events: list[GraphBreakEvent]) -> list[GraphBreakGroup]:
    """The report's ``graph_break_events`` (one per rank and location) merged over ranks: one row
    per source line and reason, with the line of code, most frequent first."""
    rows: dict[tuple[str | None, int | None, str, str | None], GraphBreakGroup] = {}
    ranks: dict[tuple[str | None, int | None, str, str | None], set[int]] = defaultdict(set)
    for e in events:
        key = (e["file"], e["line"], e["reason"], e["gb_id"])
        row = rows.setdefault(
            key,
            {
                "file": e["file"],
                "line": e["line"],
                "reason": e["reason"],
                "gb_id": e["gb_id"],
                "source": e["source"],
                "hint": e["hint"],
                "first_step": e["first_step"],
                "count": 0,
                "ranks": 0,
                "ranks_text": "",
            },
        )
        row["count"] += e["count"]
        ranks[key].add(e["rank"])
        row["first_step"] = min((s for s in (row["first_step"], e["first_step"]) if s is not None), default=None)
    for key, row in rows.items():
        row["ranks"], row["ranks_text"] = len(ranks[key]), rank_ranges(list(ranks[key]))
    return sorted(rows.values(), key=lambda r: -r["count"])
