"""What one MCP tool server is (README "MCP servers"; SPEC §8): a name, how to reach it (a stdio
command or a streamable HTTP url) and its timeouts. Plain data: the configuration builds these
from `[mcp_servers.<name>]`, an embedder builds them by hand; nothing here imports `mcp`."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import attrs

__all__ = ["McpServerSpec", "mcp_tool_name"]

# Tool names the model APIs accept (OpenAI: ^[a-zA-Z0-9_-]{1,64}$); a server name is part of one.
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def mcp_tool_name(server: str, tool: str) -> str:
    """The runtime's name of `tool` on `server`: `mcp__<server>__<tool>`, characters a model API
    refuses in a tool name replaced by `_`."""
    return f"mcp__{server}__{_UNSAFE.sub('_', tool)}"


def _strings(value: Mapping[str, str] | None) -> dict[str, str] | None:
    return None if value is None else dict(value)


@attrs.frozen(kw_only=True)
class McpServerSpec:
    """One MCP server: either `command` (+ `args`, `env`, `cwd`) run as a stdio subprocess, or
    `url` (+ `headers`) of a streamable HTTP endpoint. `env` is added to the small environment the
    SDK passes on (HOME, PATH, SHELL, TERM, USER, LOGNAME), never the whole of ours: a key the
    server needs is named here. `startup_timeout` bounds start, initialize and the tool listing;
    `call_timeout` one tool call (seconds). `output_chars` caps the text one result keeps."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    env: dict[str, str] | None = attrs.field(default=None, converter=_strings)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = attrs.field(factory=dict, converter=dict)
    startup_timeout: float = 30.0
    call_timeout: float = 300.0
    output_chars: int = 30_000
    sandbox: bool = False

    def __attrs_post_init__(self) -> None:
        where = f"MCP server {self.name!r}"
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name) or "__" in self.name:
            # It is part of every tool name (`mcp__<server>__<tool>`), which model APIs restrict.
            raise ValueError(f"MCP server name {self.name!r} must be letters, digits, '_' or '-', without '__'")
        if (self.command is None) == (self.url is None):
            raise ValueError(f"{where}: give exactly one of command (stdio) or url (streamable HTTP)")
        if self.command is not None and (not isinstance(self.command, str) or not self.command):
            raise ValueError(f"{where}: command must be a non-empty string")
        if not all(isinstance(a, str) for a in self.args):
            raise ValueError(f"{where}: args must be strings")
        for label, table in (("env", self.env or {}), ("headers", self.headers)):
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
                raise ValueError(f"{where}: {label} must map strings to strings")
        if self.url is not None and (not isinstance(self.url, str) or not re.match(r"https?://", self.url)):
            raise ValueError(f"{where}: url must start with http:// or https://, got {self.url!r}")
        if self.url is not None and (self.args or self.env is not None or self.cwd is not None):
            raise ValueError(f"{where}: args, env and cwd belong to a stdio server (command), not a url")
        if self.sandbox is not False and (self.sandbox is not True or self.url is not None):
            raise ValueError(f"{where}: sandbox must be true or false, and belongs to a stdio server (command)")
        if self.command is not None and self.headers:
            raise ValueError(f"{where}: headers belong to an HTTP server (url), not a command")
        for label in ("startup_timeout", "call_timeout"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{where}: {label} must be a positive number of seconds, got {value!r}")
        if isinstance(self.output_chars, bool) or not isinstance(self.output_chars, int) or self.output_chars < 100:
            raise ValueError(f"{where}: output_chars must be an integer of at least 100, got {self.output_chars!r}")

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"
