"""Telemetry: every run's typed events as OpenTelemetry spans (GenAI semantic conventions).

    import tether.telemetry
    tether.telemetry.instrument()            # the global TracerProvider, or pass tracer_provider=

With `OTEL_EXPORTER_OTLP_ENDPOINT` set (and `tether[otel]` installed), the CLI and the task service
export to it without any code. Off by default: with nothing instrumented, the loop does no
telemetry work at all.
"""

from tether.telemetry._otel import OtelObserver, instrument, instrument_from_env, uninstrument

__all__ = ["OtelObserver", "instrument", "instrument_from_env", "uninstrument"]
