"""`PostgresMailbox`: the mailbox contract (storage/mailbox.py) as rows of the PostgreSQL store
(SPEC §9; tables `mailbox` and `mailbox_rejected`, schema version 2 in pg_schema).

Theory of operation. Each operation is one statement, so one transaction, on an autocommit
connection of a small pool (pg_connect; the log store's pool may be shared):
- `deliver` inserts the envelope's exact bytes (`encode_envelope`, as the file form writes them)
  unless a row has its `(session_id, delivery_id)` already, and in the same statement sends
  `NOTIFY subagents_mailbox, '<session id>'` for a row it inserted: the delivery is durable
  when the commit is acknowledged (PostgreSQL's WAL fsync) and the notification leaves with the
  commit, never before it. The statement also returns the bytes already there: equal bytes are
  the same delivery (idempotent), other bytes `DeliveryConflict`. A connection lost mid-deliver
  leaves the outcome unknown, never half: the statement is sent once more on a fresh connection,
  which finds the row (the first one committed: the same bytes, done) or inserts it.
- `drain_report` is one SELECT of the session's rows in `delivery_id` order (collated "C": ULID
  order, delivery order). A row whose id is not a canonical ULID, whose bytes are over 16 MiB or
  no valid envelope, or whose envelope names another id, is moved to `mailbox_rejected` with the
  reason — one statement deleting it and inserting it there — and reported; a drain never raises
  for a row. What cannot be moved stays and is reported by every drain.
- `ack` is one DELETE (idempotent).
- `now_ms` is the database's clock, read on this host as its wall clock plus an offset measured
  by `sync_clock` (one query, the round trip halved) and again by a deliver or drain once a
  minute: every host stamps interrupts and compares its owners' start on one clock, so hosts
  whose clocks disagree judge stale interrupts alike (runtime/agent/mailbox_owner.py).
- `watch` hands out a wake-up from the one LISTEN connection every watch of this mailbox shares
  (pg_listener): a host holds one listening connection, not one per resident session.

Synchronous like the log store: the actors layer calls it from worker threads. psycopg is
imported when a mailbox opens, never by the file form.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, LiteralString

import msgspec

from .envelope import MAX_ENVELOPE_BYTES, ULID_PATTERN, DeliveryIds, Envelope, check_delivery_id, encode_envelope
from .errors import DeliveryConflict, PersistenceFailed, StorageError
from .mailbox import DrainResult, RejectedEnvelope
from .mailbox_watch import DEFAULT_POLL_INTERVAL, MailboxWatch
from .pg_connect import Pool, check_url, connect, first_line, redact
from .pg_listener import PgListener, PgSessionWatch
from .pg_mailbox_watch import CHANNEL
from .pg_schema import ensure_schema
from .pg_timeouts import is_timeout, timed_out
from .values import SessionId, check_session_id

__all__ = ["PostgresMailbox"]

log = logging.getLogger(__name__)

_DECODER = msgspec.json.Decoder(Envelope)

# One statement: insert unless there, notify for an inserted row, and say what was there before.
_DELIVER = (
    "WITH ins AS (INSERT INTO mailbox (session_id, delivery_id, envelope, created_at) "
    "VALUES (%(s)s, %(d)s, %(e)s, %(c)s) ON CONFLICT (session_id, delivery_id) DO NOTHING RETURNING 1), "
    f"woke AS (SELECT pg_notify('{CHANNEL}', %(s)s) FROM ins) "
    "SELECT EXISTS (SELECT 1 FROM woke), "
    "(SELECT envelope FROM mailbox WHERE session_id = %(s)s AND delivery_id = %(d)s)"
)
_EXISTING = "SELECT envelope FROM mailbox WHERE session_id = %s AND delivery_id = %s"
_DRAIN = (
    "SELECT delivery_id, CASE WHEN octet_length(envelope) <= %s THEN envelope END, octet_length(envelope) "
    "FROM mailbox WHERE session_id = %s ORDER BY delivery_id"
)
_REJECT = (
    "WITH moved AS (DELETE FROM mailbox WHERE session_id = %(s)s AND delivery_id = %(d)s RETURNING envelope) "
    "INSERT INTO mailbox_rejected (session_id, name, envelope, reason) "
    "SELECT %(s)s, %(name)s, envelope, %(why)s FROM moved RETURNING name"
)
_TAKEN = "SELECT name FROM mailbox_rejected WHERE session_id = %s AND (name = %s OR starts_with(name, %s))"
_ACK = "DELETE FROM mailbox WHERE session_id = %s AND delivery_id = %s"
_CLOCK = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
CLOCK_RESYNC = 60.0  # seconds between measures of the database's clock


class PostgresMailbox:
    """Mailboxes as rows of the PostgreSQL store at `url`, or on a shared `pool` (the log
    store's: `PostgresLogStore.pool`; then closing this mailbox leaves the pool open).

    `poll_interval` is what a watch asks for once its LISTEN connection broke; `random` makes
    delivery ids (`ids`, as the file form's); `wall_ns` is this host's wall clock, against which
    `now_ms` keeps the database's, measured again every `clock_resync` seconds. On its own `url` it creates or migrates the schema
    (pg_schema); on a shared `pool` the log store that made the pool has prepared (or, opened
    read-only, checked) it, and nothing more is done here.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        pool: Pool | None = None,
        pool_size: int = 2,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        random: Callable[[int], bytes] = os.urandom,
        wall_ns: Callable[[], int] = time.time_ns,
        clock_resync: float = CLOCK_RESYNC,
    ) -> None:
        if (url is None) == (pool is None):
            raise TypeError("PostgresMailbox needs a url or a pool (one of them)")
        if pool is None:
            assert url is not None
            pool = Pool(check_url(url), size=pool_size)
            self._owns_pool = True
        else:
            self._owns_pool = False
        self._pool = pool
        self.ids = DeliveryIds(random)
        self._poll_interval = poll_interval
        self._listen_lock = threading.Lock()
        self._listener: PgListener | None = None
        self._wall_ns = wall_ns
        self._offset_ms = 0  # the database's clock minus this host's wall clock
        self._synced_at: float | None = None  # time.monotonic() of the last measure
        self._clock_resync = clock_resync
        if not self._owns_pool:
            return
        import psycopg

        try:
            with self._pool.connection() as conn:
                ensure_schema(conn)
        except psycopg.Error as exc:
            self.close()
            raise PersistenceFailed(
                f"preparing the PostgreSQL mailbox at {redact(pool.url)} failed: {first_line(exc)}"
            ) from None
        except BaseException:  # a half-made mailbox closes its connections (re-raised)
            self.close()
            raise

    # --- the clock ---

    def now_ms(self) -> int:
        """The database's clock in epoch ms, as last measured against this host's wall clock
        (the wall clock alone until `sync_clock` first ran)."""
        return self._wall_ns() // 1_000_000 + self._offset_ms

    def sync_clock(self) -> None:
        """Measure the database's clock against this host's wall clock (one query)."""
        sid = "(clock)"
        before = self._wall_ns()
        (server_ms,) = self._run(sid, "clock", _CLOCK, None, retry_lost=True)
        after = self._wall_ns()
        self._offset_ms = int(server_ms) - (before + after) // 2_000_000
        self._synced_at = time.monotonic()

    def _resync(self) -> None:
        """Measure again when the last measure is over a minute old (from a worker thread)."""
        at = self._synced_at
        if at is not None and time.monotonic() - at < self._clock_resync:
            return
        try:
            self.sync_clock()
        except StorageError as exc:  # the operation that called this will say so itself
            log.debug("the database's clock could not be read: %s", exc)

    # --- delivering ---

    def deliver(self, session_id: str, envelope: Envelope) -> None:
        """Enqueue `envelope` for the session, durably (committed) before returning."""
        sid = check_session_id(session_id)
        self._resync()
        data = encode_envelope(envelope)
        args = {"s": sid, "d": envelope.delivery_id, "e": data, "c": envelope.created_at}
        for _ in range(3):
            inserted, existing = self._run(sid, "deliver", _DELIVER, args, retry_lost=True)
            if inserted:
                return
            if existing is None:
                # A concurrent delivery of this id committed after this statement's snapshot:
                # look again, outside it.
                row = self._run(sid, "deliver", _EXISTING, (sid, envelope.delivery_id), retry_lost=True)
                existing = None if row is None else row[0]
            if existing is None:
                continue  # it was removed meanwhile (acknowledged): deliver it again
            if bytes(existing) != data:
                raise DeliveryConflict(sid, envelope.delivery_id)
            return  # the same bytes: the same delivery, made before (a retry)
        raise PersistenceFailed(f"session {sid!r}: deliver: delivery {envelope.delivery_id} kept changing under it")

    # --- the owner's side ---

    def drain(self, session_id: str) -> list[Envelope]:
        """Every delivered, unacknowledged envelope in delivery order (bad rows moved aside)."""
        return self.drain_report(session_id).envelopes

    def drain_report(self, session_id: str) -> DrainResult:
        """`drain`, plus the rows it moved to `mailbox_rejected` (or could not)."""
        sid = check_session_id(session_id)
        self._resync()
        rows = self._run(sid, "drain", _DRAIN, (MAX_ENVELOPE_BYTES, sid), retry_lost=True, fetch="all")
        envelopes: list[Envelope] = []
        rejected: list[RejectedEnvelope] = []
        for delivery_id, data, size in rows:
            reason = _judge(delivery_id, data, size)
            if isinstance(reason, Envelope):
                envelopes.append(reason)
                continue
            bad = self._reject(sid, delivery_id, reason)
            if bad is not None:
                rejected.append(bad)
        return DrainResult(envelopes, rejected)

    def _reject(self, sid: SessionId, delivery_id: str, reason: str) -> RejectedEnvelope | None:
        """Move the row to `mailbox_rejected` under a free name; never raises. None when another
        drain moved it first."""
        import psycopg

        try:
            for _ in range(5):
                taken = {
                    row[0]
                    for row in self._run(sid, "reject", _TAKEN, (sid, delivery_id, f"{delivery_id}~"), fetch="all")
                }
                name = next((n for n in _names(delivery_id) if n not in taken), None)
                if name is None:
                    break
                args = {"s": sid, "d": delivery_id, "name": name, "why": reason}
                try:
                    row = self._run(sid, "reject", _REJECT, args, raw=True)
                except psycopg.errors.UniqueViolation:
                    continue  # another drain took that name meanwhile
                if row is None:
                    return None  # moved (or acknowledged) by someone else meanwhile
                log.warning("session %r: mailbox row %r rejected: %s", sid, delivery_id, reason)
                return RejectedEnvelope(delivery_id, reason, name)
        except (StorageError, psycopg.Error) as exc:
            log.warning("session %r: moving the bad mailbox row %r aside failed: %s", sid, delivery_id, exc)
        log.warning("session %r: mailbox row %r rejected (left in place): %s", sid, delivery_id, reason)
        return RejectedEnvelope(delivery_id, reason, None)

    def ack(self, session_id: str, delivery_id: str) -> None:
        """Remove a delivery for good (idempotent)."""
        sid = check_session_id(session_id)
        check_delivery_id(delivery_id)
        self._run(sid, "ack", _ACK, (sid, delivery_id), retry_lost=True, fetch="none")

    # --- wake-ups ---

    def watch(self, session_id: str) -> PgSessionWatch | MailboxWatch:
        """A wake-up for deliveries to the session from any host, from the LISTEN connection
        this mailbox shares among its watches (opened by the first, closed after the last:
        pg_listener); a polling watch, with a warning, when none can be opened."""
        sid = check_session_id(session_id)
        with self._listen_lock:
            listener = self._listener
        if listener is not None and not listener.done:
            watch = listener.add(sid)
            if watch is not None:
                return watch
            # It stopped or broke between the look and the add: a new one is opened, once.
        listener = self._listen(sid)
        watch = listener.add(sid) if listener is not None else None
        if watch is None:
            if listener is not None:  # broke as soon as it listened: no reconnecting in a loop
                log.warning("session %r: its mailbox's LISTEN connection broke at once: polling", sid)
            return MailboxWatch.pipe(self._poll_interval)
        return watch

    def _listen(self, sid: str) -> PgListener | None:
        """The mailbox's listener: a new one, or one another thread installed meanwhile."""
        import psycopg

        try:
            conn = connect(self._pool.url, self._pool.app)
        except StorageError as exc:
            log.warning("session %r: no LISTEN connection for its mailbox (%s): polling", sid, exc.message)
            return None
        try:
            conn.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as exc:
            conn.close()
            log.warning("session %r: LISTEN failed (%s): polling", sid, first_line(exc))
            return None
        listener = PgListener(conn, CHANNEL, poll_interval=self._poll_interval, on_done=self._listener_done)
        with self._listen_lock:
            current = self._listener
            if current is None or current.done:
                self._listener = listener
                return listener
        listener.stop()  # another thread's is there: ours was not needed
        return current

    def _listener_done(self, listener: PgListener) -> None:
        with self._listen_lock:
            if self._listener is listener:
                self._listener = None

    # --- plumbing ---

    def _run(
        self,
        sid: str,
        op: str,
        sql: LiteralString,
        params: Any,
        *,
        retry_lost: bool = False,
        fetch: str = "one",
        raw: bool = False,
    ) -> Any:
        """One statement on a pooled connection; with `retry_lost`, sent once more on a fresh
        connection when the first one was lost (every such statement here is safe to repeat).
        psycopg errors become `PersistenceFailed` unless `raw`."""
        import psycopg

        for attempt in (1, 2):
            try:
                with self._pool.connection() as conn:
                    try:
                        cur = conn.execute(sql, params)
                        if fetch == "none":
                            return None
                        return cur.fetchone() if fetch == "one" else cur.fetchall()
                    except psycopg.Error:
                        if retry_lost and attempt == 1 and (conn.broken or conn.closed):
                            continue
                        raise
            except StorageError:
                raise
            except psycopg.Error as exc:
                if raw:
                    raise
                if is_timeout(exc):
                    raise timed_out(redact(self._pool.url), f"session {sid!r}: mailbox {op}", exc) from None
                raise PersistenceFailed(f"session {sid!r}: mailbox {op} failed: {first_line(exc)}") from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Stop listening (open watches poll from now on) and close the connections of a pool
        this mailbox made (a shared pool stays open)."""
        with self._listen_lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()
            listener.join(timeout=10)  # it closes its connection; never blocks for long
        if self._owns_pool:
            self._pool.close()


def _judge(delivery_id: str, data: bytes | None, size: int) -> Envelope | str:
    """The row's envelope, or why it holds none."""
    if not ULID_PATTERN.fullmatch(delivery_id):
        return "the delivery id is not a 26-character upper-case ULID"
    if data is None:
        return f"the envelope is {size} bytes; an envelope is at most {MAX_ENVELOPE_BYTES}"
    try:
        envelope = _DECODER.decode(bytes(data))
    except (msgspec.DecodeError, RecursionError) as exc:
        return f"not a valid envelope: {exc}"
    except StorageError as exc:  # InvalidEnvelope from the checks made when an envelope is built
        return exc.message
    if envelope.delivery_id != delivery_id:
        return f"holds delivery_id {envelope.delivery_id!r}, which does not match its row"
    return envelope


def _names(delivery_id: str) -> list[str]:
    return [delivery_id, *(f"{delivery_id}~{n}" for n in range(1, 100))]
