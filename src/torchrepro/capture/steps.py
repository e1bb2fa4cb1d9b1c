"""Step events without code changes.

- The step clock is a global optimizer post-step hook: the first optimizer that steps is the
  clock; each of its ``step()`` calls ends a training step. A script that creates no
  ``torch.optim`` optimizer (parameters updated by hand, or no update at all) is clocked by
  ``backward()``: each call ends the step the previous one began (the last one ends at exit).
- The loss is the scalar that ``.backward()`` was called on (``torch.autograd.backward`` is
  wrapped: a CPU loss is read there, ``item()``, while it is in the caches; of a device loss the
  wrapper keeps a detached reference, no copy, no sync, read back with the step), at its own precision. A
  step's loss is what the script prints for it (docs/commands.md, "the loss of a step"): with one ``backward()``, its
  value; with several before the step (gradient accumulation: micro-losses scaled for
  ``backward()``), their sum in the losses' dtype, added in order as ``total += loss`` adds
  them; with a closure passed to ``optimizer.step()`` (LBFGS calls it many times), the first
  value, which ``step(closure)`` returns. ``loss_last`` keeps the last value of a step of
  several ``backward()`` calls, ``backward_calls`` their count.
- Batches are fingerprinted as the DataLoader iterator hands them out; a step that fetched no
  DataLoader batch is fingerprinted by the tensors passed to its outermost module call
  (``nn.Module.__call__`` is wrapped; calls inside compiled code pass straight through).
- The parameters as training starts (at the first outermost module call, before its forward)
  are fingerprinted once (an ``InitParams`` event with ``source="first_forward"``).
- Parameter fingerprints (after the step), gradient fingerprints and norm (before it) and the
  RNG-state fingerprint (at its start) come from :mod:`torchrepro.digests` and
  :mod:`torchrepro.rng`.

Every wrapper calls straight through when Dynamo is tracing, so compiled code sees exactly the
functions it would see without torchrepro. Dynamo is told to skip or not trace them once it is
imported (:mod:`.on_import`): a script that never compiles never imports it.

What runs once a step runs cold (the step's own work evicted the caches), so it touches as little as
it can (docs/performance.md, "What doctor costs a step"): the wrappers call straight through when
there is nothing to observe (``_modes``), and a step that records no digest (``doctor`` in one
process) is written from its values, without building its ``Step`` (``emit_step``).
"""

from __future__ import annotations

import gc
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from .. import _compat as compat
from ..eventlog.events import Capability, Event, InitParams, Params, Setting, Step
from ..digests import DeviceDigest, fingerprint, fingerprint_later, hash_bytes
from ..rng import combine, live_fingerprints
from .on_import import when_imported
from .readback import Readback
from .snapshots import SnapshotWriter

Digest = str | DeviceDigest  # a fingerprint, or one whose device sums are still to be read

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
    snapshots: bool = (
        False  # parameter sketches at steps 0-15, powers of two and the last; the last step whole (snapshots.py)
    )
    # doctor: RNG, batch and parameter digests only while the process is one of several ranks (the
    # cross-rank checks compare them); one process's compile health needs none (docs/performance.md)
    ranks_only: bool = False


class StepRecorder:
    """Installs the hooks and wrappers; writes one :class:`Step` event per optimizer step."""

    def __init__(
        self,
        emit: Callable[[Event], None],
        emit_step: Callable[[float, int, float | None, int, float, int], bool],
        rank: int = 0,
        config: StepConfig | None = None,
        snapshot_dir: Path | None = None,
    ):
        """``emit_step(t, index, loss, backward_calls, time_s, compiles)`` writes a common step from
        its values (``CaptureSession.emit_step``), False when ``emit`` must take its ``Step``."""
        self._readback = Readback(emit)  # step values read back in batches (no device sync per step)
        self._emit, self.rank, self.snapshot_dir = self._readback.emit, rank, snapshot_dir
        self._emit_step = emit_step
        self.config = config or StepConfig()
        self.completed = 0
        self.every = self.config.fingerprint_every
        self._digests = True  # RNG, batch and parameter digests are taken (see StepConfig.ranks_only)
        self._clock_optimizer: Any = None
        self._params: list[torch.Tensor] | None = None
        self._losses: list[torch.Tensor] = []  # device losses, read back at the batch point
        self._loss_values: list[float] = []  # CPU losses, read in backward()
        self._loss_dtype = torch.float32  # the CPU losses' (several are added in it)
        self._closure = False  # the clock's step() was given a closure (its backward() calls are inside it)
        self._batch_fps: list[str] = []
        self._batch_fp = ""  # the combination of _batch_fps
        self._grads: tuple[list[Digest], torch.Tensor] | None = None
        self._compiles = 0
        self._start = time.perf_counter()
        self._rng_fps: dict[str, str] | None = None
        self._rng_at: str | None = None
        self._rng_last: tuple[dict[str, str] | None, str] = (None, "")  # the last RNG digests and their combination
        self._own = 0.0
        self._step_times: list[float] = []
        self._fp_costs: list[float] = []
        self._own_costs: list[float] = []
        self._undo: list[Callable[[], None]] = []
        self.failed = False
        self._names: list[str] | None = None
        self._last_snapshot: int | None = None
        self._snapshots: SnapshotWriter | None = None
        self._snapshots_skipped = False  # a full snapshot was not written (said once)
        self.listeners: list[Callable[[int], None]] = []  # called with each finished step's index
        self.clock: str | None = None  # "optimizer" or "backward", once known
        self._optimizers_made = 0
        self._pending_backward = False  # backward clock: a step has begun and not ended yet
        self._input_fps: list[list[Digest]] = []
        self._in_module = False
        self._called: list[Any] = []  # the outermost modules called before the parameters are named
        self._init_done = False
        self._first_index = 0
        self._modes()

    def _modes(self) -> None:
        """What the per-step paths test once per change instead of every step (called whenever what
        they derive from changes): ``_timing``, capture times its own work (only while the automatic
        interval is measured: nothing else reads it); ``_plain``, a step records no digest, batch,
        gradient or snapshot (doctor in one process), so ``_end_step`` may write it from its values
        (``emit_step``, no ``Step`` built); ``_backward_clock``, ``backward()`` is the step clock (no
        optimizer exists: none was created, none stepped); ``_batches``, the DataLoader's batches are
        fingerprinted; ``_calls_idle``, the outermost module call has nothing to observe (clock,
        names, initial parameters known; no input digests)."""
        config = self.config
        self._timing = self.every is None and self._digests
        self._plain = not (self._digests or config.rng or config.batches or config.grads or config.snapshots)
        self._backward_clock = self.clock != "optimizer" and self._optimizers_made == 0
        self._batches = config.batches
        self._calls_idle = not (self._backward_clock or self._names is None or not self._init_done or config.batches)

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
                self._emit(
                    Capability(
                        rank=self.rank,
                        step=self.completed,
                        name="capture_error",
                        available=False,
                        note=f"step capture stopped: {type(exc).__name__}: {exc}",
                    )
                )

        return guarded

    # --- installation -------------------------------------------------------------------
    def install(self) -> list[Capability]:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._undo.append(register_optimizer_step_post_hook(self._safe(self._on_step)).remove)
        if self.config.grads:
            self._undo.append(register_optimizer_step_pre_hook(self._safe(self._on_pre_step)).remove)
        # Dynamo graph-breaks on Tensor.backward() before reaching Python, so this wrapper only ever
        # runs eagerly (and must stay plain: compiled autograd runs inside it).
        before, after = self._safe(self._note_backward), self._safe(self._after_backward)
        self._wrap(torch.autograd, "backward", before, after=after, after_while="_backward_clock")
        self._wrap(torch.optim.Optimizer, "__init__", self._safe(self._note_optimizer))
        self._wrap_module_call()
        caps = [
            Capability(
                name="steps", available=True, note="global optimizer step hook; backward() when no optimizer exists"
            )
        ]
        self._undo.append(when_imported("torch.distributed.fsdp", self._safe(self._watch_fully_shard)))
        if self.config.batches or self.config.ranks_only:
            iter_cls = compat.dataloader_iterator()
            if iter_cls is None:
                caps.append(Capability(name="batches", available=False, note="no DataLoader iterator class to observe"))
            else:
                after = self._safe(self._note_batch)
                self._wrap(iter_cls, "__next__", None, after=after, hide_from_dynamo=True, after_while="_batches")
                caps.append(Capability(name="batches", available=True, note="DataLoader iterator"))
        return caps

    def _wrap(
        self,
        owner: Any,
        name: str,
        before: Callable[..., None] | None,
        after: Callable[[Any], None] | None = None,
        hide_from_dynamo: bool = False,
        after_while: str | None = None,
    ) -> None:
        """Replace ``owner.name`` by a wrapper calling ``before``/``after`` around the original.
        ``hide_from_dynamo``: if compiled code calls it, Dynamo breaks the graph at the user's
        call, as it would for the original, instead of tracing into torchrepro. ``after_while``:
        the recorder's flag (``_modes``) without which ``after`` has nothing to observe and is not called."""
        original = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling():
                return original(*args, **kwargs)
            if before is not None:
                before(*args, **kwargs)
            result = original(*args, **kwargs)
            if after is not None and (after_while is None or getattr(self, after_while)):
                after(result)
            return result

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(owner, name, wrapper)
        self._undo.append(lambda: setattr(owner, name, original))
        if hide_from_dynamo:

            def hide() -> None:
                if getattr(owner, name) is wrapper:
                    setattr(owner, name, torch.compiler.disable(wrapper))

            self._undo.append(when_imported("torch._dynamo", self._safe(hide)))

    def _wrap_module_call(self) -> None:
        """``nn.Module.__call__``: the outermost call of a step gives its inputs' fingerprint (when
        no DataLoader batch was fetched) and, the first time, the initial parameters'."""
        original = torch.nn.Module.__call__
        observe = self._safe(self._note_module_call)

        def __call__(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if self._calls_idle or self._in_module or torch.compiler.is_compiling():
                return original(module, *args, **kwargs)
            self._in_module = True
            try:
                observe(module, args, kwargs)
                return original(module, *args, **kwargs)
            finally:
                self._in_module = False

        __call__.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(torch.nn.Module, "__call__", __call__)
        self._undo.append(lambda: setattr(torch.nn.Module, "__call__", original))
        self._undo.append(when_imported("torch._dynamo", self._safe(lambda: _skip_frame(__call__))))

    def _note_module_call(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._pending_backward and self._backward_clock:
            self._end_step("backward")  # the forward of the next step
        t0 = time.perf_counter() if self._timing else 0.0
        if self._names is None and len(self._called) < 8 and all(m is not module for m in self._called):
            self._called.append(module)
        if not self._init_done:
            root = compat.compiled_original(module)  # torch.compile(model)
            named = [(n, p) for n, p in root.named_parameters() if not p.is_meta]
            if named:  # the first call of a module with parameters (not a parameter-free transform)
                self._init_done = True
                self._modes()
                self._emit_init_params("first_forward", root, named, [fingerprint(_local(p))[:16] for _, p in named])
        if self.config.batches and not self._batch_fps:
            tensors = _tensors((args, kwargs))
            if tensors:
                try:
                    self._input_fps.append([fingerprint_later(_local(t)) for t in tensors])
                except (TypeError, ValueError):  # sparse or nested inputs: an unhashable batch, as for the DataLoader's
                    self._input_fps.append(["unhashable"])
        if self._timing:
            self._own += time.perf_counter() - t0

    def _emit_init_params(self, source: str, module: Any, named: list[tuple[str, Any]], fps: list[str]) -> None:
        """The one ``InitParams`` event: the fingerprints ``fps`` of ``module``'s ``named``
        parameters as training starts (``source``: at its first forward, or before FSDP2 shards it)."""
        self._emit(
            InitParams(
                rank=self.rank,
                step=self.completed,
                source=source,
                module=type(module).__name__,
                names=[n for n, _ in named],
                fps=fps,
            )
        )

    def _note_optimizer(self, *args: Any, **kwargs: Any) -> None:
        self._optimizers_made += 1
        self._modes()

    def _watch_fully_shard(self) -> None:
        """Fingerprint each module's full parameters just before FSDP2 shards them (FSDP2 does not
        broadcast: ranks that built different parameters train a silent mix). Installed once the
        script imports ``torch.distributed.fsdp`` (importing it at start costs a second)."""
        fsdp = sys.modules["torch.distributed.fsdp"]
        if not hasattr(fsdp, "fully_shard"):
            self._emit(
                Capability(
                    rank=self.rank, name="fsdp2_init", available=False, note="no torch.distributed.fsdp.fully_shard"
                )
            )
            return

        def before(module: Any, *args: Any, **kwargs: Any) -> None:
            named = [(n, p) for n, p in module.named_parameters() if not hasattr(p, "placements")]
            fps = ["meta" if p.is_meta else fingerprint(p)[:16] for _, p in named]
            self._emit_init_params("fully_shard", module, named, fps)

        self._wrap(fsdp, "fully_shard", self._safe(before), hide_from_dynamo=True)
        self._emit(
            Capability(
                rank=self.rank, name="fsdp2_init", available=True, note="fully_shard: full parameters before sharding"
            )
        )

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def note_compile(self) -> None:
        self._compiles += 1

    def world(self, size: int) -> None:
        """The process is one of ``size`` ranks: with ``ranks_only``, RNG, batch and parameter
        digests are taken from the next step on while there are several (none while it is alone,
        but the parameter fingerprints an explicit ``fingerprint_every`` asks for)."""
        if self.config.ranks_only:
            self.config.rng = self.config.batches = size > 1
            self._digests = size > 1 or self.config.fingerprint_every is not None
            self._modes()

    # --- observers ----------------------------------------------------------------------
    def _read_rng(self, at: str) -> None:
        """Once per step, while ``config.rng``: the RNG state when its first batch is fetched (a new
        epoch's iterator has drawn its seed by then), else at its first backward() (after any seeding)."""
        if self._rng_fps is None:
            self._rng_fps, self._rng_at = live_fingerprints(), at

    def _note_backward(self, tensors: Any = None, *args: Any, **kwargs: Any) -> None:
        if self._backward_clock and self._pending_backward:
            self._end_step("backward")  # a second backward() without a module call between
        t0 = time.perf_counter() if self._timing else 0.0
        if self.config.rng:
            self._read_rng("backward")
        if isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
            if tensors.is_cpu:  # read now, while it is in the caches: no device to wait for (readback.py)
                self._loss_values.append(tensors.item())
                self._loss_dtype = tensors.dtype
            else:
                self._losses.append(tensors.detach())
            if self._params is None and self._backward_clock:
                self._params = _leaves_of(tensors)
        if self._timing:
            self._own += time.perf_counter() - t0

    def _after_backward(self, result: Any) -> None:
        self._pending_backward = True
        if self.config.grads and self._params:
            self._grads = _grad_digest([p.grad for p in self._params if p.grad is not None])

    def _note_batch(self, batch: Any) -> None:
        t0 = time.perf_counter() if self._timing else 0.0
        if self.config.rng:
            self._read_rng("batch")
        try:
            self._batch_fps.append(fingerprint(batch))
        except (TypeError, ValueError):
            self._batch_fps.append("unhashable")
        # combined now, while the hashing code is in the caches (at the step's end it is not)
        self._batch_fp = hash_bytes(*(f.encode() for f in self._batch_fps))[:16]
        if self._timing:
            self._own += time.perf_counter() - t0

    def _on_pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._is_clock(optimizer):
            return
        self._grads = _grad_digest([p.grad for p in self._optimizer_params(optimizer) if p.grad is not None])

    def _is_clock(self, optimizer: Any) -> bool:
        if self._clock_optimizer is None:
            self._clock_optimizer = optimizer
        return optimizer is self._clock_optimizer

    @staticmethod
    def _optimizer_params(optimizer: Any) -> list[torch.Tensor]:
        return [p for group in optimizer.param_groups for p in group["params"]]

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if optimizer is not self._clock_optimizer and not self._is_clock(optimizer):
            return
        if self._params is None or self.clock != "optimizer":
            self._params = self._optimizer_params(optimizer)
        given = args[1:] if args and args[0] is optimizer else args  # torch passes step()'s self first
        self._closure = (given[0] if given else kwargs.get("closure")) is not None
        self._end_step("optimizer")

    def _end_step(self, clock: str) -> None:
        now, t = time.perf_counter(), time.time()
        step_time = now - self._start
        time_s = round(step_time * 1e6) / 1e6  # in µs, as round(step_time, 6) is, without its decimal digits
        index = self.completed
        values = self._loss_values
        self._pending_backward = False
        if not (  # the common step (doctor in one process): written from its values, no Step built
            self._plain
            and clock == self.clock
            and index != self._first_index
            and len(values) < 2
            and not self._losses
            and not self._readback.queue
            and self._emit_step(t, index, values[0] if values else None, len(values), time_s, self._compiles)
        ):
            self._record(clock, index, t, step_time, time_s, now)
            self._reset_step()
        else:  # all that a plain step gathers
            self._loss_values, self._compiles, self._closure = [], 0, False
        self.completed += 1
        for listener in self.listeners:
            listener(index)
        self._start = time.perf_counter()

    def _record(self, clock: str, index: int, t: float, step_time: float, time_s: float, now: float) -> None:
        """A step's events: its ``Step`` (queued until its device values are read back) and, when
        they change, the clock and the parameters' names; the settings after the first step."""
        if self.clock != clock:
            self.clock, self._names = clock, None
            self._emit(
                Capability(
                    rank=self.rank,
                    step=index,
                    name="step_clock",
                    available=True,
                    note="optimizer.step()" if clock == "optimizer" else "backward(): no torch.optim optimizer exists",
                )
            )
        if self._params is None:
            self._params = []
        if self._names is None:
            self._names = _param_names(self._params, self._called) if self._params else []
            self._called = []
            self._emit(
                Params(
                    rank=self.rank,
                    names=self._names,
                    shapes=[list(p.shape) for p in self._params],
                    dtypes=[str(p.dtype).replace("torch.", "") for p in self._params],
                    kinds=[_kind(p) for p in self._params],
                )
            )
            self._modes()  # a clock, names: the module calls may have nothing left to observe
        losses, values = self._losses, self._loss_values
        event = Step(
            t=t,
            rank=self.rank,
            step=index,
            index=index,
            time_s=time_s,
            backward_calls=len(losses) + len(values),
            compiles=self._compiles,
        )
        parts: list[torch.Tensor] = []  # read back at the batch point (readback.py), then filled in
        loss = None
        if values and losses:
            raise ValueError("a step whose losses are on the CPU and on a device")  # (torch.stack cannot join them)
        if values:
            event.loss, event.loss_last = _step_loss(values, self._closure, self._loss_dtype)
        elif losses:  # at their own precision (a float64 loss stays float64)
            parts.append(losses[0] if len(losses) == 1 else torch.stack([x.reshape(()) for x in losses]))
            loss = _Loss(len(losses), self._closure, parts[0].dtype)
        later: dict[str, list[list[Digest]]] = {}  # digests whose device sums are read back with them
        if self._batch_fps:
            event.batches, event.batch_fp = len(self._batch_fps), self._batch_fp
        elif self._input_fps:
            event.batches = len(self._input_fps)
            later["batch"] = self._input_fps
        if self._grads is not None:
            parts.append(self._grads[1])
            later["grads"] = [self._grads[0]]
        if self._rng_fps is not None:
            if self._rng_fps != self._rng_last[0]:  # often no generator changed (no dropout, no augmentation)
                self._rng_last = (self._rng_fps, combine(self._rng_fps))
            event.rng_fps, event.rng_fp, event.rng_at = self._rng_fps, self._rng_last[1], self._rng_at
        fp_cost = 0.0
        if self._params and self._should_fingerprint(index):
            t0 = time.perf_counter()
            later["params"] = [[fingerprint_later(_local(p)) for p in self._params]]
            fp_cost = time.perf_counter() - t0
        if later:
            parts += [
                d.sums for groups in later.values() for group in groups for d in group if isinstance(d, DeviceDigest)
            ]
        self._readback.add(event, parts, partial(_fill, loss, later))
        if self._params and self.config.snapshots and (index < 16 or index & (index - 1) == 0):
            self._snapshot(index)
        self._readback.poll()
        if index == self._first_index:
            self._emit_settings(index)
        if self._timing:
            own = self._own + (time.perf_counter() - now) - fp_cost
            self._choose_interval(index, step_time - self._own, fp_cost, own)

    def _emit_settings(self, index: int) -> None:
        """The switches in force once the script has set itself up (read after its first step)."""
        settings = {
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "num_threads": torch.get_num_threads(),
        }
        inductor = compat.inductor_config(load=False)
        if inductor is not None:
            settings |= {
                "inductor.fallback_random": bool(getattr(inductor, "fallback_random", False)),
                "inductor.deterministic": bool(getattr(inductor, "deterministic", False)),
            }
        for name, value in settings.items():
            self._emit(Setting(rank=self.rank, step=index, name=name, value=value))

    def _reset_step(self) -> None:
        self._losses, self._loss_values, self._batch_fps, self._input_fps, self._grads = [], [], [], [], None
        self._compiles = 0
        self._closure = False
        self._rng_fps, self._rng_at, self._own = None, None, 0.0

    def restart_at(self, step: int) -> None:
        """A resumed run continues at ``step``: number its steps from there and forget what the
        restore itself fetched (the skipped batches)."""
        self.completed = self._first_index = step
        self._reset_step()
        self._start = time.perf_counter()

    def _should_fingerprint(self, index: int) -> bool:
        if not self._digests:
            return False
        if self.every is None:
            return True  # still measuring
        return index % self.every == 0

    def _choose_interval(self, index: int, step_time: float, fp_cost: float, own: float) -> None:
        """Automatic interval: all of capture's per-step work — the fixed part (RNG and batch
        digests, the event) plus parameter fingerprints every N steps — within 1 % of step time
        (called while it is measured, ``_timing``)."""
        if index >= 1:  # step 0 holds the first compile
            self._step_times.append(step_time)
            self._fp_costs.append(fp_cost)
            self._own_costs.append(own)
        if len(self._step_times) >= _AUTO_WARMUP:
            step, cost, fixed = (statistics.median(x) for x in (self._step_times, self._fp_costs, self._own_costs))
            budget = _OVERHEAD_BUDGET * step
            room = max(budget - fixed, budget / 10)
            self.every = max(1, math.ceil(_SAFETY * cost / room))
            self._modes()
            self._emit(
                Capability(
                    rank=self.rank,
                    step=index,
                    name="fingerprint_interval",
                    available=True,
                    note=f"every {self.every} step(s): a parameter fingerprint costs {cost * 1e3:.3f} ms, "
                    f"other capture work {fixed * 1e3:.3f} ms, a step {step * 1e3:.3f} ms",
                )
            )

    def _snapshot(self, index: int) -> None:
        if self._snapshots is None:
            self._snapshots = SnapshotWriter(Path(self.snapshot_dir or "snapshots"))
        skipped = self._snapshots.write(index, self._names or [], self._params or [])
        if skipped and not self._snapshots_skipped:
            self._snapshots_skipped = True
            self._emit(Capability(rank=self.rank, step=index, name="snapshots", available=False, note=skipped))
        self._last_snapshot = index

    def flush(self) -> None:
        """At the end of the run: end a step begun by the last backward() (backward clock), and
        snapshot the final parameters if the schedule skipped them."""
        if self._pending_backward and self._backward_clock and not self.failed:
            self._safe(self._end_step)("backward")
        self._readback.poll(force=True)
        if self.config.snapshots and self._params is not None and self.completed:
            if self._last_snapshot != self.completed - 1:
                self._snapshot(self.completed - 1)


def _skip_frame(fn: Callable[..., Any]) -> None:
    """Dynamo compiles the frame a compiled module starts in: let it skip ours and compile the
    original ``nn.Module.__call__`` beneath, as it would without torchrepro (same function, same
    guards, same graph breaks)."""
    skip_code = compat.skip_code()
    if skip_code is not None:  # else (another torch) calls are still observed; compile events may name our frame
        skip_code(fn.__code__)


def _tensors(x: Any) -> list[torch.Tensor]:
    """The tensors in nested tuples, lists and dicts, in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return []


def _leaves_of(loss: torch.Tensor) -> list[torch.Tensor]:
    """The leaf tensors a loss's gradient flows into (what a hand-written update changes), in
    the order autograd reaches them."""
    seen, leaves, stack = set(), [], [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
        stack.extend(next_node for next_node, _ in reversed(node.next_functions))
    return leaves


def _grad_digest(grads: list[torch.Tensor]) -> tuple[list[Digest], torch.Tensor] | None:
    """(per-gradient digests, global norm as a tensor) of gradients, or None when there are none."""
    grads = [_local(g).detach() for g in grads]
    if not grads:
        return None
    norms = compat.foreach_norm(grads)
    return [fingerprint_later(g) for g in grads], torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))


@dataclass(frozen=True, slots=True)
class _Loss:
    """What a step's loss values read back are: how many ``backward()`` calls, whether inside a
    closure, and their dtype (the module docstring defines the step's loss from them)."""

    calls: int
    closure: bool
    dtype: torch.dtype


def _fill(loss: _Loss | None, later: dict[str, list[list[Digest]]], event: Step, values: list[Any]) -> None:
    """Complete a step's event from its values read back (in the order ``_end_step`` queued
    them: the losses, gradient norm, then the two device sums of each digest in ``later``)."""
    it = iter(values)
    if loss is not None:
        event.loss, event.loss_last = _step_loss([next(it) for _ in range(loss.calls)], loss.closure, loss.dtype)
    if "grads" in later:
        event.grad_norm = round(next(it), 9)
    done = {
        key: [[d if isinstance(d, str) else d.finish(next(it), next(it)) for d in group] for group in groups]
        for key, groups in later.items()
    }
    if "batch" in done:
        event.batch_fp = _combined([_combined(group) for group in done["batch"]])
    if "grads" in done:
        event.grads_fp = _combined(done["grads"][0])
    if "params" in done:
        event.param_fps = [d[:16] for d in done["params"][0]]
        event.params_fp = _combined(done["params"][0])


def _step_loss(values: list[Any], closure: bool, dtype: torch.dtype) -> tuple[Any, Any]:
    """A step's ``loss`` and ``loss_last`` from the values of its ``backward()`` calls (the module
    docstring): one value; else the first (a closure's) or their sum in ``dtype``, and the last."""
    if len(values) == 1:
        return values[0], None
    return (values[0] if closure else _summed(values, dtype)), values[-1]


def _summed(values: list[float], dtype: torch.dtype) -> float:
    """``values`` added in order in ``dtype``, rounded after each addition, as a script's
    ``total += loss.detach()`` adds them (CPU, at read-back: no extra work in the step)."""
    total = torch.tensor(values[0], dtype=dtype)
    for value in values[1:]:
        total += value
    return total.item()


def _combined(digests: list[str]) -> str:
    return hash_bytes(*(d.encode() for d in digests))[:16]


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (FSDP2 shards, tensor-parallel pieces); a plain tensor as is."""
    return t.to_local() if hasattr(t, "to_local") else t


def _kind(p: torch.Tensor) -> str:
    placements = getattr(p, "placements", None)
    return "tensor" if placements is None else "dtensor:" + ",".join(str(x) for x in placements)


def _is_module(obj: Any) -> bool:
    try:
        return isinstance(obj, torch.nn.Module)
    except ReferenceError:  # a dead weak proxy
        return False


def _param_names(params: list[torch.Tensor], called: Sequence[Any] = ()) -> list[str]:
    """Names of the optimizer's parameters, from the module that owns them: the one covering most
    of them with the shortest names, among the modules the script called and their submodules
    (found once per run), else among all live modules (a scan of every object, ~0.2 s)."""
    wanted = {id(p) for p in params}
    found = _best_names(wanted, _submodules(called))
    if len(found) < len(wanted):
        with warnings.catch_warnings():  # isinstance() on deprecated module attributes warns
            warnings.simplefilter("ignore")
            found = _best_names(wanted, [obj for obj in gc.get_objects() if _is_module(obj)])
    return [found.get(id(p), f"param{i}") for i, p in enumerate(params)]


def _submodules(roots: Sequence[Any]) -> list[Any]:
    found = []
    for root in roots:
        try:
            found.extend(root.modules())
        except Exception:  # a module whose modules() misbehaves: the scan of live modules decides
            continue
    return found


def _best_names(wanted: set[int], modules: list[Any]) -> dict[int, str]:
    best: tuple[int, int, dict[int, str]] | None = None
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
    return best[2] if best else {}
