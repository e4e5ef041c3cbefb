"""The environment a sandboxed command gets: ours without its secrets.

A command keeps what a build needs (PATH, HOME, LANG, compilers' and virtualenvs' variables) and
loses what would let it act as us elsewhere: every model API key, and any variable whose name
says it holds a key, token, secret, password or credential, or this program's own settings (a
store URL may carry a password). The names are matched, not the values: a secret under an
innocent name passes, which is why `readable_hidden` and the sandbox's files exist too.

`socket_paths` reads the other side: where our environment says local daemons listen (an ssh or
gpg agent, the session bus, docker, podman, the user's runtime folder). Removing the variable
does not remove the socket, and a read-only mount does not stop `connect()` on it, so the box
hides those paths too; and `credential_files`, the key files it names (a cloud's, kubectl's).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["credential_files", "is_secret_name", "scrubbed_env", "socket_paths"]

_SECRET = re.compile(
    r"API_?KEY|_KEY\Z|TOKEN|SECRET|PASSW(OR)?D|CREDENTIAL|\AAWS_|\ASUBAGENTS_|\APG|DATABASE_URL|\ASSH_AUTH_SOCK\Z"
    r"|\AGPG_AGENT_INFO\Z|\ADBUS_SESSION_BUS_ADDRESS\Z",
    re.IGNORECASE,
)


def is_secret_name(name: str) -> bool:
    """Whether a variable named `name` is kept from sandboxed commands."""
    return bool(_SECRET.search(name))


def scrubbed_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the variables `is_secret_name` picks out."""
    return {name: value for name, value in env.items() if not is_secret_name(name)}


# Variables naming a socket (or a folder of them) by its path, as is or after a URL-ish prefix.
_SOCKET_VARIABLES = ("XDG_RUNTIME_DIR", "SSH_AUTH_SOCK", "DOCKER_HOST", "CONTAINER_HOST", "PODMAN_HOST")


def socket_paths(env: Mapping[str, str]) -> list[str]:
    """The absolute socket paths (and the runtime folder) `env` names: to hide in the box.
    An abstract socket (`unix:abstract=…`) has no path; the box's network namespace holds it."""
    found: list[str] = []
    for name in _SOCKET_VARIABLES:
        value = env.get(name, "")
        found.append(value.removeprefix("unix://"))
    found.append(env.get("GPG_AGENT_INFO", "").split(":")[0])
    for address in env.get("DBUS_SESSION_BUS_ADDRESS", "").split(";"):
        _, _, options = address.partition(":")
        for option in options.split(","):
            key, _, value = option.partition("=")
            if key == "path":
                found.append(value)
    return [path for path in found if path.startswith("/")]


# Variables naming a credential file or folder (KUBECONFIG: a list of files, `:`-separated).
_CREDENTIAL_VARIABLES = (
    "GOOGLE_APPLICATION_CREDENTIALS",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "PGPASSFILE",
    "NETRC",
    "KUBECONFIG",
    "DOCKER_CONFIG",
    "CLOUDSDK_CONFIG",
    "AZURE_CONFIG_DIR",
)


def credential_files(env: Mapping[str, str]) -> list[str]:
    """The absolute credential paths `env` names: to hide in the box (the variable may be
    removed, the file would stay)."""
    found = [path for name in _CREDENTIAL_VARIABLES for path in env.get(name, "").split(":")]
    return [path for path in found if path.startswith("/")]
