"""``--otlp-endpoint``: how a command, its launches and every rank agree to export telemetry.

Nothing here imports OpenTelemetry: the exporter itself (:mod:`torchrepro.telemetry.otel`, the
``torchrepro[otel]`` extra) is imported only once a run asks for it.

The protocol between processes is the environment:

- ``TORCHREPRO_OTLP_ENDPOINT`` — set by ``--otlp-endpoint`` (or ``OTEL_EXPORTER_OTLP_*ENDPOINT``,
  which the command layer turns into the flag's value) in the command's process and inherited by
  every rank; a capture session that sees it exports its events live.
- ``TRACEPARENT`` — the W3C trace context of the launch span, given to every rank of a launch,
  so that all ranks of a job share one trace (a trace context already in the command's own
  environment, e.g. from CI, becomes the parent of the command's span).
- ``TORCHREPRO_OTLP_WARN_ONCE`` — a file path: of all the processes of one job, only the one
  that creates it prints the export-failure warning.

The standard ``OTEL_*`` variables (``OTEL_EXPORTER_OTLP_HEADERS``, ``_TIMEOUT``,
``_COMPRESSION``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*``,
``OTEL_METRIC_EXPORT_INTERVAL`` ...) are read by the SDK itself.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _state
from ..errors import InputError
from .trace_context import WARN_ONCE_VAR, LaunchTrace

if TYPE_CHECKING:
    from ..reports.loader import Report
    from .otel import Launcher

ENDPOINT_VAR = "TORCHREPRO_OTLP_ENDPOINT"
INSTALL_HINT = "install the OpenTelemetry extra: pip install 'torchrepro[otel]'"
_PROTOCOL_VARS = (
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
)
_LAUNCHER: _state.Kept[Launcher | None] = _state.kept(lambda: None)  # the command's, while a launcher command exports


def _validate(endpoint: str) -> None:
    """What the URL itself cannot say (the option layer checked it: commands.options.otlp_endpoint):
    the protocol asked for and the OpenTelemetry install."""
    for var in _PROTOCOL_VARS:
        value = os.environ.get(var, "").strip()
        if value and value != "http/protobuf":
            raise InputError(f"{var}={value}: torchrepro exports OTLP over HTTP with protobuf (http/protobuf) only")
    try:
        for module in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"):
            importlib.import_module(module)
    except ImportError:
        raise InputError(f"--otlp-endpoint needs OpenTelemetry: {INSTALL_HINT}") from None


def run_with_export(args: argparse.Namespace, func: Callable[[argparse.Namespace], int]) -> int:
    """Run a command, exporting its telemetry when ``args.otlp_endpoint`` is set: the command's
    span is the root of the job's trace; the ranks it launches export their own events."""
    endpoint = getattr(args, "otlp_endpoint", None)
    if not endpoint:
        return func(args)
    _validate(endpoint)
    os.environ[ENDPOINT_VAR] = endpoint
    if args.otel_service_name:
        os.environ["OTEL_SERVICE_NAME"] = args.otel_service_name
    if args.otlp_in_process:
        return func(args)
    from .otel import Launcher

    with tempfile.TemporaryDirectory(prefix="torchrepro-otlp-") as tmp:
        os.environ[WARN_ONCE_VAR] = str(Path(tmp) / "warned")
        launcher = _LAUNCHER.value = Launcher(
            endpoint, args.command, script=getattr(args, "script", None), nproc=getattr(args, "nproc", None)
        )
        code = None
        try:
            code = func(args)
            return code
        finally:
            launcher.close(code)
            _LAUNCHER.value = None


@contextmanager
def launch_span(run_dir: Path, nproc: int) -> Iterator[LaunchTrace]:
    """A span around one launch of the script (one ``check`` run, a replay, a doctor run)."""
    launcher = _LAUNCHER.value
    if launcher is None:
        yield LaunchTrace()
        return
    with launcher.launch_span(run_dir, nproc) as trace:
        yield trace


def record_report(report: Report) -> None:
    """Put a finished report's verdict and findings on the command's span and metrics."""
    launcher = _LAUNCHER.value
    if launcher is not None:
        launcher.record_report(report)


def export_stored_run(run_dir: Path) -> None:
    """Export a stored run's events (``torchrepro report RUN_DIR --otlp-endpoint URL``)."""
    launcher = _LAUNCHER.value
    if launcher is not None:
        launcher.export_run(run_dir)


def live_listeners() -> list[Callable[[Any], None]]:
    """What a capture session hands every event it writes when ``TORCHREPRO_OTLP_ENDPOINT`` is set:
    the live exporter (nothing otherwise, or with a warning when it cannot be made)."""
    endpoint = os.environ.get(ENDPOINT_VAR)
    if not endpoint:
        return []
    try:
        from .otel import live_exporter

        return [live_exporter(endpoint)]
    except Exception as exc:  # noqa: BLE001 - telemetry must never stop a run
        hint = INSTALL_HINT if isinstance(exc, ImportError) else f"{type(exc).__name__}: {exc}"
        print(f"torchrepro: warning: telemetry is not exported ({hint})", file=sys.stderr, flush=True)
        return []
