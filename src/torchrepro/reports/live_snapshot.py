"""A running job as read so far (:func:`torchrepro.analysis.live.snapshot`, rendered by
:mod:`torchrepro.render.live_text`; ``watch --json``)."""

from __future__ import annotations

from typing import TypedDict


class LiveRank(TypedDict):
    """One rank of a running job: how far it got, how fast, what it compiled, how long it has been quiet."""

    status: str
    steps: int
    last_step: int | None
    steps_per_s: float | None
    last_event_age_s: float | None
    compiles: int
    recompiles: int
    graph_breaks: int
    damage: list[str]  # what is damaged in its log (unreadable lines, step records, a last one cut short)


class LatestBreak(TypedDict):
    """The graph break read last, where it happened and why."""

    rank: int
    step: int | None
    file: str | None
    line: int | None
    source: str | None
    reason: str
    gb_id: str | None


class FindingLine(TypedDict):
    """A finding, as the live view lists it."""

    code: str
    severity: str
    title: str


class LiveSnapshot(TypedDict):
    """What a running job looks like now (:func:`torchrepro.analysis.live.snapshot`; ``watch --json``)."""

    schema: str
    finished: bool
    state: str  # being written | running | finished | interrupted (torchrepro.analysis.live.run_state)
    writer_pid: str | None  # of the torchrepro process writing the run directory, as its lock file says
    world_size: int
    ranks_seen: int
    ranks: dict[str, LiveRank]
    lagging_ranks: list[int]
    compiles: int
    recompiles: int
    recompiles_by_category: dict[str | None, int]
    graph_breaks: int
    latest_graph_break: LatestBreak | None
    findings: list[FindingLine]
    unreadable_lines: int


class WatchSnapshot(LiveSnapshot):
    """A :class:`LiveSnapshot` of the run directory ``run_dir``."""

    run_dir: str
