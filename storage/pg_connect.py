"""Connections to the PostgreSQL store: URL checks, a small bounded pool.

psycopg 3 (synchronous) is imported here, lazily, the first time a store opens: a runtime on the
file store never loads it. Every connection is in autocommit mode, so one statement is one
transaction unless a caller opens a block (`conn.transaction()`), and carries the application
name `subagents <pid>@<host>` (what `pg_stat_activity` shows an operator).

`Pool` hands out at most `size` connections, reusing idle ones; a connection a failure left
broken is discarded, never handed out again. `Pool.cursor` hands out a cursor kept with its
connection for the connection's life: the append path's one statement then does not pay for a new
cursor (its adapters and transformer) every time. Each store also keeps one dedicated connection
of its own, the owner connection that holds its host's liveness lock (pg_leases).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Generator
from contextlib import contextmanager
from typing import TYPE_CHECKING
from urllib.parse import unquote_plus, urlsplit

from .errors import InvalidStoreUrl, StoreUnreachable
from .pg_timeouts import connection_options

if TYPE_CHECKING:  # annotations: psycopg is imported when a store opens on a PostgreSQL URL
    import psycopg
    from psycopg.rows import TupleRow

    Connection = psycopg.Connection[TupleRow]  # a connection with psycopg's default rows, tuples
    Cursor = psycopg.Cursor[TupleRow]

__all__ = ["Pool", "application_name", "check_url", "close_quietly", "connect", "first_line", "redact"]

SCHEMES = ("postgresql", "postgres")


# Query parameters whose value is a secret (libpq's `password`, `sslpassword`, and anything named
# like one: a token, a key, a secret) or says where one is kept (`passfile`).
_SECRET_PARTS = ("password", "secret", "token", "key", "passfile")
_HIDDEN = "***"


def _secret_name(name: str) -> bool:
    lowered = name.lower()
    return any(part in lowered for part in _SECRET_PARTS)


def redact(url: str) -> str:
    """`url` without its secrets (for messages, banners and logs): a password in its userinfo
    and the value of every secret-bearing query parameter (`password=`, `sslpassword=`, any
    name with `password`, `secret`, `token` or `key` in it, `passfile=`) become `***`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<an unparsable URL>"
    userinfo, at, hosts = parts.netloc.rpartition("@")
    netloc = parts.netloc
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:{_HIDDEN}@{hosts}"
    query = "&".join(_redacted_param(param) for param in parts.query.split("&"))
    # Put together by hand: `urlunsplit` drops the empty host of `postgresql:///db?host=/tmp`.
    return (
        f"{parts.scheme}://{netloc}{parts.path}"
        + (f"?{query}" if parts.query else "")
        + (f"#{parts.fragment}" if parts.fragment else "")
    )


redact_url = redact  # the face's name for it (`subagents.storage.redact_url`)


def scrub(text: str, url: str) -> str:
    """`text` (a driver's error message about `url`) with each secret of `url` — in its raw and
    decoded forms — replaced by `***`: libpq quotes a malformed token of the URL back."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return text
    userinfo, at, _hosts = parts.netloc.rpartition("@")
    secrets = [userinfo.partition(":")[2]] if at and ":" in userinfo else []
    for param in parts.query.split("&"):
        name, eq, value = param.partition("=")
        if eq and _secret_name(unquote_plus(name)):
            secrets.append(value)
    for secret in sorted(
        {form for s in secrets for form in (s, unquote_plus(s)) if len(form) >= 3}, key=len, reverse=True
    ):
        text = text.replace(secret, _HIDDEN)
    return text


def _redacted_param(param: str) -> str:
    name, eq, _value = param.partition("=")
    return f"{name}={_HIDDEN}" if eq and _secret_name(unquote_plus(name)) else param


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
        reason = scrub(first_line(exc), url)
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
        raise StoreUnreachable(
            f"cannot connect to PostgreSQL at {redact(url)}: {scrub(first_line(exc), url)}"
        ) from None


class Pool:
    """At most `size` connections, reused; broken ones are dropped. Thread-safe."""

    def __init__(self, url: str, *, size: int = 4) -> None:
        self.url = url
        self.app = application_name()
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list[Connection] = []
        self._cursors: dict[Connection, Cursor] = {}  # a connection's kept cursor (`cursor`)
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def connection(self) -> Generator[Connection]:
        self._slots.acquire()
        try:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
                if conn is not None and conn.closed:
                    self._cursors.pop(conn, None)
                    conn = None
            if conn is None:
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
                        self._cursors.pop(old, None)
                for old in stale:
                    close_quietly(old)
        finally:
            self._slots.release()

    @contextmanager
    def cursor(self) -> Generator[Cursor]:
        """A cursor of a pooled connection, the same one every time that connection is handed
        out (its `connection` is the connection)."""
        with self.connection() as conn:
            cur = self._cursors.get(conn)
            if cur is None or cur.closed:
                cur = conn.cursor()
                with self._lock:
                    self._cursors[conn] = cur
            yield cur

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cursors.clear()
        for conn in idle:
            close_quietly(conn)


def close_quietly(conn: Connection) -> None:
    """Close `conn`, ignoring a failure (it failed already)."""
    try:
        conn.close()
    except Exception:  # closing a connection that already failed: nothing more to learn
        pass
