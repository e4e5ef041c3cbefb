"""When tracing is on, and where spans go: `[telemetry]` in subagents.toml and the standard
`OTEL_*` variables (README "Traces (OpenTelemetry)"). Pure: the CLI hands in its environment;
nothing below it reads one.

Tracing is on when `[telemetry] enabled = true`, or `OTEL_TRACES_EXPORTER` is `otlp` or
`console`, or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set — and
off, whatever else says, when `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` (the
specification's meanings of those two). Where a variable and the file both say something, the
variable wins: it is how a deployment steers every OpenTelemetry program at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import attrs

from ..foundation.errors import ConfigInvalid

__all__ = [
    "DEFAULT_ENDPOINT",
    "TelemetrySettings",
    "check_endpoint",
    "require_extra",
    "resolve_telemetry",
    "tracing_rows",
]

DEFAULT_ENDPOINT = "http://localhost:4318"  # OTLP/HTTP's default collector address
_TRUE = ("true", "1", "yes", "on")


@attrs.frozen(kw_only=True)
class TelemetrySettings:
    """Tracing is on: where spans go, and whether prompts and outputs go with them."""

    exporter: Literal["otlp", "console"] = "otlp"
    endpoint: str = f"{DEFAULT_ENDPOINT}/v1/traces"  # the OTLP/HTTP traces URL, used as it is
    headers: Mapping[str, str] = attrs.field(factory=dict)
    capture_content: bool = False
    service_name: str = "subagents"
    # What turned it on, for `subagents config` and error messages.
    because: str = "[telemetry] enabled"


def resolve_telemetry(
    *,
    enabled: bool | None = None,
    endpoint: str | None = None,
    capture_content: bool | None = None,
    env: Mapping[str, str],
) -> TelemetrySettings | None:
    """The settings tracing runs with, or None when it is off. `enabled`, `endpoint` and
    `capture_content` are `[telemetry]`'s (None: not in the file); `endpoint` there is a base
    URL like `OTEL_EXPORTER_OTLP_ENDPOINT`'s (`/v1/traces` is appended). `ConfigInvalid` for a
    variable with a value the specification does not allow."""
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or exporter == "none":
        return None
    if exporter not in ("", "otlp", "console"):
        raise ConfigInvalid(
            f"OTEL_TRACES_EXPORTER={env['OTEL_TRACES_EXPORTER']!r} is not supported here (otlp, console or none)"
        )
    traces_url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    base_url = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if exporter:
        because = f"OTEL_TRACES_EXPORTER={exporter}"
    elif traces_url:
        because = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    elif base_url:
        because = "OTEL_EXPORTER_OTLP_ENDPOINT"
    elif enabled:
        because = "[telemetry] enabled"
    else:
        return None
    if traces_url:
        url = traces_url
    else:
        url = _traces_url(base_url or endpoint or DEFAULT_ENDPOINT)
    for name, value in (("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces_url), ("OTEL_EXPORTER_OTLP_ENDPOINT", base_url)):
        if value and not value.startswith(("http://", "https://")):
            raise ConfigInvalid(f"{name}={value!r} must be an http:// or https:// URL")
    env_capture = env.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
    capture = env_capture.strip().lower() in _TRUE if env_capture is not None else bool(capture_content)
    return TelemetrySettings(
        exporter="console" if exporter == "console" else "otlp",
        endpoint=url,
        headers=_headers(env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS", "")),
        capture_content=capture,
        service_name=env.get("OTEL_SERVICE_NAME", "").strip() or "subagents",
        because=because,
    )


def check_endpoint(value: object) -> str:
    """`[telemetry] endpoint`: an http(s) base URL (a config check: ValueError)."""
    if not isinstance(value, str) or not value.startswith(("http://", "https://")) or len(value) < 8:
        raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
    return value


def _traces_url(base: str) -> str:
    return base.rstrip("/") + "/v1/traces"


def _headers(text: str) -> dict[str, str]:
    """`key1=value1,key2=value2` (values URL-encoded), as the OTLP exporter specification writes them."""
    from urllib.parse import unquote

    out: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            out[key.strip().lower()] = unquote(value.strip())
    return out


def require_extra(settings: TelemetrySettings) -> None:
    """`ConfigInvalid` when tracing is on and the `otel` extra is not installed (looked up
    without importing it)."""
    import importlib.util

    needed = ["opentelemetry.sdk"]
    if settings.exporter == "otlp":
        needed.append("opentelemetry.exporter.otlp.proto.http")
    for name in needed:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise ConfigInvalid(
                f"tracing is on ({settings.because}) but the otel extra is not installed: "
                "pip install 'trio-subagents[otel]'"
            )


def tracing_rows(
    *,
    enabled: bool,
    endpoint: str | None,
    capture_content: bool,
    sources: Mapping[str, str],
    env: Mapping[str, str],
) -> list[tuple[str, object, str]]:
    """`subagents config`'s rows of the tracing in effect — `[telemetry]` (`enabled`,
    `endpoint`, `capture_content`; `sources`: the configuration's, a file path per key it set)
    with the `OTEL_*` variables over it, as a host resolves them — each (key, value, source),
    the source a file path, `$VARIABLE` or `default`. Header values are never shown (they carry
    credentials): only their names. `ConfigInvalid` as `resolve_telemetry`."""

    def file(key: str) -> str:
        return sources.get(f"telemetry.{key}", "default")

    def variable(*names: str) -> str | None:
        return next((f"${name}" for name in names if env.get(name, "").strip()), None)

    settings = resolve_telemetry(enabled=enabled, endpoint=endpoint, capture_content=capture_content, env=env)
    if settings is None:
        exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            why = "$OTEL_SDK_DISABLED=true"
        elif exporter == "none":
            why = "$OTEL_TRACES_EXPORTER=none"
        else:
            why = file("enabled")  # `enabled = false` in a file, or nothing said
        return [("tracing", "off", why)]
    state = "on"
    if not _extra_installed(settings):
        state = "on, but the otel extra is not installed (hosts refuse to start): pip install 'trio-subagents[otel]'"
    because = settings.because
    rows: list[tuple[str, object, str]] = [
        ("tracing", state, file("enabled") if because == "[telemetry] enabled" else f"${because}"),
        ("tracing.exporter", settings.exporter, variable("OTEL_TRACES_EXPORTER") or "default"),
    ]
    if settings.exporter == "otlp":
        where = variable("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT") or file("endpoint")
        rows.append(("tracing.endpoint", settings.endpoint, where))
        if settings.headers:
            names = sorted(settings.headers)
            rows.append(
                (
                    "tracing.headers",
                    names,
                    variable("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS") or "default",
                )
            )
    capture = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
    rows.append(
        (
            "tracing.capture_content",
            settings.capture_content,
            f"${capture}" if capture in env else file("capture_content"),
        )
    )
    rows.append(("tracing.service_name", settings.service_name, variable("OTEL_SERVICE_NAME") or "default"))
    return rows


def _extra_installed(settings: TelemetrySettings) -> bool:
    """Whether the distributions of the otel extra are installed, asked of their metadata:
    `require_extra`'s `find_spec` imports the parent packages (`opentelemetry`, ...) to look,
    which a read-only command must not (tests/runtime/test_startup_imports.py)."""
    from importlib.metadata import PackageNotFoundError, distribution

    needed = ["opentelemetry-sdk"]
    if settings.exporter == "otlp":
        needed.append("opentelemetry-exporter-otlp-proto-http")
    for name in needed:
        try:
            distribution(name)
        except PackageNotFoundError:
            return False
    return True
