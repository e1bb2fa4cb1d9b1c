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
- Parameter fingerprints (after the step), gradient fingerprints and norm (before it; of a step given a
  closure, as its first ``backward()`` leaves them: the ones the step's loss gave) and the RNG-state
  fingerprint (at its start) come from :mod:`torchrepro.digests` and
  :mod:`torchrepro.rng`.

Every wrapper calls straight through when Dynamo is tracing, so compiled code sees exactly the
functions it would see without torchrepro. Dynamo is told to skip or not trace them once it is
imported (:mod:`.on_import`): a script that never compiles never imports it.

What runs once a step runs cold (the step's own work evicted the caches), so it touches as little as
it can (docs/evidence/performance.md, "What doctor costs a step"): the wrappers call straight through when
there is nothing to observe (``_modes``), and a step that records no digest (``doctor`` in one
process) is written from its values, without building its ``Step`` (``emit_step``).

:class:`StepRecorder` installs the hooks, keeps the step clock and assembles each step; what it
gathers is kept by one collaborator per concern: the losses (:mod:`.step_losses`), the RNG digests
(:mod:`.step_rng`), the batch and input digests (:mod:`.step_inputs`), the parameters, gradients
and snapshots (:mod:`.step_params`), the fingerprint interval (:mod:`.step_timing`) and the other
events it writes (:mod:`.step_events`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from .. import _compat as compat
from ..digests import DeviceDigest, fingerprint, hash_bytes
from ..eventlog.events import Capability, Event, Step
from .on_import import when_imported
from .readback import Readback
from .step_events import StepEvents
from .step_inputs import Digest, StepInputs, local
from .step_losses import Loss, StepLosses, step_loss
from .step_params import StepParams, leaves_of, nonfinite_params
from .step_rng import StepRng
from .step_timing import FingerprintInterval


@dataclass
class StepConfig:
    """What to record per step. ``fingerprint_every=None`` chooses the interval from the
    measured cost (every step when it costs < 1 % of step time)."""

    fingerprint_every: int | None = None
    grads: bool = False
    batches: bool = True
    rng: bool = True
    snapshots: bool = (
        False  # parameter sketches at steps 0-15, powers of two and the last; the first and last whole (snapshots.py)
    )
    whole_snapshots: bool = False  # every snapshot step whole too: compare judges each tensor at each step
    # doctor: RNG, batch and parameter digests only while the process is one of several ranks (the
    # cross-rank checks compare them); one process's compile health needs none (docs/evidence/performance.md)
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
        self.rank = rank
        self._events = StepEvents(self._readback.emit, rank)
        self._emit_step = emit_step
        self.config = config or StepConfig()
        self.completed = 0
        self.interval = FingerprintInterval(self.config.fingerprint_every)
        self._digests = True  # RNG, batch and parameter digests are taken (see StepConfig.ranks_only)
        self._clock_optimizer: Any = None
        self._losses = StepLosses()
        self._rng = StepRng()
        self._inputs = StepInputs()
        self._params = StepParams(snapshot_dir, keep_all=self.config.whole_snapshots)
        self._compiles = 0
        self._start = time.perf_counter()
        self._undo: list[Callable[[], None]] = []
        self.failed = False
        self.observing = 0  # observers running (nested: a listener inside the step end)
        self.listeners: list[Callable[[int], None]] = []  # called with each finished step's index
        self.clock: str | None = None  # "optimizer" or "backward", once known
        self._optimizers_made = 0
        self._pending_backward = False  # backward clock: a step has begun and not ended yet
        self._closure_params: list[torch.Tensor] | None = None  # the clock's step() runs a closure: its params
        self._in_module = False
        self._first_index = 0
        self._modes()

    @property
    def every(self) -> int | None:
        """The parameter fingerprints' interval (None: still measured)."""
        return self.interval.every

    def _modes(self) -> None:
        """What the per-step paths test once per change instead of every step (called whenever what
        they derive from changes): ``_timing``, capture times its own work (only while the automatic
        interval is measured: nothing else reads it); ``_plain``, a step records no digest, batch,
        gradient or snapshot (doctor in one process), so ``_end_step`` may write it from its values
        (``emit_step``, no ``Step`` built); ``_backward_clock``, ``backward()`` is the step clock (no
        optimizer exists: none was created, none stepped); ``_batches``, the DataLoader's batches are
        fingerprinted; ``_calls_idle``, the outermost module call has nothing to observe (clock,
        names, initial parameters known; no input digests)."""
        config, params = self.config, self._params
        self._timing = self.interval.every is None and self._digests
        self._plain = not (self._digests or config.rng or config.batches or config.grads or config.snapshots)
        self._backward_clock = self.clock != "optimizer" and self._optimizers_made == 0
        self._after_backward_wanted = self._backward_clock or self._closure_params is not None
        self._batches = config.batches
        self._calls_idle = not (self._backward_clock or params.names is None or not params.init_done or config.batches)

    def _safe(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Observer bugs must never reach the user's script: the first one is recorded as a
        ``capture_error`` event and step capture stops; the run goes on untouched. While an observer
        runs, ``observing`` is above 0 (an op replay does not record capture's own tensor work)."""

        def guarded(*args: Any, **kwargs: Any) -> None:
            if self.failed:
                return
            self.observing += 1
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - deliberately total
                self.failed = True
                self._events.capability(
                    "capture_error", False, f"step capture stopped: {type(exc).__name__}: {exc}", step=self.completed
                )
            finally:
                self.observing -= 1

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
        self._wrap(torch.autograd, "backward", before, after=after, after_while="_after_backward_wanted")
        self._wrap(torch.optim.Optimizer, "__init__", self._safe(self._note_optimizer))
        self._wrap(torch.nn.Module, "to_empty", None, after=self._safe(self._params.note_to_empty))
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
        initial = self._params.note_module(module)
        if initial is not None:
            root, named = initial
            self._modes()
            fps = [fingerprint(local(p))[:16] for _, p in named]
            unwritten = self._params.unwritten(named)
            self._events.init_params(self.completed, "first_forward", root, named, fps, unwritten)
            self._events.nonfinite(self.completed, "parameters", nonfinite_params(named), len(named))
        if self.config.batches and not self._inputs.batches:
            self._inputs.note_call(args, kwargs)
        if self._timing:
            self.interval.own += time.perf_counter() - t0

    def _note_optimizer(self, *args: Any, **kwargs: Any) -> None:
        self._optimizers_made += 1
        self._modes()

    def _watch_fully_shard(self) -> None:
        """Fingerprint each module's full parameters just before FSDP2 shards them (FSDP2 does not
        broadcast: ranks that built different parameters train a silent mix). Installed once the
        script imports ``torch.distributed.fsdp`` (importing it at start costs a second)."""
        fsdp = sys.modules["torch.distributed.fsdp"]
        if not hasattr(fsdp, "fully_shard"):
            self._events.capability("fsdp2_init", False, "no torch.distributed.fsdp.fully_shard")
            return

        def before(module: Any, *args: Any, **kwargs: Any) -> None:
            named = [(n, p) for n, p in module.named_parameters() if not hasattr(p, "placements")]
            fps = ["meta" if p.is_meta else fingerprint(p)[:16] for _, p in named]
            self._events.init_params(self.completed, "fully_shard", module, named, fps)

        self._wrap(fsdp, "fully_shard", self._safe(before), hide_from_dynamo=True)
        self._events.capability("fsdp2_init", True, "fully_shard: full parameters before sharding")

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
    def _note_backward(self, tensors: Any = None, *args: Any, **kwargs: Any) -> None:
        if self._backward_clock and self._pending_backward:
            self._end_step("backward")  # a second backward() without a module call between
        t0 = time.perf_counter() if self._timing else 0.0
        if self.config.rng:
            self._rng.read("backward")
        if isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
            self._losses.note(tensors)
            if self._params.params is None and self._backward_clock:
                self._params.params = leaves_of(tensors)
        if self._timing:
            self.interval.own += time.perf_counter() - t0

    def _after_backward(self, result: Any) -> None:
        params = self._params
        if self._closure_params is not None:  # the first backward() of the closure the clock's step() runs
            params.note_grads(self._closure_params)
            self._closure_params = None
            self._modes()
            return
        self._pending_backward = True
        if self.config.grads and params.params:
            params.note_grads(params.params)

    def _note_batch(self, batch: Any) -> None:
        t0 = time.perf_counter() if self._timing else 0.0
        if self.config.rng:
            self._rng.read("batch")
        self._inputs.note_batch(batch)
        if self._timing:
            self.interval.own += time.perf_counter() - t0

    def _on_pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._is_clock(optimizer):
            return
        if _closure(optimizer, args, kwargs) is None:
            self._params.note_grads(self._optimizer_params(optimizer))
        else:  # the gradients held now are the last step's: the step's own are its closure's first backward()'s
            self._closure_params = self._optimizer_params(optimizer)
            self._modes()

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
        if self._params.params is None or self.clock != "optimizer":
            self._params.params = self._optimizer_params(optimizer)
        self._losses.closure = _closure(optimizer, args, kwargs) is not None
        self._end_step("optimizer")

    def _end_step(self, clock: str) -> None:
        now, t = time.perf_counter(), time.time()
        step_time = now - self._start
        time_s = round(step_time * 1e6) / 1e6  # in µs, as round(step_time, 6) is, without its decimal digits
        index = self.completed
        losses = self._losses
        values = losses.values
        self._pending_backward = False
        if not (  # the common step (doctor in one process): written from its values, no Step built
            self._plain
            and clock == self.clock
            and index != self._first_index
            and len(values) < 2
            and not losses.device
            and not self._readback.queue
            and self._emit_step(t, index, values[0] if values else None, len(values), time_s, self._compiles)
        ):
            self._record(clock, index, t, step_time, time_s, now)
            self._reset_step()
        else:  # all that a plain step gathers
            losses.values, losses.closure, self._compiles = [], False, 0
        self.completed += 1
        for listener in self.listeners:
            listener(index)
        self._start = time.perf_counter()

    def _record(self, clock: str, index: int, t: float, step_time: float, time_s: float, now: float) -> None:
        """A step's events: its ``Step`` (queued until its device values are read back) and, when
        they change, the clock and the parameters' names; the settings after the first step."""
        params = self._params
        if self.clock != clock:
            self.clock, params.names = clock, None
            note = "optimizer.step()" if clock == "optimizer" else "backward(): no torch.optim optimizer exists"
            self._events.capability("step_clock", True, note, step=index)
        if params.name():
            self._events.params(params.names or [], params.params or [])
            self._modes()  # a clock, names: the module calls may have nothing left to observe
        losses = self._losses
        event = Step(
            t=t,
            rank=self.rank,
            step=index,
            index=index,
            time_s=time_s,
            backward_calls=len(losses.device) + len(losses.values),
            compiles=self._compiles,
        )
        parts: list[torch.Tensor] = []  # read back at the batch point (readback.py), then filled in
        loss = losses.put(event, parts)
        later: dict[str, list[list[Digest]]] = {}  # digests whose device sums are read back with them
        self._inputs.put(event, later)
        held_by: list[int] = []  # whose gradient norms are read back one by one: until one is found not finite
        if params.grads is not None:
            parts.append(params.grads.norm)
            later["grads"] = [params.grads.digests]
            if not params.nonfinite_grads_seen:
                parts.append(params.grads.norms)
                held_by = params.grads.held_by
        self._rng.put(event)
        fp_cost = 0.0
        if params.params and self._digests and self.interval.due(index):
            t0 = time.perf_counter()
            later["params"] = params.fingerprints()
            fp_cost = time.perf_counter() - t0
        if later:
            parts += [
                d.sums for groups in later.values() for group in groups for d in group if isinstance(d, DeviceDigest)
            ]
        self._readback.add(event, parts, partial(_fill, loss, later, held_by, self._nonfinite_grads))
        if params.params and self.config.snapshots and (index < 16 or index & (index - 1) == 0):
            self._snapshot(index)
        self._readback.poll()
        if index == self._first_index:
            self._events.settings(index)
        if self._timing:
            own = self.interval.own + (time.perf_counter() - now) - fp_cost
            self._choose_interval(index, step_time - self.interval.own, fp_cost, own)

    def _nonfinite_grads(self, step: int, norms: list[float], held_by: list[int]) -> None:
        """The first step whose gradient norm is not finite: which gradients are not (once a run)."""
        if not self._params.nonfinite_grads_seen:
            names, count, of = self._params.nonfinite_grads(norms, held_by)
            self._events.nonfinite(step, "gradients", names, of, count)

    def _reset_step(self) -> None:
        self._losses.reset()
        self._inputs.reset()
        self._params.grads = None
        self._compiles = 0
        self._rng.reset()
        self.interval.own = 0.0

    def restart_at(self, step: int) -> None:
        """A resumed run continues at ``step``: number its steps from there and forget what the
        restore itself fetched (the skipped batches)."""
        self.completed = self._first_index = step
        self._reset_step()
        self._start = time.perf_counter()

    def _choose_interval(self, index: int, step_time: float, fp_cost: float, own: float) -> None:
        """Automatic interval: all of capture's per-step work within 1 % of step time
        (:mod:`.step_timing`; called while it is measured, ``_timing``)."""
        chosen = self.interval.measured(index, step_time, fp_cost, own)
        if chosen is None:
            return
        step, cost, fixed = chosen
        self._modes()
        self._events.capability(
            "fingerprint_interval",
            True,
            f"every {self.interval.every} step(s): a parameter fingerprint costs {cost * 1e3:.3f} ms, "
            f"other capture work {fixed * 1e3:.3f} ms, a step {step * 1e3:.3f} ms",
            step=index,
        )

    def _snapshot(self, index: int) -> None:
        skipped = self._params.snapshot(index)
        if skipped is not None:
            self._events.capability("snapshots", False, skipped, step=index)

    def flush(self) -> None:
        """At the end of the run: end a step begun by the last backward() (backward clock), and
        snapshot the final parameters if the schedule skipped them."""
        if self._pending_backward and self._backward_clock and not self.failed:
            self._safe(self._end_step)("backward")
        self._readback.poll(force=True)
        params = self._params
        if self.config.snapshots and params.params is not None and self.completed:
            if params.last_snapshot != self.completed - 1:
                self._snapshot(self.completed - 1)


def _closure(optimizer: Any, args: Any, kwargs: Any) -> Any:
    """The closure an optimizer step hook's ``step()`` call was given, or None."""
    given = args[1:] if args and args[0] is optimizer else args  # torch passes step()'s self first
    return given[0] if given else kwargs.get("closure")


def _skip_frame(fn: Callable[..., Any]) -> None:
    """Dynamo compiles the frame a compiled module starts in: let it skip ours and compile the
    original ``nn.Module.__call__`` beneath, as it would without torchrepro (same function, same
    guards, same graph breaks)."""
    skip_code = compat.skip_code()
    if skip_code is not None:  # else (another torch) calls are still observed; compile events may name our frame
        skip_code(fn.__code__)


def _fill(
    loss: Loss | None,
    later: dict[str, list[list[Digest]]],
    held_by: list[int],
    nonfinite_grads: Callable[[int, list[float], list[int]], None],
    event: Step,
    values: list[Any],
) -> None:
    """Complete a step's event from its values read back (in the order ``_end_step`` queued
    them: the losses, gradient norm and the own norms of the gradients of the parameters at
    ``held_by``, then the two device sums of each digest in ``later``); a gradient norm that is not
    finite goes to ``nonfinite_grads``."""
    it = iter(values)
    if loss is not None:
        event.loss, event.loss_last = step_loss([next(it) for _ in range(loss.calls)], loss.closure, loss.dtype)
    if "grads" in later:
        event.grad_norm = round(next(it), 9)
        each = [next(it) for _ in held_by]
        if each and not math.isfinite(event.grad_norm):
            nonfinite_grads(event.index, each, held_by)
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


def _combined(digests: list[str]) -> str:
    return hash_bytes(*(d.encode() for d in digests))[:16]
