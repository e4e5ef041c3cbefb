"""The model defaults the CLI's help and the configuration name (`DEFAULT_MODEL`,
`DEFAULT_STALL_TIMEOUT`, `parse_stall_timeout`), apart from the models themselves: reading them
loads no model transport (httpx) and no scripted model, so a command that only shows or parses
them starts fast (issue 20, start-up)."""

from __future__ import annotations

import math

__all__ = ["DEFAULT_MODEL", "DEFAULT_STALL_TIMEOUT", "parse_stall_timeout"]

DEFAULT_MODEL = "deepseek:deepseek-chat"
DEFAULT_STALL_TIMEOUT = 30.0


def parse_stall_timeout(text: str) -> float:
    """A `--stall-timeout SECONDS` argument: a positive finite number, else `ValueError` with a
    one-line message."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"--stall-timeout must be a positive number of seconds, got {text!r}")
    return value
