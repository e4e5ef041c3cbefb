"""Session query (docs/design.md, "Session query"): the live-preferred corpus and observations
of one session.

It is the one read API above the actors: everything the runtime and its hosts read of the
store (corpus, observations, stats, checkpoint rows, lock probes, partial log reads for streams
and `tail`) goes through it and the `StoreReader` it keeps to itself (its index slot and cold
reader). `list_sessions(abort)` merges the log store's listing (through the index, one worker
thread at a time) with the live sessions of the session store: a live header wins, and a
persisted header that differs from it marks the record `conflict` instead of failing. Only an
unreadable root fails it. `observe_session(id, abort)` is an async context manager yielding an
`Observation`:
a live session's projections come from its actor (no log read), a persisted session is read by
the cold reader, its interrupted turn closed in memory, and every projection unit folded and
viewed (folded in the cold reader's worker thread). Prepared observations are kept in a small
LRU keyed by the log's revision and bounded in bytes; failures are never cached. Errors are
a `SessionQueryError`, one class per case (runtime/foundation/errors.py). An `Abort` becomes
cancellation once, at the edge of `observe_session` (`cancelled_when`): below it, Trio
cancellation alone.

Cheap at scale: records are reused while the store info and live ref they were made from are
the same objects (runtime/query_corpus.py: the store's warm index hands back the same infos),
so a warm corpus costs a few lookups per session; observations under way at once share index hops for their stats, and
their reads share thread hops in the cold reader (a listing's observations share one read group).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Literal

import attrs
import msgspec
import trio
from subagents.actors import (
    Abort,
    ActorStopped,
    ColdRead,
    ColdReader,
    ReadGroup,
    SessionStore,
    StoreReader,
    cancelled_when,
)
from subagents.storage import (
    CorruptLog,
    Event,
    FileLogStore,
    InvalidSessionId,
    Lifecycle,
    LogInfo,
    LogStore,
    LogWatch,
    ObservedCheckpoint,
    Offset,
    ProjectionBroken,
    ProjectionCells,
    ProjectionRegistry,
    Revision,
    SessionHeader,
    SessionId,
    SessionNotFound,
    StorageError,
    StoredCheckpoint,
    UnsupportedLog,
    check_session_id,
)

from .foundation.errors import (
    QueryAborted,
    QueryCorruptSession,
    QueryPersistenceFailed,
    QuerySessionNotFound,
    QuerySourceConflict,
    QueryUnsupportedSession,
    SessionQueryError,
)
from .foundation.json_values import JsonValue
from .query_corpus import Corpus, SessionRecord, headers_differ

__all__ = ["Observation", "SessionQuery", "SessionRecord", "headers_differ"]

_encode = msgspec.json.encode
_LOG_READS_AT_ONCE = 4  # partial log reads under way at once (as the cold reader's full ones)


@attrs.define(eq=False)
class Observation:
    source: Literal["live", "prepared"]
    header: SessionHeader
    inherited_event_count: int
    events: tuple[Event, ...]
    projections: dict[str, JsonValue]
    released: bool = False
    # Another process holds the session's lock (its turn may still be running): `events` are
    # as written, with no in-memory closers.
    held: bool = False
    # The checkpoint rows this read of the whole log proved, at its last durable event (None:
    # live, held elsewhere, or read past the revision it was stat'ed at): a listing writes
    # them back (docs/design.md, "Listing": observations feed the checkpoint rung).
    observed: ObservedCheckpoint | None = None
    # The log's last turn has no end (in-memory closers end it in `events` unless `held`):
    # a listing tells from it a child whose runner is gone mid-turn (`orphaned`).
    turn_open: bool = False


@attrs.frozen
class _Prepared:
    revision: Revision
    header: SessionHeader
    inherited_event_count: int
    events: tuple[Event, ...]
    projections: dict[str, JsonValue]
    size: int
    closers: int = 0  # how many of `events` are in-memory closers
    observed: ObservedCheckpoint | None = None


class SessionQuery:
    def __init__(
        self,
        log_store: LogStore,
        sessions: SessionStore,
        registry: ProjectionRegistry,
        *,
        reader: StoreReader | None = None,
        cold_reader: ColdReader | None = None,
        cache_bytes: int = 64 << 20,
        index_limiter: trio.CapacityLimiter | None = None,
    ) -> None:
        """`reader`: the one read side of `log_store` (made here from `cold_reader` and
        `index_limiter` when not given); nothing above reads the store but through this query."""
        self.sessions = sessions
        self.registry = registry
        self._reader = (
            reader if reader is not None else StoreReader(log_store, cold=cold_reader, index_limiter=index_limiter)
        )
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, _Prepared] = OrderedDict()
        self._cached = 0
        self._corpus = Corpus()  # the last corpus's records, kept for reuse (runtime/query_corpus.py)
        # Partial log reads (`read_from`: streams and `tail`) are whole-file reads in a worker
        # thread each: a few at a time, as the cold reader's.
        self._log_reads = trio.CapacityLimiter(_LOG_READS_AT_ONCE)

    @property
    def cold_reader(self) -> ColdReader:
        """The reader's cold reader (full log reads)."""
        return self._reader.cold

    @property
    def index_limiter(self) -> trio.CapacityLimiter:
        """The index's one worker slot (docs/format.md, "The index"), the reader's."""
        return self._reader.index_limiter

    # --- what listings, streams and the service ask of the store, through the reader ---

    async def stat(self, session_id: str) -> tuple[LogInfo | None, bool]:
        """The store's stat of `session_id` and whether another process holds its lock,
        through the index's one worker slot (stats asked at once share hops: `StoreReader.stat`).
        Raises the store's `StorageError`."""
        return await self._reader.stat(session_id)

    async def read_from(
        self, session_id: str, start: int, *, after: tuple[int, int] | None = None
    ) -> tuple[int, list[Event]]:
        """The session's inherited event count and its logged events from seq `start` (those
        written so far, durable or not: a caller cuts a live session at its durable end), in a
        worker thread, a few reads at a time. `after`: a `(log_offset, seq)` boundary known to
        hold a seq <= `start` (a stat's revision size and event count): only the bytes past it
        are read where the store can (`LogReader.read_after`), else the whole log is. Raises the
        store's `StorageError` (`SessionNotFound` for a log not published yet)."""
        store = self._reader.store

        def read() -> tuple[int, list[Event]]:
            handle = store.open_read(session_id)
            try:
                if after is not None and after[1] <= start:
                    tail = store.read_after(handle, after[0], after[1])
                    if tail is not None:
                        return handle.inherited_event_count, [e for e in tail if e.seq >= start]
                return handle.inherited_event_count, store.read(handle, Offset(start))
            finally:
                store.close(handle)

        return await trio.to_thread.run_sync(read, limiter=self._log_reads)

    def log_watch(self) -> LogWatch | None:
        """A change notification for logs any process on this host writes (the file store's,
        on a local file system; the caller closes it), or None: such logs must be polled."""
        store = self._reader.store
        return store.log_watch() if isinstance(store, FileLogStore) else None

    def recorded(self, session_id: str) -> SessionRecord | None:
        """The record of `session_id` in the corpus this query listed last (no store call):
        what a listing's caller shows beside its rows, from the listing's own corpus."""
        return self._corpus.recorded(session_id)

    async def checkpoint_rows(
        self,
        session_ids: Sequence[str],
        keys: Sequence[str],
        skip: Mapping[str, bytes] | None = None,
        keep: Mapping[str, bytes] | None = None,
    ) -> dict[str, list[StoredCheckpoint]]:
        """The stored checkpoint rows of `session_ids` (`StoreReader.checkpoint_rows`): every
        id asked is a key; any failure is a miss."""
        return await self._reader.checkpoint_rows(session_ids, keys, skip, keep)

    async def holders(self, session_ids: Sequence[str]) -> dict[str, str]:
        """Who holds each of the ids another process holds the lock of: `pid N`, `host H` or
        `another process` (`LogStore.holders`; advice, never an error)."""
        return await self._reader.holders(session_ids)

    async def held_elsewhere(self, session_ids: Sequence[str]) -> set[str]:
        """The ids another process holds the lock of (advice, never an error)."""
        return await self._reader.held_elsewhere(session_ids)

    async def stat_many(self, session_ids: Sequence[str]) -> list[LogInfo | None | Exception]:
        """The store's stat of each id afresh, in one index hop; failures are values."""
        return await self._reader.stat_many(session_ids)

    # --- the corpus ---

    async def list_sessions(self, abort: Abort | None = None, *, probe_locks: bool = False) -> list[SessionRecord]:
        """The corpus, newest first. `probe_locks`: also mark the records another process
        holds the lock of (`held`), asked in the same thread hop as the listing."""
        _check(abort)
        try:
            infos, held = await self._reader.list(probe_locks=probe_locks)
        except StorageError as exc:
            raise QueryPersistenceFailed(f"session persistence listing failed: {exc}") from exc
        _check(abort)
        records = self._corpus.records(infos, self.sessions.list())
        if not held:
            return records
        return [attrs.evolve(r, held=True) if r.id in held and not r.live else r for r in records]

    # --- one session ---

    @asynccontextmanager
    async def observe_session(
        self, session_id: str, abort: Abort | None = None, *, group: ReadGroup | None = None
    ) -> AsyncIterator[Observation]:
        """The session observed (see the module docstring). Observations made in the same
        `group` share the cold reader's thread hops."""
        observation = await self._edge(session_id, abort, group)
        try:
            yield observation
        finally:
            observation.released = True

    async def _edge(self, session_id: str, abort: Abort | None, group: ReadGroup | None) -> Observation:
        """Where the caller's abort becomes cancellation, once (`cancelled_when`): below it the
        observation is cancelled the Trio way. An abort set before, during, or as it ends is
        `QueryAborted`, whatever was under way (a read failing as it was cancelled included)."""
        _check(abort)
        if abort is None:
            return await self._observe(session_id, group)
        observation: Observation | None = None
        try:
            async with cancelled_when(abort):
                observation = await self._observe(session_id, group)
        except Exception:  # an abort set meanwhile is the answer, not the error it caused
            _check(abort)
            raise
        _check(abort)
        assert observation is not None  # only an abort cancels the body quietly
        return observation

    async def _observe(self, session_id: str, group: ReadGroup | None) -> Observation:
        try:
            sid = check_session_id(session_id)
        except InvalidSessionId:
            raise QuerySessionNotFound(f"session {session_id!r} not found") from None
        ref = self.sessions.get(sid)
        if ref is not None:
            try:
                projections = await ref.snapshot()
            except ActorStopped:
                pass  # it stopped meanwhile: observe what it left on disk
            except (ProjectionBroken, KeyError) as exc:
                raise QueryCorruptSession(f"failed to project session {sid!r}: {exc}") from exc
            else:
                events = await self._read_live(sid, group)
                return Observation("live", ref.header, ref.inherited_event_count, events, projections)
        prepared, held = await self._prepare(sid, group)
        events = prepared.events
        if held and prepared.closers:
            # Its writer is alive in another process: the open turn is not interrupted.
            events = events[: len(events) - prepared.closers]
        return Observation(
            "prepared",
            prepared.header,
            prepared.inherited_event_count,
            events,
            dict(prepared.projections),
            held=held,
            observed=None if held else prepared.observed,
            turn_open=prepared.closers > 0,
        )

    async def _read_live(self, sid: SessionId, group: ReadGroup | None) -> tuple[Event, ...]:
        """The durable events of a live session: none while it is not published yet, and no
        in-memory closers (its turn is not interrupted: its writer is alive)."""
        try:
            read = await self._cold(sid, group)
        except QuerySessionNotFound:
            if self.sessions.get(sid) is not None:
                return ()
            raise
        return read.events[: len(read.events) - read.closers] if read.closers else read.events

    async def _prepare(self, sid: SessionId, group: ReadGroup | None) -> tuple[_Prepared, bool]:
        """The prepared observation, and whether another writer holds the session's lock."""
        try:
            info, held = await self._reader.stat(sid)
        except StorageError as exc:
            raise _mapped(sid, exc) from exc
        if info is None:
            raise QuerySessionNotFound(f"session {sid!r} not found")
        if info.damage is not None:
            damaged = QueryUnsupportedSession if info.damage == "unsupported" else QueryCorruptSession
            # The index knows only that it is damaged; a read finds where (the seq or byte
            # offset) and raises that. Listings never get here (a damaged record is a diagnostic).
            await self._cold(sid, group)
            raise damaged(f"stored session {sid!r} is {info.damage}")
        cached = self._cache.get(sid)
        if cached is not None and cached.revision == info.revision:
            self._cache.move_to_end(sid)
            return cached, held
        read = await self._cold(sid, group, self.registry)
        if info.header is not None and headers_differ(info.header, read.header):
            raise QuerySourceConflict(f"session source headers conflict for session {sid!r}")
        cells = read.cells
        if cells is None:  # a reader that does not fold: fold here
            cells = self.registry.cells(read.header, Offset(read.inherited_event_count))
            cells.fold(read.events)
        try:
            projections = cells.snapshot()
        except (ProjectionBroken, KeyError) as exc:
            raise QueryCorruptSession(f"failed to project session {sid!r}: {exc}") from exc
        prepared = _Prepared(
            info.revision,
            read.header,
            read.inherited_event_count,
            read.events,
            projections,
            _footprint(read.events) if self.cache_bytes > 0 else 0,
            read.closers,
            self._observed(sid, info, read, cells),
        )
        self._remember(sid, prepared)
        return prepared, held

    def _observed(
        self, sid: SessionId, info: LogInfo, read: ColdRead, cells: ProjectionCells
    ) -> ObservedCheckpoint | None:
        """The rows the read proved for the log at `info.revision`: every cell at the last
        durable event (in-memory closers are not the log's), or None when the read saw another
        number of events than the stat (the log changed between them)."""
        durable = len(read.events) - read.closers
        if durable <= 0 or read.events[durable - 1].seq + 1 != info.event_count:
            return None
        if read.closers:  # rare (an interrupted turn): the cells before the closers, folded again
            cells = self.registry.cells(read.header, Offset(read.inherited_event_count))
            cells.fold(read.events[:durable])
        rows = []
        for key, row in cells.checkpoint().items():
            if row.seq != info.event_count - 1:
                continue  # (every healthy cell is folded to the end; a row is never ahead of the log)
            try:
                rows.append((key, row.ver, _encode(row.val)))
            except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
                continue  # a state that is not JSON (a unit bug): that unit's row is not written
        return ObservedCheckpoint(
            session_id=sid,
            lifecycle=Lifecycle.of(read.header, read.inherited_event_count),
            revision=info.revision,
            event_count=info.event_count,
            rows=tuple(rows),
        )

    async def write_observed(self, observed: Sequence[ObservedCheckpoint]) -> int:
        """Write back rows observations proved, in one index hop (`StoreReader.write_observed`)."""
        return await self._reader.write_observed(observed)

    async def _cold(
        self, sid: SessionId, group: ReadGroup | None, registry: ProjectionRegistry | None = None
    ) -> ColdRead:
        (result,) = await self.cold_reader.read_many([sid], registry=registry, group=group)
        if isinstance(result, StorageError):
            raise _mapped(sid, result) from result
        return result

    def _remember(self, sid: str, prepared: _Prepared) -> None:
        if self.cache_bytes <= 0 or prepared.size > self.cache_bytes:
            return  # larger logs are never cached
        old = self._cache.pop(sid, None)
        if old is not None:
            self._cached -= old.size
        self._cache[sid] = prepared
        self._cached += prepared.size
        while self._cached > self.cache_bytes:
            _, evicted = self._cache.popitem(last=False)
            self._cached -= evicted.size


# Memory an event holds beyond its raw data (the Struct, the Raw object, the list slot), measured
# with tracemalloc on small events; the cache bound is about memory, not bytes on disk (a zstd
# log is several times smaller on disk than in memory).
_EVENT_OVERHEAD = 200


def _footprint(events: tuple[Event, ...]) -> int:
    return sum(map(len, (e.data for e in events))) + _EVENT_OVERHEAD * len(events)


def _check(abort: Abort | None) -> None:
    if abort is not None and abort.is_set():
        raise QueryAborted("session observation was aborted")


def _mapped(sid: str, exc: StorageError) -> SessionQueryError:
    if isinstance(exc, (SessionNotFound, InvalidSessionId)):
        return QuerySessionNotFound(f"session {sid!r} not found")
    if isinstance(exc, CorruptLog):
        at = _at(exc.seq, exc.offset)
        return QueryCorruptSession(f"stored session {sid!r} is corrupt{at}: {exc.reason}")
    if isinstance(exc, UnsupportedLog):
        return QueryUnsupportedSession(f"stored session {sid!r} is unsupported{_at(exc.seq, None)}: {exc.reason}")
    return QueryPersistenceFailed(f"failed to observe session {sid!r}: {exc}")


def _at(seq: int | None, offset: int | None) -> str:
    where = [f"seq {seq}"] * (seq is not None) + [f"byte offset {offset}"] * (offset is not None)
    return f" at {', '.join(where)}" if where else ""
