"""The cold reader: reads persisted sessions for listings, bounded and cancellable
(docs/design.md, "Listing").

The contract. `read_many(ids, abort)` reads each id in a worker thread, at most `max_in_flight`
(4) hops at a time (a `CapacityLimiter`); the thread polls `trio.from_thread.check_cancelled`
between decode chunks and between reads, so cancelling the caller's scope ends its reads
promptly. An abort becomes cancellation once, at the top of the call (`cancelled_when`): setting
it cancels the call's reads the same way, and a read whose abort was set before it started never
starts. Results are aligned with `ids`, never with completion order. A typed storage failure of
one read is that entry's value; anything else (a bug) fails the whole call, re-raised bare —
never inside an ExceptionGroup. When `abort` is set (before, during or after the reads) the call
raises `ReadAborted` and returns nothing partial; a `trio.Cancelled` from an enclosing scope
passes through unchanged. Given a projection registry, each read also folds fresh cells over its
events in the same worker thread (the units are pure): the event loop never folds a cold log.
A read streams the log (`LogReader.read_chunks`) and folds a chunk at a time; with
`keep_events=False` it keeps only the last turn's events (what the in-memory closers need), so
folding a log of any size holds about one chunk of it.

Theory of operation. Thread hops are few and large (a hop costs about 0.1 ms, a 100 KB log about
0.4 ms to read; msgspec holds the GIL, so two decoding threads on a 2-core machine only slow each
other down). Reads made together share hops: the calls of one `ReadGroup` (a listing makes one
call per child, all in one group) or, without one, of one `Abort` form a group; calls with
neither share nothing. A group is a bounded memory channel of *requests* (one per read: the id,
a `trio.Event` set once when it is answered, and the result) plus two counters: its *pumps* and
whether a caller is *starting* one. A pump is a role, not a task of its own: the caller's task
(in a call of several reads, the read's task in the call's nursery) runs it, so its owner is the
call, it needs no nursery of the reader, and it is cancelled exactly when its caller is. A pump
holds a slot and, batch after batch, takes what is queued at that moment (`receive_nowait` until
empty) and runs it in one `to_thread.run_sync` (a *hop*); it stops when a batch finds nothing
queued. While the hop runs, a *feed* task of the hop's nursery moves the requests queued meanwhile
into its batch (observations answered by one hop ask again while the next runs: without the feed
the thread would idle between rounds). The thread reads the batch in order until it has worked
`HOP_SECONDS`, leaving the rest for the pump's next batch; each request is answered when its
hop ends.

Who pumps. A caller looks at its group once, with no checkpoint between looking and acting: with
no pump at work it becomes the pump (a call of several reads holds its slot already; a single read
— an observation — first marks the group *starting* and waits for a slot, while the reads that
arrive meanwhile queue behind it); otherwise it queues its request and waits on its event. So a
request waits in the channel only while a pump or a starter exists, and a request waiting with a
slot in hand only behind a pump that has one (else four slot holders could wait forever behind a
starter). Whenever a group is left with no pump at work — a pump ends by cancellation, a starter
is cancelled, a hop stalls — every queued request is answered unread ("handed back"): its owner
looks again, as above. A handed-back request is never reused: its owner asks again with a new
one, so no event is ever re-armed and an answer never races a second wait.

Stalls. Each hop also runs a *watch* (a task of the hop's nursery): when the thread has not
started a read for `STALL_SECONDS` (a slow or hung read), the watch ends the feed, answers the
reads the thread has done, hands back those it has not started, stops counting the pump (which
stops after that hop, handing back whatever is still in its batch then) and hands back the queue;
their owners start pumps of their own, up to `max_in_flight`. So a hung read holds up only itself
and the call whose task pumps it. (A feed cancelled just after the channel handed it a request
still holds it: it hands it back rather than strand it behind the stuck read.)

Threads without a lock. The only state a worker thread shares with Trio is its batch: a deque that
the feed appends to and the thread and the watch both drain with `popleft` (atomic, as
`collections.deque` documents), so a request is read at most once, by whoever popped it, and one
appended after the thread stopped is left for the next hop; a list of the requests the thread popped
(appended by the thread alone); a progress stamp; and each popped request's result, written once
by the thread before the hop ends. Everything else — channels, counters, events — is touched only
in Trio's thread, where no checkpoint falls between a look and the act it decides. When a hop
ends (the thread is done by then), its popped requests are answered: a result, or, if the hop was
cancelled in the middle of one, handed back unread; a cancelled hop hands back what it had not
started. A request whose call has ended is dropped unread, and a call that ends stops waiting, so
cancelling one reader never loses or hangs another's read.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from functools import partial

import attrs
import trio
from subagents.storage import (
    Event,
    LogStore,
    ProjectionCells,
    ProjectionRegistry,
    SessionHeader,
    StorageError,
    interrupted_closers,
)

from .abort import Abort, cancelled_when
from .errors import ReadAborted
from .groups import raise_bare_cancelled

__all__ = ["HOP_SECONDS", "QUEUED_READS", "STALL_SECONDS", "ColdRead", "ColdReader", "ReadGroup"]

HOP_SECONDS = 0.005  # a hop's thread stops taking reads after this much work (the pump goes on)
STALL_SECONDS = 0.02  # a hop whose thread has not started a read for this long may be stuck
QUEUED_READS = 256  # requests one group's channel holds; a caller beyond it waits to queue


class ReadGroup:
    """A token for reads made together (e.g. a listing's observations): calls given the same
    group queue their reads together, so they share thread hops."""

    __slots__ = ()


@attrs.frozen(kw_only=True)
class ColdRead:
    """A persisted session as read: its events end with in-memory closers of an interrupted
    turn (never written back)."""

    session_id: str
    header: SessionHeader
    inherited_event_count: int
    # Every logged event, then the closers; read with `keep_events=False`, the closers only.
    events: tuple[Event, ...]
    closers: int  # how many of `events` are in-memory closers
    logged: int  # how many logged events the read saw (kept in `events` or not)
    cells: ProjectionCells | None = None  # folded over the log and the closers, when read with a registry


@attrs.define(eq=False)
class _Call:
    ended: bool = False  # its reads are dropped unread from then on (read by worker threads)


@attrs.define(eq=False)
class _Request:
    """One read asked of its group, answered once through `done`: with `result`, or handed back
    unread (`result` still None), and then its owner asks again with a new request."""

    session_id: str
    registry: ProjectionRegistry | None
    call: _Call
    keep_events: bool = True
    result: ColdRead | BaseException | None = None  # written once, by the thread that read it
    done: trio.Event = attrs.Factory(trio.Event)


@attrs.define(eq=False)
class _Group:
    """The requests of one group (a `ReadGroup`, or an abort) and who pumps them."""

    send: trio.MemorySendChannel[_Request]
    receive: trio.MemoryReceiveChannel[_Request]
    calls: int = 0  # calls still running
    pumps: int = 0  # pumps at work, each holding a slot; a stalled one no longer counts
    starting: bool = False  # a caller without a slot is waiting for one, to pump

    @classmethod
    def open(cls) -> _Group:
        send, receive = trio.open_memory_channel[_Request](QUEUED_READS)
        return cls(send=send, receive=receive)


@attrs.define(eq=False)
class _Batch:
    """The requests one hop reads; while the hop runs, its thread and its watch share it."""

    group: _Group
    pending: deque[_Request]  # not yet started: drained with popleft only (thread-safe)
    taken: list[_Request] = attrs.Factory(list[_Request])  # popped by the thread (appended by it alone)
    progress: float = 0.0  # time.monotonic() when the thread last started a read
    working: bool = True  # False once the thread is done (the loop may be late to hear it)
    stalled: bool = False  # the watch gave up waiting for it
    feeding: trio.CancelScope = attrs.Factory(trio.CancelScope)  # the feed's: ended at a stall


class ColdReader:
    """Reads whole persisted sessions for listings (see the module docstring): bounded by
    `max_in_flight` thread hops, aligned, cancellable; reads of one group share hops."""

    def __init__(self, store: LogStore, *, max_in_flight: int = 4) -> None:
        self.store = store
        self.limiter = trio.CapacityLimiter(max_in_flight)
        self._groups: dict[object, _Group] = {}  # by group or abort (see the module docstring)

    async def read_many(
        self,
        ids: Sequence[str],
        abort: Abort | None = None,
        *,
        registry: ProjectionRegistry | None = None,
        group: ReadGroup | None = None,
        keep_events: bool = True,
    ) -> list[ColdRead | StorageError]:
        """Read every id (at most `max_in_flight` at a time), aligned with `ids`; with a
        `registry`, each result carries its cells folded over its events (closers included).
        `keep_events=False`: a result holds only the closers as events (a caller that wants
        the cells of a log, not its events, holds one chunk of it at a time).
        Reads share hops with the other calls of their `group` (without one: of their abort).
        Raises `ReadAborted` when `abort` is set, and a read's error that is no `StorageError`."""
        if abort is not None and abort.is_set():
            raise ReadAborted
        key: object = group if group is not None else abort if abort is not None else object()
        queue = self._groups.get(key)
        if queue is None:
            queue = self._groups[key] = _Group.open()
        queue.calls += 1
        call = _Call()
        results: list[ColdRead | BaseException | None] = [None] * len(ids)
        try:
            # The abort becomes cancellation here, once: below, reads are cancelled the Trio
            # way (their threads poll `check_cancelled`).
            async with cancelled_when(abort):
                if len(ids) == 1:
                    # One read (an observation): no task of its own, and no slot unless it pumps.
                    results[0] = await self._obtain(
                        queue, call, ids[0], registry, keep_events=keep_events, holding_slot=False
                    )
                else:
                    async with trio.open_nursery() as reads:
                        for i, session_id in enumerate(ids):
                            reads.start_soon(
                                partial(self._read_held, queue, call, results, i, session_id, registry, keep_events)
                            )
        except BaseExceptionGroup as group_error:
            # Only an enclosing cancellation gets here (reads keep everything else as values):
            # hand it on as the bare Cancelled the enclosing scope expects.
            raise_bare_cancelled(group_error)
        finally:
            call.ended = True
            queue.calls -= 1
            if not queue.calls:
                del self._groups[key]
        if abort is not None and abort.is_set():
            raise ReadAborted
        read: list[ColdRead | StorageError] = []
        for session_id, result in zip(ids, results, strict=True):
            if isinstance(result, (ColdRead, StorageError)):
                read.append(result)
            elif isinstance(result, Exception):
                raise result  # a bug: fails the call, bare
            else:  # pragma: no cover - every read ends with a result unless aborted or cancelled
                raise AssertionError(f"cold read of {session_id!r} ended without a result")
        return read

    async def _read_held(
        self,
        group: _Group,
        call: _Call,
        results: list[ColdRead | BaseException | None],
        i: int,
        session_id: str,
        registry: ProjectionRegistry | None,
        keep_events: bool,
    ) -> None:
        """A read of a call of several: it holds a slot until it is read, so that at most
        `max_in_flight` of the call's reads are under way."""
        async with self.limiter:
            results[i] = await self._obtain(
                group, call, session_id, registry, keep_events=keep_events, holding_slot=True
            )

    async def _obtain(
        self,
        group: _Group,
        call: _Call,
        session_id: str,
        registry: ProjectionRegistry | None,
        *,
        keep_events: bool = True,
        holding_slot: bool,
    ) -> ColdRead | BaseException:
        """Ask until answered with a result: pump, start a pump, or queue and wait (see "Who
        pumps"). No checkpoint falls between looking at the group and acting on it."""
        while True:
            request = _Request(session_id, registry, call, keep_events)
            if not group.pumps and holding_slot:
                await self._pump(group, request)
            elif not group.pumps and not group.starting:
                await self._start_pump(group, request)
            else:
                try:
                    group.send.send_nowait(request)
                except trio.WouldBlock:
                    await group.send.send(request)
            await request.done.wait()
            if request.result is not None:
                return request.result
            # Handed back unread (its hop was cancelled or stalled): look again.

    async def _start_pump(self, group: _Group, request: _Request) -> None:
        """Wait for a slot (reads arriving meanwhile queue behind this one), then pump — unless
        a caller holding a slot has started pumping meanwhile."""
        group.starting = True
        try:
            await self.limiter.acquire()
        except BaseException:
            group.starting = False
            self._orphaned(group)
            raise
        group.starting = False
        if group.pumps:
            self.limiter.release()
            try:
                group.send.send_nowait(request)
            except trio.WouldBlock:
                await group.send.send(request)
            return
        try:
            await self._pump(group, request)
        finally:
            self.limiter.release()

    async def _pump(self, group: _Group, request: _Request) -> None:
        """Holding a slot: read `request`, then what the group has queued, batch after batch,
        until a batch finds nothing (or a hop stalls: others pump then)."""
        group.pumps += 1
        batch = _Batch(group, deque([request]))
        try:
            while True:
                self._take_queued(group, batch.pending)
                if not batch.pending:
                    return
                await self._hop(batch)
                if batch.stalled:
                    return
                batch = _Batch(group, batch.pending)  # what the last hop left goes first
        finally:
            if not batch.stalled:
                group.pumps -= 1
            self._orphaned(group)

    @staticmethod
    def _take_queued(group: _Group, pending: deque[_Request]) -> None:
        receive = group.receive
        while True:
            try:
                request = receive.receive_nowait()
            except trio.WouldBlock:
                return
            if not request.call.ended:
                pending.append(request)

    @staticmethod
    def _orphaned(group: _Group) -> None:
        """With no pump at work, hand back every queued request: its owner looks again."""
        if group.pumps:
            return
        receive = group.receive
        while True:
            try:
                request = receive.receive_nowait()
            except trio.WouldBlock:
                return
            request.done.set()

    @staticmethod
    def _hand_back(pending: deque[_Request]) -> None:
        while True:
            try:
                request = pending.popleft()  # atomic: the batch's thread may pop too
            except IndexError:
                return
            request.done.set()

    async def _hop(self, batch: _Batch) -> None:
        """One worker thread reads `batch` (one `to_thread.run_sync`), watched for a stall;
        then its popped requests are answered, and if it failed or stalled, the rest handed back."""
        finished = False
        batch.progress = time.monotonic()
        try:
            async with trio.open_nursery() as hop:
                hop.start_soon(self._feed, batch)
                hop.start_soon(self._watch, batch)
                # Let them start waiting first: from the moment the thread is off, every task
                # here is blocked (as a test's `wait_all_tasks_blocked` expects of a hop).
                await trio.lowlevel.checkpoint()
                try:
                    await trio.to_thread.run_sync(self._work, batch)
                finally:
                    hop.cancel_scope.cancel()
            finished = True
        except BaseExceptionGroup as group_error:
            raise_bare_cancelled(group_error)  # an enclosing cancellation, bare
        finally:
            for request in batch.taken:  # the thread is done: a result, or None if cancelled in it
                request.done.set()
            if not finished or batch.stalled:  # its pump stops: what is left goes back
                self._hand_back(batch.pending)

    @staticmethod
    async def _feed(batch: _Batch) -> None:
        """Until the hop ends (or stalls): move requests queued meanwhile into its batch, where
        its thread takes them before it stops."""
        with batch.feeding:
            async for request in batch.group.receive:
                if request.call.ended:
                    continue
                if batch.stalled:
                    # Received just before the watch cancelled this feed (a value handed over
                    # stays handed over): never strand it behind a stuck read.
                    request.done.set()
                else:
                    batch.pending.append(request)  # atomic: the thread may pop meanwhile

    async def _watch(self, batch: _Batch) -> None:
        """Until cancelled at the hop's end: when the thread has started no read for
        `STALL_SECONDS`, answer what it has read and hand back what it has not started."""
        stall = STALL_SECONDS
        while True:  # polled: the thread, not a task, stamps progress (no Trio event to wait on)
            late = time.monotonic() - batch.progress
            if late < stall:
                await trio.sleep(stall - late)
            elif batch.working:
                break
            else:  # done, and the loop is late to resume the pump: no stall, the hop ends now
                await trio.sleep_forever()
        group = batch.group
        batch.stalled = True
        batch.feeding.cancel()
        group.pumps -= 1
        for request in list(batch.taken):  # a copy: the thread may append meanwhile
            if request.result is not None:
                request.done.set()
        self._hand_back(batch.pending)
        self._orphaned(group)

    def _work(self, batch: _Batch) -> None:
        """In a worker thread: read the batch's requests in order until `HOP_SECONDS` of work
        is done (the first always); drop those whose call has ended."""
        try:
            self._work_through(batch)
        finally:
            batch.working = False

    def _work_through(self, batch: _Batch) -> None:
        pending, taken = batch.pending, batch.taken
        started = time.perf_counter()
        while True:
            try:
                request = pending.popleft()  # atomic: the watch may empty it meanwhile
            except IndexError:
                return
            if request.call.ended:
                continue
            taken.append(request)
            batch.progress = time.monotonic()
            request.result = self._attempt(request)
            if time.perf_counter() - started >= HOP_SECONDS:
                return
            trio.from_thread.check_cancelled()

    def _attempt(self, request: _Request) -> ColdRead | BaseException:
        try:
            return self._read(request.session_id, request.registry, keep_events=request.keep_events)
        except StorageError as exc:
            return exc
        except Exception as exc:  # a bug: fails its call
            return exc

    def _read(
        self, session_id: str, registry: ProjectionRegistry | None = None, *, keep_events: bool = True
    ) -> ColdRead:
        store = self.store
        handle = store.open_read(session_id)
        cells = None if registry is None else registry.cells(handle.header, handle.inherited_event_count)
        kept: list[Event] = []
        logged = 0
        try:
            # Chunk by chunk; between decode chunks a cancelled scope (an abort, or an enclosing
            # cancellation) raises `trio.Cancelled` in this thread. A damaged log raises
            # after some chunks were folded: those cells are dropped with the error.
            for chunk in store.read_chunks(handle, poll=trio.from_thread.check_cancelled):
                if cells is not None:
                    cells.fold(chunk)
                logged += len(chunk)
                if keep_events:
                    kept.extend(chunk)
                else:
                    kept = _last_turn(kept, chunk)
                del chunk
        finally:
            store.close(handle)
        closers = interrupted_closers(kept, session_id=handle.session_id)
        if cells is not None and closers:
            cells.fold(closers)
        every = tuple(kept) + tuple(closers) if keep_events else tuple(closers)
        return ColdRead(
            session_id=handle.session_id,
            header=handle.header,
            inherited_event_count=handle.inherited_event_count,
            events=every,
            closers=len(closers),
            cells=cells,
            logged=logged,
        )


def _last_turn(kept: list[Event], chunk: list[Event]) -> list[Event]:
    """The events from the last `turn/start` of `kept` then `chunk` on (none before the first):
    all that `interrupted_closers` reads (`plan_continuation` reads the last turn only)."""
    for i in range(len(chunk) - 1, -1, -1):
        if chunk[i].type == "turn/start":
            return chunk[i:]
    if kept:
        kept.extend(chunk)
    return kept
