"""Step events without code changes.

- The step clock is a global optimizer post-step hook: the first optimizer that steps is the
  clock; each of its ``step()`` calls ends a training step.
- The loss is the scalar that ``.backward()`` was called on (``torch.autograd.backward`` is
  wrapped; the wrapper keeps a detached reference, no copy, no sync).
- Batches are fingerprinted as the DataLoader iterator hands them out.
- Parameter fingerprints (after the step), gradient fingerprints and norm (before it) and the
  RNG-state fingerprint (at its start) come from :mod:`torchrepro.fingerprint` and
  :mod:`torchrepro.rng`.

Every wrapper calls straight through when Dynamo is tracing, so compiled code sees exactly the
functions it would see without torchrepro.
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..events import Capability, Event, InitParams, Params, Step
from ..fingerprint import fingerprint, hash_bytes
from ..rng import combine, live_fingerprints

_AUTO_WARMUP = 5  # steps fingerprinted every time while the cost of a fingerprint is measured
_OVERHEAD_BUDGET = 0.01  # automatic interval: all capture work at most 1 % of step time ...
_SAFETY = 2.0  # ... with fingerprints planned at twice their measured cost (first-step timings are noisy)


@dataclass
class StepConfig:
    """What to record per step. ``fingerprint_every=None`` chooses the interval from the
    measured cost (every step when it costs < 1 % of step time)."""

    fingerprint_every: int | None = None
    grads: bool = False
    batches: bool = True
    rng: bool = True
    snapshots: bool = False  # save parameter values (npz) at steps 0-15, powers of two, and the last


class StepRecorder:
    """Installs the hooks and wrappers; writes one :class:`Step` event per optimizer step."""

    def __init__(self, emit: Callable[[Event], None], rank: int = 0, config: StepConfig | None = None,
                 snapshot_dir: Path | None = None):
        self._emit, self.rank, self.snapshot_dir = emit, rank, snapshot_dir
        self.config = config or StepConfig()
        self.completed = 0
        self.every = self.config.fingerprint_every
        self._clock_optimizer: Any = None
        self._params: list[torch.Tensor] | None = None
        self._losses: list[torch.Tensor] = []
        self._batch_fps: list[str] = []
        self._grads: tuple[str, float] | None = None
        self._compiles = 0
        self._start = time.perf_counter()
        self._rng_fps: dict[str, str] | None = None
        self._rng_at: str | None = None
        self._own = 0.0
        self._step_times: list[float] = []
        self._fp_costs: list[float] = []
        self._own_costs: list[float] = []
        self._undo: list[Callable[[], None]] = []
        self.failed = False
        self._names: list[str] | None = None
        self._last_snapshot: int | None = None
        self.listeners: list[Callable[[int], None]] = []  # called with each finished step's index

    def _safe(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Observer bugs must never reach the user's script: the first one is recorded as a
        ``capture_error`` event and step capture stops; the run goes on untouched."""

        def guarded(*args: Any, **kwargs: Any) -> None:
            if self.failed:
                return
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - deliberately total
                self.failed = True
                self._emit(Capability(rank=self.rank, step=self.completed, name="capture_error", available=False,
                                      note=f"step capture stopped: {type(exc).__name__}: {exc}"))

        return guarded

    # --- installation -------------------------------------------------------------------
    def install(self) -> list[Capability]:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._undo.append(register_optimizer_step_post_hook(self._safe(self._on_step)).remove)
        if self.config.grads:
            self._undo.append(register_optimizer_step_pre_hook(self._safe(self._on_pre_step)).remove)
        # Dynamo graph-breaks on Tensor.backward() before reaching Python, so this wrapper only ever
        # runs eagerly (and must stay plain: compiled autograd runs inside it).
        self._wrap(torch.autograd, "backward", self._safe(self._note_backward))
        caps = [Capability(name="steps", available=True, note="global optimizer step hook")]
        caps += self._watch_fully_shard()
        if self.config.batches:
            iter_cls = getattr(torch.utils.data.dataloader, "_BaseDataLoaderIter", None)
            if iter_cls is None:
                caps.append(Capability(name="batches", available=False, note="no DataLoader iterator class to observe"))
            else:
                self._wrap(iter_cls, "__next__", None, after=self._safe(self._note_batch), hide_from_dynamo=True)
                caps.append(Capability(name="batches", available=True, note="DataLoader iterator"))
        return caps

    def _wrap(self, owner: Any, name: str, before: Callable | None, after: Callable | None = None,
              hide_from_dynamo: bool = False) -> None:
        """Replace ``owner.name`` by a wrapper calling ``before``/``after`` around the original.
        ``hide_from_dynamo``: if compiled code calls it, Dynamo breaks the graph at the user's
        call, as it would for the original, instead of tracing into torchrepro."""
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            if torch.compiler.is_compiling():
                return original(*args, **kwargs)
            if before is not None:
                before(*args, **kwargs)
            result = original(*args, **kwargs)
            if after is not None:
                after(result)
            return result

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        if hide_from_dynamo:
            wrapper = torch.compiler.disable(wrapper)
        setattr(owner, name, wrapper)
        self._undo.append(lambda: setattr(owner, name, original))

    def _watch_fully_shard(self) -> list[Capability]:
        """Fingerprint each module's full parameters just before FSDP2 shards them (FSDP2 does not
        broadcast: ranks that built different parameters train a silent mix)."""
        try:
            import torch.distributed.fsdp as fsdp
        except ImportError:
            return []
        if not hasattr(fsdp, "fully_shard"):
            return [Capability(name="fsdp2_init", available=False, note="no torch.distributed.fsdp.fully_shard")]

        def before(module: Any, *args: Any, **kwargs: Any) -> None:
            named = [(n, p) for n, p in module.named_parameters() if not hasattr(p, "placements")]
            fps = ["meta" if p.is_meta else fingerprint(p)[:16] for _, p in named]
            self._emit(InitParams(rank=self.rank, step=self.completed, source="fully_shard",
                                  module=type(module).__name__, names=[n for n, _ in named], fps=fps))

        self._wrap(fsdp, "fully_shard", self._safe(before), hide_from_dynamo=True)
        return [Capability(name="fsdp2_init", available=True, note="fully_shard: full parameters before sharding")]

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def note_compile(self) -> None:
        self._compiles += 1

    # --- observers ----------------------------------------------------------------------
    def _read_rng(self, at: str) -> None:
        """Once per step: the RNG state when its first batch is fetched (a new epoch's iterator
        has drawn its seed by then), else at its first backward() (after any seeding)."""
        if self._rng_fps is None and self.config.rng:
            self._rng_fps, self._rng_at = live_fingerprints(), at

    def _note_backward(self, tensors: Any = None, *args: Any, **kwargs: Any) -> None:
        t0 = time.perf_counter()
        self._read_rng("backward")
        if isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
            self._losses.append(tensors.detach())
        self._own += time.perf_counter() - t0

    def _note_batch(self, batch: Any) -> None:
        t0 = time.perf_counter()
        self._read_rng("batch")
        try:
            self._batch_fps.append(fingerprint(batch))
        except (TypeError, ValueError):
            self._batch_fps.append("unhashable")
        self._own += time.perf_counter() - t0

    def _on_pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._is_clock(optimizer):
            return
        grads = [_local(p.grad) for p in self._optimizer_params(optimizer) if p.grad is not None]
        if not grads:
            return
        norms = torch._foreach_norm([g.detach() for g in grads])
        norm = float(torch.linalg.vector_norm(torch.stack([n.float() for n in norms])))
        self._grads = (hash_bytes(*(fingerprint(g).encode() for g in grads))[:16], norm)

    def _is_clock(self, optimizer: Any) -> bool:
        if self._clock_optimizer is None:
            self._clock_optimizer = optimizer
        return optimizer is self._clock_optimizer

    @staticmethod
    def _optimizer_params(optimizer: Any) -> list[torch.Tensor]:
        return [p for group in optimizer.param_groups for p in group["params"]]

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._is_clock(optimizer):
            return
        now = time.perf_counter()
        step_time = now - self._start
        index = self.completed
        if self._params is None:
            self._params = self._optimizer_params(optimizer)
            self._names = _param_names(self._params)
            self._emit(Params(rank=self.rank, names=self._names, shapes=[list(p.shape) for p in self._params],
                              dtypes=[str(p.dtype).replace("torch.", "") for p in self._params],
                              kinds=[_kind(p) for p in self._params]))
        event = Step(rank=self.rank, step=index, index=index, time_s=round(step_time, 6),
                     backward_calls=len(self._losses), compiles=self._compiles)
        if self._losses:
            event.loss = float(torch.stack([x.float().reshape(()) for x in self._losses]).mean())
        if self._batch_fps:
            event.batches = len(self._batch_fps)
            event.batch_fp = hash_bytes(*(f.encode() for f in self._batch_fps))[:16]
        if self._grads is not None:
            event.grads_fp, event.grad_norm = self._grads[0], round(self._grads[1], 9)
        if self._rng_fps is not None:
            event.rng_fps, event.rng_fp, event.rng_at = self._rng_fps, combine(self._rng_fps), self._rng_at
        fp_cost = 0.0
        if self._should_fingerprint(index):
            t0 = time.perf_counter()
            digests = [fingerprint(_local(p)) for p in self._params]
            event.param_fps = [d[:16] for d in digests]
            event.params_fp = hash_bytes(*(d.encode() for d in digests))[:16]
            fp_cost = time.perf_counter() - t0
        if self.config.snapshots and (index < 16 or index & (index - 1) == 0):
            self._snapshot(index)
        self._emit(event)
        own = self._own + (time.perf_counter() - now) - fp_cost
        self._choose_interval(index, step_time - self._own, fp_cost, own)
        self.completed += 1
        self._reset_step()
        for listener in self.listeners:
            listener(index)
        self._start = time.perf_counter()

    def _reset_step(self) -> None:
        self._losses, self._batch_fps, self._grads, self._compiles = [], [], None, 0
        self._rng_fps, self._rng_at, self._own = None, None, 0.0

    def restart_at(self, step: int) -> None:
        """A resumed run continues at ``step``: number its steps from there and forget what the
        restore itself fetched (the skipped batches)."""
        self.completed = step
        self._reset_step()
        self._start = time.perf_counter()

    def _should_fingerprint(self, index: int) -> bool:
        if self.every is None:
            return True  # still measuring
        return index % self.every == 0

    def _choose_interval(self, index: int, step_time: float, fp_cost: float, own: float) -> None:
        """Automatic interval: all of capture's per-step work — the fixed part (RNG and batch
        digests, the event) plus parameter fingerprints every N steps — within 1 % of step time."""
        if self.config.fingerprint_every is not None or self.every is not None:
            return
        if index >= 1:  # step 0 holds the first compile
            self._step_times.append(step_time)
            self._fp_costs.append(fp_cost)
            self._own_costs.append(own)
        if len(self._step_times) >= _AUTO_WARMUP:
            step, cost, fixed = (statistics.median(x) for x in (self._step_times, self._fp_costs, self._own_costs))
            budget = _OVERHEAD_BUDGET * step
            room = max(budget - fixed, budget / 10)
            self.every = max(1, math.ceil(_SAFETY * cost / room))
            self._emit(Capability(rank=self.rank, step=index, name="fingerprint_interval", available=True,
                                  note=f"every {self.every} step(s): a parameter fingerprint costs {cost * 1e3:.3f} ms, "
                                       f"other capture work {fixed * 1e3:.3f} ms, a step {step * 1e3:.3f} ms"))

    def _snapshot(self, index: int) -> None:
        arrays = {name: _to_numpy(p) for name, p in zip(self._names, self._params)}
        folder = Path(self.snapshot_dir or "snapshots")
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".step-{index:07d}.tmp.npz"
        np.savez(tmp, **arrays)
        os.replace(tmp, folder / f"step-{index:07d}.npz")
        self._last_snapshot = index

    def flush(self) -> None:
        """At the end of the run: snapshot the final parameters if the schedule skipped them."""
        if self.config.snapshots and self._params is not None and self.completed:
            if self._last_snapshot != self.completed - 1:
                self._snapshot(self.completed - 1)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (FSDP2 shards, tensor-parallel pieces); a plain tensor as is."""
    return t.to_local() if hasattr(t, "to_local") else t


def _to_numpy(p: torch.Tensor) -> np.ndarray:
    t = _local(p).detach().cpu()
    return (t.float() if t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2) else t).numpy().copy()


def _kind(p: torch.Tensor) -> str:
    placements = getattr(p, "placements", None)
    return "tensor" if placements is None else "dtensor:" + ",".join(str(x) for x in placements)


def _is_module(obj: Any) -> bool:
    try:
        return isinstance(obj, torch.nn.Module)
    except ReferenceError:  # a dead weak proxy
        return False


def _param_names(params: list[torch.Tensor]) -> list[str]:
    """Names of the optimizer's parameters, from the module that owns them (found once, by a
    scan of live modules: the one covering most of them with the shortest names)."""
    wanted = {id(p) for p in params}
    best: tuple[int, int, dict[int, str]] | None = None
    with warnings.catch_warnings():  # isinstance() on deprecated module attributes warns
        warnings.simplefilter("ignore")
        objects = gc.get_objects()
        modules = [obj for obj in objects if _is_module(obj)]
    for obj in modules:
        try:
            names = {id(p): n for n, p in obj.named_parameters() if id(p) in wanted}
        except Exception:  # dead weak proxies, modules whose named_parameters misbehave
            continue
        if not names:
            continue
        score = (len(names), -sum(len(n) for n in names.values()))
        if best is None or score > best[:2]:
            best = (*score, names)
    found = best[2] if best else {}
    return [found.get(id(p), f"param{i}") for i, p in enumerate(params)]
