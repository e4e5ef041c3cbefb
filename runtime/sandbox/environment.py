"""The environment a sandboxed command gets: ours without its secrets.

A command keeps what a build needs (PATH, HOME, LANG, compilers' and virtualenvs' variables) and
loses what would let it act as us elsewhere: every model API key, and any variable whose name
says it holds a key, token, secret, password or credential, or this program's own settings (a
store URL may carry a password). The names are matched, not the values: a secret under an
innocent name passes, which is why `readable_hidden` and the sandbox's files exist too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["is_secret_name", "scrubbed_env"]

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
