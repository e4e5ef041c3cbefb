"""Where `subagents.toml` lives and how a file of it is read, for every reader: the hosts'
configuration (runtime/config.py) and the read-only commands' single keys (`stall_after`,
`[prices]`), which must not load the configuration module (tests/runtime/test_startup_imports.py).

The user's file, then the project's (later wins); a file that does not exist is no layer. On
Linux the user's folder is platformdirs' answer computed without importing it, and `tomllib` is
imported only when a file is there: a read-only command without a config file pays neither
(~20 ms of its start-up). A file that cannot be read or parsed is one line, `ConfigInvalid`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from .errors import ConfigInvalid

__all__ = ["CONFIG_FILE", "config_files", "read_config_file", "user_config_dir"]

CONFIG_FILE = "subagents.toml"


def user_config_dir(env: Mapping[str, str] | None = None) -> str:
    """The user's config folder: `$SUBAGENTS_CONFIG_DIR`, else platformdirs' (on Linux computed
    as it does, without its import)."""
    env = os.environ if env is None else env
    if env.get("SUBAGENTS_CONFIG_DIR"):
        return env["SUBAGENTS_CONFIG_DIR"]
    if sys.platform.startswith("linux"):
        return os.path.join(env.get("XDG_CONFIG_HOME", "").strip() or os.path.expanduser("~/.config"), "subagents")
    import platformdirs

    return platformdirs.user_config_dir("subagents", appauthor=False)


def config_files(project_dir: str = ".", env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The user's file and the project's, in the order they are layered."""
    return (
        os.path.join(user_config_dir(env), CONFIG_FILE),
        os.path.join(os.path.abspath(project_dir), CONFIG_FILE),
    )


def read_config_file(path: str) -> dict[str, Any] | None:
    """The file's table, or None when there is no such file. Raises `ConfigInvalid`."""
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
