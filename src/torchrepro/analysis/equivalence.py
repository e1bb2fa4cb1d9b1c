"""Is configuration B the same training as configuration A? ``torchrepro compare`` runs the
reference A twice and B once; this module judges B against the reference's own run-to-run noise
(docs/compare.md). Pure: event logs and parameter snapshots in, a ``compare`` section out; nothing
here imports torch.

What is compared, step by step, in the order a step happens:

- the data: each run's batch fingerprints, for a batch seen twice (on two ranks at one step, or
  again later); B's batches against A's where both configurations split the data alike;
- the loss: the mean over ranks of each rank's step loss (each rank's mean over its share of the
  global batch, micro-batches scaled for accumulation: the loss of the global batch), and each
  rank's own where both have the same ranks;
- the global gradient norm (replicated parameters: any rank's; sharded ones: over the shards);
- every parameter tensor, at the steps the runs snapshot, sharded tensors joined from their shards.

Each distance is relative to the reference's magnitude so far (``|a - b| / max|a|``, the maximum over
the steps up to this one; for a tensor ``max|a - b|`` over its elements, over the largest element
magnitude so far), so that a value passing near zero does not make it blow up. The band of a quantity at step k is the largest distance between the two
reference runs up to k; B is within it when its distance to the first reference run is at most
``max(BAND_FACTOR * band, tolerance(k))``, where ``tolerance(k) = SAFETY * eps * sqrt(n) * (k + 1)``
covers the reassociation of float sums (``n``: the reduction size) when the reference is bit-exact
and the band is zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..eventlog.event_reader import EventLog
from ..eventlog.events import Params, Step
from ..eventlog.payloads import JsonObject
from ..reports.check_report import CheckRun
from ..reports.compare_report import CompareReport
from ..reports.findings import Finding
from .divergence import abs_difference, distance, finite_magnitude, same_value
from .cache_misses import warm_start_findings
from .nonfinite import nonfinite_findings, of_runs, value_text
from .verdict import Ending

if TYPE_CHECKING:
    import numpy as np

EPS = {
    "float64": 2.220446049250313e-16,
    "float32": 1.1920928955078125e-07,
    "bfloat16": 0.0078125,
    "float16": 0.0009765625,
}
SAFETY = 4.0  # tolerance(k): the probabilistic rounding bound sqrt(n) * eps per step, four times over
BAND_FACTOR = 10.0  # one pair of reference runs samples the noise once: B may be this much further
AMBIGUOUS = 10.0  # beyond what is allowed by less than this: abstain (one sample of the noise, or a model of it)
MIN_STEPS = 3  # fewer compared steps: abstain
BAND_TOO_WIDE = 0.05  # the reference's own noise over 5 % of a value: too noisy to judge
_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.")


@dataclass
class Config:
    """One run of a configuration, as the comparison reads it."""

    label: str
    logs: list[EventLog]
    ending: Ending

    @property
    def world(self) -> int:
        return len(self.logs)

    def snapshots(self, rank: int) -> Path:
        log = next(log for log in self.logs if log.rank == rank)
        return log.path.parent / "snapshots"


# --- what a configuration recorded ---------------------------------------------------------------


def _steps(log: EventLog) -> dict[int, Step]:
    return {s.index: s for s in log.of(Step)}


def _layout(log: EventLog) -> Params | None:
    params = log.of(Params)
    return params[0] if params else None


def _norm_name(name: str) -> str:
    for prefix in _PREFIXES:
        name = name.replace(prefix, "")
    return name


def _sharded(log: EventLog) -> bool | None:
    """True when every parameter is a DTensor sharded on dim 0, False when every one is a plain
    tensor, None for another layout (tensor parallel, mixed): no full tensor is joined then."""
    layout = _layout(log)
    if layout is None or not layout.kinds:
        return None
    if all(k == "tensor" for k in layout.kinds):
        return False
    if all(k in ("dtensor:S(0)", "dtensor:Shard(dim=0)") for k in layout.kinds):
        return True
    return None


def global_losses(cfg: Config) -> dict[int, float]:
    """Per step every rank recorded a loss for: the mean over ranks."""
    per_rank = [_steps(log) for log in cfg.logs]
    common = set.intersection(*(set(s) for s in per_rank)) if per_rank else set()
    out = {}
    for index in sorted(common):
        values = [steps[index].loss for steps in per_rank]
        if all(isinstance(v, (int, float)) for v in values):
            out[index] = _mean([float(v) for v in values if v is not None])
    return out


def _mean(values: list[float]) -> float:
    """The mean of ``values``: exactly rounded when all are finite, else NaN or an infinity as a sum makes it."""
    if all(map(math.isfinite, values)):
        return math.fsum(values) / len(values)
    return sum(values) / len(values)


def global_grad_norms(cfg: Config) -> dict[int, float]:
    """Per step: the global gradient norm (replicated: rank 0's; sharded on dim 0: over the
    shards); empty for another layout."""
    sharded = {_sharded(log) for log in cfg.logs}
    if len(sharded) != 1 or None in sharded or not cfg.logs:
        return {}
    per_rank = [_steps(log) for log in cfg.logs]
    common = set.intersection(*(set(s) for s in per_rank))
    out = {}
    for index in sorted(common):
        norms = [steps[index].grad_norm for steps in per_rank]
        if any(n is None for n in norms):
            continue
        values = [float(n) for n in norms if n is not None]
        out[index] = math.sqrt(math.fsum(v * v for v in values)) if True in sharded else values[0]
    return out


def full_params(cfg: Config, step: int) -> dict[str, np.ndarray] | None:
    """The full parameter tensors after ``step`` from the ranks' snapshots (names without wrapper
    prefixes), or None when not snapshotted or not joinable."""
    import numpy as np

    from .divergence import load_snapshot

    files = [cfg.snapshots(log.rank) / f"step-{step:07d}.npz" for log in sorted(cfg.logs, key=lambda x: x.rank)]
    if not files or not all(f.exists() for f in files):
        return None
    sharded = {_sharded(log) for log in cfg.logs}
    if len(sharded) != 1 or None in sharded:
        return None
    logs = sorted(cfg.logs, key=lambda x: x.rank)
    checked = [load_snapshot(f, log) for f, log in list(zip(files, logs))[: None if True in sharded else 1]]
    parts = [p for p in checked if p is not None]
    if len(parts) < len(checked):  # a snapshot with no recorded fingerprint to check it against
        return None
    names = parts[0].keys()
    if any(p.keys() != names for p in parts):
        return None
    return {
        _norm_name(n): np.concatenate([p[n] for p in parts], axis=0) if len(parts) > 1 else parts[0][n] for n in names
    }


def snapshot_steps(cfg: Config) -> set[int]:
    steps: set[int] | None = None
    for log in cfg.logs:
        here = {int(p.stem.split("-")[1]) for p in cfg.snapshots(log.rank).glob("step-*.npz")}
        steps = here if steps is None else steps & here
    return steps or set()


def dtype_eps(configs: list[Config]) -> tuple[str, float]:
    """The least precise parameter dtype of the runs, and its machine epsilon (float32 when unknown)."""
    dtypes = {d for cfg in configs for log in cfg.logs if (p := _layout(log)) for d in p.dtypes if d in EPS}
    worst = max(dtypes, key=lambda d: EPS[d], default="float32")
    return worst, EPS[worst]


def reduction_size(configs: list[Config]) -> int:
    """``n``: the largest fan-in of a parameter (the length of the dot products of its forward) times the
    most partial gradients a step adds (ranks times backward() calls): the longest sum whose order a
    change of configuration may change."""
    fan_in, partials = 1, 1
    for cfg in configs:
        for log in cfg.logs:
            layout = _layout(log)
            for shape in layout.shapes if layout else []:
                if len(shape) >= 2:
                    fan_in = max(fan_in, math.prod(shape[1:]))
            calls = max((s.backward_calls for s in log.of(Step)), default=1)
            partials = max(partials, cfg.world * max(calls, 1))
    return fan_in * partials


# --- the data each run saw --------------------------------------------------------------------------


def repeated_batches(cfg: Config, limit: int = 5) -> list[JsonObject]:
    """Batches a run saw twice: the same batch fingerprint on two ranks at one step
    (``same_batch_on_ranks``: a sampler given the wrong rank), or again at a later step
    (``batch_repeated``: an order that repeats, e.g. ``DistributedSampler.set_epoch`` not called)."""
    seen: dict[str, tuple[int, int]] = {}
    found: list[JsonObject] = []
    rows = sorted((s.index, log.rank, s.batch_fp) for log in cfg.logs for s in log.of(Step) if s.batch_fp and s.batches)
    for index, rank, fp in rows:
        assert fp is not None
        if fp in seen:
            first_step, first_rank = seen[fp]
            kind = "same_batch_on_ranks" if first_step == index else "batch_repeated"
            found.append(
                {"kind": kind, "step": index, "rank": rank, "first_step": first_step, "first_rank": first_rank}
            )
            if len(found) >= limit:
                break
        else:
            seen[fp] = (index, rank)
    return found


def _same_split(a: Config, b: Config) -> bool:
    """Whether the two configurations hand each rank the same batches per step (same ranks, same
    number of batches per step on each): then their batch fingerprints compare one to one."""
    if sorted(log.rank for log in a.logs) != sorted(log.rank for log in b.logs):
        return False
    by_rank = {log.rank: log for log in b.logs}
    for log in a.logs:
        counts_a = {s.index: s.batches for s in log.of(Step)}
        counts_b = {s.index: s.batches for s in by_rank[log.rank].of(Step)}
        if any(counts_b.get(i, n) != n for i, n in counts_a.items()):
            return False
    return True


# --- points: one quantity at one step, against the band -------------------------------------------


def tolerance(step: int, eps: float, n: int) -> float:
    """The relative difference float reassociation may make by the end of ``step`` (0-based):
    ``SAFETY * eps * sqrt(n) * (step + 1)``.

    >>> round(tolerance(0, 2 ** -23, 64) / 2 ** -23, 1)
    32.0
    """
    return SAFETY * eps * math.sqrt(n) * (step + 1)


@dataclass
class _Band:
    """One quantity's running envelopes: of the reference's noise, and of its magnitude (the
    scale distances are relative to: a value passing near zero does not make them blow up)."""

    envelope: float = 0.0
    scale: float = 0.0

    def widen(self, value: float) -> float:
        self.envelope = max(self.envelope, value)
        return self.envelope

    def size(self, value: float) -> float:
        if math.isfinite(value):
            self.scale = max(self.scale, abs(value))
        return self.scale or 1.0


def _point(
    step: int,
    quantity: str,
    a1: float,
    a2: float,
    b: float,
    band: _Band,
    tol: float,
    *,
    scale: float | None = None,
    rank: int | None = None,
    tensor: str | None = None,
    finite: tuple[bool, bool] | None = None,
) -> JsonObject:
    """One quantity at one step: the reference band (relative), B's distance, what is allowed and
    the status: ``within``, ``ambiguous`` (beyond the analytic tolerance by less than AMBIGUOUS when
    no band was measured), ``out``, or ``nonfinite`` (a reference run holds NaN or an infinity here:
    no band measured on such values can judge B). ``finite``: whether the reference (both runs) and B
    hold finite values (None: whether ``a1``, ``a2`` and ``b`` are finite). Distances are bit for bit
    where values are not finite (:func:`~.divergence.distance`)."""
    reference_finite, b_finite = finite or (math.isfinite(a1) and math.isfinite(a2), math.isfinite(b))
    size = band.size(scale if scale is not None else a1)
    noise = band.widen(distance(a1, a2) / size) if reference_finite else band.envelope
    diff = distance(a1, b) / size
    measured = BAND_FACTOR * noise
    allowed = max(measured, tol)
    governed = "band" if measured >= tol else "tolerance"
    ratio = diff / allowed if allowed > 0 else (0.0 if diff == 0 else math.inf)
    status = (
        "nonfinite"
        if not reference_finite
        else "within"
        if ratio <= 1
        else "ambiguous"
        if ratio <= AMBIGUOUS
        else "out"
    )
    return {
        "step": step,
        "quantity": quantity,
        "rank": rank,
        "tensor": tensor,
        "module": tensor.rpartition(".")[0] or None if tensor else None,
        "a": a1,
        "a2": a2,
        "b": b,
        "band_rel": noise,
        "diff_rel": diff,
        "allowed_rel": allowed,
        "governed_by": governed,
        "ratio": ratio if math.isfinite(ratio) else None,
        "status": status,
        "finite": {"reference": reference_finite, "b": b_finite},
    }


def _tensor_points(
    step: int,
    a1: dict[str, np.ndarray],
    a2: dict[str, np.ndarray],
    b: dict[str, np.ndarray],
    bands: dict[str, _Band],
    tol: float,
) -> list[JsonObject]:
    import numpy as np

    points = []
    for name, x in a1.items():
        y, z = a2.get(name), b.get(name)
        if y is None or z is None or y.shape != x.shape or z.shape != x.shape:
            continue
        scale = finite_magnitude(x)
        d2 = float(np.max(abs_difference(y, x))) if x.size else 0.0
        db = float(np.max(abs_difference(z, x))) if x.size else 0.0
        finite = (bool(np.isfinite(x).all() and np.isfinite(y).all()), bool(np.isfinite(z).all()))
        band = bands.setdefault(f"param:{name}", _Band())
        p = _point(step, "param", 0.0, d2, db, band, tol, scale=scale, tensor=name, finite=finite)
        p.update(a=scale, a2=None, b=None)
        points.append(p)
    return points


# --- the first divergence of each rank, bit for bit ------------------------------------------------


def rank_divergences(a: Config, b: Config) -> list[JsonObject]:
    """Per rank of either run, the first point in that rank's own order (step by step: batch, loss,
    gradients, parameters) where B's record differs from A's bit for bit, with the strength of its
    evidence: ``direct`` (a fingerprint of that tensor differs), ``inferred`` (only a downstream value
    differs, or earlier steps lacked the fingerprints that would show it first) or ``absent``
    (nothing comparable recorded). A rank with no difference is ``identical`` only when every
    fingerprint was there to compare."""
    by_rank_a = {log.rank: log for log in a.logs}
    by_rank_b = {log.rank: log for log in b.logs}
    same_world, same_split = a.world == b.world, _same_split(a, b)
    out = []
    for rank in sorted(by_rank_a.keys() | by_rank_b.keys()):
        la, lb = by_rank_a.get(rank), by_rank_b.get(rank)
        if la is None or lb is None:
            missing = a.label if la is None else b.label
            out.append(_rank_row(rank, "unknown", "absent", note=f"{missing} has no rank {rank}"))
            continue
        pa, pb = _layout(la), _layout(lb)
        same_layout = (
            pa is not None
            and pb is not None
            and [_norm_name(n) for n in pa.names] == [_norm_name(n) for n in pb.names]
            and (pa.shapes, pa.kinds) == (pb.shapes, pb.kinds)
        )
        out.append(_first_on_rank(rank, _steps(la), _steps(lb), pa, same_world, same_split, same_layout))
    return out


def _rank_row(rank: int, status: str, evidence: str, **more: Any) -> JsonObject:
    row: JsonObject = {"rank": rank, "status": status, "evidence": evidence, "step": None, "what": None}
    row.update({"tensor": None, "module": None, "note": None})
    row.update(more)
    return row


def _first_on_rank(
    rank: int,
    sa: dict[int, Step],
    sb: dict[int, Step],
    layout: Params | None,
    same_world: bool,
    same_split: bool,
    same_layout: bool,
) -> JsonObject:
    gaps: list[str] = []  # what was not there to compare on an earlier step
    common = sorted(sa.keys() & sb.keys())
    if not common:
        return _rank_row(rank, "unknown", "absent", note="no step recorded by both runs")
    for index in common:
        x, y = sa[index], sb[index]
        checks: list[tuple[str, Any, Any, bool, bool]] = [  # aspect, a, b, comparable, a fingerprint
            ("batch", x.batch_fp, y.batch_fp, same_split, True),
            ("loss", x.loss, y.loss, same_world, False),
            ("grads", x.grads_fp, y.grads_fp, same_layout, True),
            ("params", x.param_fps, y.param_fps, same_layout, True),
        ]
        for aspect, va, vb, comparable, fingerprint in checks:
            if not comparable:
                continue
            if va is None or vb is None:
                if fingerprint and f"{aspect} fingerprints" not in gaps:
                    gaps.append(f"{aspect} fingerprints")
                continue
            if va == vb or aspect == "loss" and same_value(va, vb):
                continue
            tensor = None
            if aspect == "params" and layout is not None:
                tensor = next((_norm_name(n) for n, p, q in zip(layout.names, va, vb) if p != q), None)
            evidence = "direct" if fingerprint and not gaps else "inferred"
            note = (
                "the gradient fingerprint covers all gradients together: no tensor is named"
                if aspect == "grads" and not gaps
                else "a value downstream of the tensors that differ: the difference starts earlier in this step's forward"
                if not fingerprint
                else f"earlier steps lacked {', '.join(gaps)}: it may start before"
                if gaps
                else None
            )
            return _rank_row(
                rank,
                "diverged",
                evidence,
                step=index,
                what=aspect,
                tensor=tensor,
                module=(tensor.rpartition(".")[0] or None) if tensor else None,
                note=note,
            )
    not_comparable = [
        what
        for what, ok in (("batches", same_split), ("losses", same_world), ("gradients and parameters", same_layout))
        if not ok
    ]
    if gaps or not_comparable:
        why = "; ".join(
            filter(None, [f"not recorded: {', '.join(gaps)}" if gaps else "", _not_comparable(not_comparable)])
        )
        compared = [what for what, ok in (("batches", same_split), ("losses", same_world)) if ok]
        agree = f"{' and '.join(compared)} agree bit for bit over {len(common)} step(s); " if compared else ""
        return _rank_row(rank, "unknown", "absent", note=agree + why)
    return _rank_row(rank, "identical", "direct", note=f"{len(common)} step(s) agree bit for bit")


def _not_comparable(what: list[str]) -> str:
    return f"{', '.join(what)} not comparable between the configurations (another split or layout)" if what else ""


# --- the verdict -------------------------------------------------------------------------------------


def judge(a1: Config, a2: Config, b: Config) -> JsonObject:
    """The ``compare`` section: B against the band of A1 and A2 (module docstring)."""
    dtype, eps = dtype_eps([a1, a2, b])
    n = reduction_size([a1, a2, b])
    notes: list[str] = []
    la1, la2, lb = global_losses(a1), global_losses(a2), global_losses(b)
    steps = sorted(la1.keys() & la2.keys() & lb.keys())
    points: list[JsonObject] = []
    bands: dict[str, _Band] = {}
    ga1, ga2, gb = global_grad_norms(a1), global_grad_norms(a2), global_grad_norms(b)
    snaps = snapshot_steps(a1) & snapshot_steps(a2) & snapshot_steps(b)
    per_rank = a1.world == b.world
    rank_steps = _by_rank(a1, a2, b) if per_rank else []
    tensors_compared = 0
    for step in steps:
        tol = tolerance(step, eps, n)
        points.append(_point(step, "loss", la1[step], la2[step], lb[step], bands.setdefault("loss", _Band()), tol))
        for rank, x, y, z in rank_steps:
            vals = [s[step].loss if step in s else None for s in (x, y, z)]
            if all(isinstance(v, (int, float)) for v in vals) and a1.world > 1:
                u, v, w = (float(x) for x in vals if x is not None)
                points.append(_point(step, "loss", u, v, w, bands.setdefault(f"loss{rank}", _Band()), tol, rank=rank))
        if step in ga1 and step in ga2 and step in gb:
            points.append(
                _point(step, "grad_norm", ga1[step], ga2[step], gb[step], bands.setdefault("grad", _Band()), tol)
            )
        if step in snaps:
            p1, p2, pb = full_params(a1, step), full_params(a2, step), full_params(b, step)
            if p1 is not None and p2 is not None and pb is not None:
                tensor_points = _tensor_points(step, p1, p2, pb, bands, tol)
                tensors_compared += len(tensor_points)
                points += tensor_points
    skipped = [i for i in sorted(la1) if steps and i < steps[0]]
    if skipped:
        notes.append(
            f"steps {skipped[0]}-{skipped[-1]} of A were not compared: B recorded none of them (a resumed run "
            "starts at its checkpoint); the verdict covers the steps compared"
        )
    data = _data_order(a1, a2, b, notes)
    # in the order a step happens; at one step a rank's own value before the mean over ranks
    points = sorted(data + points, key=lambda p: (p["step"], _ORDER.index(p["quantity"]), p["rank"] is None))
    first_out = next((p for p in points if p["status"] == "out"), None)
    first_ambiguous = next((p for p in points if p["status"] == "ambiguous"), None)
    # a reference that is not finite before B leaves it: nothing after it can be judged
    unjudged = next((p for p in points if p["status"] in ("nonfinite", "out")), None)
    first_nonfinite = unjudged if unjudged is not None and unjudged["status"] == "nonfinite" else None
    endings = [a1.ending, a2.ending, b.ending]
    ranks = rank_divergences(a1, b)
    uncovered = _uncovered(steps, {cfg.label: set(x) for cfg, x in ((a1, la1), (a2, la2), (b, lb))})
    if not tensors_compared:
        uncovered.append(_no_tensors([a1, a2, b], snaps))
    verdict, reason, decide = _verdict(first_out, first_ambiguous, first_nonfinite, steps, endings, bands, uncovered)
    return {
        "verdict": verdict,
        "reason": reason,
        "decide": decide,
        "steps_compared": len(steps),
        "first_step": steps[0] if steps else None,
        "last_step": steps[-1] if steps else None,
        "steps_a": len(la1),
        "steps_b": len(lb),
        "tensors_compared": tensors_compared,
        "tolerance": {
            "dtype": dtype,
            "eps": eps,
            "reduction_size": n,
            "safety": SAFETY,
            "band_factor": BAND_FACTOR,
            "ambiguous_factor": AMBIGUOUS,
            "formula": "allowed(k) = max(band_factor * band(k), safety * eps * sqrt(reduction_size) * (k + 1))",
        },
        "band": {
            "zero": all(band.envelope == 0 for band in bands.values()),
            "loss_rel": bands["loss"].envelope if "loss" in bands else None,
            "params_rel": max((v.envelope for k, v in bands.items() if k.startswith("param:")), default=None),
        },
        "first_out": first_out,
        "first_ambiguous": first_ambiguous,
        "first_nonfinite": first_nonfinite,
        "out_at_first": [
            p["tensor"] or p["quantity"]
            for p in points
            if first_out and p["step"] == first_out["step"] and p["status"] == "out"
        ][:20],
        "series": _series(points),
        "per_rank": ranks,
        "data_order": {cfg.label: repeated_batches(cfg) for cfg in (a1, b)},
        "bit_exact": all(r["status"] == "identical" for r in ranks) and bool(ranks),
        "endings": [e.to_json() for e in endings],
        "ended_normally": all(e.ok for e in endings),
        "unreadable": any(e.unreadable for e in endings),
        "notes": notes,
    }


_ORDER = ("batch", "loss", "grad_norm", "param")


def _by_rank(a1: Config, a2: Config, b: Config) -> list[tuple[int, dict[int, Step], dict[int, Step], dict[int, Step]]]:
    """Per rank all three runs have (configurations with the same ranks): its steps in each."""
    logs = [{log.rank: log for log in cfg.logs} for cfg in (a1, a2, b)]
    ranks = sorted(logs[0].keys() & logs[1].keys() & logs[2].keys())
    return [(r, _steps(logs[0][r]), _steps(logs[1][r]), _steps(logs[2][r])) for r in ranks]


def _data_order(a1: Config, a2: Config, b: Config, notes: list[str]) -> list[JsonObject]:
    """Points for the data: B's batches against A's (same split, when the reference's own batches
    are reproducible), and batches B sees twice that the reference does not."""
    points: list[JsonObject] = []
    if _same_split(a1, b) and _same_split(a1, a2):
        by_rank = _by_rank(a1, a2, b)
        reproducible = all(x[i].batch_fp == y[i].batch_fp for _, x, y, _ in by_rank for i in x.keys() & y.keys())
        if not reproducible:
            notes.append("the reference's batches differ between its two runs: the data order is not compared")
        else:
            for rank, x, _, z in by_rank:
                for i in sorted(x.keys() & z.keys()):
                    if x[i].batch_fp and z[i].batch_fp and x[i].batch_fp != z[i].batch_fp:
                        points.append(_batch_point(i, rank, "another batch than the reference's at this step"))
                        break
    if repeated_batches(b) and not repeated_batches(a1):
        first = repeated_batches(b, limit=1)[0]
        what = (
            f"the same batch as rank {first['first_rank']}"
            if first["kind"] == "same_batch_on_ranks"
            else f"the batch of step {first['first_step']} again"
        )
        points.append(_batch_point(first["step"], first["rank"], what))
    return points


def _batch_point(step: int, rank: int, what: str) -> JsonObject:
    return {
        "step": step,
        "quantity": "batch",
        "rank": rank,
        "tensor": None,
        "module": None,
        "status": "out",
        "detail": what,
        "governed_by": "fingerprint",
    }


def _series(points: list[JsonObject]) -> list[JsonObject]:
    """Per step: the global loss point and the worst tensor (by ratio), for the report's table."""
    rows: dict[int, JsonObject] = {}
    for p in points:
        row = rows.setdefault(p["step"], {"step": p["step"], "status": "within"})
        if p["quantity"] == "loss" and p["rank"] is None:
            row.update(
                loss_a=p["a"],
                loss_a2=p["a2"],
                loss_b=p["b"],
                loss_band_rel=p["band_rel"],
                loss_diff_rel=p["diff_rel"],
                allowed_rel=p["allowed_rel"],
            )
        if p["quantity"] == "param" and (p["ratio"] or 0) >= (row.get("param_ratio") or 0):
            row.update(
                param=p["tensor"], param_band_rel=p["band_rel"], param_diff_rel=p["diff_rel"], param_ratio=p["ratio"]
            )
        rank = {"within": 0, "ambiguous": 1, "nonfinite": 2, "out": 3}
        if rank[p["status"]] > rank[row["status"]]:
            row["status"] = p["status"]
    return [rows[k] for k in sorted(rows)]


def _uncovered(steps: list[int], recorded: dict[str, set[int]]) -> list[str]:
    """What a run recorded that was not compared, from the first compared step on (a run resumed at
    a checkpoint starts later: the steps before are a note): steps only some runs ran. Empty when
    every run's steps are the compared ones."""
    compared = set(steps)
    out = []
    for label, own in recorded.items():
        extra = sorted(i for i in own - compared if not steps or i > steps[0])
        if extra:
            others = [other for other, theirs in recorded.items() if other != label and not set(extra) <= theirs]
            out.append(
                f"{label} recorded {len(extra)} step(s) ({_span(extra)}) that {' and '.join(others)} did not: "
                "not compared"
            )
    return out


def _span(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"


def _no_tensors(configs: list[Config], common: set[int]) -> str:
    """Why no parameter tensor was compared: a run kept no snapshot, the runs kept none at a step in
    common, or their shards cannot be joined."""
    bare = [cfg.label for cfg in configs if not snapshot_steps(cfg)]
    why = (
        f"{' and '.join(bare)} kept no parameter snapshot"
        if bare
        else "the runs kept no parameter snapshot at a step in common"
        if not common
        else "a layout whose shards cannot be joined"
    )
    return f"no parameter tensor compared ({why}): the loss and gradient norm alone do not show the parameters agree"


def _verdict(
    first_out: JsonObject | None,
    first_ambiguous: JsonObject | None,
    first_nonfinite: JsonObject | None,
    steps: list[int],
    endings: list[Ending],
    bands: dict[str, _Band],
    uncovered: list[str],
) -> tuple[str, str, str | None]:
    """(``equivalent`` | ``different`` | ``abstain``, why, what would decide it)."""
    failed = [f"{e.label}: {e.problems[0]}" for e in endings if not e.ok]
    if first_nonfinite is not None:
        p = first_nonfinite
        bad = next((v for v in (p["a"], p["a2"]) if v is not None and not math.isfinite(v)), math.nan)
        held = "holds NaN or inf" if p["quantity"] == "param" else f"is {value_text(bad)}"
        return (
            "abstain",
            f"A's {_what(p)} {held} at step {p['step']}: A's run-to-run band is not finite there, and no band "
            "of values that are not finite can judge B",
            "a reference that trains on finite values (the NONFINITE findings say where it first does not)",
        )
    if first_out is not None:
        return "different", _where(first_out), None
    if failed:
        return "abstain", "not every run ended normally (" + "; ".join(failed) + ")", "runs that end normally"
    if len(steps) < MIN_STEPS:
        return (
            "abstain",
            f"{len(steps)} step(s) compared, fewer than {MIN_STEPS}",
            f"run at least {MIN_STEPS} steps in both configurations",
        )
    if first_ambiguous is not None:
        p = first_ambiguous
        if p["governed_by"] == "tolerance":
            return (
                "abstain",
                f"the reference is bit-exact (no band to measure) and B leaves the reassociation tolerance at step "
                f"{p['step']} ({_what(p)}) by {p['ratio']:.3g}x, less than the {AMBIGUOUS:g}x that would be a "
                "difference",
                "a reference with measured noise (run A where its float sums reorder, e.g. another thread count or "
                "another GPU), or more steps: a real difference grows, reassociation noise stays near the tolerance",
            )
        return (
            "abstain",
            f"B leaves A's measured band at step {p['step']} ({_what(p)}) by {p['ratio']:.3g}x, less than the "
            f"{AMBIGUOUS:g}x that would be a difference: two reference runs sample the noise once",
            "compare again (a difference that stays beyond the band is real; noise moves), or more steps",
        )
    wide = max((band.envelope for band in bands.values()), default=0.0)
    if wide > BAND_TOO_WIDE:
        return (
            "abstain",
            f"the reference's own noise reaches {wide:.1%} of a value: too wide a band to tell configurations apart",
            "make the reference reproducible first (torchrepro check), then compare",
        )
    if uncovered:  # never equivalent over what one side did not run, or without its parameters
        return (
            "abstain",
            "; ".join(uncovered),
            "every run recording the same steps, with its parameter snapshots (compare keeps them)",
        )
    return "equivalent", f"{len(steps)} step(s) (steps {steps[0]}-{steps[-1]})", None


def _what(p: JsonObject) -> str:
    if p["quantity"] == "param":
        return f"parameter {p['tensor']}"
    if p["quantity"] == "batch":
        return "batch"
    return str(p["quantity"]).replace("_", " ") + (f" of rank {p['rank']}" if p.get("rank") is not None else "")


def _where(p: JsonObject) -> str:
    if p["quantity"] == "batch":
        return f"step {p['step']}, rank {p['rank']}: {p['detail']}"
    if not p["finite"]["b"]:  # NaN or inf in B where A's values are finite: no relative distance to state
        if p["quantity"] == "param":
            return f"step {p['step']}: {_what(p)} holds NaN or inf in B, and only finite values in A"
        return f"step {p['step']}: {_what(p)} is {value_text(p['b'])} in B, {value_text(p['a'])} in A"
    return (
        f"step {p['step']}: {_what(p)} differs by {p['diff_rel']:.3g} (relative), "
        f"{'the band allows' if p['governed_by'] == 'band' else 'the reassociation tolerance allows'} {p['allowed_rel']:.3g}"
    )


def verdict_line(section: JsonObject) -> str:
    """The one-line summary of a ``compare`` section."""
    v = section["verdict"]
    if v == "equivalent":
        exact = " (bit for bit)" if section.get("bit_exact") else ""
        return f"EQUIVALENT{exact}: B stays within A's run-to-run band over {section['reason']}"
    if v == "different":
        return f"DIFFERENT at {section['reason']}"
    return f"ABSTAIN: {section['reason']}; to decide: {section['decide']}"


_REPEATS = {
    "same_batch_on_ranks": "rank {rank} received the same batch as rank {first_rank} at step {step}: a sampler given "
    "the wrong rank (or none) sends every sample to several ranks, and others to none",
    "batch_repeated": "rank {rank} at step {step} received the batch of step {first_step} (rank {first_rank}) again: "
    "the data order repeats (DistributedSampler.set_epoch(epoch) not called each epoch?)",
}


def findings(section: JsonObject) -> list[Finding]:
    """The findings of a ``compare`` section: the first point out of the band, why it abstains, the
    batches B saw twice, and the tolerance a bit-exact reference is held to."""
    out: list[Finding] = []
    first = section.get("first_out")
    if section["verdict"] == "different" and first is not None:
        out.append(
            Finding(
                "COMPARE_DIFFERENT",
                "error",
                f"B leaves A's band at {section['reason']}",
                "the configurations do not train the same model: look at what B changes before this step "
                "(loss scaling under accumulation, the data each rank gets, what is reduced over ranks)",
                {"first_out": first, "out_at_first": section.get("out_at_first", [])},
            )
        )
    if section["verdict"] == "abstain":
        out.append(Finding("COMPARE_ABSTAIN", "warning", section["reason"], f"to decide: {section['decide']}", {}))
    for label, repeats in section.get("data_order", {}).items():
        for r in repeats[:1]:
            out.append(
                Finding(
                    "REPEATED_BATCHES",
                    "error" if label == "b" else "warning",
                    f"{label}: " + _REPEATS[r["kind"]].format(**r),
                    "give DistributedSampler num_replicas=world size and rank=this rank, and call "
                    "sampler.set_epoch(epoch) at the start of every epoch",
                    {"run": label, "repeats": repeats},
                )
            )
    if section["band"]["zero"] and section["verdict"] != "different":
        tol = section["tolerance"]
        out.append(
            Finding(
                "REFERENCE_BIT_EXACT",
                "info",
                f"A is bit-exact run to run (band zero): B is held to the reassociation tolerance "
                f"{tol['safety']:g} * eps({tol['dtype']}) * sqrt({tol['reduction_size']}) * (step + 1)",
                "",
                {"tolerance": tol},
            )
        )
    return out


def compare_report(
    section: JsonObject,
    run_dirs: dict[str, str],
    timings: dict[str, float],
    meta: JsonObject,
    configs: Sequence[Config] = (),
) -> CompareReport:
    """The :class:`~torchrepro.reports.compare_report.CompareReport` of a judged comparison, with the
    non-finite values and uninitialised parameters of its runs (``configs``), and a ``--warm-from``
    pack kept from them (``meta``)."""
    runs = of_runs({cfg.label: nonfinite_findings(cfg.logs) for cfg in configs}) + warm_start_findings(meta)
    return CompareReport(CheckRun(run_dirs, timings, meta), section, findings(section) + runs, verdict_line(section))
