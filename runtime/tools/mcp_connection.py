"""One MCP server's connection (runtime/tools/mcp_servers.py has the whole story): a task holding
the SDK's client session over stdio or streamable HTTP, relays that notice the server going away
and note our calls' request ids, and the calls themselves with their timeout, cancellation and
error results. `mcp` and anyio are imported inside the functions, never at module level."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx
import trio
from subagents.actors import Abort

from ..foundation.errors import ToolFailure
from ..foundation.json_values import JsonObject as Json
from ..sandbox.box import Sandbox, SandboxUnavailable
from ..sandbox.policy import PolicyRefused
from .mcp_render import render_content
from .mcp_spec import McpServerSpec

if TYPE_CHECKING:  # annotations: the SDK is imported when a server starts, never before
    from mcp import ClientSession
    from mcp.types import RequestId
    from mcp.types import Tool as ListedTool

__all__ = ["McpConnection"]


_META_KEY = "subagents/call"  # marks our tools/call request so its JSON-RPC id can be found to cancel it
_STDERR_TAIL = 2000  # characters of a server's stderr kept to explain its failure
_CANCEL_NOTICE = 1.0  # seconds spent telling a server a call was cancelled
_STDERR_WAIT = 1.0  # seconds to read the rest of a server's stderr once it has exited
_PING_EVERY = 2.0  # seconds between pings of an HTTP server while calls are in flight
_PING_TIMEOUT = 10.0  # seconds a ping may take before the server counts as gone


def _fail(message: str, code: str) -> ToolFailure:
    return ToolFailure(message, code=code, name="McpError")


class McpConnection:
    """One server's connection: its task (`run`) holds the SDK session from start to close;
    `call` calls one of its tools."""

    def __init__(self, spec: McpServerSpec, *, sandbox: Sandbox | None = None, workspace: str | None = None) -> None:
        self.spec = spec
        self._sandbox = sandbox
        self._workspace = workspace
        self.state = "starting"
        self._reason: str | None = None
        self.listed: list[ListedTool] = []  # the tools the server listed
        self.settled = trio.Event()  # ready or failed
        self.done = trio.Event()  # the task has ended
        self._wake = trio.Event()  # stop asked, or the server went down
        self._down = trio.Event()
        self._scope = trio.CancelScope()
        self._session: ClientSession | None = None
        self._stderr = ""
        self._requests: dict[str, RequestId | None] = {}  # our call token -> its JSON-RPC request id
        self._calls = 0

    # --- the task -------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            with self._scope:
                async with self._open_session() as session:
                    listed = await self._initialize(session)
                    if listed is not None:
                        self._ready(session, listed)
                        async with trio.open_nursery() as nursery:
                            if self.spec.url is not None:
                                nursery.start_soon(self._keep_watch, session)
                            await self._wake.wait()
                            nursery.cancel_scope.cancel()
        except Exception as exc:  # any failure of the server or its transport: the server is unavailable
            self._went_down(_describe(exc))
        finally:
            self._went_down("the runtime closed it")
            self.settled.set()  # after the transport closed: the stderr tail is read by now
            self.done.set()

    async def _keep_watch(self, session: ClientSession) -> None:
        """Over HTTP, while calls are in flight, ping the server every few seconds: the SDK lets
        a response stream that broke off end quietly, leaving its call to wait for its timeout,
        so a server that died mid-call is found by its ping instead (a failed ping breaks the
        transport, which marks the server down; one unanswered in time marks it here)."""
        while True:
            await trio.sleep(_PING_EVERY)
            if not self._requests:
                continue
            with trio.move_on_after(_PING_TIMEOUT) as waited:
                with contextlib.suppress(Exception):  # a broken transport reports itself (`run`)
                    await session.send_ping()
            if waited.cancelled_caught:
                self._went_down(f"it did not answer a ping within {_PING_TIMEOUT:g}s")

    async def _initialize(self, session: ClientSession) -> list[ListedTool] | None:
        """Initialize and list the tools, within the startup timeout; None if the server went
        down meanwhile (its reason is recorded)."""
        from mcp import McpError

        listed: list[ListedTool] | None = None
        async with trio.open_nursery() as nursery:

            async def watching() -> None:
                await self._down.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watching)
            with trio.move_on_after(self.spec.startup_timeout) as waited:
                try:
                    await session.initialize()
                    listed = await _list_tools(session)
                except McpError as exc:  # an error answer (over HTTP, a 404 reads "Session terminated")
                    raise _StartFailed(f"it refused to initialize: {exc}") from exc
            if waited.cancelled_caught:
                raise _StartFailed(f"it did not start within {self.spec.startup_timeout:g}s")
            nursery.cancel_scope.cancel()
        return listed

    @contextlib.asynccontextmanager
    async def _open_session(self) -> AsyncIterator[ClientSession]:
        import anyio
        from mcp import ClientSession

        async with self._transport() as streams, trio.open_nursery() as relays:
            to_session, session_reads = anyio.create_memory_object_stream[Any](0)
            session_writes, from_session = anyio.create_memory_object_stream[Any](0)
            relays.start_soon(self._relay_in, streams[0], to_session)
            relays.start_soon(self._relay_out, from_session, streams[1])
            async with ClientSession(session_reads, session_writes) as session:
                yield session
            relays.cancel_scope.cancel()

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        spec = self.spec
        if spec.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            # No read timeout: the startup and call timeouts bound every answer waited for, and
            # the server's own event stream (GET) may rightly stay quiet for long.
            timeout = httpx.Timeout(spec.startup_timeout, read=None)
            async with (
                httpx.AsyncClient(headers=spec.headers, timeout=timeout) as client,
                streamable_http_client(spec.url, http_client=client) as streams,
            ):
                yield streams
            return
        from mcp.client.stdio import StdioServerParameters, stdio_client

        assert spec.command is not None  # a spec without a url has a command (checked when made)
        argv = [spec.command, *spec.args]
        if spec.sandbox:
            argv = await self._boxed(argv)
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=spec.env, cwd=spec.cwd)
        # The server's stderr goes to a pipe we read (its tail explains a failure), not to our
        # terminal, where a chat or an ACP client would show it.
        read_fd, write_fd = os.pipe()
        errlog = os.fdopen(write_fd, "w")
        stderr_read = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_stderr, read_fd, stderr_read)
            try:
                async with stdio_client(params, errlog=errlog) as streams:
                    errlog.close()  # the child holds its own copy now
                    yield streams
            finally:
                errlog.close()
                # The server has exited: read what it wrote last, unless something it started
                # still holds the pipe open.
                with trio.move_on_after(_STDERR_WAIT):
                    await stderr_read.wait()
                nursery.cancel_scope.cancel()

    async def _boxed(self, argv: list[str]) -> list[str]:
        """`argv` inside the runtime's sandbox, the workspace (else the server's folder) writable.
        The environment stays the SDK's small one plus the spec's `env`."""
        if self._sandbox is None:
            raise _StartFailed("it asks for the sandbox and this runtime has none")
        folder = self.spec.cwd or self._workspace or os.getcwd()
        try:
            boxed, _ = await self._sandbox.wrap(argv, workspace=self._workspace or folder, cwd=folder)
        except (SandboxUnavailable, PolicyRefused) as exc:  # refused: a writable folder made a symlink
            raise _StartFailed(str(exc)) from None
        except OSError as exc:  # its program is missing, or hidden in the box
            raise _StartFailed(f"{argv[0]} cannot start in the sandbox: {exc.strerror or exc}") from None
        return boxed

    async def _read_stderr(self, fd: int, finished: trio.Event) -> None:
        async with trio.lowlevel.FdStream(fd) as stream:
            while chunk := await stream.receive_some(4096):
                self._stderr = (self._stderr + chunk.decode("utf-8", "replace"))[-_STDERR_TAIL:]
        finished.set()

    async def _relay_in(self, source: Any, sink: Any) -> None:
        """Server to session. The end of the server's stream means the server is gone; a session
        that no longer reads is our own side closing."""
        import anyio

        with contextlib.closing(sink):
            async for item in source:
                try:
                    await sink.send(item)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return
            # Marked down before the session hears the end: a call it then fails with "connection
            # closed" finds the server down, and answers so.
            self._went_down("its process ended" if self.spec.command is not None else "it closed the connection")

    async def _relay_out(self, source: Any, sink: Any) -> None:
        """Session to server, noting the id of each of our tool calls (to cancel it). A server
        that no longer reads is gone; the end of the session's stream is our own side closing."""
        import anyio

        async with source:
            async for item in source:
                root = getattr(item.message, "root", None)
                params = getattr(root, "params", None)
                meta = params.get("_meta") if isinstance(params, dict) else None
                if root is not None and isinstance(meta, dict) and meta.get(_META_KEY) in self._requests:
                    self._requests[meta[_META_KEY]] = root.id
                try:
                    await sink.send(item)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    self._went_down("its connection broke")
                    return

    def _ready(self, session: ClientSession, listed: list[ListedTool]) -> None:
        self.listed = listed
        self._session = session
        self.state = "ready"
        self.settled.set()

    def _went_down(self, reason: str) -> None:
        if self._down.is_set():
            return
        if self.state == "starting":
            self.state = "failed"
        elif self.state == "ready":
            self.state = "down"
        self._reason = reason
        self._down.set()
        self._wake.set()

    @property
    def error(self) -> str | None:
        """Why the server is not ready, with the last of its stderr (None while it is)."""
        if self._reason is None:
            return None
        lines = [" ".join(line.split()) for line in self._stderr.splitlines() if line.strip()]
        return f"{self._reason}; its stderr ended: {' | '.join(lines[-3:])}" if lines else self._reason

    def stop(self) -> None:
        self._wake.set()

    def cancel(self) -> None:
        self._scope.cancel()

    # --- calls ----------------------------------------------------------------------------

    def _unavailable(self) -> ToolFailure:
        return _fail(
            f"the MCP server {self.spec.name!r} is unavailable: {self.error or 'it is not running'}",
            "MCP_SERVER_UNAVAILABLE",
        )

    async def call(self, remote: str, name: str, args: Json, abort: Abort) -> str:
        session = self._session
        if session is None or self._down.is_set():
            raise self._unavailable()
        self._calls += 1
        token = f"{self._calls}"
        self._requests[token] = None
        outcome: dict[str, Any] = {}

        async def calling() -> None:
            from mcp import McpError

            with trio.move_on_after(self.spec.call_timeout) as waited:
                try:
                    outcome["result"] = await session.call_tool(remote, args, meta={_META_KEY: token})
                except McpError as exc:
                    # The SDK fails a call whose connection closed with an error of its own; the
                    # relay has marked the server down by then (`_relay_in`).
                    outcome["broken" if self._down.is_set() else "error"] = exc
                except Exception as exc:  # the transport failed under this call: the server is unavailable
                    outcome["broken"] = exc
            outcome["timeout"] = waited.cancelled_caught
            nursery.cancel_scope.cancel()

        async def watching(event: trio.Event | Abort, key: str) -> None:
            await event.wait()
            outcome[key] = True
            nursery.cancel_scope.cancel()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(calling)
                nursery.start_soon(watching, self._down, "down")
                nursery.start_soon(watching, abort, "aborted")
        finally:
            request_id = self._requests.pop(token, None)
            if "result" not in outcome and "error" not in outcome:
                await self._tell_cancelled(session, request_id)
        if "broken" in outcome:
            self._went_down(_describe(outcome["broken"]))
        if self._down.is_set() and "result" not in outcome and "error" not in outcome:
            await self._down_reason()
        return self._answer(name, outcome)

    def _answer(self, name: str, outcome: dict[str, Any]) -> str:
        if "result" in outcome:
            result = outcome["result"].model_dump(mode="json", by_alias=True)
            text = render_content(result.get("content") or [], result.get("structuredContent"), self.spec.output_chars)
            if result.get("isError"):
                raise _fail(text, "MCP_TOOL_ERROR")
            return text
        if "error" in outcome:
            raise _fail(f"the MCP server {self.spec.name!r} refused the call: {outcome['error']}", "MCP_TOOL_ERROR")
        if outcome.get("aborted"):
            raise _fail(f"{name} was cancelled with its turn", "MCP_CALL_CANCELLED")
        if outcome.get("timeout"):
            raise _fail(
                f"{name} did not answer within {self.spec.call_timeout:g}s (the call was cancelled)", "MCP_TIMEOUT"
            )
        raise self._unavailable()

    async def _down_reason(self) -> None:
        """Let a server that just went down finish closing, so its reason holds its stderr."""
        with trio.move_on_after(_STDERR_WAIT + 1):
            await self.done.wait()

    async def _tell_cancelled(self, session: ClientSession, request_id: RequestId | None) -> None:
        """Tell the server we gave up on a call (best effort: it may have gone)."""
        if request_id is None or self._down.is_set():
            return
        from mcp import types

        notice = types.ClientNotification(
            types.CancelledNotification(
                params=types.CancelledNotificationParams(requestId=request_id, reason="cancelled by the client")
            )
        )
        with trio.CancelScope(shield=True), trio.move_on_after(_CANCEL_NOTICE):
            with contextlib.suppress(Exception):  # the server may be gone already: nothing to tell
                await session.send_notification(notice)


async def _list_tools(session: ClientSession) -> list[ListedTool]:
    tools: list[ListedTool] = []
    cursor = None
    while True:
        page = await session.list_tools(cursor)
        tools.extend(page.tools)
        cursor = page.nextCursor
        if not cursor:
            return tools


class _StartFailed(Exception):
    """A server that did not initialize in time (stays inside this module)."""


def _describe(exc: BaseException) -> str:
    """One line for a failure, from the first leaf of a group (the SDK's task groups wrap)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, httpx.HTTPStatusError):
        return f"it answered HTTP {exc.response.status_code} at {exc.request.url}"
    if isinstance(exc, httpx.HTTPError):
        return f"its connection failed ({exc or type(exc).__name__})"
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").partition(".")[0] in ("mcp", "anyio"):
        return "the MCP SDK is not installed (install the `mcp` extra: pip install 'trio-subagents[mcp]')"
    if isinstance(exc, FileNotFoundError):
        return f"its command was not found ({exc.filename or exc})"
    if isinstance(exc, OSError):
        return f"it could not be started or reached ({exc.strerror or exc})"
    return str(exc) or type(exc).__name__
