"""A real MCP server for the tests, written with the official SDK (FastMCP), run as a subprocess.

    python mcp_server.py stdio    serve over stdio
    python mcp_server.py http     serve streamable HTTP on a free loopback port, printing
                                  `port N` on stdout once the socket listens
    python mcp_server.py broken   write a complaint to stderr and exit 3 before initializing

Tools: echo, add, optional (an anyOf schema), fail (raises: an isError result), picture (an image
block), look (a file's text, or the error reading it: what a sandboxed server sees), sleep (waits until cancelled), cancellations (how many sleeps were cancelled, waiting
for the first), header (an HTTP request header) and exit (the process dies, mid-call).
"""

from __future__ import annotations

import os
import socket
import sys

import anyio
from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ImageContent

server = FastMCP("test-server", log_level="WARNING")
cancelled = {"count": 0, "event": None}


@server.tool()
def echo(text: str) -> str:
    """Say `text` back."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def optional(x: int | None = None) -> str:
    """Say whether `x` was given (its schema is an anyOf)."""
    return "no x" if x is None else f"x={x}"


@server.tool()
def look(path: str) -> str:
    """The text of the file at `path`, or the error reading it."""
    try:
        with open(path) as f:
            return f.read()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror}"


@server.tool()
def fail(message: str) -> str:
    """Raise an error with `message`."""
    raise ValueError(message)


@server.tool()
def picture() -> list[object]:
    """A caption and a four-byte image."""
    return ["a caption", ImageContent(type="image", data="AAECAw==", mimeType="image/png")]


def _event() -> anyio.Event:
    if cancelled["event"] is None:
        cancelled["event"] = anyio.Event()
    return cancelled["event"]  # type: ignore[return-value]  # set before the tool returns


@server.tool()
async def sleep(fifo: str = "") -> str:
    """Wait until cancelled; first write a line to the named pipe `fifo`, if given (the test
    waits on it to know the call has arrived)."""
    if fifo:
        await anyio.to_thread.run_sync(_tell, fifo)
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        cancelled["count"] += 1
        _event().set()
        raise
    return "unreachable"


def _tell(fifo: str) -> None:
    with open(fifo, "w") as pipe:
        pipe.write("sleeping\n")


@server.tool()
async def cancellations() -> int:
    """How many `sleep` calls were cancelled (waits up to 20 s for the first)."""
    with anyio.move_on_after(20):
        await _event().wait()
    return int(cancelled["count"])


@server.tool()
def header(key: str, ctx: Context) -> str:
    """The value of the HTTP request header `key` (empty over stdio)."""
    request = ctx.request_context.request
    return "" if request is None else str(request.headers.get(key, ""))


@server.tool()
def exit(code: int = 7) -> str:
    """End the server process at once, mid-call."""
    print(f"exiting with {code} on request", file=sys.stderr, flush=True)
    os._exit(code)


async def serve_http() -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on")
    print(f"port {sock.getsockname()[1]}", flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "stdio":
        server.run("stdio")
    elif mode == "http":
        anyio.run(serve_http)
    else:
        print("refusing to start: this server is broken on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
