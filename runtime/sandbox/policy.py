"""What the sandbox allows (README "Sandbox"): `[sandbox]` in `subagents.toml` as a value.

Plain data and the checks of its keys; nothing here runs a process. `mode = "on"` confines every
`run_command` (and each stdio MCP server marked `sandbox = true`) in bubblewrap; `"off"` runs them
unconfined, as before the sandbox existed. The paths are as written: `~` and relative paths are
made absolute when a command is wrapped (argv.py), where the home folder and the workspace are
known.
"""

from __future__ import annotations

import os
from typing import Literal

import attrs

__all__ = [
    "HIDDEN_HOME_PATHS",
    "HIDDEN_SOCKET_FOLDERS",
    "PolicyRefused",
    "SandboxMode",
    "SandboxPolicy",
    "check_mode",
    "check_paths",
    "check_writable",
]

SandboxMode = Literal["on", "off"]

# Under the home folder: what a person expects no command of an agent to read (keys, cloud
# credentials, this program's own configuration with its model keys), and the folders where a
# container engine's VM puts its socket (colima, lima, Rancher Desktop, podman machine): a
# command that reaches a docker socket is root on that engine.
HIDDEN_HOME_PATHS = (
    ".ssh",
    ".aws",
    ".gnupg",
    ".netrc",
    ".docker",
    ".kube",
    ".config/gh",
    ".config/subagents",
    # Credential stores of common tools (git's, package indexes', databases', clouds', keyrings).
    ".git-credentials",
    ".pypirc",
    ".pgpass",
    ".my.cnf",
    ".vault-token",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".config/gcloud",
    ".azure",
    ".password-store",
    ".local/share/keyrings",
    ".terraform.d/credentials.tfrc.json",
    ".config/hub",
    ".colima",
    ".lima",
    ".rd",
    ".local/share/containers/podman/machine",
)
# Outside the home folder, besides /run and /tmp (argv.py): daemons' sockets elsewhere
# (/var/run where it is a folder rather than a link to /run; LXD's, root-equivalent).
HIDDEN_SOCKET_FOLDERS = ("/var/run", "/var/snap/lxd/common/lxd", "/var/lib/lxd")


class PolicyRefused(ValueError):
    """An agent type asks to make writable a path the box hides (its message names both)."""


@attrs.frozen(kw_only=True)
class SandboxPolicy:
    """`mode`: confine commands ("on") or not ("off"). `network`: commands may reach the
    network (off: a private network namespace with nothing in it, loopback included).
    `writable`: folders writable besides the workspace. `readable_hidden`: paths hidden besides
    the defaults (the runtime's root, `HIDDEN_HOME_PATHS`). `type_writable`: the folders an
    agent type adds to `writable` (README "Agent types"), refused (`PolicyRefused`) at or under a
    hidden path, where `writable`'s own would uncover it."""

    mode: SandboxMode = "on"
    network: bool = False
    writable: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    readable_hidden: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    type_writable: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    def __attrs_post_init__(self) -> None:
        check_mode(self.mode)
        check_writable(list(self.writable))
        check_paths(list(self.readable_hidden))
        check_paths(list(self.type_writable))

    @property
    def on(self) -> bool:
        return self.mode == "on"

    def summary(self) -> str:
        """One line for a tool result: what the box lets through."""
        parts = ["workspace writable", f"network {'on' if self.network else 'off'}"]
        if self.writable or self.type_writable:
            parts.append(f"also writable: {', '.join((*self.writable, *self.type_writable))}")
        return ", ".join(parts)


def check_mode(value: object) -> SandboxMode:
    """`sandbox.mode`: raises ValueError unless "on" or "off"."""
    if value == "on":
        return "on"
    if value == "off":
        return "off"
    raise ValueError(f'must be "on" or "off", got {value!r}')


def check_writable(value: object) -> tuple[str, ...]:
    """`sandbox.writable`: `check_paths`, and never the root itself — bound writable over the box
    it would cover its private /dev, /proc and /tmp with the host's (`mode = "off"` is the
    honest way to run unconfined)."""
    paths = check_paths(value)
    for path in paths:
        if os.path.normpath(path) in ("/", "//"):
            raise ValueError(f'may not hold {path!r}: the root writable is no box (set mode = "off" instead)')
    return paths


def check_paths(value: object) -> tuple[str, ...]:
    """`sandbox.writable`, `sandbox.readable_hidden`: a list of non-empty paths."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"must be a list of paths, got {value!r}")
    for path in value:
        if "\0" in path:
            raise ValueError(f"has a path with a NUL byte: {path!r}")
    return tuple(value)
