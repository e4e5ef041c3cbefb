"""MCP tool servers (README "MCP servers"; SPEC §8) through the official `mcp` SDK, on Trio.

`McpServers.start(nursery, specs)` starts every configured server at once, one task each in the
runtime's nursery holding the SDK's client session (stdio subprocess or streamable HTTP), and
returns when each is ready or has failed (bounded by its `startup_timeout`). Each tool a server
lists becomes a runtime tool `mcp__<server>__<tool>` whose calls go to `call_tool`.

Failures never reach the runtime: a server that cannot start contributes no tools and keeps its
reason (`status()`, for the host to show); one that dies later (its process exits, its connection
breaks) is marked down, and every call of its tools — one in flight included — answers at once
with `MCP_SERVER_UNAVAILABLE` and the reason (with the last lines the server wrote to stderr). A
call that outlasts `call_timeout` fails `MCP_TIMEOUT`; a cancelled turn cancels its calls at
once, and the server is told (`notifications/cancelled`, best effort). Restart policy: none — a
server that died stays down for the rest of the runtime (a new runtime starts it again), so a
crashing server cannot loop. The tools are the ones listed at start (`list_changed` is not
followed). `mcp` (and anyio) are imported only by mcp_connection.py, and only when a server is
configured.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import ClassVar

import attrs
import trio

from ..foundation.json_values import JsonObject as Json
from ..foundation.json_values import JsonValue
from ..sandbox.box import Sandbox
from .base import ToolContext
from .mcp_connection import McpConnection
from .mcp_spec import McpServerSpec, mcp_tool_name

__all__ = ["McpServerStatus", "McpServers", "McpTool"]


_CLOSE_GRACE = 5.0  # seconds the servers get to shut down on close before they are cancelled


@attrs.frozen
class McpServerStatus:
    """One server as the host may show it: `state` is starting, ready, failed (never started)
    or down (started, then died or closed); `error` says why it is not ready."""

    name: str
    state: str
    tools: tuple[str, ...]
    error: str | None


@attrs.frozen(kw_only=True)
class McpTool:
    """A runtime tool calling one tool of one MCP server. Its parameters are the server's input
    schema, given to the model unchanged and validated by the server (`server_validated`: the
    framework's own JSON-schema subset would refuse the `anyOf`/`$ref` schemas MCP servers send)."""

    name: str
    description: str
    parameters: Mapping[str, JsonValue]
    parallel_safe: bool
    remote_name: str
    # Its server's annotations say it reads only, or is idempotent: a call a crash cut runs again.
    idempotent: bool = False
    server: McpConnection
    server_validated: ClassVar[bool] = True

    async def run(self, args: Json, ctx: ToolContext) -> str:
        return await self.server.call(self.remote_name, self.name, args, ctx.abort)


def _tools_of(server: McpConnection) -> list[McpTool]:
    """The runtime tools of a server's listed tools (none if it never started). A remote name
    that maps to a name taken already, or one too long for a model API, is left out."""
    tools: dict[str, McpTool] = {}
    for tool in server.listed:
        name = mcp_tool_name(server.spec.name, tool.name)
        if name in tools or len(name) > 64:
            continue
        schema = tool.inputSchema if isinstance(tool.inputSchema, Mapping) else {}
        annotations = getattr(tool, "annotations", None)
        tools[name] = McpTool(
            name=name,
            description=tool.description or f"The {tool.name} tool of the MCP server {server.spec.name!r}.",
            parameters={"type": "object", **schema},
            parallel_safe=bool(getattr(annotations, "readOnlyHint", False)),
            idempotent=getattr(annotations, "readOnlyHint", None) is True
            or getattr(annotations, "idempotentHint", None) is True,
            remote_name=tool.name,
            server=server,
        )
    return list(tools.values())


class McpServers:
    """The runtime's MCP servers: their tools, their status, their lifetime."""

    def __init__(self, servers: Sequence[McpConnection]) -> None:
        self._servers = list(servers)
        self._tools = {id(s): _tools_of(s) for s in self._servers}  # fixed at start: no list_changed

    @classmethod
    async def start(
        cls,
        nursery: trio.Nursery,
        specs: Sequence[McpServerSpec],
        *,
        sandbox: Sandbox | None = None,
        workspace: str | None = None,
    ) -> McpServers:
        """Start every server in `nursery` and wait until each is ready or has failed; a server
        marked `sandbox` runs in `sandbox` with `workspace` writable."""
        cls.check(specs)
        # The SDK logs a server's protocol noise (a stray line on its stdout) with a traceback;
        # with no handler anywhere, Python's last resort would print it over the host's terminal.
        # A NullHandler stops only that: a host that configures logging still gets the records.
        sdk_log = logging.getLogger("mcp")
        if not any(isinstance(h, logging.NullHandler) for h in sdk_log.handlers):
            sdk_log.addHandler(logging.NullHandler())
        servers = [McpConnection(spec, sandbox=sandbox, workspace=workspace) for spec in specs]
        for server in servers:
            nursery.start_soon(server.run)
        for server in servers:
            await server.settled.wait()
        return cls(servers)

    @staticmethod
    def check(specs: Sequence[McpServerSpec]) -> None:
        """Refuse a list naming one server twice (its tools would collide)."""
        names = [spec.name for spec in specs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"MCP server names must be unique, given twice: {', '.join(twice)}")

    def tools(self) -> list[McpTool]:
        """The tools of every ready server, in configuration order."""
        return [tool for server in self._servers for tool in self._tools[id(server)]]

    def status(self) -> list[McpServerStatus]:
        return [
            McpServerStatus(s.spec.name, s.state, tuple(t.name for t in self._tools[id(s)]), s.error)
            for s in self._servers
        ]

    async def aclose(self) -> None:
        """Stop every server (stdin closed, or the HTTP session ended), cancelling the ones that
        do not finish within a few seconds."""
        for server in self._servers:
            server.stop()
        with trio.move_on_after(_CLOSE_GRACE):
            for server in self._servers:
                await server.done.wait()
        for server in self._servers:
            server.cancel()
        for server in self._servers:
            await server.done.wait()
