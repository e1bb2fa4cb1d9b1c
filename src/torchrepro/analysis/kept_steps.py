"""What the doctor report keeps of one rank's step events: its figures (count, losses, times),
the series the timeline draws, and the columns the cross-rank checks compare. A rank's steps are
98 % of its log; reduced to this as each rank is read (``rundir.load_run(..., keep=KeptSteps.of)``),
a report over 1024 ranks x 10 000 steps holds one rank's events at a time, and reading processes
send back this instead of the events. Nothing here imports torch.
"""

from __future__ import annotations

import statistics
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter, eq

from ..eventlog.events import EventLog, Step

MAX_POINTS = 400  # per timeline series: longer runs are thinned evenly, steps that compiled are always kept
COMPILE_STEPS = 50  # the steps that compiled, listed in the steps summary
_HEX = "0123456789abcdef"

_INDEX, _T, _TIME_S, _COMPILES, _PARAMS_FP, _PARAM_FPS, _BATCH_FP = map(
    attrgetter, ("index", "t", "time_s", "compiles", "params_fp", "param_fps", "batch_fp")
)


@dataclass(slots=True)
class KeptSteps:
    """One rank's steps, reduced: the figures of the steps summary, the timeline's series, and,
    per step in log order, the index, torch RNG stream and batch fingerprints the cross-rank
    checks compare (and the parameter fingerprints of the steps that have them)."""

    count: int
    last_index: int | None
    first_loss: float | None
    last_loss: float | None
    total_time_s: float
    median_s: float | None  # of the steps that did not compile (of all, when every step did)
    quiet_median_s: float | None  # of the steps that did not compile only
    compile_steps: list[int]  # the first COMPILE_STEPS steps that compiled
    fingerprinted: int  # steps with a parameter fingerprint
    first_t: float | None  # the earliest step's time stamp
    series: list[list[float]]  # [index, host time, compiles] of the steps with a host time, thinned to MAX_POINTS
    indices: Sequence[int]  # a range where they count up by one
    torch_streams: list[str | None]
    batch_fps: Sequence[int | str | None]  # see _batch_column
    param_indices: list[int]  # the steps with per-parameter fingerprints
    param_fps: list[list[str]]

    @classmethod
    def of(cls, steps: list[Step]) -> KeptSteps:
        """Reduce a rank's steps (in log order). A few passes, at C speed where they can be."""
        times = [t for t in map(_TIME_S, steps) if t is not None]
        quiet = [s.time_s for s in steps if not s.compiles and s.time_s is not None]
        quiet_median = statistics.median(quiet) if quiet else None
        fingerprinted = [s for s in steps if s.param_fps]
        return cls(
            count=len(steps),
            last_index=steps[-1].index if steps else None,
            first_loss=next((s.loss for s in steps if s.loss is not None), None),
            last_loss=next((s.loss for s in reversed(steps) if s.loss is not None), None),
            total_time_s=sum(times),
            median_s=quiet_median if quiet_median is not None or not times else statistics.median(times),
            quiet_median_s=quiet_median,
            compile_steps=[s.index for s in steps if s.compiles][:COMPILE_STEPS],
            fingerprinted=len(steps) - list(map(_PARAMS_FP, steps)).count(None),
            first_t=min(map(_T, steps), default=None),
            series=_series(steps),
            indices=_indices(steps),
            torch_streams=[
                (fps.get("torch_cpu") or fps.get("cuda:0")) if fps else None for fps in (s.rng_fps for s in steps)
            ],
            batch_fps=_batch_column(list(map(_BATCH_FP, steps))),
            param_indices=list(map(_INDEX, fingerprinted)),
            param_fps=list(map(_PARAM_FPS, fingerprinted)),
        )


def _series(steps: list[Step]) -> list[list[float]]:
    """``[index, host time, compiles]`` of the steps with a host time: at most :data:`MAX_POINTS`
    evenly spread, and every step that compiled."""
    timed = [s for s in steps if s.time_s is not None]
    if len(timed) > MAX_POINTS:
        stride = len(timed) / MAX_POINTS
        keep = {int(i * stride) for i in range(MAX_POINTS)}
        keep.update(compress(range(len(timed)), map(_COMPILES, timed)))
        timed = [timed[i] for i in sorted(keep)]
    return [[s.index, round(s.time_s or 0.0, 6), s.compiles] for s in timed]  # timed: time_s is set


def _indices(steps: list[Step]) -> Sequence[int]:
    """The steps' indices: a ``range`` when they count up by one (most logs: less to hold and send)."""
    indices = list(map(_INDEX, steps))
    if indices and type(indices[0]) is int:
        counted = range(indices[0], indices[0] + len(indices))
        if all(map(eq, indices, counted)):
            return counted
    return indices


def _batch_column(fps: list[str | None]) -> Sequence[int | str | None]:
    """The batch fingerprints, for the cross-rank checks to compare (equal stays equal, different
    stays different): when every one is what capture writes, 16 lowercase hex digits, an ``array``
    of their 8 bytes each (a 65-byte string each before: over 1024 ranks x 10 000 steps the report's
    peak RSS fell from 1.97 to 1.12 GB); else a list, each such fingerprint as the integer the array
    would hold."""
    known = [fp for fp in fps if fp is not None]
    if len(known) == len(fps) and set(map(len, known)) <= {16}:
        joined = "".join(known)
        if not joined.strip(_HEX):
            column = array("Q")
            column.frombytes(bytes.fromhex(joined))
            return column
    return [_as_key(fp) for fp in fps]


def _as_key(fp: str | None) -> int | str | None:
    if fp is not None and len(fp) == 16 and not fp.strip(_HEX):
        return int.from_bytes(bytes.fromhex(fp), sys.byteorder)
    return fp


def kept_steps(logs: list[EventLog]) -> dict[int, KeptSteps]:
    """Each rank's :class:`KeptSteps`: the reader's, where it kept only those, else its steps reduced."""
    return {log.rank: log.kept if log.kept is not None else KeptSteps.of(log.of(Step)) for log in logs}
