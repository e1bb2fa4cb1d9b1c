"""Is it reproducible? Compare two runs step by step, find the first divergence, and decide its
cause from evidence: data order, RNG state, environment, compiled graphs, or what an op-level
replay of the divergent step shows."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..eventlog.event_reader import EventLog
from ..eventlog.events import Compile, Header, InitParams, Params, Setting, Step
from ..eventlog.random_ops import is_random_op
from ..eventlog.payloads import JsonObject
from ..reports.check_report import CurvePoint, ParamDifference

if TYPE_CHECKING:
    import numpy as np  # only the snapshot comparisons need numpy (~60 ms to import): imported there

# Causes (a fixed set): data_order, rng, numerics, nondeterministic_op, environment, recompile,
# unknown. A divergent step is attributed to, in the order a step happens: its batch, the RNG it
# ran with, then what it computes (loss, grads, params).


@dataclass
class Tolerance:
    """``|a - b| <= atol + rtol * |b|`` counts as equal (loss, grad norm, snapshot values)."""

    rtol: float = 0.0
    atol: float = 0.0

    @property
    def exact(self) -> bool:
        return self.rtol == 0 and self.atol == 0

    def close(self, a: float | None, b: float | None) -> bool:
        if a is None or b is None:
            return a is b
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return abs(a - b) <= self.atol + self.rtol * abs(b)


@dataclass
class Divergence:
    """The first point where two runs differ."""

    step: int
    rank: int
    what: str
    detail: JsonObject = field(default_factory=dict)


def _aspect_values(s: Step) -> dict[str, Any]:
    return {"batch": s.batch_fp, "loss": s.loss, "grads": s.grads_fp, "params": s.params_fp}


def _torch_streams(fps: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (fps or {}).items() if k == "torch_cpu" or k.startswith(("cuda:", "generator:", "fork:"))}


def compare_steps(a: Step, b: Step, tol: Tolerance) -> tuple[str, JsonObject] | None:
    """How two records of the same step differ, or None. A step diverges when its batch or
    what it computes differs; it is then attributed to the first of: the batch, the torch RNG
    streams it started with (CPU, CUDA, registered generators), the loss, the gradients, the
    parameters. RNG states alone are not a divergence: an unused stream may differ harmlessly."""
    va, vb = _aspect_values(a), _aspect_values(b)
    if va["batch"] is not None and vb["batch"] is not None and va["batch"] != vb["batch"]:
        return "batch", {}
    computed = []
    for aspect in ("loss", "grads", "params"):
        x, y = va[aspect], vb[aspect]
        if x is None or y is None:  # not recorded in one of the runs
            continue
        if aspect == "loss":
            equal = x == y or (not tol.exact and tol.close(x, y))
        elif aspect == "grads" and not tol.exact:
            equal = x == y or tol.close(a.grad_norm, b.grad_norm)
        elif aspect == "params" and not tol.exact:
            equal = True  # fingerprints cannot be close; values are compared on snapshots
        else:
            equal = x == y
        if not equal:
            computed.append(aspect)
    if not computed:
        return None
    if a.rng_fps is not None and b.rng_fps is not None and _torch_streams(a.rng_fps) != _torch_streams(b.rng_fps):
        return "rng", _detail("rng", a, b)
    return computed[0], {**_detail(computed[0], a, b), **_rng_note(a, b)}


def _rng_note(a: Step, b: Step) -> JsonObject:
    streams = _detail("rng", a, b)["streams"]
    return {"other_rng_streams_differ": streams} if streams else {}


def _detail(aspect: str, a: Step, b: Step) -> JsonObject:
    if aspect == "rng":
        fa, fb = a.rng_fps or {}, b.rng_fps or {}
        return {"streams": sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k)), "read_at": a.rng_at}
    if aspect == "loss":
        return {"loss_a": a.loss, "loss_b": b.loss, "abs_diff": abs((a.loss or 0) - (b.loss or 0))}
    if aspect == "grads":
        return {"grad_norm_a": a.grad_norm, "grad_norm_b": b.grad_norm}
    return {}


def init_divergence(a: EventLog, b: EventLog) -> Divergence | None:
    """The parameters as training started (fingerprinted at the first forward) differ. Only runs
    that started at the same step compare (a resumed run starts from its checkpoint)."""
    init_a, init_b = (next((e for e in log.of(InitParams) if e.source == "first_forward"), None) for log in (a, b))
    if (
        init_a is None
        or init_b is None
        or init_a.step != init_b.step
        or (init_a.names, init_a.fps) == (init_b.names, init_b.fps)
    ):
        return None
    fps_b = dict(zip(init_b.names, init_b.fps))
    differing = [n for n, fp in zip(init_a.names, init_a.fps) if fps_b.get(n) != fp]
    return Divergence(
        0,
        a.rank,
        "init_params",
        {
            "module": init_a.module,
            "first_parameter": differing[0] if differing else None,
            "parameters_differing": len(differing),
        },
    )


def steps_compared(logs_a: list[EventLog], logs_b: list[EventLog]) -> int:
    """Steps compared: the step indices both runs recorded, on the rank with fewest (0 when the
    runs have no rank in common)."""
    by_rank_b = {log.rank: log for log in logs_b}
    counts = [
        len({s.index for s in a.of(Step)} & {s.index for s in by_rank_b[a.rank].of(Step)})
        for a in logs_a
        if a.rank in by_rank_b
    ]
    return min(counts, default=0)


EVIDENCE = ("params", "grads", "loss", "rng", "batch")  # what a comparison of two steps rests on
# fingerprinted at an interval capture chooses from each run's own measured cost: two runs of one
# script may hold them at different steps, and are compared at the steps both hold
_SAMPLED = ("params",)


def _held(s: Step) -> tuple[bool, ...]:
    """Which of :data:`EVIDENCE` a step recorded."""
    return (
        s.params_fp is not None,
        s.grads_fp is not None,
        s.loss is not None,
        s.rng_fps is not None or s.rng_fp is not None,
        s.batch_fp is not None,
    )


@dataclass
class Coverage:
    """What a comparison of two runs rests on: per kind of :data:`EVIDENCE`, the steps at which
    both runs held it (``compared``); the evidence one run holds at a step and the other lacks
    (``not_compared``); why fewer steps were paired than the runs recorded (``unpaired``: steps
    of one run only, duplicated, out of order or missing). Either list keeps a verdict from
    being bit-exact or within tolerance (:func:`~torchrepro.analysis.verdict.judge`)."""

    compared: dict[str, int] = field(default_factory=lambda: dict.fromkeys(EVIDENCE, 0))
    not_compared: list[str] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)  # steps duplicated or out of order: no divergence found stands

    @property
    def incomplete_because(self) -> list[str]:
        return self.damaged + self.unpaired + self.not_compared


def coverage(
    logs_a: list[EventLog], logs_b: list[EventLog], labels: tuple[str, str], first_step: int | None = None
) -> Coverage:
    """:class:`Coverage` of the ranks both runs logged (a rank one run lacks is said by how that run
    ended), step indices from ``first_step`` on (a resumed run starts there; None: all)."""
    out = Coverage()
    by_rank_b = {log.rank: log for log in logs_b}
    lacking: dict[tuple[str, str], list[int]] = {}  # (kind, run lacking it) -> steps
    held: dict[tuple[str, int], int] = {}  # (sampled kind, run 0 or 1) -> steps holding it
    for log_a in logs_a:
        log_b = by_rank_b.get(log_a.rank)
        if log_b is None:
            continue
        rank = log_a.rank
        steps = [[s for s in log.of(Step) if first_step is None or s.index >= first_step] for log in (log_a, log_b)]
        for label, of_run in zip(labels, steps):
            damaged, missing = _sequence_problems(rank, label, [s.index for s in of_run])
            out.damaged += damaged
            out.unpaired += missing
        by_index = {s.index: s for s in steps[1]}
        paired = [(x, by_index[x.index]) for x in {s.index: s for s in steps[0]}.values() if x.index in by_index]
        if len(paired) < max(len(steps[0]), len(steps[1])):
            out.unpaired.append(
                f"rank {rank}: {len(paired)} step(s) paired by index, of {len(steps[0])} in {labels[0]} "
                f"and {len(steps[1])} in {labels[1]}"
            )
        for x, y in paired:
            for kind, hx, hy in zip(EVIDENCE, _held(x), _held(y)):
                if hx and hy:
                    out.compared[kind] += 1
                elif hx != hy and kind not in _SAMPLED:
                    lacking.setdefault((kind, labels[1] if hx else labels[0]), []).append(x.index)
        for which, of_run in enumerate(steps):
            for kind in _SAMPLED:
                held[kind, which] = held.get((kind, which), 0) + sum(_held(s)[EVIDENCE.index(kind)] for s in of_run)
    for (kind, label), at in lacking.items():
        out.not_compared.append(f"{kind} not compared at {len(at)} step(s) ({_steps_text(at)}): {label} lacks it there")
    for kind in _SAMPLED:
        a, b = held.get((kind, 0), 0), held.get((kind, 1), 0)
        if (a or b) and not out.compared[kind]:
            out.not_compared.append(
                f"{kind} not compared: recorded at {a} step(s) of {labels[0]} and {b} of {labels[1]}, never at a "
                "step both recorded"
            )
    return out


def _sequence_problems(rank: int, label: str, indices: list[int]) -> tuple[list[str], list[str]]:
    """Step indices of one rank that are not one step after another: duplicated or out of order
    (damage), and missing."""
    damaged, missing = [], []
    distinct = set(indices)
    if len(distinct) < len(indices):
        damaged.append(f"rank {rank}: {label} records {len(indices) - len(distinct)} step index(es) more than once")
    if any(b < a for a, b in zip(indices, indices[1:])):
        damaged.append(f"rank {rank}: {label}'s steps are out of order")
    if distinct and (gap := max(distinct) - min(distinct) + 1 - len(distinct)) > 0:
        missing.append(f"rank {rank}: {label} lacks {gap} step(s) between steps {min(distinct)} and {max(distinct)}")
    return damaged, missing


def _steps_text(indices: list[int], most: int = 10) -> str:
    """``"steps 3, 5–9"``: step indices as ranges, the first ``most`` of them."""
    ordered = sorted(set(indices))
    parts, start = [], 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            first, last = ordered[start], ordered[i - 1]
            parts.append(str(first) if first == last else f"{first}–{last}")
            start = i
    return (
        ("step " if len(ordered) == 1 else "steps ") + ", ".join(parts[:most]) + (", ..." if len(parts) > most else "")
    )


def settings(log: EventLog) -> dict[str, object]:
    """The switches recorded after the first step (``deterministic_algorithms``, ...)."""
    return {e.name: e.value for e in log.of(Setting)}


def first_divergence(
    logs_a: list[EventLog], logs_b: list[EventLog], tol: Tolerance
) -> tuple[Divergence | None, list[str]]:
    """Earliest divergence over all ranks present in both runs: the initial parameters first, then
    steps matched by index (at the same step the rank whose earliest aspect differs, then the lowest
    rank); and notes on what could not be compared."""
    by_rank_b = {log.rank: log for log in logs_b}
    inits = [d for log in logs_a if log.rank in by_rank_b for d in [init_divergence(log, by_rank_b[log.rank])] if d]
    notes, found = [], []
    if inits:
        if not tol.exact:  # fingerprints are equal or not: no distance to hold against a tolerance
            notes.append("the initial parameters are compared by fingerprint, bit for bit: --rtol/--atol do not apply")
        return min(inits, key=lambda d: d.rank), notes
    for log_a in logs_a:
        log_b = by_rank_b.get(log_a.rank)
        if log_b is None:
            notes.append(f"rank {log_a.rank} is missing from the second run")
            continue
        steps_a, steps_b = log_a.of(Step), {s.index: s for s in log_b.of(Step)}
        pairs = [(a, steps_b[a.index]) for a in steps_a if a.index in steps_b]
        if len(steps_a) != len(steps_b) or len(pairs) != len(steps_a):
            notes.append(
                f"rank {log_a.rank}: {len(steps_a)} vs {len(steps_b)} steps; compared the {len(pairs)} "
                "with the same index"
            )
        for a, b in pairs:
            diff = compare_steps(a, b, tol)
            if diff is not None:
                detail = {**diff[1], **_param_detail(log_a, a, b)} if diff[0] == "params" else diff[1]
                found.append(Divergence(a.index, log_a.rank, diff[0], detail))
                break
    if not found:
        return None, notes
    # within one step, a rank whose input or loss differs started it; gradients and parameters that
    # differ on the others came through the collective (DDP's all-reduce)
    return min(found, key=lambda d: (d.step, _ASPECTS.index(d.what), d.rank)), notes


_ASPECTS = ("batch", "rng", "loss", "grads", "params")


def _param_detail(log: EventLog, a: Step, b: Step) -> JsonObject:
    params = log.of(Params)
    if not params or not a.param_fps or not b.param_fps:
        return {}
    names = params[0].names
    differing = [names[i] for i, (x, y) in enumerate(zip(a.param_fps, b.param_fps)) if x != y and i < len(names)]
    return {"first_parameter": differing[0] if differing else None, "parameters_differing": len(differing)}


# --- evidence beyond the steps -----------------------------------------------------------------

_ENV_KEYS = ("versions", "threads", "hardware")


def environment_differences(a: Header | None, b: Header | None, ignore: tuple[str, ...] = ()) -> list[str]:
    """What differs between two runs' recorded environments (versions, threads, determinism
    switches, variables that change numerics), leaving out lines that mention ``ignore``."""
    if a is None or b is None or not a.env or not b.env:
        return []
    out = []
    for key in _ENV_KEYS:
        x, y = a.env.get(key) or {}, b.env.get(key) or {}
        for name in sorted(set(x) | set(y)):
            if name in ("platform", "cpus_usable", "torch_git"):
                continue
            if x.get(name) != y.get(name):
                out.append(f"{key}.{name}: {x.get(name)!r} vs {y.get(name)!r}")

    def switches(h: Header) -> dict[str, object]:
        return {s["name"]: s["value"] for s in h.env.get("determinism", [])}

    def variables(h: Header) -> dict[str, object]:
        return {v["name"]: v["value"] for v in h.env.get("env_vars", []) if v.get("in_fingerprint")}

    sa, sb = switches(a), switches(b)
    out += [f"switch {n}: {sa.get(n)!r} vs {sb.get(n)!r}" for n in sorted(set(sa) | set(sb)) if sa.get(n) != sb.get(n)]
    va, vb = variables(a), variables(b)
    out += [f"${n}: {va.get(n)!r} vs {vb.get(n)!r}" for n in sorted(set(va) | set(vb)) if va.get(n) != vb.get(n)]
    return [line for line in out if not any(word in line for word in ignore)]


def compile_differences(a: EventLog, b: EventLog) -> list[str]:
    """How the compiled graphs of two runs differ (count, recompile reasons, graph sizes)."""

    def shape(log: EventLog) -> list[tuple[str | None, int | None, tuple[str, ...], str | None]]:
        return [(c.function, c.graph_ops, tuple(c.recompile_reasons[:1]), c.limit_hit) for c in log.of(Compile)]

    sa, sb = shape(a), shape(b)
    if sa == sb:
        return []
    out = [f"rank {a.rank}: {len(sa)} vs {len(sb)} compiles"] if len(sa) != len(sb) else []
    for i, (x, y) in enumerate(zip(sa, sb)):
        if x != y:
            out.append(
                f"rank {a.rank}: compile #{i} differs: {x[0]} ({x[1]} ops, {x[2][0] if x[2] else 'first'}) vs "
                f"{y[0]} ({y[1]} ops, {y[2][0] if y[2] else 'first'})"
            )
            break
    extra = sa[len(sb) :] or sb[len(sa) :]
    if extra:
        out.append(f"rank {a.rank}: extra compile of {extra[0][0]}: {extra[0][2][0] if extra[0][2] else 'new frame'}")
    return out


# --- divergence curve from parameter snapshots -------------------------------------------------
#
# A run's snapshot folder (torchrepro.capture.snapshots) holds a sketch per snapshot step
# (sketch-<step>.npz) and the full parameters of its last one (step-<step>.npz); folders written
# before sketches existed hold full parameters at every snapshot step. A step both runs hold in
# full is compared exactly; else their sketches are: tensors with equal fingerprints are equal,
# tensors small enough to be kept whole are compared exactly, the others' L2 difference is estimated.

SKETCH_CONFIDENCE = 0.9  # the probability the error bound of an estimated L2 difference is stated at


def sketch_error(dims: int, confidence: float = SKETCH_CONFIDENCE) -> float:
    """The relative error of an L2 difference estimated from count sketches of at least ``dims``
    dims that is exceeded with probability at most ``1 - confidence``. The squared norm of the
    sketches' difference estimates the squared difference without bias with variance at most
    ``2|d|⁴/dims`` (Chebyshev: relative error above ``e`` with probability at most ``2/(dims e²)``),
    and the norm's relative error is at most the squared norm's."""
    return math.sqrt(2 / (dims * (1 - confidence)))


@dataclass
class Sketch:
    """One snapshot step's sketch file: per tensor its fingerprint, size, sketch (the values
    themselves where ``dims == numel``), L2 norm and largest magnitude."""

    scheme: str
    names: list[str]
    fps: list[str]
    numel: list[int]
    dims: list[int]
    parts: list[np.ndarray]
    l2: list[float]
    max_abs: list[float]

    def tensors(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}


def load_sketch(path: Path, log: EventLog) -> Sketch:
    """A sketch file (``sketch-<n>.npz``, :func:`~torchrepro.eventlog.snapshot_files.read_npz`), its
    fingerprints checked against those ``log`` recorded for step ``n`` and the values of each tensor
    it keeps whole against its own fingerprint: :class:`InputError` for one that cannot be read or
    does not match (damaged or replaced: never evidence)."""
    import numpy as np

    from ..eventlog.snapshot_files import candidate_dtypes, matches, read_npz

    data = read_npz(path, "sketch")
    try:
        dims = [int(d) for d in data["dims"]]
        bounds = np.cumsum([0, *dims])
        values = data["sketch"]
        sketch = Sketch(
            str(data["scheme"]),
            [str(n) for n in data["names"]],
            [str(f) for f in data["fps"]],
            [int(n) for n in data["numel"]],
            dims,
            [values[bounds[i] : bounds[i + 1]] for i in range(len(dims))],
            [float(x) for x in data["l2"]],
            [float(x) for x in data["max_abs"]],
        )
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise InputError(f"{path}: unreadable sketch ({exc})") from None
    sizes = {len(sketch.names), len(sketch.fps), len(sketch.numel), len(sketch.l2), len(sketch.max_abs), len(dims)}
    if len(sizes) != 1 or bounds[-1] != len(values):
        raise InputError(f"{path}: unreadable sketch (its arrays disagree in length)")
    step = _step_of(path)
    recorded = recorded_fingerprints(log, step)
    params = _params_in_force(log, step)
    plain = (
        {  # the tensors whose shape (so whose fingerprint) the log knows: not a DTensor's shard, not complex
            n: (shape, dtype)
            for n, shape, dtype, kind in zip(params.names, params.shapes, params.dtypes, params.kinds)
            if kind == "tensor" and not dtype.startswith("complex")
        }
        if params is not None
        else {}
    )
    for i, name in enumerate(sketch.names):
        fp, dtype = recorded.get(name, (None, None))
        if fp is not None and not (dtype or "").startswith("complex") and fp != sketch.fps[i]:
            raise InputError(f"{path}: {_not_recorded(name, step)}")
        shape, dtype = plain.get(name, (None, None))
        if shape is not None and dims[i] == sketch.numel[i] == math.prod(shape):
            whole = sketch.parts[i].reshape(shape)
            if not matches(whole, [sketch.fps[i]], candidate_dtypes(whole, dtype)):
                raise InputError(
                    f"{path}: the values of {name!r} do not match its own fingerprint: damaged or replaced"
                )
    return sketch


def _step_of(path: Path) -> int:
    return int(path.stem.split("-", 1)[1])


def _not_recorded(name: str, step: int) -> str:
    return (
        f"{name!r} does not match the fingerprint the run recorded for step {step}: the snapshot is damaged or "
        "was replaced, and is not compared"
    )


def _params_in_force(log: EventLog, step: int) -> Params | None:
    """The ``Params`` event that names the parameters of step ``step`` (None: the log has none)."""
    named = [p for p in log.of(Params) if p.step is None or p.step <= step] or log.of(Params)[:1]
    return named[-1] if named else None


def recorded_fingerprints(log: EventLog, step: int) -> dict[str, tuple[str, str | None]]:
    """Each parameter's fingerprint (16 hex digits) and dtype as ``log`` recorded them for step
    ``step`` (``Step.param_fps``, named by the ``Params`` in force); empty where that step's were not
    fingerprinted (the automatic interval)."""
    params = _params_in_force(log, step)
    record = next((s for s in log.of(Step) if s.index == step), None)
    if params is None or record is None or not record.param_fps or len(record.param_fps) != len(params.names):
        return {}
    dtypes: list[str | None] = (
        list(params.dtypes) if len(params.dtypes) == len(params.names) else [None] * len(params.names)
    )
    return {n: (fp, d) for n, fp, d in zip(params.names, record.param_fps, dtypes)}


def load_snapshot(path: Path, log: EventLog) -> dict[str, np.ndarray] | None:
    """A parameter snapshot (``step-<n>.npz``, written uncompressed by ``np.savez``), every tensor
    checked against the fingerprints the run recorded for step ``n``: in ``log`` and in the sketch
    of that step beside it (:func:`load_sketch`). :class:`InputError` for one that cannot be read or
    does not match them, or holds other tensors (damaged or replaced: never evidence); None where the
    run recorded no fingerprint to check it against (it is not compared)."""
    from ..eventlog.snapshot_files import candidate_dtypes, matches, read_npz

    step = _step_of(path)
    arrays = read_npz(path, "parameter snapshot")
    recorded = {name: ([fp], dtype) for name, (fp, dtype) in recorded_fingerprints(log, step).items()}
    sketch_file = path.with_name(f"sketch-{path.name.split('-', 1)[1]}")
    if sketch_file.exists():
        sketch = load_sketch(sketch_file, log)
        for name, fp in zip(sketch.names, sketch.fps):
            fps, dtype = recorded.get(name, ([], None))
            recorded[name] = ([*fps, fp], dtype)
    if not recorded:
        return None
    if set(arrays) != set(recorded):
        raise InputError(
            f"{path}: holds other tensors ({len(arrays)}) than the run recorded for step {step} ({len(recorded)}): "
            "the snapshot is damaged or was replaced, and is not compared"
        )
    for name, array in arrays.items():
        fps, dtype = recorded[name]
        if not matches(array, fps, candidate_dtypes(array, dtype)):
            raise InputError(f"{path}: {_not_recorded(name, step)}")
    return arrays


def snapshot_steps(folder: Path, kind: str = "step") -> dict[int, Path]:
    """The snapshot files of ``folder`` by step: full parameters (``kind="step"``, ``step-<n>.npz``) or
    sketches (``"sketch"``); other names are not snapshots."""
    out = {}
    for p in sorted(folder.glob(f"{kind}-*.npz")):
        number = p.stem.split("-", 1)[1]
        if number.isascii() and number.isdigit():
            out[int(number)] = p
    return out


def _difference(
    diffs: dict[str, tuple[float | None, float | None, float, float]], estimated_dims: list[int]
) -> ParamDifference:
    """Per tensor (max abs, max rel: None where estimated; L2 of the difference, L2 of B) summed up."""
    exact = not estimated_dims
    worst_abs, worst_rel, worst_l2, where, where_l2 = 0.0, 0.0, 0.0, None, None
    for name, (d, rel, l2, _) in diffs.items():
        if d is not None and d > worst_abs:
            worst_abs, where = d, name
        worst_rel = max(worst_rel, rel or 0.0)
        if l2 > worst_l2:
            worst_l2, where_l2 = l2, name
    total = math.sqrt(sum(x[2] ** 2 for x in diffs.values()))
    norm = math.sqrt(sum(x[3] ** 2 for x in diffs.values()))
    return {
        "max_abs": worst_abs if exact else None,
        "max_rel": worst_rel if exact else None,
        "parameter": where if exact else where_l2,
        "l2": total,
        "l2_rel": total / norm if norm > 0 else (0.0 if total == 0 else math.inf),
        "estimated": not exact,
        "sketch_dims": min(estimated_dims) if estimated_dims else None,
    }


_MISMATCH = (math.inf, math.inf, math.inf, 0.0)


def _exact(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """(max abs, max rel to B's largest magnitude, L2 of the difference, L2 of B) of two arrays."""
    import numpy as np

    x, y = x.astype(np.float64), y.astype(np.float64)
    if x.shape != y.shape:
        return _MISMATCH
    if not x.size:
        return 0.0, 0.0, 0.0, 0.0
    d, scale = float(np.max(np.abs(x - y))), float(np.max(np.abs(y)))
    rel = d / scale if scale > 0 else (0.0 if d == 0 else math.inf)
    return d, rel, float(np.linalg.norm((x - y).ravel())), float(np.linalg.norm(y.ravel()))


def param_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> ParamDifference:
    """Max absolute and max relative (to the parameter's largest magnitude) difference, the
    parameter where the absolute difference is largest, and the L2 norm of the difference."""
    diffs: dict[str, tuple[float | None, float | None, float, float]] = {}
    for name in sorted(a.keys() & b.keys()):
        diffs[name] = _exact(a[name], b[name])
        if diffs[name] == _MISMATCH:
            return {**_difference({name: _MISMATCH}, []), "parameter": name}
    return _difference(diffs, [])


def sketch_difference(a: Sketch, b: Sketch) -> ParamDifference:
    """:func:`param_difference` from two sketch files: exact for tensors with equal fingerprints
    (no difference) and tensors kept whole; the L2 difference of the others estimated."""
    import numpy as np

    diffs: dict[str, tuple[float | None, float | None, float, float]] = {}
    estimated: list[int] = []
    tensors_b = b.tensors()
    for i, name in enumerate(a.names):
        j = tensors_b.get(name)
        if j is None:
            continue
        if a.numel[i] != b.numel[j] or a.dims[i] != b.dims[j] or a.scheme != b.scheme:
            return {**_difference({name: _MISMATCH}, []), "parameter": name}
        if a.fps[i] == b.fps[j]:
            diffs[name] = (0.0, 0.0, 0.0, b.l2[j])
        elif a.dims[i] == a.numel[i]:  # kept whole
            diffs[name] = _exact(a.parts[i], b.parts[j])
        else:
            estimated.append(a.dims[i])
            diffs[name] = (None, None, float(np.linalg.norm(a.parts[i] - b.parts[j])), b.l2[j])
    return _difference(diffs, estimated)


def divergence_curve(dir_a: Path, dir_b: Path, log_a: EventLog, log_b: EventLog) -> list[CurvePoint]:
    """Per snapshot step both runs recorded: the parameter difference (exact where both kept the
    step in full, else from their sketches) and the loss difference. A full snapshot with no
    recorded fingerprint to check it against is not compared (the sketches are, where kept)."""
    full_a, full_b = snapshot_steps(dir_a), snapshot_steps(dir_b)
    sketch_a, sketch_b = snapshot_steps(dir_a, "sketch"), snapshot_steps(dir_b, "sketch")
    full, sketched = full_a.keys() & full_b.keys(), sketch_a.keys() & sketch_b.keys()
    loss_a = {s.index: s.loss for s in log_a.of(Step)}
    loss_b = {s.index: s.loss for s in log_b.of(Step)}
    curve: list[CurvePoint] = []
    for step in sorted(full | sketched):
        pair = _full_pair(full_a, full_b, log_a, log_b, step)
        if pair is not None:
            diff = param_difference(*pair)
        elif step in sketched:
            diff = sketch_difference(load_sketch(sketch_a[step], log_a), load_sketch(sketch_b[step], log_b))
        else:
            continue
        la, lb = loss_a.get(step), loss_b.get(step)
        curve.append({"step": step, **diff, "loss_diff": abs(la - lb) if la is not None and lb is not None else None})
    return curve


def _full_pair(
    full_a: dict[int, Path], full_b: dict[int, Path], log_a: EventLog, log_b: EventLog, step: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None:
    """Both runs' full parameters at ``step``, each checked (:func:`load_snapshot`); None unless both are."""
    if step not in full_a or step not in full_b:
        return None
    a, b = load_snapshot(full_a[step], log_a), load_snapshot(full_b[step], log_b)
    return (a, b) if a is not None and b is not None else None


def final_within(tol: Tolerance, dir_a: Path, dir_b: Path, log_a: EventLog, log_b: EventLog) -> bool:
    """Whether the last snapshot step both runs recorded is elementwise within tolerance: in
    full, or from sketches where every tensor that differs was kept whole (a sketched tensor that
    differs cannot be held to it elementwise, nor can a snapshot that cannot be checked: not within)."""
    import numpy as np

    full_a, full_b = snapshot_steps(dir_a), snapshot_steps(dir_b)
    sketch_a, sketch_b = snapshot_steps(dir_a, "sketch"), snapshot_steps(dir_b, "sketch")
    common = sorted((full_a.keys() & full_b.keys()) | (sketch_a.keys() & sketch_b.keys()))
    if not common:
        return False
    last = common[-1]
    pair = _full_pair(full_a, full_b, log_a, log_b, last)
    if pair is not None:
        a, b = pair
    elif last in sketch_a and last in sketch_b:
        sa, sb = load_sketch(sketch_a[last], log_a), load_sketch(sketch_b[last], log_b)
        tensors_b = sb.tensors()
        a, b = {}, {}
        for i, name in enumerate(sa.names):
            j = tensors_b.get(name)
            if j is None or sa.fps[i] == sb.fps[j]:
                continue
            if sa.dims[i] != sa.numel[i] or sa.dims[i] != sb.dims[j]:
                return False
            a[name], b[name] = sa.parts[i], sb.parts[j]
        if sa.names != sb.names:
            return False
    else:
        return False
    return (
        all(
            a[k].shape == b[k].shape and np.allclose(a[k], b[k], rtol=tol.rtol, atol=tol.atol, equal_nan=True)
            for k in a.keys() & b.keys()
        )
        and a.keys() == b.keys()
    )


# --- op-level replay comparison --------------------------------------------------------------


def compare_replays(ops_a: list[JsonObject], ops_b: list[JsonObject]) -> JsonObject | None:
    """The first op whose outputs differ between two replays of the same step, and what that
    says: a random op → ``rng``; same inputs, different outputs → ``nondeterministic_op``;
    different inputs from outside torch → ``unknown``; a different op sequence → control flow."""
    for x, y in zip(ops_a, ops_b):
        if x["op"] != y["op"]:
            return {
                "op": x["op"],
                "other_op": y["op"],
                "index": x["i"],
                "module": x["module"],
                "phase": x["phase"],
                "source": x["source"],
                "kind": "control_flow",
            }
        if x["outputs"] != y["outputs"]:
            if is_random_op(x["op"]):
                kind = "rng"
            elif x["inputs"] == y["inputs"]:
                kind = "nondeterministic_op"
            else:
                kind = "input_from_outside_torch"
            return {
                "op": x["op"],
                "index": x["i"],
                "module": x["module"],
                "phase": x["phase"],
                "source": x["source"],
                "kind": kind,
            }
    if len(ops_a) != len(ops_b):
        return {
            "op": None,
            "index": min(len(ops_a), len(ops_b)),
            "module": None,
            "phase": None,
            "source": None,
            "kind": "control_flow",
        }
    return None
