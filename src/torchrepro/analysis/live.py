"""The state of a run while it is written: events in (as they arrive), a snapshot out.

:class:`LiveRun` accumulates each rank's events in bounded memory (step counts and a window of
recent step times; compile, graph-break and cache events, which are few); :func:`snapshot` turns
it into the view ``torchrepro watch`` shows and ``--once --json`` prints: the run's state (being
written by a torchrepro process, running, finished or interrupted), each rank's and what is damaged
in its log (a rank of an ended run without its end record is said to have none, never ``ok``).
Pure: no files (the caller reads them: :class:`torchrepro.eventlog.tail.RunFollower`), no clock
(the caller passes ``now``), no torch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ..eventlog.event_reader import EventLog
from ..eventlog.events import CacheLookup, Capability, Compile, Counters, End, Event, GraphBreak, Header, Step
from . import compile as compile_analysis
from ..eventlog.payloads import JsonObject
from ..reports.live_snapshot import LiveRank, LiveSnapshot

STEP_WINDOW = 20  # steps/s over the last this many steps
LAG_STEPS = 2  # a rank lags when it is this many steps (and 5 % of the leader's) behind the leader
_KEPT = (Header, Compile, GraphBreak, CacheLookup, Capability, Counters, End)


@dataclass
class RankState:
    """One rank so far: its compile-related events, and its steps counted, not kept."""

    rank: int
    log: EventLog
    steps: int = 0
    last_index: int | None = None
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_WINDOW))  # wall time at each step's end
    last_t: float | None = None


@dataclass
class LiveRun:
    """Every rank's state, fed event by event (``add``) in the order each rank wrote them."""

    ranks: dict[int, RankState] = field(default_factory=dict)

    def add(self, rank: int, event: Event) -> None:
        """Take one event of ``rank`` into account."""
        state = self.ranks.get(rank)
        if state is None:
            state = self.ranks[rank] = RankState(rank, EventLog(Path(f"rank-{rank}")))
        state.last_t = event.t
        if isinstance(event, Step):
            state.steps += 1
            state.last_index = event.index
            state.step_times.append(event.t)
        elif isinstance(event, _KEPT):
            state.log.events.append(event)


def _steps_per_s(state: RankState) -> float | None:
    times = state.step_times
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return round(float((len(times) - 1) / (times[-1] - times[0])), 3)


def _rank_status(state: RankState, ended: bool) -> str:
    end = state.log.end
    if end is not None:
        return end.status
    if ended:
        return "no end record"
    return "running" if state.log.header else "starting"


def run_state(live: LiveRun, meta: JsonObject, writer: str | None) -> str:
    """``interrupted`` (its supervisor gone without recording the end), ``finished``, ``being
    written`` (a torchrepro process holds the directory) or ``running`` (ranks write it, none of
    them a process of this machine that holds it: another node's job)."""
    if meta.get("interrupted"):
        return "interrupted"
    if is_finished(live, meta):
        return "finished"
    return "being written" if writer is not None else "running"


def expected_ranks(live: LiveRun, meta: JsonObject) -> int:
    """How many ranks the run has: run.json's world size, else the ranks' headers', else those seen."""
    sizes = [h.world_size for h in (s.log.header for s in live.ranks.values()) if h is not None]
    return int(meta.get("world_size") or max(sizes, default=0) or len(live.ranks))


def is_finished(live: LiveRun, meta: JsonObject) -> bool:
    """The run has ended: run.json says so (or that its supervisor is gone), or every expected
    rank wrote its end record."""
    if meta.get("ended") or "exit_code" in meta or meta.get("interrupted"):
        return True
    ended = sum(s.log.end is not None for s in live.ranks.values())
    return bool(live.ranks) and ended >= expected_ranks(live, meta)


def lagging(steps: dict[int, int], running: set[int]) -> list[int]:
    """The running ranks behind the leading rank (finished ranks included) by at least
    ``LAG_STEPS`` steps and 5 % of the leader's steps."""
    lead = max(steps.values(), default=0)
    return sorted(r for r in running if lead - steps[r] >= max(LAG_STEPS, 0.05 * lead))


def snapshot(
    live: LiveRun,
    meta: JsonObject,
    now: float,
    unreadable: int = 0,
    damage: dict[int, list[str]] | None = None,
    writer: str | None = None,
) -> LiveSnapshot:
    """What the run looks like now: its state (:func:`run_state`; ``writer``: the pid of the
    torchrepro process writing it); per rank steps, steps/s, compiles, status and what is damaged
    in its log (``damage``, as the reader found it); the ranks that lag; recompiles by category;
    the latest graph break with its source line; compile findings (and the ``unreadable`` lines
    and records the reader of the logs skipped)."""
    logs = [live.ranks[r].log for r in sorted(live.ranks)]
    ended = is_finished(live, meta)
    section, findings = compile_analysis.summarize(logs)
    ranks: dict[str, LiveRank] = {}
    for rank in sorted(live.ranks):
        state = live.ranks[rank]
        per = section["per_rank"].get(str(rank))
        ranks[str(rank)] = {
            "status": _rank_status(state, ended),
            "steps": state.steps,
            "last_step": state.last_index,
            "steps_per_s": _steps_per_s(state),
            "last_event_age_s": round(now - state.last_t, 3) if state.last_t is not None else None,
            "compiles": per["compiles"] if per else 0,
            "recompiles": per["recompiles"] if per else 0,
            "graph_breaks": per["graph_breaks"] if per else 0,
            "damage": (damage or {}).get(rank, []),
        }
    steps = {r: s.steps for r, s in live.ranks.items()}
    breaks = [b for log in logs for b in log.of(GraphBreak)]
    latest = max(breaks, key=lambda b: b.t, default=None)
    return {
        "schema": "torchrepro.watch/1",
        "finished": ended,
        "state": run_state(live, meta, writer),
        "writer_pid": writer,
        "world_size": expected_ranks(live, meta),
        "ranks_seen": len(live.ranks),
        "ranks": ranks,
        "lagging_ranks": lagging(steps, {r for r, s in live.ranks.items() if s.log.end is None}),
        "compiles": section["compiles"],
        "recompiles": section["recompiles"],
        "recompiles_by_category": section["recompiles_by_category"],
        "graph_breaks": section["graph_breaks"],
        "latest_graph_break": None
        if latest is None
        else {
            "rank": latest.rank,
            "step": latest.step,
            "file": latest.file,
            "line": latest.line,
            "source": latest.source,
            "reason": latest.reason,
            "gb_id": latest.gb_id,
        },
        "findings": [{"code": f.code, "severity": f.severity, "title": f.title} for f in findings],
        "unreadable_lines": unreadable,
    }
