"""One `LISTEN subagents_mailbox` connection for every mailbox watch of a `PostgresMailbox`.

Why shared. A watch per resident session each holding a connection of its own would spend one
server connection per session: a host with a hundred live children would hold a hundred idle
backends, eat `max_connections` and starve every other host's pool, and every delivery would wake
every one of them (one channel carries all sessions). Here one connection listens for the whole
mailbox and one thread reads it: a notification wakes the watches of the session it names and no
other.

A watch is the self-pipe form of `MailboxWatch` (`poll_interval` None while the server vouches for
it): the thread waits in `poll` on the connection's socket and on a stop pipe, consumes what
arrived (`consume_input`, then `notifies` until none is left) and signals the watches of each
session named. The first watch opens the connection and is handed out only once `LISTEN` ran, so
a delivery committed after `watch()` returns always wakes it; the last watch closed stops the
thread, which closes the connection.

When the connection breaks (a restart, a terminated backend, a network cut) every watch turns into
the polling form for good (`poll_interval` set, `listening` False) and is signalled once, so its
owner drains what it may have missed; the listener is done, and the next `watch()` opens a new one.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .mailbox_watch import MailboxWatch
from .pg_connect import close_quietly, first_line

if TYPE_CHECKING:
    from .pg_connect import Connection

__all__ = ["PgListener", "PgSessionWatch"]

log = logging.getLogger(__name__)


class PgSessionWatch(MailboxWatch):
    """A session's wake-up from a shared `PgListener` (a self-pipe `MailboxWatch`)."""

    def __init__(self, fd: int, *, inotify: bool, poll_interval: float | None) -> None:
        super().__init__(fd, inotify=inotify, poll_interval=poll_interval)
        self._listening = True

    @property
    def listening(self) -> bool:
        """Whether the server signals every delivery to this session, from any host."""
        return self._listening and self._poll_interval is None

    def fall_back(self, poll_interval: float) -> None:
        """The listener is gone: poll from now on, and wake the owner to drain once."""
        self._listening = False
        self._poll_interval = poll_interval
        self.signal()


class PgListener:
    """The listening connection `conn` (already `LISTEN`ing on `channel`), read by one thread
    that signals the watches registered per session (see the module docstring). Thread-safe.
    `on_done` is called once, from the thread, when the listener stopped or broke."""

    def __init__(
        self, conn: Connection, channel: str, *, poll_interval: float, on_done: Callable[[PgListener], None]
    ) -> None:
        self._conn = conn
        self._channel = channel
        self._poll_interval = poll_interval
        self._on_done = on_done
        self._lock = threading.Lock()
        self._watches: dict[bytes, set[PgSessionWatch]] = {}
        self._done = False
        self._stopping = False
        self._stop_read, self._stop_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name=f"pg-listen-{channel}", daemon=True)
        self._thread.start()

    @property
    def done(self) -> bool:
        """Stopped, stopping or broken: it takes no new watch."""
        return self._done or self._stopping

    def add(self, session_id: str) -> PgSessionWatch | None:
        """A new watch of `session_id`, or None when this listener is done."""
        watch = PgSessionWatch.pipe(None)
        key = session_id.encode("utf-8")
        with self._lock:
            if self._done or self._stopping:
                watch.close()
                return None
            self._watches.setdefault(key, set()).add(watch)
        watch.on_close = lambda _closed: self._remove(key, watch)  # `_closed` is `watch`
        return watch

    def _remove(self, key: bytes, watch: PgSessionWatch) -> None:
        with self._lock:
            watches = self._watches.get(key)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[key]
            if not self._watches:
                self._stop_locked()  # in the same stretch: no watch can join a stopping listener

    def stop(self) -> None:
        """Ask the thread to close the connection and end (idempotent, never blocks)."""
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        # The thread closes the pipe under the lock once done: no write to a stale fd.
        if self._done or self._stopping:
            return
        self._stopping = True
        os.write(self._stop_write, b"\0")

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        broke: BaseException | None = None
        try:
            sock = int(self._conn.pgconn.socket)
            poller = select.poll()  # not select(): a busy host's fds run past FD_SETSIZE
            poller.register(sock, select.POLLIN)
            poller.register(self._stop_read, select.POLLIN)
            while True:
                ready = {fd for fd, _ in poller.poll()}
                if self._stop_read in ready:
                    break
                self._wake(self._consume())
        except Exception as exc:  # psycopg.OperationalError or OSError: the connection is gone
            broke = exc
        finally:
            with self._lock:
                self._done = True
                left = [w for ws in self._watches.values() for w in ws]
                self._watches.clear()
                os.close(self._stop_read)
                os.close(self._stop_write)
            close_quietly(self._conn)
            if broke is not None:
                log.warning(
                    "the mailbox's LISTEN connection broke (%s): its %d watch(es) poll every %ss from now on",
                    first_line(broke),
                    len(left),
                    self._poll_interval,
                )
            for watch in left:
                watch.fall_back(self._poll_interval)
            self._on_done(self)

    def _consume(self) -> set[bytes]:
        """The sessions named by what arrived (never blocks)."""
        from psycopg import pq

        pgconn = self._conn.pgconn
        pgconn.consume_input()
        named: set[bytes] = set()
        channel = self._channel.encode("utf-8")
        while True:
            note = pgconn.notifies()
            if note is None:
                break
            if note.relname == channel:
                named.add(note.extra)
        if pgconn.status != pq.ConnStatus.OK:
            raise ConnectionError("the listening connection was closed by the server")
        return named

    def _wake(self, named: set[bytes]) -> None:
        with self._lock:
            watches = [w for key in named for w in self._watches.get(key, ())]
        for watch in watches:
            watch.signal()
