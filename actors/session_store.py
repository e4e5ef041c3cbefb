"""The session store: the registry of live session actors of one runtime (docs/design.md,
"Session actors and group commit").

It owns the nursery the actors run in (`open_session_store`), so no actor outlives it, and it
is the only place that turns a log into a live session: `create` (a new session, or a seeded
one whose inherited prefix is published with its first append), `open` (a persisted session:
take the lock, validate, cut a torn tail, fold the projections), `fork` (a new seeded session
holding a prefix of another), `get`/`list`, and `release` (stop the actor, free the lock so
another process can open the session). Storage calls run in worker threads; the store never
keeps a module-level registry.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import asynccontextmanager

import attrs
import trio
from subagents.storage import (
    Event,
    InvalidEvent,
    InvalidRange,
    LogStore,
    Offset,
    ProjectionCells,
    ProjectionRegistry,
    SessionAlreadyExists,
    SessionHeader,
    WriteHandle,
    make_event,
)

from .durable_feed import DurableFeed
from .errors import ActorStopped
from .session_actor import SessionActor, close_handle
from .session_ref import SessionRef

__all__ = ["SessionStore", "open_session_store"]

DEFAULT_MAILBOX_CAPACITY = 64


@attrs.define(eq=False)
class SessionStore:
    log_store: LogStore
    registry: ProjectionRegistry
    now_ms: Callable[[], int]
    _nursery: trio.Nursery
    # As many requests as one group commit takes (the actor's `batch_limit`): appenders past
    # this many park in the channel and are handed over one by one (bench/postgres.py part 3:
    # 16 cost about a fifth of the throughput of 100 appenders to one session).
    mailbox_capacity: int = DEFAULT_MAILBOX_CAPACITY
    # docs/design.md, "Projections and checkpoints": a checkpoint every `checkpoint_every` events,
    # and after `checkpoint_interval` seconds idle while dirty (None: never on a timer).
    checkpoint_every: int = 256
    checkpoint_interval: float | None = 30.0
    _actors: dict[str, SessionActor] = attrs.field(factory=dict)
    last_open_folds: int = 0  # (event, unit) folds the last `open` ran: restores are measured by it
    _claims: dict[str, trio.Lock] = attrs.field(factory=dict)  # one per id being created/opened
    # Every actor publishes its durable events here (the event stream subscribes to it).
    feed: DurableFeed = attrs.field(factory=DurableFeed)

    async def create(
        self,
        header: SessionHeader,
        *,
        inherited: Sequence[Event] = (),
    ) -> SessionRef:
        """A new live session; with `inherited`, a seeded one (the marker is added here)."""
        k = len(inherited)
        seed: list[Event] = list(inherited)
        # A seed that could never be published would wedge the session: refuse it up front.
        if not all(type(e) is Event for e in seed) or [e.seq for e in seed] != list(range(k)):
            raise InvalidEvent(f"session {header.id!r}: a seed must be Events with seqs 0..{k - 1}")
        if k:
            marker_time = inherited[-1].time
            seed.append(make_event(k, "session/end-seed", marker_time, {"inherited": True}))
        async with self._claim(header.id):
            if header.id in self._actors and not self._actors[header.id].mailbox.stopped:
                raise SessionAlreadyExists(header.id)
            handle = await trio.to_thread.run_sync(
                lambda: self.log_store.create(header, inherited_event_count=Offset(k))
            )
            cells = self.registry.cells(header, Offset(k))
            return await self._start(
                SessionActor(
                    self.log_store,
                    handle,
                    cells,
                    now_ms=self.now_ms,
                    seed=seed,
                    capacity=self.mailbox_capacity,
                    checkpoint_every=self.checkpoint_every,
                    checkpoint_interval=self.checkpoint_interval,
                    on_durable=self.feed.publish,
                )
            )

    async def open(self, session_id: str) -> SessionRef:
        """A persisted session made live (or the live one, if it already is)."""
        ref, _ = await self._open(session_id, keep=False)
        return ref

    async def open_with_events(self, session_id: str) -> tuple[SessionRef, list[Event]]:
        """`open`, and the session's durable events as the open read them: one full read of the
        log serves both the projections and the caller (a resume, which rebuilds its surface
        from them). For a session already live, its durable events are read."""
        ref, events = await self._open(session_id, keep=True)
        if events is None:
            events = await trio.to_thread.run_sync(self._read_durable, session_id)
        return ref, events

    async def _open(self, session_id: str, *, keep: bool) -> tuple[SessionRef, list[Event] | None]:
        async with self._claim(session_id):
            live = self._actors.get(session_id)
            if live is not None and not live.mailbox.stopped:
                return live.ref, None

            handle, cells, folded, events = await trio.to_thread.run_sync(self._load, session_id, keep)
            self.last_open_folds = folded
            ref = await self._start(
                SessionActor(
                    self.log_store,
                    handle,
                    cells,
                    now_ms=self.now_ms,
                    capacity=self.mailbox_capacity,
                    checkpoint_every=self.checkpoint_every,
                    checkpoint_interval=self.checkpoint_interval,
                    on_durable=self.feed.publish,
                )
            )
            return ref, events

    def _read_durable(self, session_id: str) -> list[Event]:
        """In a worker thread: the session's durable events, through a read handle."""
        handle = self.log_store.open_read(session_id)
        try:
            return list(self.log_store.read(handle))
        finally:
            self.log_store.close(handle)

    def _load(
        self, session_id: str, keep: bool = False
    ) -> tuple[WriteHandle, ProjectionCells, int, list[Event] | None]:
        """Claim the log and bring the projection cells to its end: from the stored checkpoint
        when it covers every unit and the log still holds the next seq where it says, else by
        folding the whole log. Runs in a worker thread (the units are pure). `keep`: also
        return every event of the log, read once (else None; only the tail after a usable
        checkpoint is read)."""
        store = self.log_store
        handle = store.open_write(session_id)
        try:
            k = handle.inherited_event_count
            every = list(store.read(handle)) if keep else None
            found = store.read_checkpoint(session_id, handle.header, k)
            if found is not None:
                rows, offset = found
                seq = max(row.seq for row in rows.values())
                events = store.read_after(handle, offset, seq + 1) if seq < handle.next_seq else None
                if events is not None and seq + 1 + len(events) == handle.next_seq:
                    # The log still holds seq+1 where the rows say: they are this log's.
                    cells = self.registry.cells(handle.header, k, rows)
                    if cells.floor == seq:
                        return handle, cells, cells.fold(events), every
                    # A unit without a usable row (another state_version) folds from the start;
                    # the others skip what their rows cover.
                    return handle, cells, _fold(cells, store, handle, every), every
            cells = self.registry.cells(handle.header, k)
            return handle, cells, _fold(cells, store, handle, every), every
        except BaseException:
            store.close(handle)
            raise

    async def fork(self, source: SessionRef, prefix: Offset, header: SessionHeader) -> SessionRef:
        """A new session seeded with the source's events `[0, prefix)` (lazy, like `create`)."""
        ref, _ = await self.fork_with_events(source, prefix, header)
        return ref

    async def fork_with_events(
        self, source: SessionRef, prefix: Offset, header: SessionHeader
    ) -> tuple[SessionRef, list[Event]]:
        """`fork`, and the inherited events it read (the new session's first events)."""
        if type(prefix) is not int or prefix < 0:
            raise InvalidRange(f"fork prefix must be a non-negative int, got {prefix!r}")
        if prefix == 0:
            return await self.create(header), []

        def read() -> list[Event]:
            handle = self.log_store.open_read(source.session_id)
            try:
                return self.log_store.read(handle, Offset(0), prefix)
            finally:
                self.log_store.close(handle)

        events = await trio.to_thread.run_sync(read)
        if len(events) != prefix:
            raise InvalidRange(f"session {source.session_id!r} has {len(events)} durable events, not {prefix}")
        return await self.create(header, inherited=events), events

    def get(self, session_id: str) -> SessionRef | None:
        actor = self._actors.get(session_id)
        return actor.ref if actor is not None and not actor.mailbox.stopped else None

    def list(self) -> list[SessionRef]:
        return [a.ref for a in self._actors.values() if not a.mailbox.stopped]

    def mark_lost(self, session_id: str) -> None:
        """Another host took the session over: its actor stops now (`SessionRef.ownership_lost`),
        its queued requests fail and nothing more is written for it here."""
        actor = self._actors.get(session_id)
        if actor is not None:
            actor.lose()

    async def release(self, session_id: str) -> None:
        """Stop the session's actor after the appends already queued, and free its lock."""
        async with self._claim(session_id):  # not while the same id is being created or opened
            await self._release(session_id)

    async def _release(self, session_id: str) -> None:
        actor = self._actors.get(session_id)
        if actor is None:
            return
        try:
            await actor.ref.checkpoint()  # after the appends already queued (fail-soft)
        except ActorStopped:
            pass  # already stopping: its queued requests have been failed
        actor.stop()
        await actor.finished.wait()
        if self._actors.get(session_id) is actor:
            del self._actors[session_id]

    @asynccontextmanager
    async def _claim(self, session_id: str) -> AsyncGenerator[None]:
        """Serialize creating/opening one id; different ids proceed concurrently."""
        lock = self._claims.setdefault(session_id, trio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._claims.pop(session_id, None)

    async def _start(self, actor: SessionActor) -> SessionRef:
        try:
            ref: SessionRef = await self._nursery.start(actor.run)
        except BaseException:
            # Cancelled before the actor ran: nobody else will close its handle (and lock).
            if not actor.finished.is_set():
                await close_handle(self.log_store, actor.handle)
            raise
        self._actors[actor.handle.session_id] = actor
        self.feed.opened(ref.session_id, ref.durable_next)
        return ref

    async def aclose(self) -> None:
        for session_id in list(self._actors):
            await self.release(session_id)


@asynccontextmanager
async def open_session_store(
    log_store: LogStore,
    registry: ProjectionRegistry,
    *,
    now_ms: Callable[[], int],
    mailbox_capacity: int = DEFAULT_MAILBOX_CAPACITY,
    checkpoint_every: int = 256,
    checkpoint_interval: float | None = 30.0,
) -> AsyncGenerator[SessionStore]:
    # The body's own error is re-raised after the nursery closes, so callers get it unchanged
    # rather than wrapped in an ExceptionGroup (the actors themselves never raise).
    interval_ok = checkpoint_interval is None or (
        type(checkpoint_interval) in (int, float) and math.isfinite(checkpoint_interval) and checkpoint_interval > 0
    )
    if type(checkpoint_every) is not int or checkpoint_every < 1 or not interval_ok:
        raise ValueError("checkpoint_every must be an int >= 1 and checkpoint_interval a finite number > 0 (or None)")
    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        store = SessionStore(
            log_store, registry, now_ms, nursery, mailbox_capacity, checkpoint_every, checkpoint_interval
        )
        try:
            yield store
        except BaseException as exc:  # re-raised bare once the nursery has closed
            body_error = exc
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(10):
                    await store.aclose()
            nursery.cancel_scope.cancel()
    if body_error is not None:
        raise body_error


def _fold(cells: ProjectionCells, store: LogStore, handle: WriteHandle, every: list[Event] | None) -> int:
    """Fold the whole log into `cells`: the events read already, else a chunk at a time
    (`read_chunks`: a log of any size is never held whole to be folded)."""
    if every is not None:
        return cells.fold(every)
    return sum(cells.fold(chunk) for chunk in store.read_chunks(handle))
