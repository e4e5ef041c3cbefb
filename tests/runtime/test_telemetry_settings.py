"""When tracing is on (README "Traces (OpenTelemetry)"): `[telemetry]` and the OTEL_* variables
as a table, and every bad value as one line naming it (exit 2 from a host), never a traceback."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from cli_process import write_script
from subagents.runtime.config import load_config
from subagents.runtime.foundation.errors import ConfigInvalid
from subagents.runtime.hosts.cli import main
from subagents.runtime.telemetry.settings import TelemetrySettings, resolve_telemetry

LOCAL = "http://localhost:4318/v1/traces"


@pytest.mark.parametrize(
    ("file", "env", "expected"),
    [
        ({}, {}, None),
        ({"enabled": False, "endpoint": "http://c:4318"}, {}, None),
        ({"enabled": True}, {}, TelemetrySettings(endpoint=LOCAL)),
        ({"enabled": True, "endpoint": "http://c:4318/"}, {}, TelemetrySettings(endpoint="http://c:4318/v1/traces")),
        (
            {"enabled": True, "capture_content": True},
            {},
            TelemetrySettings(endpoint=LOCAL, capture_content=True),
        ),
        (
            {},
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1"},
            TelemetrySettings(endpoint="http://x:1/v1/traces", because="OTEL_EXPORTER_OTLP_ENDPOINT"),
        ),
        (
            {"endpoint": "http://file:2"},
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:1/custom"},
            TelemetrySettings(endpoint="http://x:1/custom", because="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        ),
        (
            {"endpoint": "http://file:2"},
            {"OTEL_TRACES_EXPORTER": "otlp"},
            TelemetrySettings(endpoint="http://file:2/v1/traces", because="OTEL_TRACES_EXPORTER=otlp"),
        ),
        (
            {},
            {"OTEL_TRACES_EXPORTER": "console"},
            TelemetrySettings(exporter="console", endpoint=LOCAL, because="OTEL_TRACES_EXPORTER=console"),
        ),
        ({"enabled": True}, {"OTEL_TRACES_EXPORTER": "none"}, None),
        ({"enabled": True}, {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1"}, None),
        (
            {"enabled": True, "capture_content": True},
            {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "false"},
            TelemetrySettings(endpoint=LOCAL),
        ),
        (
            {"enabled": True},
            {
                "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
                "OTEL_SERVICE_NAME": "billing-agents",
                "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20t,x-tenant=7",
            },
            TelemetrySettings(
                endpoint=LOCAL,
                capture_content=True,
                service_name="billing-agents",
                headers={"authorization": "Bearer t", "x-tenant": "7"},
            ),
        ),
    ],
)
def test_when_tracing_is_on(file: dict[str, Any], env: dict[str, str], expected: TelemetrySettings | None) -> None:
    assert resolve_telemetry(**file, env=env) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"OTEL_TRACES_EXPORTER": "zipkin"},
            "OTEL_TRACES_EXPORTER='zipkin' is not supported here (otlp, console or none)",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4318"},
            "OTEL_EXPORTER_OTLP_ENDPOINT='localhost:4318' must be an http:// or https:// URL",
        ),
    ],
)
def test_bad_variables_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        resolve_telemetry(env=env)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[telemetry]\nenabled = "yes"\n', "telemetry.enabled must be true or false, got 'yes'"),
        ('[telemetry]\nendpoint = "ftp://c"\n', "telemetry.endpoint must be an http:// or https:// URL, got 'ftp://c'"),
        ("[telemetry]\ncapture_content = 1\n", "telemetry.capture_content must be true or false, got 1"),
        ("[telemetry]\nsampler = 1\n", "unknown key telemetry.sampler"),
        ("telemetry = true\n", "telemetry must be a table ([telemetry]), got True"),
    ],
)
def test_bad_telemetry_tables_name_the_key(tmp_path: Path, toml: str, message: str) -> None:
    (tmp_path / "subagents.toml").write_text(toml)
    with pytest.raises(ConfigInvalid) as caught:
        load_config(str(tmp_path), env={"SUBAGENTS_CONFIG_DIR": str(tmp_path / "none")})
    assert str(caught.value) == f"{tmp_path / 'subagents.toml'}: {message}"


def test_the_file_is_read_with_its_sources(tmp_path: Path) -> None:
    (tmp_path / "subagents.toml").write_text('[telemetry]\nenabled = true\nendpoint = "http://c:4318"\n')
    config = load_config(str(tmp_path), env={"SUBAGENTS_CONFIG_DIR": str(tmp_path / "none")})
    assert (config.telemetry_enabled, config.telemetry_endpoint, config.telemetry_capture_content) == (
        True,
        "http://c:4318",
        False,
    )
    rows = {key: (value, source) for key, value, source in config.rows()}
    assert rows["telemetry.enabled"] == (True, str(tmp_path / "subagents.toml"))
    assert rows["telemetry.capture_content"] == (False, "default")


def _cli(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_host_refuses_a_bad_variable_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_script(tmp_path / "s.json", {"agents": [{"responses": [{"text": "x"}]}]})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SUBAGENTS_CONFIG_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger")
    code, out, err = _cli(capsys, ["run", "--root", str(tmp_path / "r"), "--model", model, "go"])
    assert (code, out) == (2, "")
    assert "OTEL_TRACES_EXPORTER='jaeger' is not supported here" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_tracing_on_without_the_extra_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_script(tmp_path / "s.json", {"agents": [{"responses": [{"text": "x"}]}]})
    (tmp_path / "subagents.toml").write_text("[telemetry]\nenabled = true\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SUBAGENTS_CONFIG_DIR", str(tmp_path / "none"))
    found = importlib.util.find_spec

    def without_otel(name: str, package: str | None = None) -> Any:
        return None if name.startswith("opentelemetry") else found(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", without_otel)
    code, out, err = _cli(capsys, ["run", "--root", str(tmp_path / "r"), "--model", model, "go"])
    assert (code, out) == (2, "")
    assert err.strip().endswith(
        "tracing is on ([telemetry] enabled) but the otel extra is not installed: pip install 'trio-subagents[otel]'"
    )
    assert err.count("\n") == 1


_OTEL = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_SERVICE_NAME",
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
)


@pytest.mark.parametrize(
    ("toml", "env", "expected"),
    [
        ("", {}, {"tracing": ("off", "default")}),
        ("[telemetry]\nenabled = false\n", {}, {"tracing": ("off", "FILE")}),
        (
            "[telemetry]\nenabled = true\n",
            {},
            {
                "tracing": ("on", "FILE"),
                "tracing.exporter": ("otlp", "default"),
                "tracing.endpoint": (LOCAL, "default"),
                "tracing.capture_content": (False, "default"),
                "tracing.service_name": ("subagents", "default"),
            },
        ),
        # A variable over the file, either way.
        (
            "[telemetry]\nenabled = true\n",
            {"OTEL_SDK_DISABLED": "true"},
            {"tracing": ("off", "$OTEL_SDK_DISABLED=true")},
        ),
        (
            "[telemetry]\nenabled = true\n",
            {"OTEL_TRACES_EXPORTER": "none"},
            {"tracing": ("off", "$OTEL_TRACES_EXPORTER=none")},
        ),
        (
            '[telemetry]\nenabled = false\nendpoint = "http://file:1"\ncapture_content = true\n',
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1",
                "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20secret-token,x-team=a",
                "OTEL_SERVICE_NAME": "billing",
            },
            {
                "tracing": ("on", "$OTEL_EXPORTER_OTLP_ENDPOINT"),
                "tracing.exporter": ("otlp", "default"),
                "tracing.endpoint": ("http://x:1/v1/traces", "$OTEL_EXPORTER_OTLP_ENDPOINT"),
                "tracing.headers": (["authorization", "x-team"], "$OTEL_EXPORTER_OTLP_HEADERS"),  # names only
                "tracing.capture_content": (True, "FILE"),
                "tracing.service_name": ("billing", "$OTEL_SERVICE_NAME"),
            },
        ),
        (
            '[telemetry]\nendpoint = "http://file:1"\n',
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "false"},
            {
                "tracing": ("on", "$OTEL_TRACES_EXPORTER=otlp"),
                "tracing.exporter": ("otlp", "$OTEL_TRACES_EXPORTER"),
                "tracing.endpoint": ("http://file:1/v1/traces", "FILE"),
                "tracing.capture_content": (False, "$OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"),
                "tracing.service_name": ("subagents", "default"),
            },
        ),
        (
            "",
            {"OTEL_TRACES_EXPORTER": "console"},
            {
                "tracing": ("on", "$OTEL_TRACES_EXPORTER=console"),
                "tracing.exporter": ("console", "$OTEL_TRACES_EXPORTER"),  # (no endpoint: stdout)
                "tracing.capture_content": (False, "default"),
                "tracing.service_name": ("subagents", "default"),
            },
        ),
    ],
)
def test_config_shows_the_tracing_in_effect_and_its_source(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    toml: str,
    env: dict[str, str],
    expected: dict[str, tuple[object, str]],
) -> None:
    """`config` shows whether tracing is on, what turned it on or off (the file, an OTEL_*
    variable, the default) and where spans go, as a host resolves it; never a header's value."""
    import json

    (tmp_path / "subagents.toml").write_text(toml)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SUBAGENTS_CONFIG_DIR", str(tmp_path / "none"))
    for name in _OTEL:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = _cli(capsys, ["config", "--json"])
    assert (code, err) == (0, "")
    file = str(tmp_path / "subagents.toml")
    rows = {r["key"]: (r["value"], r["source"]) for r in json.loads(out)["values"] if r["key"].startswith("tracing")}
    assert rows == {key: (value, file if source == "FILE" else source) for key, (value, source) in expected.items()}
    code, out, err = _cli(capsys, ["config"])
    assert code == 0 and "secret-token" not in out
    state, source = expected["tracing"]
    assert f'tracing = "{state}"' in out and f"# {file if source == 'FILE' else source}\n" in out


def test_config_says_when_tracing_is_on_without_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SUBAGENTS_CONFIG_DIR", str(tmp_path / "none"))
    for name in _OTEL:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:1")
    import importlib.metadata

    found = importlib.metadata.distribution

    def without_otel(name: str) -> Any:
        if name.startswith("opentelemetry"):
            raise importlib.metadata.PackageNotFoundError(name)
        return found(name)

    monkeypatch.setattr(importlib.metadata, "distribution", without_otel)
    code, out, err = _cli(capsys, ["config"])
    assert (code, err) == (0, "")
    assert (
        "tracing = \"on, but the otel extra is not installed (hosts refuse to start): pip install 'trio-subagents[otel]'\""
        in out
    )


def test_config_refuses_a_bad_variable_as_a_host_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SUBAGENTS_CONFIG_DIR", str(tmp_path / "none"))
    for name in _OTEL:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "x:1")
    code, out, err = _cli(capsys, ["config"])
    assert (code, out) == (2, "")
    assert err == "subagents: OTEL_EXPORTER_OTLP_ENDPOINT='x:1' must be an http:// or https:// URL\n"
