"""`subagents acp`: the stdio loop. Lines in from the client, one task per request (bounded),
every reply and notification out through one writer task, so lines never interleave.

Trio only: stdin and stdout are read and written as file descriptors. The connection ends
when stdin does; the runtime around it then drains like any other host's.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import trio

from ...app import Runtime, open_runtime
from ...models.base import AnyModel
from ...models.tee import TeeModel
from ...tools.permissions import PermissionAnswer, PermissionRequest
from .rpc import PARSE_ERROR, Incoming, error_line, parse_line
from .server import AcpServer

__all__ = ["TextRelay", "run_acp", "serve_acp"]

MAX_LINE = 16 * 1024 * 1024  # a longer line is refused (-32700) and skipped, not buffered
MAX_REQUESTS = 32  # requests handled at once; the reader waits beyond
_OUT_CAPACITY = 64


class TextRelay:
    """The `on_text` of a runtime's `TeeModel`, and its approver: answer text and permission
    questions go to the ACP server once one serves (the runtime opens before it exists)."""

    def __init__(self) -> None:
        self.target: Callable[[str, int, str], None] | None = None
        self.server: AcpServer | None = None

    def __call__(self, session_id: str, call: int, text: str) -> None:
        if self.target is not None:
            self.target(session_id, call, text)

    async def approve(self, request: PermissionRequest) -> PermissionAnswer:
        if self.server is None:
            return PermissionAnswer("deny", "no client is connected to ask")
        return await self.server.approve(request)


async def run_acp(
    root: str,
    model: AnyModel,
    version: str,
    runtime_options: Mapping[str, Any] | None = None,
    *,
    session_workspace: bool = False,
) -> int:
    """Serve ACP on this process's stdin and stdout over a runtime on `root` opened with
    `runtime_options` (the host's configuration); permission questions go to the client."""
    stdin = trio.lowlevel.FdStream(os.dup(0))
    stdout = trio.lowlevel.FdStream(os.dup(1))
    relay = TextRelay()
    options = {**(runtime_options or {}), "approver": relay.approve}
    async with stdin, stdout, open_runtime(root, model=TeeModel(model, relay), **options) as runtime:
        await serve_acp(runtime, stdin, stdout, version=version, relay=relay, session_workspace=session_workspace)
    return 0


async def serve_acp(
    runtime: Runtime,
    receive: trio.abc.ReceiveStream,
    send: trio.abc.SendStream,
    *,
    version: str,
    relay: TextRelay | None = None,
    session_workspace: bool = False,
) -> None:
    """Serve one ACP connection until `receive` ends. With `relay` (the `on_text` of the
    runtime's `TeeModel`), answer text streams as the model writes it; without, each reply's
    text is sent when it is durable."""
    out_send, out_receive = trio.open_memory_channel[bytes](_OUT_CAPACITY)
    async with trio.open_nursery() as outer:
        outer.start_soon(_write_lines, out_receive, send)
        async with out_send:
            limiter = trio.Semaphore(MAX_REQUESTS)  # released by the request's own task
            async with trio.open_nursery() as work:
                server = AcpServer(runtime, work, out_send, version=version, session_workspace=session_workspace)
                if relay is not None:
                    relay.target = server.on_text
                    relay.server = server
                async for line in _lines(receive):
                    message = (
                        parse_line(line)
                        if line is not None
                        else error_line(None, PARSE_ERROR, "Parse error: line too long")
                    )
                    if isinstance(message, bytes):
                        await out_send.send(message)
                    elif message.is_response:  # to a request of ours (a permission question)
                        server.on_response(message)
                    else:
                        await limiter.acquire()
                        work.start_soon(_handle, server, message, limiter)
                if relay is not None:
                    relay.target = relay.server = None
                await server.aclose()
                work.cancel_scope.cancel()  # prompts still waiting: the client has gone


async def _handle(server: AcpServer, message: Incoming, limiter: trio.Semaphore) -> None:
    try:
        await server.handle(message)
    finally:
        limiter.release()


async def _write_lines(lines: trio.MemoryReceiveChannel[bytes], stream: trio.abc.SendStream) -> None:
    """Write each line; once the client stops reading, keep draining so no sender blocks."""
    broken = False
    async with lines:
        async for line in lines:
            if broken:
                continue
            try:
                await stream.send_all(line)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                broken = True


async def _lines(stream: trio.abc.ReceiveStream) -> AsyncIterator[bytes | None]:
    """The non-blank lines of `stream`; None for a line over MAX_LINE (never buffered whole:
    the rest of it is skipped up to its newline)."""
    buffer = bytearray()
    skipping = False
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            if buffer.strip() and not skipping:
                yield bytes(buffer) if len(buffer) <= MAX_LINE else None
            return
        scan = len(buffer)  # only the new bytes can hold a newline
        buffer += chunk
        while (end := buffer.find(b"\n", scan)) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            scan = 0
            if skipping:
                skipping = False
            elif len(line) > MAX_LINE:
                yield None
            elif line.strip():
                yield line
        if len(buffer) > MAX_LINE:
            buffer.clear()
            if not skipping:
                skipping = True
                yield None
