"""`subagents web`'s server: the console's app under Hypercorn's Trio worker, over a read side
kept open while it serves."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from ...read_side import open_read_side
from .app import WebSettings, build_app
from .security import Access, is_loopback

if TYPE_CHECKING:
    from starlette.types import ASGIApp

__all__ = ["allowed_hosts", "serve_console"]


def allowed_hosts(host: str) -> frozenset[str]:
    """The names a loopback console answers in a `Host` header, whatever the port (a page of
    another site that rebinds its name to 127.0.0.1 sends its own name); empty (any) for a
    console bound elsewhere, which asks for the token on every request instead."""
    if not is_loopback(host):
        return frozenset()
    return frozenset({f"[{host}]" if ":" in host else host, "localhost", "127.0.0.1", "[::1]"})


async def serve_console(
    *,
    root: str,
    store: str | None,
    host: str,
    port: int,
    access: Access,
    read_only: bool,
    stall_after: float,
    ready: Callable[[list[str]], None],
    shutdown: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until `shutdown` returns (or the caller is cancelled); `ready(urls)` once bound."""
    async with open_read_side(root, store=store, stall_after=stall_after) as side:
        settings = WebSettings(
            root=root,
            access=access,
            read_only=read_only,
            private_reads=not is_loopback(host),
            hosts=allowed_hosts(host),
        )
        config = Config()
        config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
        config.accesslog = None
        config.errorlog = None  # a request's error is its page; the server's own go to stderr below
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(_serve, build_app(side, settings), config, shutdown)
            ready(urls)
            task_status.started(urls)


async def _serve(
    app: ASGIApp,
    config: Config,
    shutdown: Callable[[], Awaitable[None]] | None,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    await serve(app, config, shutdown_trigger=shutdown, task_status=task_status)  # type: ignore[arg-type]  # Starlette's ASGI types are Hypercorn's in another spelling
