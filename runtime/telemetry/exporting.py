"""Tracing on: an SDK `TracerProvider` exporting in batches, over OTLP/HTTP (protobuf) or to
the console (README "Traces (OpenTelemetry)"). Imported only when tracing is on."""

from __future__ import annotations

from ..foundation.errors import ConfigInvalid
from .gen_ai import OtelTelemetry
from .settings import TelemetrySettings

__all__ = ["open_telemetry"]

EXPORT_TIMEOUT = 5.0  # seconds for one export: a collector that is down must not hold the exit long


def open_telemetry(settings: TelemetrySettings) -> OtelTelemetry:
    """A `Telemetry` exporting as `settings` say (its `shutdown` flushes and stops it)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    exporter: SpanExporter
    if settings.exporter == "console":
        exporter = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ConfigInvalid(
                f"tracing is on ({settings.because}) but the OTLP exporter is not installed: "
                "pip install 'trio-subagents[otel]'"
            ) from None
        exporter = OTLPSpanExporter(
            endpoint=settings.endpoint, headers=dict(settings.headers) or None, timeout=EXPORT_TIMEOUT
        )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return OtelTelemetry(provider, capture_content=settings.capture_content)
