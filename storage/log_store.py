"""The storage contract: the protocols its callers use, the handles and batches.

A store is synchronous (actors call it from worker threads) and speaks in handles: `create`
and `open_write` return a `WriteHandle` that holds the session's single-writer lock until
`close`; `open_read` returns a `ReadHandle` that takes no lock. `append(handle, batches)` writes
every batch and makes them durable with one fsync before it returns; each batch states the seq
it expects first, and a mismatch refuses the whole call with `SequenceConflict` before anything
is written. Long reads take a `poll` (an `AbortPoll`) called between chunks; `read_chunks`
streams a log for consumers that need not hold every event at once.

The contract is cut by what its callers do, and each caller asks for the narrowest part:

- `LogReader`: open a log without a lock, read its events, look sessions up and list them (the
  cold reader, event streams, operator commands);
- `LogWriter`: claim a session, append durably, checkpoint exactly what is durable, release (the
  session actor);
- `CheckpointRows`: the stored projection checkpoints, which any process reads and may refresh
  (the index is a cache); `CheckpointedReader` is a reader of both (the store reader);
- `LeasedStore`: the optional capability of a store shared by hosts (PostgreSQL): leases to
  renew and a placement queue. `LogStore.leased` gives it, or None: nothing probes for it.

`LogStore` is all of them, what a backend implements (the file store, PostgreSQL, the memory and
faulty doubles in storage/testing) and what the session store and `open_runtime` hold.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import attrs

from ._codec import Event
from .projection import CheckpointRow, ObservedCheckpoint
from .values import AbortPoll, LogInfo, Offset, SessionHeader, SessionId

if TYPE_CHECKING:
    from .index_rows import StoredCheckpoint
    from .placements import Placements

__all__ = [
    "Batch",
    "CheckpointRows",
    "CheckpointedReader",
    "Handle",
    "LeasedStore",
    "LogReader",
    "LogStore",
    "LogWriter",
    "ObservedCheckpoint",
    "ReadHandle",
    "WriteHandle",
]


@attrs.frozen
class Batch:
    """Events to append, numbered from `expected_seq` (the seq the caller believes is next)."""

    expected_seq: Offset
    events: Sequence[Event]


@attrs.define(eq=False, kw_only=True)
class ReadHandle:
    session_id: SessionId
    header: SessionHeader
    inherited_event_count: Offset
    closed: bool = False
    impl: object = None  # the store's own state; opaque to callers


@attrs.define(eq=False, kw_only=True)
class WriteHandle:
    session_id: SessionId
    header: SessionHeader
    inherited_event_count: Offset
    next_seq: Offset
    published: bool
    # The epoch of the lease this handle writes under (a `LeasedStore`'s); None where the
    # single-writer lock is not a lease (the file store's flock).
    epoch: int | None = None
    closed: bool = False
    dead: str | None = None  # why the handle died (a failed fsync); it never writes again
    end_offset: int = 0  # the record boundary just after the last durable event
    impl: object = None


Handle = ReadHandle | WriteHandle  # what reads and `close` take


class LogReader(Protocol):
    """Reading logs: handles that take no lock, their events, and the sessions' listing rows."""

    def open_read(self, session_id: str) -> ReadHandle:
        """A handle on a published session's log (`SessionNotFound` when there is none)."""
        ...

    def read(
        self, handle: Handle, start: Offset = Offset(0), stop: Offset | None = None, *, poll: AbortPoll | None = None
    ) -> list[Event]:
        """Events `[start, stop)` of the complete prefix (never a torn tail)."""
        ...

    def read_chunks(
        self, handle: Handle, *, start: Offset = Offset(0), poll: AbortPoll | None = None
    ) -> Iterator[list[Event]]:
        """`read(handle, start)` a chunk at a time, for a consumer that folds or forwards the
        events and need not hold them all: non-empty lists in seq order whose concatenation is
        exactly what `read` returns, validated by the same rules (torn tail, damage, seed
        marker). The store holds one chunk's bytes and a bounded read-ahead at a time (a
        frame or about a MB of plain bytes on files, a page of batch rows on PostgreSQL).
        `HandleClosed` and `InvalidRange` are raised at the call; everything else while
        iterating: damage met mid-stream raises the error `read` raises for it after the
        earlier chunks were yielded, so a consumer must discard what it folded from them."""
        ...

    def read_after(
        self, handle: Handle, log_offset: int, first_seq: int, *, poll: AbortPoll | None = None
    ) -> list[Event] | None:
        """Events from a record boundary that must hold `first_seq`; None when it does not."""
        ...

    def stat(self, session_id: str) -> LogInfo | None:
        """One session's listing row, damage reported; None when it is not published."""
        ...

    def list(self) -> list[LogInfo]:
        """Every published session, damage reported per session; fails only for an unreadable root."""
        ...

    def held_elsewhere(self, session_ids: Sequence[str]) -> set[str]:
        """The ids whose single-writer lock a writer in another process holds now (the
        memory store: any other holder), found without taking any lock; empty where the store
        cannot tell. Advice for display: a writer may take or drop a lock the moment after."""
        ...

    def holders(self, session_ids: Sequence[str]) -> dict[str, str]:
        """`held_elsewhere` with who holds each id: `pid N` (files: the lock table's holder),
        `host H` (PostgreSQL: the lease's owner host), or `ANOTHER_PROCESS` where the store
        cannot name it. Advice for display, like `held_elsewhere` (its keys are the same ids)."""
        ...

    def close(self, handle: Handle) -> None:
        """Idempotent; releases a write handle's lock."""
        ...


class LogWriter(Protocol):
    """Writing logs: one writer per session, durable appends, checkpoints of what is durable."""

    def create(self, header: SessionHeader, *, inherited_event_count: Offset = Offset(0)) -> WriteHandle:
        """Claim a new session; nothing is written until the first append publishes it."""
        ...

    def open_write(self, session_id: str) -> WriteHandle:
        """Claim a published session: lock, validate the whole log, cut a torn tail."""
        ...

    def append(self, handle: WriteHandle, batches: Sequence[Batch]) -> Offset:
        """Write every batch and fsync once; returns the next seq. Durable when it returns."""
        ...

    def write_checkpoint(self, handle: WriteHandle, rows: Mapping[str, CheckpointRow]) -> bool:
        """Store rows covering exactly the durable log; fail-soft (False when not stored)."""
        ...

    def close(self, handle: Handle) -> None:
        """Idempotent; releases a write handle's lock."""
        ...


class CheckpointRows(Protocol):
    """The stored projection checkpoints of the sessions, as readers (and a writer resuming
    from them) find them; a cache, so any process may refresh it."""

    def read_checkpoint(
        self, session_id: str, header: SessionHeader, inherited_event_count: int
    ) -> tuple[dict[str, CheckpointRow], int] | None:
        """Rows of this lifecycle of the session and the log offset they cover, if any."""
        ...

    def read_checkpoint_rows(
        self,
        session_ids: Sequence[str],
        keys: Sequence[str] | None = None,
        skip: Mapping[str, bytes] | None = None,
        keep: Mapping[str, bytes] | None = None,
    ) -> dict[str, list[StoredCheckpoint]] | None:
        """Every stored checkpoint row of these sessions (of the unit `keys` only, if given; a
        row of unit `k` whose JSON contains `skip[k]` may be left out, and one whose JSON does not
        contain `keep[k]`) in one query; None on a cache miss."""
        ...

    def write_observed_checkpoints(self, observed: Sequence[ObservedCheckpoint]) -> int:
        """Store observed rows (the index is a cache: any process may refresh it), all in one
        write: an entry only while its log is still at the revision and event count observed,
        and never over stored rows of the same lifecycle at the same or a later seq. Fail-soft
        and quiet (a store this process may not write is no error): how many were stored."""
        ...


class CheckpointedReader(LogReader, CheckpointRows, Protocol):
    """A reader of the logs and of their checkpoint rows: what the read side needs."""


class LeasedStore(Protocol):
    """The capability of a store shared by hosts (PostgreSQL, SPEC §9): each write handle holds
    a lease (`WriteHandle.epoch`) that must be renewed, and the hosts share a placement queue."""

    @property
    def lease_renew_interval(self) -> float:
        """Seconds between two renewals (a third of the lease's ttl by default)."""
        ...

    def renew_leases(self) -> frozenset[SessionId]:
        """Extend every lease held, in one statement; returns the sessions found lost (another
        host took them over). `PersistenceFailed` or `StoreUnreachable` when it cannot."""
        ...

    def placements(self) -> Placements:
        """The placement queue and host registry, as this host."""
        ...

    def change_mark(self) -> object:
        """A cheap value (one small query) that differs whenever `list()` or `held_elsewhere`
        could answer otherwise: a reader that polls the corpus lists again only when it moved."""
        ...


class LogStore(LogReader, LogWriter, CheckpointRows, Protocol):
    """The whole contract a backend implements."""

    @property
    def leased(self) -> LeasedStore | None:
        """The store's leased capability, or None for a store whose writers need no lease."""
        ...

    def close_store(self) -> None:
        """Release what the store holds (connections, the index); handles are closed one by one."""
        ...
