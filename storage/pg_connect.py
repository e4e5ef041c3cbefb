"""Connections to the PostgreSQL store: URL checks, a small bounded pool, the owner connection.

psycopg 3 (synchronous) is imported here, lazily, the first time a store opens: a runtime on the
file store never loads it. Every connection is in autocommit mode, so one statement is one
transaction unless a caller opens a block (`conn.transaction()`), and carries the application
name `subagents <pid>@<host>`: `held_elsewhere` tells this process's locks from another's by it.

`Pool` hands out at most `size` connections, reusing idle ones; a connection a failure left
broken is discarded, never handed out again. `Owner` is one dedicated connection per store that
holds the session-level advisory locks standing for write handles (PostgreSQL releases them when
the connection ends, as the kernel releases a flock when a process dies).
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from .errors import InvalidStoreUrl, StoreUnreachable
from .pg_timeouts import connection_options

if TYPE_CHECKING:
    import psycopg

__all__ = ["Owner", "Pool", "application_name", "check_url", "lock_key", "redact"]

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


def lock_key(session_id: str) -> int:
    """The advisory lock key (a signed 64-bit int) standing for a session's write handle."""
    digest = hashlib.blake2b(session_id.encode("utf-8"), digest_size=8, person=b"subagents-own").digest()
    return int.from_bytes(digest, "big", signed=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def connect(url: str, app: str) -> psycopg.Connection[Any]:
    """One autocommit connection, or `StoreUnreachable` saying why in one line."""
    import psycopg

    try:
        return psycopg.connect(url, autocommit=True, application_name=app, **connection_options(url))
    except psycopg.Error as exc:
        raise StoreUnreachable(f"cannot connect to PostgreSQL at {redact(url)}: {_first_line(exc)}") from None


class Pool:
    """At most `size` connections, reused; broken ones are dropped. Thread-safe."""

    def __init__(self, url: str, *, size: int = 4) -> None:
        self.url = url
        self.app = application_name()
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
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
                    _close_quietly(old)
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            _close_quietly(conn)


class Owner:
    """The connection holding this store's advisory locks, one per write handle's session.

    Advisory locks are re-entrant within one connection, so the ids this store holds are also
    kept here: a second claim by the same store is refused like one from elsewhere. If the
    connection is lost its locks are gone with it, unnoticed by the handles until fencing
    (lease epochs checked by every append, SPEC §9) is built; meanwhile every append's seq
    check keeps two writers from interleaving silently. `incarnation` counts connections, so
    closing a handle never unlocks a key on a connection that did not take it."""

    def __init__(self, url: str, app: str) -> None:
        self.url = url
        self.app = app
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}  # session id -> lock key
        self.incarnation = 0

    def _connection(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                _close_quietly(conn)
                self._held.clear()  # the server released them with the connection
            conn = self._conn = connect(self.url, self.app)
            self.incarnation += 1
        return conn

    def try_lock(self, session_id: str) -> int | None:
        """The incarnation holding the new lock, or None when it is held (here or elsewhere)."""
        with self._lock:
            if session_id in self._held:
                return None
            key = lock_key(session_id)
            import psycopg

            try:
                row = self._connection().execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            except psycopg.OperationalError:
                if self._conn is None or not (self._conn.broken or self._conn.closed):
                    raise
                # The connection was gone (a restart, a terminated backend) and its locks with
                # it: take this one on a new connection.
                row = self._connection().execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            if not (row and row[0]):
                return None
            self._held[session_id] = key
            return self.incarnation

    def unlock(self, session_id: str, incarnation: int) -> None:
        with self._lock:
            key = self._held.pop(session_id, None)
            conn = self._conn
            if key is None or incarnation != self.incarnation or conn is None or conn.closed:
                return
            import psycopg

            try:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
            except psycopg.Error:
                pass  # a lost connection released every lock it held

    @property
    def backend_pid(self) -> int | None:
        conn = self._conn
        return None if conn is None or conn.closed else conn.info.backend_pid

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                _close_quietly(self._conn)
                self._conn = None
            self._held.clear()


def _close_quietly(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.close()
    except Exception:  # closing a connection that already failed: nothing more to learn
        pass
