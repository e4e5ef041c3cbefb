"""Wake-ups for the PostgreSQL mailbox: `LISTEN subagents_mailbox` on a connection of its own.

Every delivery sends `NOTIFY subagents_mailbox, '<session id>'` in its transaction, so the
notification leaves the server when the delivery commits, from whatever host made it. A watch
keeps one dedicated autocommit connection that listens and does nothing else: its socket becomes
readable when a notification (or anything else, like the server going away) arrives, and a Trio
task waits on `fileno()` with `trio.lowlevel.wait_readable`, as on the file form's inotify fd.

`clear()` reads what has arrived without blocking (libpq's socket is non-blocking:
`consume_input`, then `notifies` until none is left) and says whether any named this watch's
session. One channel serves every session, so a delivery to another session makes the fd
readable too — an early wake-up, which the contract allows (clear, drain, wait): `clear()`
returns False and the socket is readable no more.

When the connection breaks (a restart, a terminated backend, a network cut) the watch closes it,
turns into the polling form — `poll_interval` becomes non-None and stays so, and `fileno()` is a
pipe nothing writes to — and `clear()` says True once, so the owner drains what it might have
missed. It does not reconnect by itself (that would block the caller): a new `watch()` listens
again.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from .mailbox_watch import DEFAULT_POLL_INTERVAL, MailboxWatch
from .pg_connect import close_quietly

if TYPE_CHECKING:
    from .pg_connect import Connection

__all__ = ["CHANNEL", "PgMailboxWatch"]

log = logging.getLogger(__name__)

CHANNEL = "subagents_mailbox"


class PgMailboxWatch:
    """A `MailboxWatch`-compatible wake-up for one session of the PostgreSQL mailbox (see the
    module docstring). `conn` is a psycopg connection already listening on `channels` (default
    `CHANNEL`); the watch owns it. With `session_id` None any notification there counts (the
    placement queue's watch, pg_placements)."""

    def __init__(
        self,
        conn: Connection,
        session_id: str | None,
        *,
        channels: tuple[str, ...] = (CHANNEL,),
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> None:
        self._conn: Connection = conn
        # None: every notification on the channels counts (the placement queue's watch)
        self._session = None if session_id is None else session_id.encode("utf-8")
        self._channels = frozenset(channel.encode("utf-8") for channel in channels)
        self._fallback_interval = poll_interval
        self._fallback: MailboxWatch | None = None  # the polling form, once the connection broke
        self._closed = False
        self._lock = threading.Lock()

    @property
    def inotify(self) -> bool:
        """False: no kernel watch here (see `listening`)."""
        return False

    @property
    def listening(self) -> bool:
        """Whether the server signals every delivery, from any host, on `fileno()`."""
        return self._fallback is None and not self._closed  # the connection is there until closed

    @property
    def poll_interval(self) -> float | None:
        """None while listening; the seconds between looks once the connection broke."""
        return None if self._fallback is None else self._fallback.poll_interval

    def fileno(self) -> int:
        """The fd to wait on for readability (it changes once, when the connection breaks)."""
        with self._lock:
            if self._closed:
                raise ValueError("the mailbox watch is closed")
            if self._fallback is None:
                try:
                    return int(self._conn.pgconn.socket)
                except Exception as exc:  # psycopg.OperationalError: no socket any more
                    self._break(exc)
            assert self._fallback is not None
            return self._fallback.fileno()

    def clear(self) -> bool:
        """Consume every notification that arrived (never blocks); True if one named this
        watch's session, or the connection just broke (something may have been missed)."""
        with self._lock:
            if self._closed:
                return False
            if self._fallback is not None:
                return self._fallback.clear()
            try:
                return self._consume()
            except Exception as exc:  # psycopg.OperationalError (or OSError): the connection is gone
                self._break(exc)
                return True

    def _consume(self) -> bool:
        pgconn = self._conn.pgconn
        pgconn.consume_input()
        ours = False
        while True:
            note = pgconn.notifies()
            if note is None:
                break
            if note.relname in self._channels and (self._session is None or note.extra == self._session):
                ours = True
        from psycopg import pq

        if pgconn.status != pq.ConnStatus.OK:
            raise ConnectionError("the listening connection was closed by the server")
        return ours

    def _break(self, exc: BaseException) -> None:
        log.warning(
            "the mailbox's LISTEN connection broke (%s): polling every %ss from now on",
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            self._fallback_interval,
        )
        close_quietly(self._conn)
        self._fallback = MailboxWatch.pipe(self._fallback_interval)

    def close(self) -> None:
        """Close the connection (stop listening); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            close_quietly(self._conn)
            if self._fallback is not None:
                self._fallback.close()

    def __enter__(self) -> PgMailboxWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
