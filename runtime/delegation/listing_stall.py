"""`stall_after` for the read-only listings (`children`, `agents`, `sessions`): the one key of
`subagents.toml` they need, read without loading the configuration module (it imports the
model and tool specs a read-only command must not load: tests/runtime/test_startup_imports.py).

The same files and precedence as runtime/config.py (the project's file over the user's over the
default) and the same check (a number of seconds > 0); a file that cannot be read or parsed, or
a bad value, is the same one-line error (`ConfigInvalid`) `subagents config` gives.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..foundation.config_files import config_files, read_config_file
from ..foundation.errors import ConfigInvalid

__all__ = ["STALL_AFTER", "configured_stall_after"]

STALL_AFTER = 300.0  # the default: 5 minutes


def configured_stall_after(project_dir: str = ".", *, env: Mapping[str, str] | None = None) -> float:
    """The effective `stall_after` (seconds). Raises `ConfigInvalid`."""
    value = STALL_AFTER
    for path in config_files(project_dir, env):
        document = read_config_file(path)
        if document is not None and "stall_after" in document:
            value = _seconds(path, document["stall_after"])
    return value


def _seconds(path: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        shown = "a table" if isinstance(value, dict) else "a list" if isinstance(value, list) else repr(value)
        raise ConfigInvalid(f"{path}: stall_after must be a number of seconds > 0, got {shown}")
    return float(value)
