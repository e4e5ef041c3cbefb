"""Traces in the OpenTelemetry GenAI semantic conventions (README "Traces (OpenTelemetry)"):
the seam the agent loop calls (`seam.py`, a no-op when tracing is off), when tracing is on
(`settings.py`), and the OpenTelemetry implementation behind it (`gen_ai.py`, `exporting.py`:
the `otel` extra, imported only when tracing is on)."""
