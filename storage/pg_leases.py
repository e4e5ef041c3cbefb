"""Leases with fencing on the PostgreSQL store (SPEC §9): which host writes a session, in which epoch.

Theory of operation. Every `PostgresLogStore` is a *host*, named by its host id (a fresh ULID
unless given; host ids must be unique among the stores sharing a database). A write handle stands
for a row of `leases`: `(session_id, owner = a host id, epoch, expires_at)`, timestamps from the
database clock. Taking a session (`acquire`, one statement) inserts its lease at epoch 1, or takes
the row over — owner = this host, epoch + 1, a fresh expiry — only when the row has expired, or its
owner is not alive, or its owner is this very host (which holds no open handle on it: the store
checks that first, without a query), or its owner has no `hosts` row (it closed cleanly, or was
forgotten). Otherwise: `AlreadyOwned`. Only the lease decides: a host is never judged dead by its
connection, since a live host whose owner connection was cut (`pg_terminate_backend`, a server
restart) goes on running its sessions — taking them at once would run them twice. A killed
process's sessions therefore wait for their leases to expire (a ttl at most).

Host liveness is one session-level advisory lock per host, keyed by its id
(`hashtextextended(id, LIVENESS_SEED)`), held by the store's *owner connection* for the store's
lifetime: `subagents hosts` shows a host whose lock is free as gone, and counting serving hosts
skips it, but no lease or placement changes hands for it. Every lease statement runs on the
owner connection, one at a time (a lock): a lost owner connection is found by the next statement
(a renewal, every `lease_renew_interval`) and replaced — the liveness lock and the `hosts` row
taken again — before it is retried once, well within the ttl; a host that cannot reconnect before
its leases expire finds them taken at its next renewal or append (`OwnershipLost`) and stops those
sessions.

Fencing is in the append statements of pg_append: a publication updates the lease only where
owner and epoch are still this handle's; a later append advances the session row's count only
where that row still names this owner and epoch (`sessions.writer`, `writer_epoch`: a trigger on
this table rewrites them in every transaction that takes a lease over or deletes it) — a stale
writer writes nothing and learns `OwnershipLost`. Deliberately, a lease that expired but that no
other host took over (same owner, same epoch) still lets its holder append, and an append made
half a ttl or more after the handle's last renewal renews it: safety comes from the epoch, not
from the clock, so a slow renewal never stops a session nobody else wanted. Releasing (closing a handle) expires the row but keeps it, so epochs only grow, and
notifies channel `subagents_lease` with the session id. `renew` extends every held lease in one
statement and reports the ones found lost; `held_elsewhere` (listing's `running`) is an unexpired
lease of another registered host: exactly the leases `acquire` would refuse to take.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

import attrs

from .envelope import new_delivery_id
from .errors import AlreadyOwned, PersistenceFailed, StorageError
from .pg_connect import close_quietly, connect, first_line
from .values import SessionId

if TYPE_CHECKING:
    from psycopg.rows import TupleRow

    from .pg_connect import Connection

__all__ = ["LEASE_CHANNEL", "LeaseState", "Leases", "host_gone", "lease_in_force", "lease_options", "new_host_id"]

log = logging.getLogger(__name__)

T = TypeVar("T")

LEASE_CHANNEL = "subagents_lease"  # NOTIFY'd with the session id when a lease is released
LIVENESS_SEED = 0x5355_4241  # "SUBA": the seed of the liveness lock keys (hashtextextended)

# The liveness keys held now (advisory locks of this database, bigint form), computed once per
# statement: `hashtextextended(owner, seed) IN (SELECT key FROM live)` tells a live host.
LIVE_HOSTS = (
    "live AS MATERIALIZED (SELECT (k.classid::bigint << 32) | k.objid::bigint AS key FROM pg_locks k "
    "WHERE k.locktype = 'advisory' AND k.granted AND k.objsubid = 1 "
    "AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database()))"
)
_EXPIRY = "now() + make_interval(secs => %(ttl)s)"


def host_gone(host: str) -> str:
    """SQL: the host named by the column `host` has no `hosts` row (it closed cleanly, or was
    forgotten): its leases bind nobody, expired or not."""
    return f"NOT EXISTS (SELECT 1 FROM hosts gone WHERE gone.id = {host})"


def lease_in_force(lease: str) -> str:
    """SQL: the lease row `lease` binds every other host — unexpired, and its owner still
    registered. A free liveness lock does not end it: a host whose owner connection was cut is
    alive and still runs the session (it reconnects, renews, and takes its lock again)."""
    return f"({lease}.expires_at > now() AND NOT {host_gone(f'{lease}.owner')})"


_ACQUIRE = (
    "INSERT INTO leases AS l (session_id, owner, epoch, expires_at) "
    f"VALUES (%(id)s, %(me)s, 1, {_EXPIRY}) "
    "ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner, epoch = l.epoch + 1, "
    "expires_at = excluded.expires_at, released = false "
    f"WHERE l.expires_at <= now() OR l.owner = %(me)s OR {host_gone('l.owner')} "
    "RETURNING epoch"
)
_RELEASE = (
    "WITH r AS (UPDATE leases l SET expires_at = least(l.expires_at, now()), released = true "
    "FROM unnest(%(ids)s::text[], %(epochs)s::bigint[]) AS h (sid, epoch) "
    "WHERE l.session_id = h.sid AND l.owner = %(me)s AND l.epoch = h.epoch RETURNING l.session_id) "
    f"SELECT pg_notify('{LEASE_CHANNEL}', session_id) FROM r"
)
_REGISTER = (
    "INSERT INTO hosts (id, started_at, capacity, renewed_at, pid, hostname) "
    "VALUES (%(me)s, now(), %(capacity)s, now(), %(pid)s, %(hostname)s) "
    "ON CONFLICT (id) DO UPDATE SET capacity = excluded.capacity, renewed_at = now(), pid = excluded.pid, "
    "hostname = excluded.hostname"
)
# The host's row is written again if it went missing (an operator's cleanup, say).
_RENEW = (
    "WITH h AS (INSERT INTO hosts (id, started_at, capacity, renewed_at, pid, hostname) "
    "VALUES (%(me)s, now(), %(capacity)s, now(), %(pid)s, %(hostname)s) "
    "ON CONFLICT (id) DO UPDATE SET renewed_at = now()) "
    f"UPDATE leases l SET expires_at = {_EXPIRY} "
    "FROM unnest(%(ids)s::text[], %(epochs)s::bigint[]) AS held (sid, epoch) "
    "WHERE l.session_id = held.sid AND l.owner = %(me)s AND l.epoch = held.epoch RETURNING l.session_id"
)
_HELD_ELSEWHERE = (
    "SELECT l.session_id FROM leases l WHERE l.session_id = ANY(%(ids)s) AND l.owner <> %(me)s "
    f"AND {lease_in_force('l')}"
)


def new_host_id() -> str:
    """A fresh host id: a ULID (sorts by start time)."""
    return new_delivery_id(int(time.time() * 1000))


def lease_options(host_id: object, ttl: object, interval: object) -> tuple[str, float, float]:
    """The checked lease options (`ValueError` for a caller's mistake)."""
    if host_id is None:
        host_id = new_host_id()
    if type(host_id) is not str or not host_id or len(host_id) > 200 or not host_id.isprintable():
        raise ValueError(f"host_id must be a non-empty printable str of at most 200 characters, got {host_id!r}")
    seconds: list[float] = []
    for name, value in (("lease_ttl", ttl), ("lease_renew_interval", ttl if interval is None else interval)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < 1e7:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        seconds.append(float(value))
    return host_id, seconds[0], seconds[1] if interval is not None else seconds[0] / 3


@attrs.define(eq=False)
class LeaseState:
    """One write handle's lease: its epoch, and whether it was found lost (it never writes again)."""

    session_id: SessionId
    epoch: int
    lost: bool = False
    # `time.monotonic()` when the statement that last set its expiry was sent: the lease ends no
    # sooner than a ttl after it (the database stamps it later), so a host that could not renew
    # since knows when another host may have taken the session.
    renewed_from: float = 0.0


class Leases:
    """This host's leases and the owner connection holding its liveness lock. Thread-safe."""

    def __init__(self, url: str, app: str, *, host_id: str, ttl: float) -> None:
        self.url = url
        self.app = app
        self.host_id = host_id
        self.ttl = ttl
        self.capacity: int | None = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._held: dict[str, LeaseState | None] = {}  # None: being acquired
        self._registered = False  # the host's row written once: renewals keep it fresh
        self._live = False  # the owner connection holds the liveness lock
        self._closed = False
        self.monotonic: Callable[[], float] = time.monotonic  # the tests move it

    # --- the owner connection ---

    def _connection(self) -> Connection:
        """The owner connection; a new one takes the liveness lock and registers the host."""
        conn = self._conn
        if conn is not None and not (conn.closed or conn.broken):
            return conn
        if conn is not None:
            close_quietly(conn)
            self._conn = None
        conn = connect(self.url, self.app)
        self._live = False
        try:
            self._take_liveness(conn)
            conn.execute(_REGISTER, self._register_args())
            self._registered = True
        except BaseException:  # a half-made owner connection is not kept (re-raised)
            close_quietly(conn)
            raise
        self._conn = conn
        return conn

    def _take_liveness(self, conn: Connection) -> None:
        """Take the liveness lock on `conn` (once: advisory locks count their takers)."""
        got = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, %s))", (self.host_id, LIVENESS_SEED))
        row = got.fetchone()
        assert row is not None  # a SELECT without FROM returns one row
        self._live = bool(row[0])
        if not self._live:
            # Another connection holds it: most likely a lost owner connection whose server
            # process has not ended yet (it still speaks for this host; renewals try again), or
            # a second store given this host id.
            log.warning("host %s: its liveness lock is held by another connection", self.host_id)

    def _run(self, op: str, fn: Callable[[Connection], T]) -> T:
        """`fn` on the owner connection (the caller holds `_lock`); a connection found lost is
        replaced once — every lease statement is safe to send again."""
        import psycopg

        try:
            for attempt in (1, 2):
                conn = self._connection()
                try:
                    return fn(conn)
                except psycopg.OperationalError:
                    if attempt == 1 and (conn.closed or conn.broken):
                        continue
                    raise
        except StorageError:
            raise
        except psycopg.Error as exc:
            raise PersistenceFailed(f"host {self.host_id}: {op} failed: {first_line(exc)}") from None
        raise AssertionError("unreachable")

    def register(self, capacity: int | None = None) -> None:
        """Take the liveness lock and write (or update) this host's `hosts` row now (a store
        does it by itself when it first takes a lease: read-only commands register nothing)."""
        with self._lock:
            self.capacity = capacity
            self._run("registering the host", lambda c: c.execute(_REGISTER, self._register_args()))

    def _register_args(self) -> dict[str, object]:
        return {"me": self.host_id, "capacity": self.capacity, "pid": os.getpid(), "hostname": socket.gethostname()}

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def backend_pid(self) -> int | None:
        """The server process holding the liveness lock (tests terminate it)."""
        conn = self._conn
        return None if conn is None or conn.closed else conn.info.backend_pid

    # --- leases ---

    def acquire(self, sid: SessionId) -> LeaseState:
        """This host's lease on `sid` at a new epoch, or `AlreadyOwned`."""
        with self._lock:
            if self._closed:
                raise PersistenceFailed(f"session {sid!r}: the store is closed")
            if sid in self._held:
                raise AlreadyOwned(sid)
            self._held[sid] = None
            sent = self.monotonic()
            try:
                row = self._run(
                    "taking a lease",
                    lambda c: c.execute(_ACQUIRE, {"id": sid, "me": self.host_id, "ttl": self.ttl}).fetchone(),  # pyright: ignore[reportArgumentType]  # a statement of this module, built from its constants alone
                )
            except BaseException:  # nothing taken (re-raised)
                del self._held[sid]
                raise
            if row is None:
                del self._held[sid]
                raise AlreadyOwned(sid)
            state = self._held[sid] = LeaseState(sid, row[0], renewed_from=sent)
            return state

    def release(self, state: LeaseState) -> None:
        """Expire the lease (if still this host's) and notify; never raises."""
        with self._lock:
            if self._held.get(state.session_id) is state:
                del self._held[state.session_id]
            if state.lost or self._closed:
                return
            try:
                self._run("releasing a lease", lambda c: self._release(c, [state]))
            except StorageError as exc:  # it expires by itself; a dead connection freed the liveness lock
                log.warning("session %r: lease not released: %s", state.session_id, exc)

    def _release(self, conn: Connection, states: Sequence[LeaseState]) -> None:
        conn.execute(
            _RELEASE,
            {"ids": [s.session_id for s in states], "epochs": [s.epoch for s in states], "me": self.host_id},
        )

    def renew(self) -> frozenset[SessionId]:
        """Extend every held lease (and this host's `renewed_at`) in one statement; the sessions
        found no longer this host's are marked lost and returned. When the statement fails (the
        database cannot be reached), the leases not renewed for a ttl are given up — marked lost
        and returned, so their sessions stop here before another host may take them — and any
        others leave the failure raised (tried again at the next interval)."""
        with self._lock:
            if self._closed or not self._registered:
                return frozenset()  # never registered: nothing held
            states = [s for s in self._held.values() if s is not None and not s.lost]
            args = {
                "ids": [s.session_id for s in states],
                "epochs": [s.epoch for s in states],
                "ttl": self.ttl,
                **self._register_args(),
            }

            def renew(conn: Connection) -> list[TupleRow]:
                if not self._live:
                    self._take_liveness(conn)
                return conn.execute(_RENEW, args).fetchall()

            sent = self.monotonic()
            try:
                rows = self._run("renewing leases", renew)
            except StorageError as exc:
                overdue = [s for s in states if sent - s.renewed_from >= self.ttl]
                if not overdue:
                    raise
                log.warning(
                    "host %s: leases not renewed for a ttl (%s): their %d sessions stop here",
                    self.host_id,
                    exc,
                    len(overdue),
                )
                for state in overdue:
                    state.lost = True
                return frozenset(s.session_id for s in overdue)
            kept = {row[0] for row in rows}
            for state in states:
                if state.session_id in kept:
                    state.renewed_from = sent
            lost = [s for s in states if s.session_id not in kept]
            for state in lost:
                state.lost = True
            return frozenset(s.session_id for s in lost)

    def held_elsewhere(self, conn: Connection, ids: Iterable[str]) -> set[str]:
        """The ids among `ids` another live host holds an unexpired lease on (on `conn`)."""
        rows = conn.execute(_HELD_ELSEWHERE, {"ids": list(ids), "me": self.host_id}).fetchall()  # pyright: ignore[reportArgumentType]  # a statement of this module, built from its constants alone
        return {row[0] for row in rows}

    def close(self) -> None:
        """Release every held lease, drop this host's row and end the owner connection (and with
        it the liveness lock). Never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            states = [s for s in self._held.values() if s is not None and not s.lost]
            self._held.clear()
            conn, self._conn = self._conn, None
            if conn is None or conn.closed:
                return
            import psycopg

            try:
                with conn.transaction():
                    self._release(conn, states)
                    conn.execute("DELETE FROM hosts WHERE id = %s", (self.host_id,))
            except psycopg.Error as exc:  # they expire by themselves; the lock goes with the connection
                log.warning("host %s: leases not released at close: %s", self.host_id, first_line(exc))
            finally:
                close_quietly(conn)
