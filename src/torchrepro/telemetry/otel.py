"""OpenTelemetry export over OTLP/HTTP (protobuf): events in, spans and metrics out.

Built on the official SDK (the ``torchrepro[otel]`` extra). One :class:`RankExporter` per rank
turns that rank's events into telemetry, live (a listener on the capture session's event writer,
see :func:`torchrepro.telemetry.otlp.live_listeners`) or afterwards from a stored run (``torchrepro
report RUN_DIR --otlp-endpoint URL``). The command that launches the ranks has a
:class:`Launcher`: its span is the root of the job's trace, each launch (a ``check`` run, a
replay) a child span, and every rank's span a child of its launch (``TRACEPARENT``).

Spans: ``torchrepro <command>`` → ``torchrepro launch`` → ``torchrepro rank`` → one
``torch.compile`` per compile (compile id, function, recompile reason and category, graph
breaks as span events, cache hits and misses, durations). No span per step.

Metrics (cumulative): ``torchrepro.compiles``, ``torchrepro.recompiles`` (by
``torchrepro.recompile.category``), ``torchrepro.graph_breaks``, ``torchrepro.compile.duration``
and ``torchrepro.step.duration`` (histograms, seconds), ``torchrepro.cache.lookups`` and
``torchrepro.cache.hit_ratio``, ``torchrepro.findings`` (by code: replica, RNG ... findings),
``torchrepro.telemetry.dropped``.

Nothing here can slow or stop a step: recording a span or a measurement is an append to the
SDK's bounded queue or an in-memory aggregation; batches leave from the SDK's background threads
(BatchSpanProcessor, PeriodicExportingMetricReader). Spans beyond the queue bound are dropped and
counted. A collector that is down, refuses or never answers costs one warning line per job and
at most :data:`EXPORT_TIMEOUT_S` per command: each export (retries included) gives up after
:data:`EXPORT_TIMEOUT_S`, and once one failed, what is left is not sent (a process's end, the
rest of a stored run).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import re
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, TypedDict

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExportResult, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from .. import __version__, _state
from ..analysis.categories import category_of
from ..analysis.compile import display_function
from ..eventlog.events import CacheLookup, Compile, End, Event, GraphBreak, Header, Step
from .trace_context import TRACEPARENT_VAR, WARN_ONCE_VAR, LaunchTrace
from ..reports.loader import Report
from ..render.sanitize import visible

DEFAULT_SERVICE = "torchrepro"
END_FLUSH_S = 3.0  # the longest a process waits at its end for its last batches
EXPORT_TIMEOUT_S = 2.0  # one export, retries included (the SDK's default is 10 s): OTEL_EXPORTER_OTLP_TIMEOUT wins
GIVEN_UP_S = 0.2  # the same, once the job saw its collector fail: what is left fails at once
END_GRACE_S = 1.0  # how long a retry, once told to stop, may take to end and be counted
STORED_FLUSH_S = 30.0  # exporting a stored run is the whole job: wait longer
STEP_FLUSH_S = 1.0  # step times reach the histogram in batches, once a second
METRIC_INTERVAL_MS = 10_000  # unless OTEL_METRIC_EXPORT_INTERVAL says otherwise
_STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_COMPILE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_MAX_PENDING = 256  # compiles whose graph breaks / cache lookups await their compile event
_MAX_TEXT = 500
_PROPAGATOR = TraceContextTextMapPropagator()


def _ns(t: float) -> int:
    return int(t * 1e9)


def _attrs(values: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
    """OpenTelemetry attributes: no None values and no NaN or infinite number (absent, as an
    attribute a run did not have: a backend's sums and charts stay numbers), texts made visible
    (they quote the user's script: :func:`~torchrepro.render.sanitize.visible`) and cut."""
    return {
        k: visible(v)[:_MAX_TEXT] if isinstance(v, str) else v
        for k, v in values.items()
        if v is not None and not (isinstance(v, float) and not math.isfinite(v))
    }


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name) or default)
    except ValueError:
        return default


# --- health: one warning per job -----------------------------------------------------------


class _Health(logging.Handler):
    """Export failures of this process. The SDK's own log records stay off the user's log
    handlers (they would repeat on every retry); the first failure becomes one warning line."""

    def __init__(self, endpoint: str):
        super().__init__(level=logging.WARNING)
        self.endpoint = endpoint
        self.failures = 0
        self.reason: str | None = None
        self._warned = False
        self.reporter = False  # the launcher prints the warnings of its whole job
        self._lock = threading.Lock()
        logger = logging.getLogger("opentelemetry")
        logger.addHandler(self)
        logger.propagate = False

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "Transient error" in message:
            self.reason = self.reason or message.split("Transient error", 1)[1].split(" encountered", 1)[0].strip()
        elif record.levelno >= logging.ERROR and "max retries" not in message:
            self.reason = self.reason or message

    def failed(self) -> None:
        self.failures += 1
        reason = " ".join((self.reason or "no answer in time").split())
        errno = re.search(r"\[Errno -?\d+\] ([^'\")]+)", reason)
        reason = errno.group(1).strip() if errno else reason[:160]
        self.warn(f"OpenTelemetry export to {self.endpoint} failed ({reason}); the run goes on, its telemetry is lost")

    def warn(self, message: str) -> None:
        """One warning line per job: a rank under a torchrepro launcher leaves its warning in the
        launcher's file (the launcher prints it, once); anyone else prints it here, once."""
        with self._lock:
            if self._warned:
                return
            self._warned = True
        path = os.environ.get(WARN_ONCE_VAR)
        if path and not self.reporter:
            mine = f"{path}.{os.getpid()}"
            try:  # written whole, then linked into place: the launcher never reads half a warning
                Path(mine).write_text(message, encoding="utf-8")
                os.link(mine, path)
            except OSError:  # another rank was first
                pass
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(mine)
            return
        print(f"torchrepro: warning: {message}", file=sys.stderr, flush=True)

    def report_job(self) -> None:
        """The launcher, at its end: the warning a rank left, unless this process warned already."""
        path = os.environ.get(WARN_ONCE_VAR)
        if path and os.path.exists(path):
            self.warn(Path(path).read_text(encoding="utf-8", errors="replace").strip())


def _job_failed() -> bool:
    path = os.environ.get(WARN_ONCE_VAR)
    return bool(path and os.path.exists(path))


_HEALTH: _state.Kept[_Health | None] = _state.kept(lambda: None)  # the exporter's health: one per process


def _health(endpoint: str) -> _Health:
    if _HEALTH.value is None:
        _HEALTH.value = _Health(endpoint)
    return _HEALTH.value


# --- exporters and providers ----------------------------------------------------------------


def _signal_endpoint(base: str, signal: str) -> str:
    """``OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT`` if set, else the base URL + ``/v1/<signal>``."""
    return os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT") or base.rstrip("/") + f"/v1/{signal}"


def _export_timeout(signal: str) -> float | None:
    """:data:`EXPORT_TIMEOUT_S`, or None where the user set ``OTEL_EXPORTER_OTLP_[<SIGNAL>_]TIMEOUT``
    (the SDK then reads it): the SDK's 10 s would make a silent collector hold every command."""
    if os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_TIMEOUT") or os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT"):
        return None
    return EXPORT_TIMEOUT_S


class _Guarded:
    """What both exporters add to the SDK's: in a forked child (a DataLoader worker) they send
    nothing (the parent exports); shut down (:meth:`Telemetry.close` after a failure), or with
    ``give_up`` (a stored run, a process's end) once an export of this process failed, a batch
    fails at once and is no new failure: a silent collector costs one export timeout, not one
    per batch."""

    health: _Health
    give_up: bool
    _pid: int
    _shutdown: bool

    def _sends(self) -> bool:
        return not (self._shutdown or (self.give_up and self.health.failures))


class _Spans(_Guarded, OTLPSpanExporter):
    """The official exporter, counting what it was handed and telling health how it went."""

    def __init__(self, health: _Health, endpoint: str, give_up: bool = False):
        super().__init__(endpoint=_signal_endpoint(endpoint, "traces"), timeout=_export_timeout("traces"))
        self.health, self.give_up, self.handed, self._pid = health, give_up, 0, os.getpid()

    def export(self, spans: Any) -> SpanExportResult:
        if os.getpid() != self._pid:
            return SpanExportResult.SUCCESS
        self.handed += len(spans)
        if not self._sends():
            return SpanExportResult.FAILURE
        result = super().export(spans)
        if result is not SpanExportResult.SUCCESS:
            self.health.failed()
        return result


class _Metrics(_Guarded, OTLPMetricExporter):
    def __init__(self, health: _Health, endpoint: str, give_up: bool = False):
        super().__init__(endpoint=_signal_endpoint(endpoint, "metrics"), timeout=_export_timeout("metrics"))
        self.health, self.give_up, self._pid = health, give_up, os.getpid()

    def export(self, metrics_data: Any, timeout_millis: float | None = 10_000, **kwargs: Any) -> MetricExportResult:
        if os.getpid() != self._pid:
            return MetricExportResult.SUCCESS
        if not self._sends():
            return MetricExportResult.FAILURE
        result = super().export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        if result is not MetricExportResult.SUCCESS:
            self.health.failed()
        return result


class _BoundedSpans(BatchSpanProcessor):
    """The SDK's batching (it reads ``OTEL_BSP_*``); a span that would overflow the queue is
    dropped here and counted, or with ``block`` (a stored run) the queue is flushed first, unless
    an export failed already."""

    def __init__(self, exporter: _Spans, block: bool = False):
        super().__init__(exporter)
        self.exporter, self.block = exporter, block
        self.limit = max(1, _env_int("OTEL_BSP_MAX_QUEUE_SIZE", 2048))
        self.ended = self.dropped = 0

    def on_end(self, span: Any) -> None:
        if self.ended - self.exporter.handed >= self.limit:
            if not self.block or self.exporter.health.failures:
                self.dropped += 1
                return
            self.force_flush()
        self.ended += 1
        super().on_end(span)


def _resource(attributes: Mapping[str, AttributeValue]) -> Resource:
    """The SDK's resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) with ours added;
    ``service.name`` is ``torchrepro`` unless the user set one."""
    base = Resource.create({})
    if str(base.attributes.get("service.name", "")).startswith("unknown_service"):
        attributes = {"service.name": DEFAULT_SERVICE, **attributes}
    return base.merge(Resource(_attrs(attributes)))


def job_attributes() -> dict[str, AttributeValue]:
    """The job's ids, where the scheduler or launcher set them."""
    slurm, elastic = os.environ.get("SLURM_JOB_ID"), os.environ.get("TORCHELASTIC_RUN_ID")
    return _attrs({"torchrepro.job.id": slurm or elastic, "slurm.job.id": slurm, "torchelastic.run_id": elastic})


def job_context() -> Context | None:
    """The parent of this process's spans: ``TRACEPARENT`` (a launcher's span), else a context
    derived from the job id, the same on every rank of a job someone else launched."""
    traceparent = os.environ.get(TRACEPARENT_VAR)
    if traceparent:
        carrier = {"traceparent": traceparent, "tracestate": os.environ.get("TRACESTATE", "")}
        context = _PROPAGATOR.extract(carrier)
        if trace.get_current_span(context).get_span_context().is_valid:
            return context
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID")
    if not job:
        return None
    digest = hashlib.blake2b(f"torchrepro:{job}".encode(), digest_size=24).digest()
    parent = SpanContext(
        int.from_bytes(digest[:16], "big"),
        int.from_bytes(digest[16:], "big"),
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


class Telemetry:
    """A tracer and a meter for one resource (a rank, or the launcher), batched to the collector."""

    def __init__(self, endpoint: str, attributes: Mapping[str, AttributeValue], *, block: bool = False):
        self.health = _health(endpoint)
        resource = _resource(attributes)
        self.spans = _BoundedSpans(_Spans(self.health, endpoint, give_up=block), block=block)
        self.tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self.tracer_provider.add_span_processor(self.spans)
        interval = None if os.environ.get("OTEL_METRIC_EXPORT_INTERVAL") else METRIC_INTERVAL_MS
        self.metrics = _Metrics(self.health, endpoint, give_up=block)
        reader = PeriodicExportingMetricReader(self.metrics, export_interval_millis=interval)
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
        self.tracer = self.tracer_provider.get_tracer("torchrepro", __version__)
        self.meter = self.meter_provider.get_meter("torchrepro", __version__)
        self.meter.create_observable_counter(
            "torchrepro.telemetry.dropped",
            [self._dropped],
            unit="{span}",
            description="spans dropped because the export queue was full",
        )

    def _dropped(self, options: CallbackOptions) -> Iterator[Observation]:
        yield Observation(self.spans.dropped, {"signal": "traces"})

    def close(self, timeout_s: float = END_FLUSH_S) -> None:
        """Send what is left, spans and metrics at once, waiting at most ``timeout_s``; once this
        process or another of its job saw the collector fail, nothing more is sent (an endpoint
        that never answers would hold every process of the job). Never raises."""
        self.spans.exporter.give_up = self.metrics.give_up = True  # one failed export ends the close
        given_up = bool(self.health.failures or _job_failed())
        if given_up:  # the job's warning is out already: an export still in flight is not awaited
            _quietly(self.spans.exporter.shutdown)
            _quietly(self.metrics.shutdown)
            timeout_s = min(timeout_s, GIVEN_UP_S)
        closers = [
            threading.Thread(target=_quietly, args=(fn,), name="torchrepro-otel-close", daemon=True)
            for fn in (self.spans.shutdown, lambda: self.meter_provider.shutdown(timeout_millis=timeout_s * 1e3))
        ]
        deadline = time.monotonic() + timeout_s
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(max(0.0, deadline - time.monotonic()))
        # Still retrying: the exporters' own shutdown ends the retries, and the failed export is
        # then counted (and warned of) before this process goes on to its end, where a daemon
        # thread would be cut off before it could leave the job's warning.
        for closer, shutdown in zip(closers, (self.spans.exporter.shutdown, self.metrics.shutdown)):
            if closer.is_alive() and not given_up:
                _quietly(shutdown)
                closer.join(END_GRACE_S)
        if self.spans.dropped:
            self.health.warn(f"{self.spans.dropped} span(s) dropped: the OpenTelemetry export queue was full")


def _quietly(fn: Any) -> None:
    with contextlib.suppress(Exception):  # closing telemetry must never fail the command
        fn()


# --- one rank's events ------------------------------------------------------------------------


class _Pending(TypedDict):
    """What was said of a compile before its compile event: its graph breaks and cache lookups."""

    breaks: list[GraphBreak]
    lookups: list[CacheLookup]


class RankExporter:
    """Turns one rank's events, in order, into spans and metrics. Called as a listener; never
    raises (an internal error stops the export with one warning, the run goes on)."""

    def __init__(
        self,
        endpoint: str,
        *,
        parent: Context | None,
        live: bool,
        attributes: Mapping[str, AttributeValue] | None = None,
    ):
        self.endpoint, self.parent, self.live = endpoint, parent, live
        self.attributes = attributes or {}
        self.telemetry: Telemetry | None = None
        self.rank_span: Any = None
        self._rank_context: Context | None = None
        self._pending: dict[str, _Pending] = {}
        self._frames: dict[tuple[str | None, str | None, int | None], Compile] = {}  # names the code after a break
        self._lookups: Counter[tuple[str, str]] = Counter()  # (cache, status) -> lookups
        self._last_t = 0.0
        self._step_times: list[float] = []
        self._flushed_at = 0.0
        self.stopped = False

    def __call__(self, event: Event) -> None:
        if self.stopped:
            return
        try:
            self._last_t = event.t
            handler = self._HANDLERS.get(type(event))
            if handler is not None:
                handler(self, event)
        except Exception as exc:  # noqa: BLE001 - telemetry must never reach the user's run
            self.stopped = True
            _health(self.endpoint).warn(f"OpenTelemetry export stopped: {type(exc).__name__}: {exc}")

    def _on_header(self, h: Header) -> None:
        rank = {"torchrepro.rank": h.rank, "torchrepro.local_rank": h.local_rank, "torchrepro.world_size": h.world_size}
        self.telemetry = Telemetry(
            self.endpoint,
            {
                "torchrepro.role": "rank",
                **rank,
                "host.name": h.host or socket.gethostname(),
                "process.pid": h.pid or None,
                "torchrepro.torch_version": h.torch_version,
                **self.attributes,
            },
            block=not self.live,
        )
        meter = self.telemetry.meter
        self.compiles = meter.create_counter("torchrepro.compiles", "{compile}", "frames compiled by torch.compile")
        self.recompiles = meter.create_counter(
            "torchrepro.recompiles", "{recompile}", "recompiles, by the category of the guard that failed"
        )
        self.graph_breaks = meter.create_counter("torchrepro.graph_breaks", "{graph_break}", "graph breaks")
        self.cache_lookups = meter.create_counter(
            "torchrepro.cache.lookups", "{lookup}", "FX-graph and AOTAutograd cache lookups"
        )
        self.compile_duration = meter.create_histogram(
            "torchrepro.compile.duration",
            "s",
            "time compiling one frame",
            explicit_bucket_boundaries_advisory=_COMPILE_BUCKETS,
        )
        self.step_duration = meter.create_histogram(
            "torchrepro.step.duration",
            "s",
            "host time of one optimizer step",
            explicit_bucket_boundaries_advisory=_STEP_BUCKETS,
        )
        meter.create_observable_gauge(
            "torchrepro.cache.hit_ratio", [self._hit_ratio], unit="1", description="cache hits / (hits + misses)"
        )
        self.rank_span = self.telemetry.tracer.start_span(
            "torchrepro rank", context=self.parent, start_time=_ns(h.t), attributes=_attrs(rank)
        )
        self._rank_context = trace.set_span_in_context(self.rank_span)

    def _hit_ratio(self, options: CallbackOptions) -> Iterator[Observation]:
        for cache in sorted({cache for cache, _ in list(self._lookups)}):
            hits, misses = self._lookups[(cache, "hit")], self._lookups[(cache, "miss")]
            if hits + misses:
                yield Observation(hits / (hits + misses), {"torchrepro.cache": cache})

    def _pending_for(self, compile_id: str) -> _Pending:
        if compile_id not in self._pending and len(self._pending) >= _MAX_PENDING:
            self._pending.pop(next(iter(self._pending)))
        return self._pending.setdefault(compile_id, {"breaks": [], "lookups": []})

    def _on_graph_break(self, b: GraphBreak) -> None:
        if self.telemetry is None:
            return
        self.graph_breaks.add(1, _attrs({"torchrepro.graph_break.id": b.gb_id}))
        self._pending_for(b.compile_id)["breaks"].append(b)

    def _on_cache(self, c: CacheLookup) -> None:
        if self.telemetry is None:
            return
        self._lookups[(c.cache, c.status)] += 1
        self.cache_lookups.add(1, {"torchrepro.cache": c.cache, "torchrepro.cache.status": c.status})
        self._pending_for(c.compile_id)["lookups"].append(c)

    def _on_compile(self, c: Compile) -> None:
        if self.telemetry is None:
            return
        pending = self._pending.pop(c.compile_id, {"breaks": [], "lookups": []})
        self._frames.setdefault((c.function, c.file, c.line), c)
        function = display_function(c, self._frames.values())
        attributes: dict[str, AttributeValue] = {
            "torchrepro.compile.id": c.compile_id,
            "torchrepro.function": function,
            "code.function": c.function,
            "code.filepath": c.file,
            "code.lineno": c.line,
            "torchrepro.step": c.step,
            "torchrepro.compile.recompile": c.is_recompile,
            "torchrepro.compile.graph_breaks": len(pending["breaks"]),
            "torchrepro.compile.guards": c.guards,
            "torchrepro.compile.graph_ops": c.graph_ops,
            "torchrepro.compile.limit_hit": c.limit_hit,
        }
        if c.recompile_reasons:
            attributes["torchrepro.recompile.reason"] = c.recompile_reasons[0]
            attributes["torchrepro.recompile.category"] = category_of(c)
        for phase in ("dynamo", "backend", "inductor", "build", "backward"):
            attributes[f"torchrepro.compile.{phase}_s"] = getattr(c, f"{phase}_s")
        for cache, counts in c.cache.items():
            for status, n in counts.items():
                attributes[f"torchrepro.cache.{cache}.{status}"] = n
        for lookup in pending["lookups"]:
            attributes[f"torchrepro.cache.{lookup.cache}"] = lookup.status
        end = _ns(c.t)
        span = self.telemetry.tracer.start_span(
            "torch.compile",
            context=self._rank_context,
            start_time=end - _ns(c.dynamo_s if c.dynamo_s is not None and math.isfinite(c.dynamo_s) else 0.0),
            attributes=_attrs(attributes),
        )
        for b in pending["breaks"]:
            span.add_event(
                "graph_break",
                _attrs(
                    {
                        "torchrepro.graph_break.reason": b.reason,
                        "torchrepro.graph_break.id": b.gb_id,
                        "code.filepath": b.file,
                        "code.lineno": b.line,
                        "torchrepro.source": b.source,
                    }
                ),
                timestamp=_ns(b.t),
            )
        if c.fail_type or c.limit_hit:
            span.set_status(Status(StatusCode.ERROR, visible(c.fail_reason or c.limit_hit or c.fail_type)))
        span.end(end_time=end)
        if c.limit_hit:
            return
        self.compiles.add(1, {"torchrepro.function": function})
        if c.is_recompile:
            self.recompiles.add(
                1, {"torchrepro.function": function, "torchrepro.recompile.category": category_of(c) or "other"}
            )
        if c.dynamo_s is not None and math.isfinite(c.dynamo_s):
            self.compile_duration.record(c.dynamo_s, {"torchrepro.function": function})

    def _on_step(self, s: Step) -> None:
        """Step times are kept and recorded once a second: recording into the SDK's histogram costs
        ~90 µs when its code is cache-cold after a training step, ~5 µs in a batch."""
        if self.telemetry is None or s.time_s is None or not math.isfinite(s.time_s):
            return  # a time that is not a number is no measurement (the SDK would drop it with a warning)
        self._step_times.append(s.time_s)
        if s.t - self._flushed_at >= STEP_FLUSH_S:
            self._flush_steps(s.t)

    def _flush_steps(self, now: float) -> None:
        for seconds in self._step_times:
            self.step_duration.record(seconds)
        self._step_times.clear()
        self._flushed_at = now

    def _on_end(self, e: End) -> None:
        self.end(e)
        if self.live:
            self.close()

    def end(self, e: End | None = None) -> None:
        """End the rank's span (at its end event, else at its last event: a crashed rank)."""
        if self.rank_span is None:
            return
        self._flush_steps(self._last_t)
        status = e.status if e else "incomplete"
        self.rank_span.set_attributes(
            _attrs(
                {
                    "torchrepro.status": status,
                    "torchrepro.exit_code": e.exit_code if e else None,
                    "torchrepro.steps": e.step if e else None,
                }
            )
        )
        if status not in ("ok", "imported"):
            self.rank_span.set_status(Status(StatusCode.ERROR, visible((e.error if e else None) or status)))
        self.rank_span.end(end_time=_ns(e.t if e else self._last_t))
        self.rank_span = None

    def close(self, timeout_s: float = END_FLUSH_S) -> None:
        self.stopped = True
        if self.telemetry is not None:
            self.telemetry.close(timeout_s)

    _HANDLERS: ClassVar[dict[type, Any]] = {
        Header: _on_header,
        GraphBreak: _on_graph_break,
        CacheLookup: _on_cache,
        Compile: _on_compile,
        Step: _on_step,
        End: _on_end,
    }


def live_exporter(endpoint: str) -> RankExporter:
    """The listener a capture session adds to its event writer (``TORCHREPRO_OTLP_ENDPOINT``)."""
    return RankExporter(endpoint, parent=job_context(), live=True, attributes=job_attributes())


# --- the launching command ----------------------------------------------------------------------


_FIX_FIGURES = ("compiles", "recompiles", "graph_breaks", "compile_time_s", "step_time_s")


def compile_fix_attributes(row: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """The attributes of one ``doctor --fixes`` row on the command's ``compile_fix`` span event:
    ``torchrepro.compile_fix.{name,applied_to,status,numerics}`` and each figure before and after
    (``torchrepro.compile_fix.recompiles.before`` ...; absent for a fix not run)."""
    out: dict[str, AttributeValue] = {
        f"torchrepro.compile_fix.{key}": row.get(key) for key in ("name", "applied_to", "status", "numerics")
    }
    for side in ("before", "after"):
        figures = row.get(side) or {}
        for key in _FIX_FIGURES:
            out[f"torchrepro.compile_fix.{key}.{side}"] = figures.get(key)
    return out


class Launcher:
    """The command's own telemetry: its span (the root of the job's trace), a span per launch,
    the report's verdict and findings."""

    def __init__(self, endpoint: str, command: str, *, script: str | None = None, nproc: int | None = None):
        self.endpoint, self.command = endpoint, command
        self.telemetry = Telemetry(
            endpoint, {"torchrepro.role": "launcher", "torchrepro.command": command, **job_attributes()}
        )
        self.telemetry.health.reporter = True
        self.span = self.telemetry.tracer.start_span(
            f"torchrepro {command}",
            context=job_context(),
            attributes=_attrs({"torchrepro.command": command, "torchrepro.script": script, "torchrepro.nproc": nproc}),
        )
        self.context = trace.set_span_in_context(self.span)
        self.findings = self.telemetry.meter.create_counter(
            "torchrepro.findings", "{finding}", "findings of the analysis, by code and severity"
        )

    @contextmanager
    def launch_span(self, run_dir: Path, nproc: int) -> Iterator[LaunchTrace]:
        span = self.telemetry.tracer.start_span(
            "torchrepro launch",
            context=self.context,
            attributes=_attrs(
                {"torchrepro.run.label": run_dir.name, "torchrepro.run_dir": str(run_dir), "torchrepro.nproc": nproc}
            ),
        )
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        launch = LaunchTrace(env={TRACEPARENT_VAR: carrier["traceparent"]} if "traceparent" in carrier else {})
        try:
            yield launch
        finally:
            if launch.exit_code is not None:
                span.set_attribute("torchrepro.exit_code", launch.exit_code)
                if launch.exit_code:
                    span.set_status(Status(StatusCode.ERROR, f"exit code {launch.exit_code}"))
            span.end()

    def record_report(self, report: Report) -> None:
        self.span.set_attributes(_attrs({"torchrepro.verdict": report.verdict_line}))
        for finding in report.findings:
            attributes = {"torchrepro.finding.code": finding.code, "torchrepro.finding.severity": finding.severity}
            self.findings.add(1, attributes)
            self.span.add_event("finding", _attrs({**attributes, "torchrepro.finding.title": finding.title}))
        for row in getattr(report, "compile_fixes", None) or []:  # doctor --fixes
            self.span.add_event("compile_fix", _attrs(compile_fix_attributes(row)))
        recommended = getattr(report, "compile_fix_recommended", None)
        if recommended:
            self.span.set_attributes(
                _attrs(
                    {
                        "torchrepro.compile_fix.recommended": recommended["name"],
                        "torchrepro.compile_fix.recommended_line": recommended["line"],
                    }
                )
            )

    def export_run(self, run_dir: Path) -> None:
        """Every rank's stored events, as if exported live, under this command's span; after an
        export failed, the remaining ranks are not sent (its warning says the telemetry is lost)."""
        from ..eventlog.rundir import load_run

        for log in load_run(run_dir).logs:
            if self.telemetry.health.failures:
                break
            exporter = RankExporter(self.endpoint, parent=self.context, live=False)
            for event in log.events:
                exporter(event)
            exporter.end(log.end)
            exporter.close(timeout_s=STORED_FLUSH_S)

    def close(self, exit_code: int | None) -> None:
        self.span.set_attributes(_attrs({"torchrepro.exit_code": exit_code}))
        if exit_code is None or exit_code >= 2:
            self.span.set_status(
                Status(StatusCode.ERROR, "the command failed" if exit_code is None else f"exit code {exit_code}")
            )
        self.span.end()
        self.telemetry.close()
        self.telemetry.health.report_job()
