"""Connections to the PostgreSQL store: URL checks, a small bounded pool.

psycopg 3 (synchronous) is imported here, lazily, the first time a store opens: a runtime on the
file store never loads it. Every connection is in autocommit mode, so one statement is one
transaction unless a caller opens a block (`conn.transaction()`), and carries the application
name `subagents <pid>@<host>` (what `pg_stat_activity` shows an operator).

`Pool` hands out at most `size` connections, reusing idle ones; a connection a failure left
broken is discarded, never handed out again. Each store also keeps one dedicated connection of
its own, the owner connection that holds its host's liveness lock (pg_leases).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Generator
from contextlib import contextmanager
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from .errors import InvalidStoreUrl, StoreUnreachable
from .pg_timeouts import connection_options

if TYPE_CHECKING:  # annotations: psycopg is imported when a store opens on a PostgreSQL URL
    import psycopg
    from psycopg.rows import TupleRow

    Connection = psycopg.Connection[TupleRow]  # a connection with psycopg's default rows, tuples

__all__ = ["Pool", "application_name", "check_url", "close_quietly", "connect", "first_line", "redact"]

SCHEMES = ("postgresql", "postgres")


def redact(url: str) -> str:
    """`url` without its password (for messages and logs)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "<an unparsable URL>"


def check_url(url: object) -> str:
    """The URL if it is a PostgreSQL connection URL psycopg accepts, else `InvalidStoreUrl`
    (`StoreUnreachable` when psycopg itself is missing)."""
    if type(url) is not str:
        raise InvalidStoreUrl(f"a PostgreSQL store URL is a str, got {type(url).__name__}")
    scheme = url.partition("://")[0]
    if scheme not in SCHEMES or "://" not in url:
        raise InvalidStoreUrl(f"not a PostgreSQL URL (postgresql://...): {redact(url)!r}")
    try:
        import psycopg
    except ImportError:
        raise StoreUnreachable(
            "the PostgreSQL store needs psycopg 3, which is not installed: pip install 'trio-subagents[postgres]'"
        ) from None
    from psycopg import conninfo

    try:
        conninfo.conninfo_to_dict(url)
        urlsplit(url).port  # noqa: B018  # a port that is not a number raises here
    except (ValueError, psycopg.Error) as exc:  # psycopg.ProgrammingError: a malformed conninfo
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidStoreUrl(f"not a valid PostgreSQL URL {redact(url)!r}: {reason}") from None
    return url


def application_name() -> str:
    """This process among the store's clients (at most 63 bytes, PostgreSQL's limit)."""
    return f"subagents {os.getpid()}@{socket.gethostname()}"[:63]


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (psycopg's run to several), or its class name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def connect(url: str, app: str) -> Connection:
    """One autocommit connection, or `StoreUnreachable` saying why in one line."""
    import psycopg

    try:
        return psycopg.connect(url, autocommit=True, application_name=app, **connection_options(url))
    except psycopg.Error as exc:
        raise StoreUnreachable(f"cannot connect to PostgreSQL at {redact(url)}: {first_line(exc)}") from None


class Pool:
    """At most `size` connections, reused; broken ones are dropped. Thread-safe."""

    def __init__(self, url: str, *, size: int = 4) -> None:
        self.url = url
        self.app = application_name()
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def connection(self) -> Generator[Connection]:
        self._slots.acquire()
        try:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None or conn.closed:
                conn = connect(self.url, self.app)
            try:
                yield conn
            finally:
                with self._lock:
                    if conn.broken or conn.closed:
                        # The server went away (a restart, a failover) or cut this backend: the
                        # idle ones are most likely gone too, so none is handed out again.
                        stale, self._idle = [conn, *self._idle], []
                    elif self._closed:
                        stale = [conn]
                    else:
                        stale = []
                        self._idle.append(conn)
                for old in stale:
                    close_quietly(old)
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            close_quietly(conn)


def close_quietly(conn: Connection) -> None:
    """Close `conn`, ignoring a failure (it failed already)."""
    try:
        conn.close()
    except Exception:  # closing a connection that already failed: nothing more to learn
        pass
