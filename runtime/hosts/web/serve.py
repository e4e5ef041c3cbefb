"""`subagents web`'s server: the console's app under Hypercorn's Trio worker, over a read side
kept open while it serves."""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from subagents.storage import StorageError

from ...foundation.errors import SessionQueryError, UsageError
from ...read_side import open_read_side
from .app import WebSettings, build_app
from .security import Access, is_loopback

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from ...read_side import ReadSide

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
    live_interval: float = 1.0,
    ready: Callable[[list[str]], None],
    shutdown: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until `shutdown` returns (or the caller is cancelled); `ready(urls)` once bound. An
    address that cannot be bound is a `UsageError`, before the store is opened."""
    fd = _listening_socket(host, port)
    handed = False
    try:
        # With change notification: the console lists the corpus again and again (each page,
        # and the pulse of the live pages every interval), and a warm listing then re-stats
        # only the session folders the kernel named.
        async with open_read_side(root, store=store, stall_after=stall_after, watch=True) as side:
            settings = WebSettings(
                root=root,
                store=store,
                access=access,
                read_only=read_only,
                private_reads=not is_loopback(host),
                hosts=allowed_hosts(host),
                live_interval=live_interval,
            )
            config = Config()
            config.bind = [f"fd://{fd}"]  # bound here, so a refusal is one clear error
            config.accesslog = None
            config.loglevel = "WARNING"  # its "Running on" line repeats ours
            await _warm(side)
            async with trio.open_nursery() as nursery:
                handed = True  # Hypercorn's listener owns (and closes) the socket from here
                urls = await nursery.start(_serve, build_app(side, settings), config, shutdown)
                ready(urls)
                task_status.started(urls)
    finally:
        if not handed:
            os.close(fd)


async def _warm(side: ReadSide) -> None:
    """One listing before the console says it is ready: the first listing of a store reads the
    index whole and sets the change watches (about 0.3 s at 10,000 sessions), the later ones
    re-stat what changed, so the first page a person opens costs what every later one does. A
    store that does not answer now is the first page's to say (a 503 page and the banner)."""
    try:
        await side.query.list_sessions(probe_locks=True)
    except (StorageError, SessionQueryError, OSError):
        pass  # said by the pages, which ask again


def _listening_socket(host: str, port: int) -> int:
    """A socket bound to `host:port`, as a file descriptor for Hypercorn's `fd://` bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host.strip("[]"), port), family=family)
    except OSError as exc:
        raise UsageError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    return sock.detach()


async def _serve(
    app: ASGIApp,
    config: Config,
    shutdown: Callable[[], Awaitable[None]] | None,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    await serve(app, config, shutdown_trigger=shutdown, task_status=task_status)  # type: ignore[arg-type]  # Starlette's ASGI types are Hypercorn's in another spelling
