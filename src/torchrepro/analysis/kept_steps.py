"""What the doctor report keeps of one rank's step events: its figures (count, losses, times),
the series the timeline draws, and the columns the cross-rank checks compare. A rank's steps are
98 % of its log; reduced to this as each rank is read (``rundir.load_run(..., keep=StepReducer)``:
the reader hands over the rank's steps as columns of values and builds no step event), a report
over 1024 ranks x 10 000 steps holds one rank's steps at a time, and reading processes send back
this instead of the events. Nothing here imports torch.
"""

from __future__ import annotations

import math
import statistics
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, islice
from operator import eq

from ..eventlog.event_reader import EventLog, StepColumns, step_columns
from ..eventlog.events import STEP_FIELDS, Step

MAX_POINTS = 400  # per timeline series: longer runs are thinned evenly, steps that compiled are always kept
COMPILE_STEPS = 50  # the steps that compiled, listed in the steps summary


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
    losses: list[list[float]]  # [index, loss] of the steps with a loss, thinned to MAX_POINTS (see _loss_series)
    indices: Sequence[int]  # a range where they count up by one
    torch_streams: Sequence[object]  # see _Digests
    batch_fps: Sequence[object]  # see _Digests
    param_indices: Sequence[int]  # the steps with per-parameter fingerprints (a range where they count up by one)
    param_fps: list[list[str]]


_AT = {name: at for at, name in enumerate(STEP_FIELDS)}
_T, _INDEX, _LOSS, _TIME_S, _COMPILES, _PARAMS_FP, _PARAM_FPS, _BATCH_FP, _RNG_FPS = (
    _AT[name] for name in ("t", "index", "loss", "time_s", "compiles", "params_fp", "param_fps", "batch_fp", "rng_fps")
)


class StepReducer:
    """Reduces the steps of one rank after another to :class:`KeptSteps`, given a batch of steps
    at a time, field by field, in log order (``event_reader.read_events(reduce=...)``; one batch:
    ``[event_reader.step_columns(steps)]``), holding once the parameter fingerprints that ranks agree
    on: the ``keep`` of ``rundir.load_run`` (each process that reads makes one).

    >>> reduce = StepReducer()
    >>> reduce([step_columns([Step(index=0, loss=2.0), Step(index=1, loss=1.5)])]).last_loss
    1.5
    """

    def __init__(self) -> None:
        self.agreed: dict[int, list[str]] = {}  # the first parameter fingerprints reduced, by step index

    def __call__(self, batches: Iterable[StepColumns]) -> KeptSteps:
        index: list[int] = []
        time_s: list[float | None] = []
        compiles: list[int] = []
        loss: list[float | None] = []
        first_t: float | None = None
        unfingerprinted = 0
        param_indices: list[int] = []
        param_fps: list[list[str]] = []
        batch_fps, streams, agreed = _Digests(), _Digests(), self.agreed
        for step in batches:  # what can be done while a batch is in the caches is done here
            index += step[_INDEX]
            time_s += step[_TIME_S]
            compiles += step[_COMPILES]
            loss += step[_LOSS]
            if step[_T]:
                low = min(step[_T])
                first_t = low if first_t is None else min(first_t, low)
            unfingerprinted += step[_PARAMS_FP].count(None)
            at = list(compress(step[_INDEX], step[_PARAM_FPS]))
            fps = list(compress(step[_PARAM_FPS], step[_PARAM_FPS]))
            # a rank's fingerprints equal to those an earlier rank had at that step are held as that one object
            param_indices += at
            param_fps += [held if held == own else own for held, own in zip(map(agreed.setdefault, at, fps), fps)]
            batch_fps.add(step[_BATCH_FP])
            streams.add([(rng.get("torch_cpu") or rng.get("cuda:0")) if rng else None for rng in step[_RNG_FPS]])
        times = [t for t in time_s if t is not None]
        quiet = [t for t, c in zip(time_s, compiles) if not c and t is not None]
        quiet_median = statistics.median(quiet) if quiet else None
        return KeptSteps(
            count=len(index),
            last_index=index[-1] if index else None,
            first_loss=next((x for x in loss if x is not None), None),
            last_loss=next((x for x in reversed(loss) if x is not None), None),
            total_time_s=sum(times),
            median_s=quiet_median if quiet_median is not None or not times else statistics.median(times),
            quiet_median_s=quiet_median,
            compile_steps=list(islice(compress(index, compiles), COMPILE_STEPS)),
            fingerprinted=len(index) - unfingerprinted,
            first_t=first_t,
            series=_series(index, time_s, compiles),
            losses=_loss_series(index, loss),
            indices=_indices(index),
            torch_streams=streams.column(),
            batch_fps=batch_fps.column(),
            param_indices=_indices(param_indices),
            param_fps=param_fps,
        )


def _series(index: Sequence[int], time_s: Sequence[float | None], compiles: Sequence[int]) -> list[list[float]]:
    """``[index, host time, compiles]`` of the steps with a host time: at most :data:`MAX_POINTS`
    evenly spread, and every step that compiled."""
    timed = [at for at, t in enumerate(time_s) if t is not None]
    if len(timed) > MAX_POINTS:
        stride = len(timed) / MAX_POINTS
        keep = {int(i * stride) for i in range(MAX_POINTS)}
        keep.update(compress(range(len(timed)), [compiles[at] for at in timed]))
        timed = [timed[i] for i in sorted(keep)]
    return [[index[at], round(time_s[at] or 0.0, 6), compiles[at]] for at in timed]  # timed: time_s is set


def _loss_series(index: Sequence[int], loss: Sequence[float | None]) -> list[list[float]]:
    """``[index, loss]`` of the steps with a loss: at most :data:`MAX_POINTS` evenly spread, the
    last step, and the first step whose loss is not finite (NaN or infinite: where a loss curve
    ends in a chart, and why)."""
    with_loss = [at for at, x in enumerate(loss) if x is not None]
    if len(with_loss) > MAX_POINTS:
        stride = len(with_loss) / MAX_POINTS
        keep = {int(i * stride) for i in range(MAX_POINTS)} | {len(with_loss) - 1}
        keep.update(islice((i for i, at in enumerate(with_loss) if not math.isfinite(loss[at] or 0.0)), 1))
        with_loss = [with_loss[i] for i in sorted(keep)]
    return [[index[at], loss[at] or 0.0] for at in with_loss]  # with_loss: the loss is set


def _indices(indices: Sequence[int]) -> Sequence[int]:
    """Step indices: a ``range`` when they count up by one (most logs: less to hold and send), else a list."""
    if indices and type(indices[0]) is int:
        counted = range(indices[0], indices[0] + len(indices))
        if all(map(eq, indices, counted)):
            return counted
    return list(indices)


class _Digests:
    """A column of digests (batches, torch RNG streams) for the cross-rank checks to compare (equal
    stays equal, different stays different), added a batch at a time: while every one is what
    capture writes, 16 lowercase hex digits, their 8 bytes each (an ``array`` at the end; a 65-byte
    string each before: over 1024 ranks x 10 000 steps the report's peak RSS fell from 1.97 to
    1.12 GB); else a list: each such digest as the integer the array would hold, other strings
    and None as they are, any other value in a tuple of its own (a number a log held there is no
    digest's integer)."""

    def __init__(self) -> None:
        self.packed = bytearray()
        self.keys: list[object] | None = None  # once a digest is not capture's

    def add(self, fps: Sequence[object]) -> None:
        if self.keys is None:
            if set(map(type, fps)) <= {str} and set(map(len, fps)) <= {16}:  # type: ignore[arg-type]  # (all str)
                joined = "".join(fps)  # type: ignore[arg-type]
                packed = _hex_bytes(joined)
                if packed is not None:
                    self.packed += packed
                    return
            self.keys = list(self.column())
        self.keys += map(_as_key, fps)

    def column(self) -> Sequence[object]:
        if self.keys is not None:
            return self.keys
        column = array("Q")
        column.frombytes(self.packed)
        return column


def _as_key(fp: object) -> object:
    if type(fp) is not str:
        return fp if fp is None else (fp,)
    packed = _hex_bytes(fp) if len(fp) == 16 else None
    return fp if packed is None else int.from_bytes(packed, sys.byteorder)


def _hex_bytes(digits: str) -> bytes | None:
    """The bytes that ``digits`` spells in lowercase hex, two digits a byte; None if it is anything else
    (``bytes.fromhex`` also takes capitals and spaces: those are checked by spelling the bytes again)."""
    try:
        packed = bytes.fromhex(digits)
    except ValueError:
        return None
    return packed if packed.hex() == digits else None


def kept_steps(logs: list[EventLog]) -> dict[int, KeptSteps]:
    """Each rank's :class:`KeptSteps`: the reader's, where it kept only those, else its steps reduced."""
    reduce = StepReducer()
    return {log.rank: log.kept if log.kept is not None else reduce([step_columns(log.of(Step))]) for log in logs}
