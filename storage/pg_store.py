"""`PostgresLogStore`: session logs as rows of a PostgreSQL database (SPEC §9; schema: pg_schema).

Theory of operation. The store speaks the `LogStore` contract of the file store, synchronously,
from worker threads, over a small pool of autocommit connections (pg_connect). Each store is a
host with a lease on every session it writes (pg_leases: the flock of the file store, with
fencing): `create` and `open_write` take the lease at a new epoch (`WriteHandle.epoch`) — a
second writer, in this store or any other, gets `AlreadyOwned` while the holder is alive and its
lease unexpired. Appends are single fenced statements (pg_append: publication, seq checks,
`OwnershipLost`, and what a connection lost mid-append leaves). A lease that expired but was not
taken over still lets its holder append (and an append renews it once half a ttl has passed since
its last renewal): safety comes from the epoch, fenced on the session row.
A commit is durable when PostgreSQL acknowledges it (its own WAL fsync).

Reads fetch the batch rows they need in one query and decode them with the file form's own line
decoder (envelopes, seq continuity, known types, payloads), so damage planted in a row is
reported, located by seq, like damage in a file. `list()`, `stat()`, headers and checkpoint rows
are single queries; a listing judges a session by its header row (rows are written only by
appends that validated every event), and a read judges the rest.

`renew_leases` (run by the runtime every `lease_renew_interval`) extends every lease in one
statement and marks the handles whose lease was lost: their next append raises `OwnershipLost`
without a query. `held_elsewhere` (listing's `running`) names the sessions another live host holds
an unexpired lease on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, LiteralString, TypeVar, cast

from ._codec import Event
from .append_check import check_new_session
from .errors import (
    CorruptLog,
    HandleClosed,
    InvalidRange,
    PersistenceFailed,
    SessionAlreadyExists,
    SessionNotFound,
    StorageError,
    UnsupportedLog,
)
from .framing import decode_event_lines, is_seed_marker
from .index_rows import StoredCheckpoint
from .log_store import Batch, Handle, ObservedCheckpoint, ReadHandle, WriteHandle
from .pg_append import PgAppender
from .pg_checkpoints import PgCheckpoints
from .pg_connect import Pool, check_url, first_line, redact
from .pg_leases import Leases, LeaseState, lease_in_force, lease_options
from .pg_rows import SESSION_COLUMNS, batch_lines, header_record, log_info
from .pg_schema import check_schema, ensure_schema
from .pg_timeouts import is_timeout, timed_out
from .projection import CheckpointRow
from .values import AbortPoll, LogInfo, Offset, SessionHeader, SessionId, check_session_id

if TYPE_CHECKING:
    from psycopg import Cursor
    from psycopg.abc import Params
    from psycopg.rows import TupleRow

    from .pg_placements import PgPlacements

__all__ = ["COMPRESS_ABOVE", "PostgresLogStore"]

log = logging.getLogger(__name__)

STREAM_PAGE_ROWS = 64  # batch rows a streaming read fetches per query

T = TypeVar("T")

# A batch's lines are stored as one zstd frame above this many bytes: below it a frame gains
# little (SPEC §3.3: about 1.8x for one event) and costs a compression per append.
COMPRESS_ABOVE = 1024


class PostgresLogStore:
    """The `LogStore` contract on PostgreSQL (`url`: `postgresql://...`); `pool_size` connections
    at most, plus the owner connection that holds the host's liveness lock. `host_id` names this
    store among the hosts sharing the database (default: a fresh ULID); its leases last
    `lease_ttl` seconds past each renewal, due every `lease_renew_interval` (default ttl / 3).
    With `create_schema` (the default) the schema is created or migrated here; without it
    (read-only commands) it is only checked: a database without it, or with an older one,
    raises `StoreNotInitialized`, and nothing is written."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 4,
        compress_above: int = COMPRESS_ABOVE,
        host_id: str | None = None,
        lease_ttl: float = 15.0,
        lease_renew_interval: float | None = None,
        create_schema: bool = True,
    ) -> None:
        self.url = check_url(url)
        self.create_schema = create_schema
        self.compress_above = compress_above
        host_id, lease_ttl, lease_renew_interval = lease_options(host_id, lease_ttl, lease_renew_interval)
        self.lease_renew_interval = lease_renew_interval
        self._pool = Pool(url, size=pool_size)
        self._leases = Leases(url, self._pool.app, host_id=host_id, ttl=lease_ttl)
        self._placements: PgPlacements | None = None
        self._appender = PgAppender(self._pool, self._leases, compress_above=compress_above)
        self._checkpoints = PgCheckpoints(self._pool)
        # id -> (what its row said, the listing row made from it); replaced whole by `list()`
        self._infos: dict[str, tuple[tuple[Any, ...], LogInfo]] = {}
        import psycopg

        try:
            with self._pool.connection() as conn:
                if create_schema:
                    ensure_schema(conn)
                else:
                    check_schema(conn, url)
        except psycopg.Error as exc:  # a server that refuses the DDL (no privilege, say)
            self._pool.close()
            if is_timeout(exc):
                raise timed_out(redact(url), "checking the schema", exc) from None
            raise PersistenceFailed(
                f"preparing the PostgreSQL store at {redact(url)} failed: {first_line(exc)}"
            ) from None
        except BaseException:  # a store whose schema failed closes its pool (re-raised)
            self._pool.close()
            raise

    # --- claiming ---

    def create(self, header: SessionHeader, *, inherited_event_count: Offset = Offset(0)) -> WriteHandle:
        sid = check_new_session(header, inherited_event_count)
        lease = self._leases.acquire(sid)
        try:
            if self._query_one(sid, "create", "SELECT 1 FROM sessions WHERE id = %s", (sid,)) is not None:
                raise SessionAlreadyExists(sid)
        except BaseException:  # the lease released if the claim fails (re-raised)
            self._leases.release(lease)
            raise
        return WriteHandle(
            session_id=sid,
            header=header,
            inherited_event_count=inherited_event_count,
            next_seq=Offset(0),
            published=False,
            epoch=lease.epoch,
            impl=lease,
        )

    def open_write(self, session_id: str) -> WriteHandle:
        sid = check_session_id(session_id)
        lease = self._leases.acquire(sid)
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
            if row[6] != row[2]:
                raise CorruptLog(sid, f"its batches hold {row[6]} events but the session row counts {row[2]}")
        except BaseException:  # the lease released if the claim fails (re-raised)
            self._leases.release(lease)
            raise
        return WriteHandle(
            session_id=sid,
            header=record.header,
            inherited_event_count=record.inherited_event_count,
            next_seq=Offset(row[2]),
            published=True,
            epoch=lease.epoch,
            end_offset=row[2],
            impl=lease,
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
        lease = handle.impl
        if isinstance(lease, LeaseState):
            self._leases.release(lease)  # expired, kept (epochs only grow), notified

    # --- leases (pg_leases) ---

    @property
    def host_id(self) -> str:
        """This store's name among the hosts sharing the database (`leases.owner`)."""
        return self._leases.host_id

    def register_host(self, capacity: int | None = None) -> None:
        """Write this host's `hosts` row (with `capacity`) and take its liveness lock now; a
        store does so by itself when it first claims a session."""
        self._leases.register(capacity)

    @property
    def leased(self) -> PostgresLogStore:
        """This store: its writers hold leases, and it has a placement queue (`LeasedStore`)."""
        return self

    def placements(self) -> PgPlacements:
        """The placement queue and host registry of this database, as this host (pg_placements;
        one per store, sharing its pool and host identity)."""
        if self._placements is None:
            from .pg_placements import PgPlacements

            self._placements = PgPlacements(self.url, self._pool, self._leases)
        return self._placements

    def change_mark(self) -> object:
        """What moves whenever `list()` or `held_elsewhere` could answer otherwise, in one query:
        the sessions table's row count, its sums of event counts, sizes and generations and its
        largest generation (an append grows a count and a size; a session made, removed or made
        again moves a generation), and which leases another live host holds in force, at which
        epoch (an md5 of them: expiry and a host's end move it). A session row changes in no
        other way a listing sees (line 1 is written once). `StorageError` as `list()`."""
        row = self._query_one(None, "change mark", _CHANGE_MARK, {"me": self._leases.host_id})
        return None if row is None else tuple(row)

    def renew_leases(self) -> frozenset[SessionId]:
        """Extend every lease this store holds, in one statement (and the host's `renewed_at`);
        returns the sessions found lost, whose handles' next append raises `OwnershipLost`.
        `PersistenceFailed` or `StoreUnreachable` when the database cannot be reached."""
        return self._leases.renew()

    # --- appending (pg_append) ---

    def append(self, handle: WriteHandle, batches: Sequence[Batch]) -> Offset:
        return self._appender.append(handle, batches)

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
        """`read`'s events: the stream's, from one query of every row."""
        return [event for chunk in self._event_chunks(handle, start, stop, poll, page=None) for event in chunk]

    def read_chunks(
        self, handle: Handle, *, start: Offset = Offset(0), poll: AbortPoll | None = None
    ) -> Iterator[list[Event]]:
        """`read(handle, start)` a batch row at a time (`LogReader.read_chunks`), fetched a
        page of `STREAM_PAGE_ROWS` rows per query (a log is append-only: the pages agree)."""
        sid = handle.session_id
        if handle.closed:
            raise HandleClosed(sid, "read")
        if type(start) is not int or start < 0:
            raise InvalidRange(f"session {sid!r}: read start {start!r} is not an offset")
        stop: int | None = None
        if isinstance(handle, WriteHandle):
            if not handle.published or handle.next_seq <= start:
                return iter(())
            stop = handle.next_seq  # what this writer wrote, as `read` reads
        return self._event_chunks(handle, start, stop, poll)

    def _event_chunks(
        self,
        handle: Handle,
        start: int,
        stop: int | None,
        poll: AbortPoll | None,
        *,
        page: int | None = STREAM_PAGE_ROWS,
    ) -> Iterator[list[Event]]:
        """The events from `start` (before `stop`) a batch row at a time, checked as they come
        (a missing batch, a batch's count, the seed marker where it falls); rows fetched `page`
        at a time (None: all in one query, as `read` takes them)."""
        sid = handle.session_id
        k = handle.inherited_event_count
        rows = self._query_all(
            sid,
            "read",
            "SELECT first_seq, count, data, compressed FROM batches WHERE session_id = %(id)s "
            "AND first_seq >= coalesce((SELECT max(first_seq) FROM batches "
            "WHERE session_id = %(id)s AND first_seq <= %(start)s), 0) "
            "AND (%(stop)s::bigint IS NULL OR first_seq < %(stop)s) ORDER BY first_seq LIMIT %(page)s",
            {"id": sid, "start": start, "stop": stop, "page": page},
        )
        expected: int | None = None
        while rows:
            for row in rows:
                first_seq, count, data, compressed = int(row[0]), int(row[1]), row[2], bool(row[3])
                if expected is None:
                    expected = first_seq
                elif poll is not None:
                    poll()
                if first_seq != expected:
                    raise CorruptLog(sid, f"the batch holding seq {expected} is missing", seq=expected)
                lines = batch_lines(sid, first_seq, bytes(data), compressed)
                events: list[Event] = decode_event_lines(sid, lines, 0, len(lines), first_seq=first_seq, poll=poll)
                del lines
                if len(events) != count:
                    raise CorruptLog(
                        sid, f"the batch at seq {first_seq} holds other than {count} events", seq=first_seq
                    )
                if k and first_seq <= k < first_seq + count and not is_seed_marker(events[k - first_seq]):
                    raise CorruptLog(sid, f"seq {k} must be the tagged session/end-seed marker", seq=k)
                expected = first_seq + count
                low = max(0, start - first_seq)
                high = count if stop is None else max(0, min(count, stop - first_seq))
                if low < high:
                    yield events if (low, high) == (0, count) else events[low:high]
                del events
            if page is None or len(rows) < page:
                return
            rows = self._query_all(
                sid,
                "read",
                "SELECT first_seq, count, data, compressed FROM batches WHERE session_id = %(id)s "
                "AND first_seq >= %(next)s AND (%(stop)s::bigint IS NULL OR first_seq < %(stop)s) "
                "ORDER BY first_seq LIMIT %(page)s",
                {"id": sid, "next": expected, "stop": stop, "page": page},
            )

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
        out: list[LogInfo] = []
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
        """The ids another live host (another store, in this process or any other) holds an
        unexpired lease on — SPEC §9 "Activity across hosts": running there. One query, taking
        no lock; empty when it cannot be read."""
        return set(self.holders(session_ids))

    def holders(self, session_ids: Sequence[str]) -> dict[str, str]:
        """`held_elsewhere` with who holds each: `host H`, the lease owner's host id."""
        import psycopg

        ids: list[SessionId] = []
        for session_id in session_ids:
            try:
                ids.append(check_session_id(session_id))
            except StorageError:
                continue
        if not ids:
            return {}
        try:
            with self._pool.connection() as conn:
                held = self._leases.held_elsewhere(conn, ids)
        except (psycopg.Error, StorageError):
            return {}
        return {sid: f"host {owner}" for sid, owner in held.items()}

    # --- checkpoints (pg_checkpoints) ---

    def write_checkpoint(self, handle: WriteHandle, rows: Mapping[str, CheckpointRow]) -> bool:
        """Store the rows that cover exactly the durable log (seq = the last durable seq),
        replacing the session's earlier ones. Fail-soft: False when not stored (also by a
        writer whose lease was found lost)."""
        lease = handle.impl
        if isinstance(lease, LeaseState) and lease.lost:
            return False
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
        self,
        session_ids: Sequence[str],
        keys: Sequence[str] | None = None,
        skip: Mapping[str, bytes] | None = None,
        keep: Mapping[str, bytes] | None = None,
    ) -> dict[str, list[StoredCheckpoint]] | None:
        """Every stored checkpoint row of these sessions (of the units `keys` only, if given; a
        row of unit `k` whose JSON contains `skip[k]` left out, and one whose JSON does not contain
        `keep[k]`), in one query; None on a failure."""
        return self._checkpoints.rows(session_ids, keys, skip, keep)

    # --- plumbing ---

    def _query_one(self, sid: str | None, op: str, sql: LiteralString, params: Params) -> TupleRow | None:
        return self._query(sid, op, sql, params, lambda cur: cur.fetchone())

    def _query_all(self, sid: str | None, op: str, sql: LiteralString, params: Params) -> list[TupleRow]:
        return self._query(sid, op, sql, params, lambda cur: cur.fetchall())

    def _query(
        self, sid: str | None, op: str, sql: LiteralString, params: Params, fetch: Callable[[Cursor[TupleRow]], T]
    ) -> T:
        """A read-only query; a connection found dead (an idle one after a server restart, say)
        is replaced once: reading again is harmless."""
        import psycopg

        for attempt in (1, 2):
            try:
                with self._pool.connection() as conn:
                    try:
                        return fetch(conn.execute(sql, params))
                    except psycopg.Error:
                        if attempt == 1 and (conn.broken or conn.closed):
                            continue
                        raise
            except StorageError:
                raise
            except psycopg.Error as exc:
                who = f"session {sid!r}: " if sid is not None else ""
                if is_timeout(exc):
                    raise timed_out(redact(self.url), f"{who}{op}", exc) from None
                raise PersistenceFailed(f"{who}{op} failed: {first_line(exc)}") from None
        raise AssertionError("unreachable")

    @property
    def pool(self) -> Pool:
        """The store's connection pool (a `PostgresMailbox` may share it)."""
        return self._pool

    @property
    def owner_backend_pid(self) -> int | None:
        """The server process holding this host's liveness lock (tests terminate it)."""
        return self._leases.backend_pid

    def close_store(self) -> None:
        """Release every lease this store holds and its `hosts` row, then close every
        connection (the liveness lock goes with the owner connection). A handle left open
        appends no more."""
        self._leases.close()
        self._pool.close()


# Built from this package's constants alone (`lease_in_force` is SQL text, no input): literal.
_CHANGE_MARK = cast(
    "LiteralString",
    "SELECT (SELECT row(count(*), sum(event_count), sum(byte_size), sum(generation), max(generation))::text "
    "FROM sessions), (SELECT row(count(*), md5(string_agg(l.session_id || ' ' || l.owner || ' ' || l.epoch, "
    f"',' ORDER BY l.session_id COLLATE \"C\")))::text FROM leases l WHERE l.owner <> %(me)s AND {lease_in_force('l')})",
)


def _row_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """What makes a listing row: header bytes, event count, size, generation."""
    return (bytes(row[1]), row[2], row[3], row[4])
