"""`PostgresLogStore`: session logs as rows of a PostgreSQL database (SPEC §9; schema: pg_schema).

Theory of operation. The store speaks the `LogStore` contract of the file store, synchronously,
from worker threads, over a small pool of autocommit connections (pg_connect). `create` and
`open_write` take a session-level advisory lock on the store's owner connection (the flock of the
file store: released by the server when the connection ends) — a second writer, in this store or
any other, gets `AlreadyOwned`. The first append publishes: one statement inserts the `sessions`
row (line 1 exactly) and the batch row together, refused as "already exists" when the row is there.
Every later append is one statement too: it advances `sessions.event_count` only where it still
equals the expected seq and inserts the batch row (primary key `(session_id, first_seq)`) in the
same transaction — a stale seq updates nothing and writes nothing (`SequenceConflict`). A commit
is durable when PostgreSQL acknowledges it (its own WAL fsync).

A connection lost mid-append leaves the outcome unknown to the client, never half-done: the
statement is one transaction. The append then asks, on a fresh connection, what the session's
row says: the batch is there with exactly these bytes → it committed (acknowledged); the count
still stands at the expected seq → it did not, and it is sent once more. If even that fails, the
handle is dead (reopen to see what committed), as after a failed fsync in the file store.

Reads fetch the batch rows they need in one query and decode them with the file form's own line
decoder (envelopes, seq continuity, known types, payloads), so damage planted in a row is
reported, located by seq, like damage in a file. `list()`, `stat()`, headers and checkpoint rows
are single queries; a listing judges a session by its header row (rows are written only by
appends that validated every event), and a read judges the rest.

Seams left for later (SPEC §9): the lease epoch of fencing (`batches.epoch` is written NULL; the
append statement is where the lease check joins), the mailbox, hosts and placements.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ._codec import Event
from ._records import HeaderRecord, encode_header_line
from .append_check import check_append, check_new_session
from .errors import (
    AlreadyOwned,
    CorruptLog,
    HandleClosed,
    InvalidRange,
    PersistenceFailed,
    SequenceConflict,
    SessionAlreadyExists,
    SessionNotFound,
    StorageError,
    UnsupportedLog,
)
from .framing import decode_event_lines, is_seed_marker
from .index import StoredCheckpoint
from .log_store import Batch, Handle, ObservedCheckpoint, ReadHandle, WriteHandle
from .pg_checkpoints import PgCheckpoints
from .pg_connect import Owner, Pool, check_url, lock_key, redact
from .pg_rows import SESSION_COLUMNS, batch_lines, header_record, log_info
from .pg_schema import ensure_schema
from .projection import CheckpointRow
from .values import AbortPoll, LogInfo, Offset, SessionHeader, SessionId, check_session_id
from .zstd_framing import compress_frame

__all__ = ["COMPRESS_ABOVE", "PostgresLogStore"]

log = logging.getLogger(__name__)

# A batch's lines are stored as one zstd frame above this many bytes: below it a frame gains
# little (SPEC §3.3: about 1.8x for one event) and costs a compression per append.
COMPRESS_ABOVE = 1024


@attrs.define(eq=False)
class _WriteState:
    incarnation: int  # of the owner connection that took this handle's lock


class PostgresLogStore:
    """The `LogStore` contract on PostgreSQL (`url`: `postgresql://...`); `pool_size` connections
    at most, plus one that holds the write handles' locks."""

    def __init__(self, url: str, *, pool_size: int = 4, compress_above: int = COMPRESS_ABOVE) -> None:
        self.url = check_url(url)
        self.compress_above = compress_above
        self._pool = Pool(url, size=pool_size)
        self._owner = Owner(url, self._pool.app)
        self._checkpoints = PgCheckpoints(self._pool)
        # id -> (what its row said, the listing row made from it); replaced whole by `list()`
        self._infos: dict[str, tuple[tuple[Any, ...], LogInfo]] = {}
        import psycopg

        try:
            with self._pool.connection() as conn:
                ensure_schema(conn)
        except psycopg.Error as exc:  # a server that refuses the DDL (no privilege, say)
            self._pool.close()
            raise PersistenceFailed(f"preparing the PostgreSQL store at {redact(url)} failed: {_line(exc)}") from None
        except BaseException:  # a store whose schema failed closes its pool (re-raised)
            self._pool.close()
            raise

    # --- claiming ---

    def create(self, header: SessionHeader, *, inherited_event_count: Offset = Offset(0)) -> WriteHandle:
        sid = check_new_session(header, inherited_event_count)
        incarnation = self._claim(sid)
        try:
            if self._query_one(sid, "create", "SELECT 1 FROM sessions WHERE id = %s", (sid,)) is not None:
                raise SessionAlreadyExists(sid)
        except BaseException:  # the lock released if the claim fails (re-raised)
            self._owner.unlock(sid, incarnation)
            raise
        return WriteHandle(
            session_id=sid,
            header=header,
            inherited_event_count=inherited_event_count,
            next_seq=Offset(0),
            published=False,
            impl=_WriteState(incarnation),
        )

    def _claim(self, sid: SessionId) -> int:
        try:
            incarnation = self._owner.try_lock(sid)
        except StorageError:
            raise
        except Exception as exc:  # psycopg.Error on the owner connection
            raise PersistenceFailed(f"session {sid!r}: taking the write lock failed: {_line(exc)}") from None
        if incarnation is None:
            raise AlreadyOwned(sid)
        return incarnation

    def open_write(self, session_id: str) -> WriteHandle:
        sid = check_session_id(session_id)
        incarnation = self._claim(sid)
        try:
            row = self._query_one(
                sid,
                "open for writing",
                f"SELECT {SESSION_COLUMNS}, "
                "(SELECT coalesce(sum(count), 0) FROM batches WHERE session_id = %s) FROM sessions WHERE id = %s",
                (sid, sid),
            )
            if row is None:
                raise SessionNotFound(sid)
            record = header_record(sid, row[1])
            if row[5] != row[2]:
                raise CorruptLog(sid, f"its batches hold {row[5]} events but the session row counts {row[2]}")
        except BaseException:  # the lock released if the claim fails (re-raised)
            self._owner.unlock(sid, incarnation)
            raise
        return WriteHandle(
            session_id=sid,
            header=record.header,
            inherited_event_count=record.inherited_event_count,
            next_seq=Offset(row[2]),
            published=True,
            end_offset=row[2],
            impl=_WriteState(incarnation),
        )

    def open_read(self, session_id: str) -> ReadHandle:
        sid = check_session_id(session_id)
        row = self._query_one(sid, "open for reading", "SELECT header FROM sessions WHERE id = %s", (sid,))
        if row is None:
            raise SessionNotFound(sid)
        record = header_record(sid, row[0])
        return ReadHandle(session_id=sid, header=record.header, inherited_event_count=record.inherited_event_count)

    def close(self, handle: Handle) -> None:
        if handle.closed:
            return
        handle.closed = True
        state = handle.impl
        if isinstance(state, _WriteState):
            self._owner.unlock(handle.session_id, state.incarnation)

    # --- appending ---

    def append(self, handle: WriteHandle, batches: Sequence[Batch]) -> Offset:
        sid = handle.session_id
        checked = check_append(handle, batches)
        if checked is None:
            return handle.next_seq
        events, payload = checked
        first = handle.next_seq
        compressed = len(payload) > self.compress_above
        data = compress_frame(payload) if compressed else payload
        args = {
            "id": sid,
            "first": first,
            "n": len(events),
            "data": data,
            "z": compressed,
            "size": len(payload),
            "time": events[-1].time,
        }
        if handle.published:
            statement = _APPEND
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
        handle.published = True
        handle.next_seq = Offset(first + len(events))
        handle.end_offset = handle.next_seq
        return handle.next_seq

    def _write_once(self, handle: WriteHandle, statement: str, args: dict[str, Any]) -> None:
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
            raise PersistenceFailed(f"session {sid!r}: append failed: {_line(exc)}") from None
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
                handle.dead = f"the connection was lost twice mid-append ({_line(lost.cause)})"
                raise PersistenceFailed(f"session {sid!r}: append failed: {_line(lost.cause)}") from None
            except psycopg.Error as exc:
                raise PersistenceFailed(f"session {sid!r}: append failed: {_line(exc)}") from None
        handle.dead = f"the connection was lost mid-append ({_line(first)}) and what committed cannot be told"
        raise PersistenceFailed(f"session {sid!r}: append failed: {_line(first)}")

    def _write(self, handle: WriteHandle, statement: str, args: dict[str, Any]) -> None:
        """One attempt: written, or a verdict (`SequenceConflict`, ...), or `_Lost`."""
        import psycopg

        with self._pool.connection() as conn:
            try:
                written = conn.execute(statement, args).rowcount
            except psycopg.errors.UniqueViolation:
                written = 0  # another writer's batch at this seq: a conflict like any other
            except psycopg.Error as exc:
                if conn.broken or conn.closed:
                    raise _Lost(exc) from None
                raise
            if written != 1:
                self._refuse(conn, handle, args)

    def _refuse(self, conn: Any, handle: WriteHandle, args: dict[str, Any]) -> None:
        """Nothing was written: say why (the session exists already, or its count moved)."""
        sid = handle.session_id
        row = conn.execute("SELECT event_count FROM sessions WHERE id = %s", (sid,)).fetchone()
        if not handle.published:
            raise SessionAlreadyExists(sid)
        actual = row[0] if row is not None else 0
        raise SequenceConflict(sid, expected=args["first"], actual=actual)

    def _resolve(self, handle: WriteHandle, args: dict[str, Any]) -> str:
        """After a lost connection: "committed" (the very batch is there), "absent" (the count
        stands at the expected seq) or "unknown"."""
        import psycopg

        sid = handle.session_id
        try:
            with self._pool.connection() as conn:
                row = conn.execute(
                    "SELECT s.event_count, b.data FROM sessions s "
                    "LEFT JOIN batches b ON b.session_id = s.id AND b.first_seq = %s WHERE s.id = %s",
                    (args["first"], sid),
                ).fetchone()
        except (psycopg.Error, StorageError):
            return "unknown"
        if row is None:
            return "absent" if not handle.published else "unknown"
        count, data = row
        if data is not None and bytes(data) == args["data"] and count >= args["first"] + args["n"]:
            return "committed"
        if count == args["first"] and data is None:
            return "absent"
        return "unknown"

    # --- reading ---

    def read(
        self, handle: Handle, start: Offset = Offset(0), stop: Offset | None = None, *, poll: AbortPoll | None = None
    ) -> list[Event]:
        sid = handle.session_id
        if handle.closed:
            raise HandleClosed(sid, "read")
        if type(start) is not int or start < 0 or (stop is not None and (type(stop) is not int or stop < start)):
            raise InvalidRange(f"session {sid!r}: read range [{start!r}, {stop!r}) is not a range of offsets")
        if isinstance(handle, WriteHandle):
            if not handle.published:
                return []
            # A writer reads what it wrote: rows past it could only be another writer's, after
            # this handle's lock was lost (the file store's writer reads up to its own end too).
            stop = handle.next_seq if stop is None else Offset(min(stop, handle.next_seq))
        if stop is not None and stop <= start:
            return []
        return self._events(handle, start, stop, poll)

    def _events(self, handle: Handle, start: int, stop: int | None, poll: AbortPoll | None) -> list[Event]:
        sid = handle.session_id
        rows = self._query_all(
            sid,
            "read",
            "SELECT first_seq, count, data, compressed FROM batches WHERE session_id = %(id)s "
            "AND first_seq >= coalesce((SELECT max(first_seq) FROM batches "
            "WHERE session_id = %(id)s AND first_seq <= %(start)s), 0) "
            "AND (%(stop)s::bigint IS NULL OR first_seq < %(stop)s) ORDER BY first_seq",
            {"id": sid, "start": start, "stop": stop},
        )
        if not rows:
            return []
        base = rows[0][0]
        events: list[Event] = []
        expected = base
        for first_seq, count, data, compressed in rows:
            if poll is not None and events:
                poll()
            if first_seq != expected:
                raise CorruptLog(sid, f"the batch holding seq {expected} is missing", seq=expected)
            lines = batch_lines(sid, first_seq, bytes(data), compressed)
            got = decode_event_lines(sid, lines, 0, len(lines), first_seq=first_seq, poll=poll, out=events)
            if len(got) != expected - base + count:
                raise CorruptLog(sid, f"the batch at seq {first_seq} holds other than {count} events", seq=first_seq)
            expected = first_seq + count
        k = handle.inherited_event_count
        if k and base <= k < expected and not is_seed_marker(events[k - base]):
            raise CorruptLog(sid, f"seq {k} must be the tagged session/end-seed marker", seq=k)
        return events[start - base : None if stop is None else stop - base]

    def read_after(
        self, handle: Handle, log_offset: int, first_seq: int, *, poll: AbortPoll | None = None
    ) -> list[Event] | None:
        """The events from `first_seq` on. Here a checkpoint's `log_offset` is the event count
        it covers, so it must equal `first_seq`; None when it does not, or past the end."""
        sid = handle.session_id
        if handle.closed:
            raise HandleClosed(sid, "read")
        if type(log_offset) is not int or log_offset < 0 or type(first_seq) is not int or first_seq < 0:
            raise InvalidRange(
                f"session {sid!r}: log_offset and first_seq must be non-negative ints, "
                f"got {log_offset!r}, {first_seq!r}"
            )
        if log_offset != first_seq:
            return None
        stop = None
        if isinstance(handle, WriteHandle):
            if first_seq > handle.next_seq:
                return None
            if first_seq == handle.next_seq:
                return []
            stop = handle.next_seq
        try:
            return self._events(handle, first_seq, stop, poll)
        except (CorruptLog, UnsupportedLog):
            return None

    # --- listing ---

    def stat(self, session_id: str) -> LogInfo | None:
        sid = check_session_id(session_id)
        row = self._query_one(sid, "stat", f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = %s", (sid,))
        if row is None:
            return None
        infos = self._infos
        info = self._info(row, infos)
        infos[sid] = (_row_key(row), info)
        return info

    def list(self) -> list[LogInfo]:
        """One query. A row unchanged since the last listing (same generation, count, size and
        header bytes) gives the very same `LogInfo` again: line 1 is parsed once per lifecycle."""
        rows = self._query_all(None, "list", f'SELECT {SESSION_COLUMNS} FROM sessions ORDER BY id COLLATE "C"', ())
        known, infos = self._infos, {}
        out = []
        for row in rows:
            try:
                info = self._info(row, known)
            except StorageError:
                continue  # an id no valid session has (planted by hand): not a session
            infos[info.id] = (_row_key(row), info)
            out.append(info)
        self._infos = infos  # only the sessions that still exist stay cached
        return out

    @staticmethod
    def _info(row: tuple[Any, ...], known: dict[str, tuple[tuple[Any, ...], LogInfo]]) -> LogInfo:
        cached = known.get(row[0])
        if cached is not None and cached[0] == _row_key(row):
            return cached[1]
        return log_info(row)

    def held_elsewhere(self, session_ids: Sequence[str]) -> set[str]:
        """The ids whose write lock a client of another process holds now (by its application
        name; a client of another role, whose name PostgreSQL hides, counts as another process),
        read from `pg_locks` without taking any lock; empty when that cannot be read."""
        import psycopg

        keys: dict[int, str] = {}
        for session_id in session_ids:
            try:
                keys[lock_key(check_session_id(session_id))] = session_id
            except StorageError:
                continue
        if not keys:
            return set()
        try:
            with self._pool.connection() as conn:
                rows = conn.execute(
                    "SELECT l.classid::bigint, l.objid::bigint FROM pg_locks l "
                    "JOIN pg_stat_activity a ON a.pid = l.pid "
                    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
                    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                    "AND a.application_name IS DISTINCT FROM %s",
                    (self._pool.app,),
                ).fetchall()
        except (psycopg.Error, StorageError):
            return set()
        held = set()
        for high, low in rows:
            key = int.from_bytes(((high << 32) | low).to_bytes(8, "big"), "big", signed=True)
            if key in keys:
                held.add(keys[key])
        return held

    # --- checkpoints (pg_checkpoints) ---

    def write_checkpoint(self, handle: WriteHandle, rows: Mapping[str, CheckpointRow]) -> bool:
        """Store the rows that cover exactly the durable log (seq = the last durable seq),
        replacing the session's earlier ones. Fail-soft: False when not stored."""
        return self._checkpoints.write(handle, rows)

    def write_observed_checkpoints(self, observed: Sequence[ObservedCheckpoint]) -> int:
        """Rows a reader proved by folding whole logs (`LogStore`); fail-soft and quiet."""
        return self._checkpoints.write_observed(observed)

    def read_checkpoint(
        self, session_id: str, header: SessionHeader, inherited_event_count: int
    ) -> tuple[dict[str, CheckpointRow], int] | None:
        """The stored rows of this lifecycle of the session and the event count they cover."""
        return self._checkpoints.read(session_id, header, inherited_event_count)

    def read_checkpoint_rows(
        self, session_ids: Sequence[str], keys: Sequence[str] | None = None, skip: Mapping[str, bytes] | None = None
    ) -> dict[str, list[StoredCheckpoint]] | None:
        """Every stored checkpoint row of these sessions (of the units `keys` only, if given; a
        row of unit `k` whose JSON contains `skip[k]` left out), in one query; None on a failure."""
        return self._checkpoints.rows(session_ids, keys, skip)

    # --- plumbing ---

    def _query_one(self, sid: str | None, op: str, sql: str, params: Any) -> Any:
        return self._query(sid, op, sql, params, one=True)

    def _query_all(self, sid: str | None, op: str, sql: str, params: Any) -> list[Any]:
        return self._query(sid, op, sql, params, one=False)

    def _query(self, sid: str | None, op: str, sql: str, params: Any, *, one: bool) -> Any:
        """A read-only query; a connection found dead (an idle one after a server restart, say)
        is replaced once: reading again is harmless."""
        import psycopg

        for attempt in (1, 2):
            try:
                with self._pool.connection() as conn:
                    try:
                        cur = conn.execute(sql, params)
                        return cur.fetchone() if one else cur.fetchall()
                    except psycopg.Error:
                        if attempt == 1 and (conn.broken or conn.closed):
                            continue
                        raise
            except StorageError:
                raise
            except psycopg.Error as exc:
                who = f"session {sid!r}: " if sid is not None else ""
                raise PersistenceFailed(f"{who}{op} failed: {_line(exc)}") from None
        raise AssertionError("unreachable")

    @property
    def pool(self) -> Pool:
        """The store's connection pool (a `PostgresMailbox` may share it)."""
        return self._pool

    @property
    def owner_backend_pid(self) -> int | None:
        """The server process holding this store's write locks (tests terminate it)."""
        return self._owner.backend_pid

    def close_store(self) -> None:
        """Close every connection; the write locks go with the owner connection."""
        self._owner.close()
        self._pool.close()


_PUBLISH = (
    "WITH s AS (INSERT INTO sessions (id, header, created_at, parent_session, origin, is_seeded, "
    "inherited_event_count, delegation_depth, event_count, last_time, byte_size) VALUES (%(id)s, %(header)s, "
    "%(created_at)s, %(parent)s, %(origin)s, %(seeded)s, %(k)s, %(depth)s, %(n)s, %(time)s, %(size)s) "
    "ON CONFLICT (id) DO NOTHING RETURNING id) "
    "INSERT INTO batches (session_id, first_seq, count, data, compressed, epoch) "
    "SELECT id, %(first)s, %(n)s, %(data)s, %(z)s, NULL FROM s"
)

# The fencing of SPEC §9 joins here: a CTE updating `leases` where owner and epoch still match,
# and the batch inserted only from it.
_APPEND = (
    "WITH s AS (UPDATE sessions SET event_count = event_count + %(n)s, byte_size = byte_size + %(size)s, "
    "last_time = %(time)s WHERE id = %(id)s AND event_count = %(first)s RETURNING id) "
    "INSERT INTO batches (session_id, first_seq, count, data, compressed, epoch) "
    "SELECT id, %(first)s, %(n)s, %(data)s, %(z)s, NULL FROM s"
)


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _row_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """What makes a listing row: header bytes, event count, size, generation."""
    return (bytes(row[1]), row[2], row[3], row[4])


class _Lost(Exception):
    """The connection went away during a statement: whether it committed is unknown."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause
