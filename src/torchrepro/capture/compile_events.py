"""Compile events, live: a handler on PyTorch's structured-trace logger (``torch.__trace``).

Every compile, recompile reason, graph break and cache lookup reaches the handler as the
same record that ``TORCH_TRACE`` would write to a file; :mod:`torchrepro.eventlog.structured_trace`
turns them into events. Feature-detected: on a torch without that logger, a
:class:`~torchrepro.eventlog.events.Capability` event says what could not be observed.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from types import FrameType

from .._compat import compiled_original, dynamo_counters, trace_logger
from ..eventlog.events import Capability, Compile, Counters, Event
from ..eventlog.structured_trace import TraceTranslator, constant_ids
from .fx_nodes import SKIP_DIRS


class _TraceHandler(logging.Handler):
    def __init__(self, capture: CompileCapture):
        super().__init__(level=logging.DEBUG)
        self.capture = capture

    def emit(self, record: logging.LogRecord) -> None:
        metadata = getattr(record, "metadata", None)
        if not isinstance(metadata, dict):
            return
        try:
            events = self.capture.translator.feed(metadata, getattr(record, "payload", None))
        except Exception as exc:  # a record shape this version did not expect: count it, never fail the run
            counts = self.capture.translator.counts
            counts["malformed"] += 1
            if counts["malformed"] == 1:  # said at once (a killed run has no end counters), counted at the end
                self.capture.emit(
                    Capability(
                        name="trace_records",
                        available=False,
                        note=f"a structured-trace record could not be read "
                        f"({type(exc).__name__}: {exc}); such records are skipped",
                    )
                )
            return
        for event in events:
            self.capture.emit(event)


def _locate(event: Compile) -> None:
    """Where the user compiled it, from this thread's stack (the record is logged while the call
    that compiles runs): the call site is the first frame of the user's code outside torch's
    frames and torchrepro's (the trace's own stack leaves out the caller's frame and counts
    torchrepro's wrappers as the user's); a compiled module (``torch.compile(model)``) whose call
    compiles is named by its class and ``forward`` (``GPT.forward``; ``Sequential.forward`` at its
    definition instead of torch's ``inner``)."""
    torch_dir = SKIP_DIRS[0]
    frame: FrameType | None = sys._getframe(2)
    in_torch, module = False, None
    while frame is not None:
        file = frame.f_code.co_filename
        if file.startswith(torch_dir):
            in_torch = True
            if module is None and "self" in frame.f_code.co_varnames:
                found = frame.f_locals.get("self")
                original = compiled_original(found)
                module = original if original is not found else None
        elif in_torch and not file.startswith((*SKIP_DIRS, "<")):
            event.call_site = f"{file}:{frame.f_lineno}"
            break
        frame = frame.f_back
    forward = getattr(type(module).forward, "__code__", None) if module is not None else None
    if forward is None:
        return
    own = event.function == "forward" and (event.file, event.line) == (forward.co_filename, forward.co_firstlineno)
    if own or (event.file or "").startswith(torch_dir):
        event.function = f"{type(module).__name__}.forward"
        event.file, event.line = forward.co_filename, forward.co_firstlineno


class CompileCapture:
    """Installs the trace handler; ``emit`` receives each event with its step filled in."""

    def __init__(self, emit: Callable[[Event], None], clock: Callable[[], int | None], rank: int = 0):
        self._emit, self._clock = emit, clock
        self.translator = TraceTranslator(rank=rank, constants=constant_ids())  # ids of this process: live
        self._handler: _TraceHandler | None = None
        self._logger: logging.Logger | None = None
        self._old_level: int | None = None
        self._old_propagate = False

    def emit(self, event: Event) -> None:
        event.step = self._clock()
        if isinstance(event, Compile):
            try:
                _locate(event)
            except Exception:  # noqa: BLE001 - an object on the stack that misbehaves: the trace's location stays
                pass
        self._emit(event)

    def install(self) -> list[Capability]:
        """Start observing; returns what is and is not observable on this torch."""
        logger = trace_logger()
        if logger is None:
            return [
                Capability(
                    name="compile_events",
                    available=False,
                    note="this torch has no structured-trace logger; compiles are not observed",
                )
            ]
        self._handler, self._logger = _TraceHandler(self), logger
        self._old_level, self._old_propagate = logger.level, logger.propagate
        logger.setLevel(logging.DEBUG)
        logger.propagate = False  # these DEBUG records must never reach the user's own log handlers
        logger.addHandler(self._handler)
        return [Capability(name="compile_events", available=True, note="structured trace (torch.__trace)")]

    def uninstall(self) -> None:
        logger = self._logger
        if self._handler is None or logger is None:
            return
        logger.removeHandler(self._handler)
        if self._old_level is not None and not logger.handlers:
            logger.setLevel(self._old_level)
            logger.propagate = self._old_propagate
        self._handler = None

    def counters(self) -> Counters:
        """Dynamo's own counters now (a cross-check written at the end of a run)."""
        counters = dynamo_counters()
        snapshot = {
            group: {str(k): int(v) for k, v in values.items()}
            for group, values in counters.items()
            if group in ("stats", "graph_break", "unimplemented", "frames", "inductor", "aot_autograd")
        }
        snapshot["torchrepro"] = {
            "unique_graphs_traced": self.translator.unique_graphs,
            "malformed_records": self.translator.counts.get("malformed", 0),
        }
        return Counters(counters=snapshot, step=self._clock())
