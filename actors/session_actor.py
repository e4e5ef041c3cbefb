"""The session actor: one task per live session, owning its write handle and projection cells.

Theory of operation. Requests arrive in a bounded mailbox. The actor takes one, then drains
whatever else is already queued (`receive_nowait`, up to `batch_limit`) and serves the lot in
order. Consecutive appends form one *group commit*: each request's expected seq is checked and
its drafts become events with the next seqs, then the whole group is written with **one**
storage `append` of one batch (one fsync) in one thread hop, and only then are its events
folded into the projection cells, in one pass for the whole group, and every request in it
acknowledged — so a live snapshot costs no log read, never shows an event that is not durable,
and always shows an acknowledged one. A request that fails its own checks (a stale
expected seq, an invalid event) fails alone; a failed write fails its whole group, and a dead
handle stops the actor — as does `OwnershipLost` (another host took the session's lease: never
retried, the new owner writes now). Any other request waits for the appends queued before it.

The thread hop is never abandoned: a cancelled actor still waits for its fsync before it stops,
then fails everything pending with `ActorStopped`. What callers hold and send (the ref, drafts,
requests, `snapshot_all`) is session_ref.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, TypeVarTuple

import trio
from subagents.storage import (
    Batch,
    Event,
    HandleDead,
    InvalidEvent,
    LogWriter,
    Offset,
    OwnershipLost,
    ProjectionCells,
    SequenceConflict,
    StorageError,
    WriteHandle,
    make_event,
)

from .errors import ActorStopped
from .mailbox import Mailbox, Request
from .session_ref import (
    AppendRequest,
    AppendResult,
    CheckpointRequest,
    EventDraft,
    FlushRequest,
    SessionRef,
    SnapshotRequest,
)

__all__ = ["SessionActor", "close_handle"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


async def close_handle(store: LogWriter, handle: WriteHandle) -> None:
    """Close `handle` in a worker thread, even while cancelled (shielded): the file store's close
    is an unlock, the PostgreSQL store's a statement on the network (bounded by its
    statement_timeout) that must not stall the event loop. Not bounded by a Trio timer: a close
    left to its thread would hold the session's lock past the actor's end, where the next open
    of the session finds it taken."""
    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(store.close, handle)


def _own_copy(exc: StorageError) -> StorageError:
    """The same error (class, message, fields) as a fresh object: each task that raises it gets
    its own traceback, with the original as the cause."""
    cls = type(exc)
    copy = cls.__new__(cls)
    copy.__dict__.update(exc.__dict__)
    copy.args = exc.args
    copy.__cause__ = exc
    return copy


class SessionActor:
    def __init__(
        self,
        store: LogWriter,
        handle: WriteHandle,
        cells: ProjectionCells,
        *,
        now_ms: Callable[[], int],
        seed: Sequence[Event] = (),
        capacity: int = 16,
        batch_limit: int = 64,
        checkpoint_every: int = 256,
        checkpoint_interval: float | None = 30.0,
        on_durable: Callable[[str, int, Sequence[Event]], None] | None = None,
    ) -> None:
        self.store = store
        # Told of every group's events once they are durable (the store's `DurableFeed`).
        self._on_durable = on_durable
        self.handle = handle
        self.cells = cells
        # A seeded session not yet published: its inherited events and end-seed marker go out
        # with the first append, so no crash can leave a child without its own first events.
        self._seed = list(seed)
        self.finished = trio.Event()
        self._died = False
        self._dead_reason = "stopped: its log handle is dead"  # said once the handle is dead
        self.ownership_lost: OwnershipLost | None = None  # another host took the session over
        self._in_storage = False  # a worker thread is using the handle
        self.now_ms = now_ms
        self.batch_limit = batch_limit
        self.mailbox = Mailbox(f"session {handle.session_id}", capacity)
        self.ref = SessionRef(self)
        self.fsyncs = 0  # appends written (one fsync each): group commit is measured by it
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval = checkpoint_interval
        self._since_checkpoint = 0
        self._dirty_since = 0.0  # trio time of the first event not covered by a checkpoint
        self.checkpoints = 0  # checkpoints written

    async def run(self, *, task_status: trio.TaskStatus[SessionRef] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(self.ref)
        taken: list[Request[Any]] = []
        mailbox = self.mailbox
        try:
            receive = mailbox.receive.receive
            while True:
                # Parked: everything taken so far is served, so the cells are what a snapshot
                # sent now would be answered from (`Mailbox.idle`, `snapshot_all`).
                mailbox.parked = True
                if not self._since_checkpoint or self.checkpoint_interval is None:
                    request = await receive()  # clean: no checkpoint deadline to wait with
                else:
                    request = await self._next_request()
                mailbox.parked = False
                if request is None:
                    await self._write_checkpoint()  # idle for checkpoint_interval while dirty
                    continue
                mailbox.taken += 1
                if type(request) is SnapshotRequest:
                    self._snapshot(request)  # a snapshot sent while busy: served inline, no batch
                    continue
                taken = [request]
                if type(request) is AppendRequest:
                    # Group commit: the appends queued behind this one share its fsync. (Other
                    # requests are served one by one: probing costs a WouldBlock each.)
                    receive_nowait = mailbox.receive.receive_nowait
                    while len(taken) < self.batch_limit:
                        try:
                            taken.append(receive_nowait())
                        except trio.WouldBlock:
                            break
                        mailbox.taken += 1
                await self._serve(taken)
                taken = []
        except (trio.EndOfChannel, trio.ClosedResourceError):
            pass  # the mailbox was closed: the actor ends normally
        except Exception:
            # A bug in the actor or a unit must not take the session store (and every other
            # session) down with it: this actor dies, its requests fail, the error is logged.
            log.exception("session %r: its actor died", self.handle.session_id)
            self._died = True
        finally:
            reason = "stopped" if self.handle.dead is None else self._dead_reason
            if self._died:
                reason = "stopped: its actor died (see the log)"
            if self._in_storage:
                reason = "stopped: its storage did not answer"
            for request in taken:
                request.reply.fail(ActorStopped(self.mailbox.name, reason))
            self.mailbox.close(reason)
            if self._in_storage:
                # An abandoned worker thread still holds the handle: it is left to it (and its
                # lock stays held until the process ends) rather than closed under its feet.
                log.warning("session %r: storage did not answer; its handle was abandoned", self.handle.session_id)
            else:
                await close_handle(self.store, self.handle)  # frees the single-writer lock
            self.finished.set()

    async def _next_request(self) -> Request[Any] | None:
        """The next request, or None when events have waited `checkpoint_interval` for one."""
        if not self._since_checkpoint or self.checkpoint_interval is None:
            return await self.mailbox.receive.receive()
        with trio.move_on_at(self._dirty_since + self.checkpoint_interval):
            return await self.mailbox.receive.receive()
        return None

    def stop(self) -> None:
        """Refuse new requests and fail queued ones; the run loop ends at its next receive."""
        self.mailbox.close()

    def lose(self) -> None:
        """Another host took the session over (found by its store's lease renewal): stop as an
        append refused with `OwnershipLost` would, without waiting for one — an idle session's
        owners here must not act for it any more."""
        if self.mailbox.stopped:
            return
        # A handle without a lease (a test's renewing store over files) is named epoch 0.
        epoch = 0 if self.handle.epoch is None else self.handle.epoch
        self.ownership_lost = OwnershipLost(self.handle.session_id, epoch)
        self._dead_reason = f"stopped: ownership lost (epoch {epoch})"
        self.mailbox.close(self._dead_reason)

    async def _serve(self, requests: list[Request[Any]]) -> None:
        group: list[AppendRequest] = []
        for index, request in enumerate(requests):
            if isinstance(request, AppendRequest):
                group.append(request)
                continue
            if group:
                await self._commit(group)
                group = []
            if self.mailbox.stopped:  # the handle died under the group: nothing more is served
                self._refuse(requests[index:])
                return
            if isinstance(request, SnapshotRequest):
                self._snapshot(request)
            elif isinstance(request, FlushRequest):
                request.reply.set(self.handle.next_seq)
            elif isinstance(request, CheckpointRequest):
                request.reply.set(await self._write_checkpoint())
        if group:
            await self._commit(group)

    def _snapshot(self, request: SnapshotRequest) -> None:
        try:
            request.reply.set(self.cells.snapshot(request.keys))
        except Exception as exc:  # a broken unit or an unknown key: the asker's problem
            request.reply.fail(exc)

    def _refuse(self, requests: Iterable[Request[Any]]) -> None:
        for request in requests:
            request.reply.fail(ActorStopped(self.mailbox.name, self._dead_reason))

    async def _commit(self, group: list[AppendRequest]) -> None:
        if not group:
            return
        if self.mailbox.stopped:
            self._refuse(group)
            return
        handle = self.handle
        seed = self._seed
        first = nxt = Offset(handle.next_seq + len(seed))
        events: list[Event] = []  # the group's events, contiguous from `first`
        accepted: list[tuple[AppendRequest, list[Event]]] = []
        for request in group:
            if request.reply.done:
                continue
            if request.expected_seq is not None and request.expected_seq != nxt:
                request.reply.fail(SequenceConflict(handle.session_id, expected=request.expected_seq, actual=nxt))
                continue
            try:
                made = self._number(request.drafts, nxt)
            except StorageError as exc:
                request.reply.fail(exc)
                continue
            except Exception as exc:  # a draft no event can be made of: only its request fails
                request.reply.fail(InvalidEvent(f"session {handle.session_id!r}: invalid draft: {exc!r}"))
                continue
            events += made
            accepted.append((request, made))
            nxt = Offset(nxt + len(made))
        # One batch for the whole group (its events are contiguous), after the seed's own.
        batches: list[Batch] = [Batch(Offset(0), seed)] if seed else []
        if events:
            batches.append(Batch(first, events))
            try:
                # Nobody hears of a group before its fsync finishes (or fails). Only when the
                # store gives up on this actor (cancel after a bounded wait) is the hop abandoned:
                # its requests then fail with ActorStopped — outcome unknown, never acknowledged.
                await self._in_thread(self.store.append, handle, batches)
            except StorageError as exc:
                for request, _ in accepted:
                    request.reply.fail(_own_copy(exc))  # one error object per waiting task
                if isinstance(exc, OwnershipLost):
                    self.ownership_lost = exc
                    self._dead_reason = f"stopped: ownership lost (epoch {exc.epoch})"
                    self.mailbox.close(self._dead_reason)
                elif isinstance(exc, HandleDead) or handle.dead is not None:
                    self.mailbox.close(self._dead_reason)
                return
            self.fsyncs += 1
            if seed:
                self._seed = []
                durable = seed + events
            else:
                durable = events
            # One fold of the whole group (the cells take any contiguous run), before any ack:
            # an acknowledged append is in every snapshot asked after it.
            self.cells.fold(durable)
            if not self._since_checkpoint:
                self._dirty_since = trio.current_time()
            self._since_checkpoint += len(events)
        else:
            durable = []  # (a seed is published with the first event of the session's own)
        for request, made in accepted:
            at = made[0].seq if made else int(nxt)
            request.reply.set(AppendResult(at, Offset(at + len(made)), tuple(made)))
        if durable and self._on_durable is not None:
            # In the same synchronous stretch as the acks: an answered append has been published.
            try:
                self._on_durable(handle.session_id, handle.inherited_event_count, durable)
            except Exception:  # a subscriber's bug must not take the session down
                log.exception("session %r: a durable-event subscriber failed", handle.session_id)
        # Checkpoints cover only what is durable, so they are written after the acks: right
        # after publication, at every turn end, and every `checkpoint_every` events.
        if events and (
            seed
            or first == 0
            or self._since_checkpoint >= self.checkpoint_every
            or any(e.type == "turn/end" for e in events)
        ):
            await self._write_checkpoint()

    async def _write_checkpoint(self) -> bool:
        if self.handle.dead is not None or not self.handle.published:
            return False
        rows = self.cells.checkpoint()
        written = await self._in_thread(self.store.write_checkpoint, self.handle, rows)
        # A failed write (logged by the store) is retried after another interval, not at once.
        self._dirty_since = trio.current_time()
        if written:
            self.checkpoints += 1
            self._since_checkpoint = 0
        return written

    async def _in_thread(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """A storage call in a worker thread. If the actor is cancelled meanwhile (the store gave
        up on it after a bounded wait), the call is abandoned and the thread keeps the handle."""
        self._in_storage = True
        try:
            result = await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
        except trio.Cancelled:
            raise  # abandoned: the worker thread still uses the handle
        except BaseException:
            self._in_storage = False
            raise
        self._in_storage = False
        return result

    def _number(self, drafts: Sequence[EventDraft], first: int) -> list[Event]:
        now: int | None = None  # one clock reading for every undated draft of a request
        events: list[Event] = []
        for i, draft in enumerate(drafts):
            time = draft.time
            if time is None:
                if now is None:
                    now = self.now_ms()
                time = now
            events.append(
                make_event(
                    first + i,
                    draft.type,
                    time,
                    draft.data,
                    ignorable=draft.ignorable,
                    surface_op=draft.surface_op,
                    source_event_seqs=draft.source_event_seqs,
                )
            )
        return events
