"""The append path of the PostgreSQL store (pg_store): fenced statements, and what to do when a
connection is lost mid-append.

Theory of operation. The first append publishes: one statement inserts the `sessions` row (line 1
exactly) and the batch row together, refused as "already exists" when the row is there. Every
later append is one statement too: it advances `sessions.event_count` only where it still equals
the expected seq and inserts the batch row (primary key `(session_id, first_seq)`) in the same
transaction — a stale seq updates nothing and writes nothing (`SequenceConflict`). Both are
fenced, the batch row recording the writer's epoch (`batches.epoch`); a writer whose lease
another host took writes nothing, gets `OwnershipLost`, and its handle never writes again.

The fence (schema version 5). The publication is fenced on the lease row: it renews the lease
where owner and epoch are still the handle's and inserts the session row only from that update,
copying owner and epoch into `sessions.writer` / `writer_epoch`. A later append is fenced on the
session row it writes anyway: its count UPDATE also requires `writer = me AND writer_epoch =
epoch`. The invariant it relies on: **the session row names the lease's current owner and epoch
in every committed state** — a trigger on `leases` (pg_schema, `leases_writer`) rewrites the two
columns in the very transaction that takes a lease over (by any build, or by hand) or deletes it.
So an append and a takeover both write the session row and are ordered by its row lock: an
append that commits first was acknowledged before the takeover (the new writer, which reads the
log after its takeover commits, sees it); an append that comes second re-checks its WHERE on the
takeover's row version (READ COMMITTED re-evaluates an UPDATE's condition on the newest row) and
updates nothing — no batch, `OwnershipLost`. No acknowledged event is lost, no stale write lands.

The lease itself is renewed by the runtime's renewal task (every ttl / 3); an append renews it
too, in the same statement, only when the handle's lease was last renewed half a ttl ago or more
(by the client's clock: that is liveness, not safety — the epoch fences). That statement takes
the lease row first and the session row second (the session UPDATE reads the lease UPDATE's
result), the order a takeover takes them in (its lease row, then the trigger's session row), and
a renewal or a release locks lease rows only: no two statements wait on each other in opposite
orders, so renewal and takeover cannot deadlock. Checkpoint writes lock the session row only.

A connection lost mid-append leaves the outcome unknown to the client, never half-done: the
statement is one transaction. The append then asks, on a fresh connection, what the session's
row says: the batch is there with exactly these bytes → it committed (acknowledged); the count
still stands at the expected seq → it did not, and it is sent once more. If even that fails, the
handle is dead (reopen to see what committed), as after a failed fsync in the file store. The
batch found must carry this handle's epoch to count as committed; a resent statement is fenced
like the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, LiteralString

from ._records import HeaderRecord, encode_header_line
from .append_check import check_append
from .errors import OwnershipLost, PersistenceFailed, SequenceConflict, SessionAlreadyExists, StorageError
from .log_store import Batch, WriteHandle
from .pg_connect import Pool, first_line
from .pg_leases import Leases, LeaseState
from .values import Offset
from .zstd_framing import compress_frame

__all__ = ["PgAppender", "ownership_lost"]


class PgAppender:
    """Appends of one store, on its pool, under its host's leases; batches whose lines exceed
    `compress_above` bytes are stored as one zstd frame."""

    def __init__(self, pool: Pool, leases: Leases, *, compress_above: int) -> None:
        self.pool = pool
        self.leases = leases
        self.compress_above = compress_above

    def append(self, handle: WriteHandle, batches: Sequence[Batch]) -> Offset:
        """`LogStore.append` on PostgreSQL: one fenced statement (see the module docstring)."""
        sid = handle.session_id
        lease = handle.impl
        assert isinstance(lease, LeaseState), "a write handle of this store"
        if not handle.closed:
            if lease.lost:
                raise ownership_lost(handle, lease)
            if self.leases.closed:
                raise PersistenceFailed(f"session {sid!r}: append failed: the store is closed")
        checked = check_append(handle, batches)
        if checked is None:
            return handle.next_seq
        events, payload = checked
        first = handle.next_seq
        compressed = len(payload) > self.compress_above
        data = compress_frame(payload) if compressed else payload  # the thread's kept compressor
        args = {
            "id": sid,
            "first": first,
            "n": len(events),
            "data": data,
            "z": compressed,
            "size": len(payload),
            "time": events[-1].time,
            "me": self.leases.host_id,
            "epoch": lease.epoch,
            "ttl": self.leases.ttl,
        }
        renews = not handle.published or self.leases.monotonic() - lease.renewed_from >= self.leases.ttl / 2
        sent = self.leases.monotonic() if renews else 0.0
        if handle.published:
            statement = _APPEND_RENEWING if renews else _APPEND
        else:
            head = encode_header_line(
                HeaderRecord(header=handle.header, inherited_event_count=handle.inherited_event_count)
            )
            h = handle.header
            args |= {
                "header": head,
                "created_at": h.created_at,
                "parent": h.parent_session,
                "origin": h.origin,
                "seeded": h.is_seeded,
                "k": handle.inherited_event_count,
                "depth": h.delegation_depth,
                "size": len(head) + len(payload),
            }
            statement = _PUBLISH
        self._write_once(handle, statement, args)
        if renews:
            lease.renewed_from = max(lease.renewed_from, sent)  # the lease now ends a ttl after `sent` at the soonest
        handle.published = True
        handle.next_seq = Offset(first + len(events))
        handle.end_offset = handle.next_seq
        return handle.next_seq

    def _write_once(self, handle: WriteHandle, statement: LiteralString, args: dict[str, Any]) -> None:
        """Run the append statement; after a lost connection, find out whether it committed and
        send it again only if it did not (at most once)."""
        import psycopg

        sid = handle.session_id
        try:
            self._write(handle, statement, args)
            return
        except _Lost as lost:
            first = lost.cause
        except psycopg.Error as exc:  # the statement failed whole (a full disk, say): nothing written
            raise PersistenceFailed(f"session {sid!r}: append failed: {first_line(exc)}") from None
        outcome = self._resolve(handle, args)
        if outcome == "committed":
            return
        if outcome == "absent":
            try:
                self._write(handle, statement, args)
                return
            except SequenceConflict:
                # The lost statement may still have been running on the server and committed
                # after the look: then the batch there is this very one.
                if self._resolve(handle, args) == "committed":
                    return
                raise
            except _Lost as lost:
                handle.dead = f"the connection was lost twice mid-append ({first_line(lost.cause)})"
                raise PersistenceFailed(f"session {sid!r}: append failed: {first_line(lost.cause)}") from None
            except psycopg.Error as exc:
                raise PersistenceFailed(f"session {sid!r}: append failed: {first_line(exc)}") from None
        handle.dead = f"the connection was lost mid-append ({first_line(first)}) and what committed cannot be told"
        raise PersistenceFailed(f"session {sid!r}: append failed: {first_line(first)}")

    def _write(self, handle: WriteHandle, statement: LiteralString, args: dict[str, Any]) -> None:
        """One attempt: written, or a verdict (`SequenceConflict`, ...), or `_Lost`."""
        import psycopg

        with self.pool.cursor() as cur:
            conn = cur.connection
            try:
                written = cur.execute(statement, args).rowcount
            except psycopg.errors.UniqueViolation:
                written = 0  # another writer's batch at this seq: a conflict like any other
            except psycopg.Error as exc:
                if conn.broken or conn.closed:
                    raise _Lost(exc) from None
                raise
            if written != 1:
                self._refuse(conn, handle, args)

    def _refuse(self, conn: Any, handle: WriteHandle, args: dict[str, Any]) -> None:
        """Nothing was written: say why (the lease is another's, the session exists already,
        or its count moved)."""
        sid = handle.session_id
        row = conn.execute(
            "SELECT s.event_count, s.writer = %(me)s AND s.writer_epoch = %(epoch)s, "
            "EXISTS (SELECT 1 FROM leases WHERE session_id = %(id)s AND owner = %(me)s AND epoch = %(epoch)s) "
            "FROM (SELECT 1) one LEFT JOIN sessions s ON s.id = %(id)s",
            args,
        ).fetchone()
        count, fenced_in, ours = row
        # Published: the session row is the fence (and the lease row, when the append renewed it);
        # a session row gone (deleted by hand) is a moved count, as before the fence moved there.
        if not ours or (handle.published and count is not None and not fenced_in):
            assert isinstance(handle.impl, LeaseState)
            raise ownership_lost(handle, handle.impl)
        if not handle.published:
            raise SessionAlreadyExists(sid)
        raise SequenceConflict(sid, expected=args["first"], actual=count or 0)

    def _resolve(self, handle: WriteHandle, args: dict[str, Any]) -> str:
        """After a lost connection: "committed" (the very batch is there), "absent" (the count
        stands at the expected seq) or "unknown"."""
        import psycopg

        sid = handle.session_id
        try:
            with self.pool.connection() as conn:
                row = conn.execute(
                    "SELECT s.event_count, b.data, b.epoch FROM sessions s "
                    "LEFT JOIN batches b ON b.session_id = s.id AND b.first_seq = %s WHERE s.id = %s",
                    (args["first"], sid),
                ).fetchone()
        except (psycopg.Error, StorageError):
            return "unknown"
        if row is None:
            return "absent" if not handle.published else "unknown"
        count, data, epoch = row
        if (
            data is not None
            and bytes(data) == args["data"]
            and epoch == args["epoch"]
            and count >= args["first"] + args["n"]
        ):
            return "committed"
        if count == args["first"] and data is None:
            return "absent"
        return "unknown"


def ownership_lost(handle: WriteHandle, lease: LeaseState) -> OwnershipLost:
    """Mark the lease lost and the handle dead (it never writes again); the error to raise."""
    lease.lost = True
    handle.dead = f"ownership lost (epoch {lease.epoch})"
    return OwnershipLost(handle.session_id, lease.epoch)


# Fencing (SPEC §9, schema version 5; see the module docstring). `l` renews the lease only where
# owner and epoch are still the handle's, and what follows it is written only from its row.
_FENCE: Final = (
    "WITH l AS (UPDATE leases SET expires_at = now() + make_interval(secs => %(ttl)s) "
    "WHERE session_id = %(id)s AND owner = %(me)s AND epoch = %(epoch)s RETURNING session_id), "
)

_PUBLISH: Final = (
    _FENCE + "s AS (INSERT INTO sessions (id, header, created_at, parent_session, origin, is_seeded, "
    "inherited_event_count, delegation_depth, event_count, last_time, byte_size, writer, writer_epoch) "
    "SELECT session_id, %(header)s, %(created_at)s, %(parent)s, %(origin)s, %(seeded)s, %(k)s, %(depth)s, %(n)s, "
    "%(time)s, %(size)s, %(me)s, %(epoch)s FROM l ON CONFLICT (id) DO NOTHING RETURNING id) "
    "INSERT INTO batches (session_id, first_seq, count, data, compressed, epoch) "
    "SELECT id, %(first)s, %(n)s, %(data)s, %(z)s, %(epoch)s FROM s"
)

# The count advanced only where the session row still names this writer: two rows written.
_ADVANCE: Final = (
    "s AS (UPDATE sessions SET event_count = event_count + %(n)s, byte_size = byte_size + %(size)s, "
    "last_time = %(time)s WHERE id = "
)
_ADVANCED: Final = (
    " AND event_count = %(first)s AND writer = %(me)s AND writer_epoch = %(epoch)s RETURNING id) "
    "INSERT INTO batches (session_id, first_seq, count, data, compressed, epoch) "
    "SELECT id, %(first)s, %(n)s, %(data)s, %(z)s, %(epoch)s FROM s"
)

_APPEND: Final = "WITH " + _ADVANCE + "%(id)s" + _ADVANCED

# The same, renewing the lease first: the lease row locked before the session row, as a takeover
# locks them (its trigger writes the session row), so the two cannot deadlock.
_APPEND_RENEWING: Final = _FENCE + _ADVANCE + "(SELECT session_id FROM l)" + _ADVANCED


class _Lost(Exception):
    """The connection went away during a statement: whether it committed is unknown."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause
