"""Running the `subagents` command in a subprocess: the command line, a clean environment and
script files for `--model scripted:PATH`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

_SCRIPT = Path(sys.executable).parent / "subagents"
CLI: list[str] = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "subagents.runtime.hosts.cli"]
_PROVIDER_SETTINGS = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "DEEPSEEK_API_KEY",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
)


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any provider settings or user configuration, plus
    `extra`."""
    # Nor the OTEL_* variables: they would turn tracing on (README "Traces (OpenTelemetry)").
    env = {k: v for k, v in os.environ.items() if k not in _PROVIDER_SETTINGS and not k.startswith("OTEL_")}
    # Never the person's own ~/.config/subagents: a test that wants a user file passes its own.
    env["SUBAGENTS_CONFIG_DIR"] = os.path.join(os.sep, "nonexistent", "subagents-config")
    env.update(extra)
    return env


def write_script(path: Path, script: Any) -> str:
    """Write a model script to `path`; the `--model` value that names it."""
    path.write_text(json.dumps(script))
    return f"scripted:{path}"


def kill_when_held(
    argv: list[str], holding: threading.Event, *, cwd: Path, env: dict[str, str], timeout: float
) -> None:
    """Run `argv` until a fake provider server holds its model call (`holding` set), then
    SIGKILL it: a process that dies mid-call, as a crash leaves it."""
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert holding.wait(timeout), f"{argv[:4]}: the model call was never held"
    finally:
        process.kill()
        process.wait(timeout)
