"""`stall_after` for the read-only listings (`children`, `agents`, `sessions`): the one key of
`subagents.toml` they need, read without loading the configuration module (it imports the
model and tool specs a read-only command must not load: tests/runtime/test_startup_imports.py).

The same files and precedence as runtime/config.py (the project's file over the user's over the
default) and the same check (a number of seconds > 0); a file that cannot be read or parsed, or
a bad value, is the same one-line error (`ConfigInvalid`) `subagents config` gives.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping

from ..foundation.errors import ConfigInvalid

__all__ = ["STALL_AFTER", "configured_stall_after"]

STALL_AFTER = 300.0  # the default: 5 minutes
_FILE = "subagents.toml"


def configured_stall_after(project_dir: str = ".", *, env: Mapping[str, str] | None = None) -> float:
    """The effective `stall_after` (seconds). Raises `ConfigInvalid`."""
    env = os.environ if env is None else env
    if env.get("SUBAGENTS_CONFIG_DIR"):
        user_dir = env["SUBAGENTS_CONFIG_DIR"]
    elif sys.platform.startswith("linux"):
        # platformdirs' answer on Linux, without its import (~10 ms of a command's start-up).
        user_dir = os.path.join(env.get("XDG_CONFIG_HOME", "").strip() or os.path.expanduser("~/.config"), "subagents")
    else:
        import platformdirs

        user_dir = platformdirs.user_config_dir("subagents", appauthor=False)
    value = STALL_AFTER
    for path in (os.path.join(user_dir, _FILE), os.path.join(os.path.abspath(project_dir), _FILE)):
        document = _read(path)
        if document is not None and "stall_after" in document:
            value = _seconds(path, document["stall_after"])
    return value


def _read(path: str) -> dict[str, object] | None:
    if not os.path.lexists(path):
        return None  # the usual case: no file, and tomllib (~9 ms to import) is not loaded
    import tomllib

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise ConfigInvalid(f"{path}: is a folder, not a file") from None
    except OSError as exc:
        raise ConfigInvalid(f"{path}: cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigInvalid(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigInvalid(f"{path}: not UTF-8 text") from None


def _seconds(path: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        shown = "a table" if isinstance(value, dict) else "a list" if isinstance(value, list) else repr(value)
        raise ConfigInvalid(f"{path}: stall_after must be a number of seconds > 0, got {shown}")
    return float(value)
