"""What a launch hands the ranks it starts when telemetry is exported: the W3C trace context of
its span (``TRACEPARENT``) and the file where a rank leaves its one warning for the launcher.
Shared by the OTLP glue (:mod:`torchrepro.telemetry.otlp`) and the exporter (:mod:`torchrepro.telemetry.otel`),
neither importing the other's side."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

WARN_ONCE_VAR = "TORCHREPRO_OTLP_WARN_ONCE"
TRACEPARENT_VAR = "TRACEPARENT"


@dataclass
class LaunchTrace:
    """What one launch passes to its ranks: the trace context of its span (nothing when not
    exporting), and how it ended."""

    env: dict[str, str] = field(default_factory=dict)
    exit_code: int | None = None

    def child_env(self, env: dict[str, str] | None) -> dict[str, str] | None:
        """``env`` (None: this process's environment) plus the trace context."""
        return env if not self.env else {**(os.environ if env is None else env), **self.env}
