"""The MCP servers an ACP client names in `session/new` and `session/load`, started for that
session only (README, "ACP").

Each server the client names becomes an `McpServerSpec` (the one MCP machinery the runtime's
configured servers use, runtime/tools/mcp_servers.py): stdio `{name, command, args, env}` runs
the command in the session's `cwd` with those environment variables; `{type: "http", name, url,
headers}` is a streamable HTTP endpoint. SSE (`type: "sse"`, not advertised in `initialize`) and
anything else are skipped with a log line, as is a server that fails to start: the session works
without its tools. A name that a tool name cannot carry (`mcp__<server>__<tool>`: letters,
digits, `_`, `-`) is mended (other characters become `_`); a name given twice keeps its first.

The servers run in a nursery of their own, in a task of the connection's nursery, so they live
as long as the session: `aclose` (on `session/close`, or when the connection ends) stops them.
Their tools go to the session and its descendants through the agent registry's session tools
(`SessionTools`), and they replace, for that session, the tools of a configured server of the
same name (the client's wins).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from ...agent.registry import SessionTools
from ...foundation.json_values import JsonValue
from ...tools.mcp_servers import McpServers
from ...tools.mcp_spec import McpServerSpec, mcp_tool_name

__all__ = ["ClientServers", "client_specs"]

log = logging.getLogger(__name__)


def client_specs(servers: Sequence[JsonValue], cwd: str, session_id: str) -> list[McpServerSpec]:
    """The specs of the servers a client named; each one that cannot be served is logged and
    left out."""
    specs: list[McpServerSpec] = []
    for server in servers:
        raw = server.get("name") if isinstance(server, Mapping) else None
        label = repr(raw) if isinstance(raw, str) else "without a name"
        try:
            spec = _spec(server, cwd)
        except ValueError as exc:
            log.warning("MCP server %s of session %s left out: %s", label, session_id, exc)
            continue
        if any(s.name == spec.name for s in specs):
            log.warning(
                "MCP server %s of session %s left out: the name %r is given twice", label, session_id, spec.name
            )
            continue
        specs.append(spec)
    return specs


def _spec(server: JsonValue, cwd: str) -> McpServerSpec:
    if not isinstance(server, Mapping):
        raise ValueError("not an object")
    name = server.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("it has no name")
    mended = re.sub(r"_{2,}", "_", re.sub(r"[^A-Za-z0-9_-]", "_", name))
    kind = server.get("type", "stdio")
    if kind == "stdio":
        return McpServerSpec(
            name=mended,
            command=server.get("command"),
            args=_list(server.get("args", []), "args"),
            env=_pairs(server.get("env", []), "env"),
            cwd=cwd,
        )
    if kind == "http":
        return McpServerSpec(name=mended, url=server.get("url"), headers=_pairs(server.get("headers", []), "headers"))
    if kind == "sse":
        raise ValueError("SSE servers are not supported (use stdio or streamable HTTP)")
    raise ValueError(f"unknown server type {kind!r}")


def _list(value: JsonValue, label: str) -> list[JsonValue]:
    if not isinstance(value, list):
        raise ValueError(f"{label} must be a list")
    return value


def _pairs(value: JsonValue, label: str) -> dict[str, JsonValue]:
    """ACP's `[{name, value}]` as a mapping (the spec checks the values are strings)."""
    out: dict[str, JsonValue] = {}
    for entry in _list(value, label):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) or "value" not in entry:
            raise ValueError(f"each of {label} must be {{name, value}}")
        out[entry["name"]] = entry["value"]
    return out


class ClientServers:
    """One session's client-named MCP servers: their tools for the registry, their lifetime."""

    def __init__(self, specs: Sequence[McpServerSpec], servers: McpServers | None) -> None:
        self._specs = list(specs)
        self._servers = servers

    @classmethod
    async def start(
        cls, nursery: trio.Nursery, servers: Sequence[JsonValue], cwd: str, session_id: str
    ) -> ClientServers:
        """Start the servers a client named (in a task of `nursery`), each ready or failed when
        this returns; each one that failed is logged."""
        specs = client_specs(servers, cwd, session_id)
        if not specs:
            return cls(specs, None)

        async def hold(task_status: trio.TaskStatus[McpServers]) -> None:
            # The servers' own nursery: it ends when `aclose` has stopped every connection.
            async with trio.open_nursery() as own:
                task_status.started(await McpServers.start(own, specs))

        started: McpServers = await nursery.start(hold)
        for status in started.status():
            if status.state != "ready":
                log.warning(
                    "MCP server %r of session %s did not start: %s; the session goes on without its tools",
                    status.name,
                    session_id,
                    status.error,
                )
        return cls(specs, started)

    def session_tools(self, configured: Sequence[Any]) -> SessionTools:
        """The tools they give the session; `configured` (the runtime's shared MCP tools) named
        by one of their servers are hidden — named by the client, the server is the client's."""
        prefixes = tuple(mcp_tool_name(spec.name, "") for spec in self._specs)
        hides = [tool.name for tool in configured if tool.name.startswith(prefixes)] if prefixes else []
        return SessionTools(self._servers.tools() if self._servers is not None else (), hides)

    async def aclose(self) -> None:
        """Stop every server (bounded: see `McpServers.aclose`)."""
        if self._servers is not None:
            await self._servers.aclose()
