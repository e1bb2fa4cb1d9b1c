"""OpenTelemetry: the OTLP export, the trace context a launch hands its ranks, the mapping of events and reports to spans and metrics."""
