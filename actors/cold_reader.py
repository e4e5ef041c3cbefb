"""The cold reader: reads persisted sessions for listings, bounded and cancellable
(docs/design.md, "Listing").

Theory of operation. `read_many(ids, abort)` reads each id in a worker thread holding one of at
most `max_in_flight` (4) slots of a `CapacityLimiter`; the thread polls
`trio.from_thread.check_cancelled` between decode chunks, so cancelling the caller's scope ends
reads promptly. An abort becomes cancellation once, at the top of the call (`cancelled_when`):
setting it cancels the call's reads the same way, and a read whose abort was set before it got
a slot never starts. (A call of several reads runs one task per read in a nursery it owns; a
call of one read — an observation — runs in its caller's task, under its caller's scope; a
caller that made its abort a cancel scope already passes none.) Results are aligned with
`ids`, never with completion order. A typed storage failure of one read is that entry's value;
anything else (a bug) fails the whole call, re-raised bare — never inside an ExceptionGroup.
When `abort` is set (before, during or after the reads) the call raises `ReadAborted` and
returns nothing partial; a `trio.Cancelled` from an enclosing scope passes through unchanged.

Few large thread hops, and one CPU-bound hop at a time (a hop costs about 0.1 ms, a 100 KB log
about 0.4 ms to read; msgspec holds the GIL, so two decoding threads on a 2-core machine only
slow each other down). Every read waits in a queue shared by the calls made in the same
`ReadGroup` (a listing makes one call per child, all in one group) or, without one, under the
same `Abort`: its group. A read that finds
no hop of its group at work takes a slot, claims itself and *pumps*: its worker thread, once
that read is done, claims queued reads of the group until `HOP_SECONDS` of work is done or the
queue is empty, and the task then starts another hop while the queue holds reads nobody has
started. The other reads of the group wait for the pump without a slot (a call of several reads
waits holding its slot, so that its tasks keep the slots they will need). One waiter watches
for a stall — no read started for `STALL_SECONDS`: a slow or hung read — and then wakes the
others, which start hops of their own, up to `max_in_flight`. So there are never more than
`max_in_flight` reads in flight, a read never starts twice and never without a slot, and a hung
read holds up only itself. A hop cancelled in the middle of another call's read hands it back
unread, queued again; a read whose call has ended is never started. Calls with neither a group
nor an `Abort` share nothing.

Given a projection registry, each read also folds fresh cells over its events in the same
worker thread (the units are pure): the event loop then never runs a fold of a cold log.
"""

from __future__ import annotations

import threading
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

__all__ = ["HOP_SECONDS", "STALL_SECONDS", "ColdRead", "ColdReader", "ReadGroup"]

HOP_SECONDS = 0.005  # a hop claims more queued reads until it has worked this long
STALL_SECONDS = 0.02  # a hop that has not started a read for this long may be stuck


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
    events: tuple[Event, ...]
    closers: int  # how many of `events` are in-memory closers
    cells: ProjectionCells | None = None  # folded over `events`, when read with a registry


_PENDING, _CLAIMED, _DONE = 0, 1, 2


@attrs.define(eq=False)
class _Group:
    """The reads queued in one group (a `ReadGroup`, or an abort), and the hops working on them."""

    queue: deque[_Job] = attrs.Factory(deque)  # claimed entries are dropped as hops meet them
    calls: int = 0  # calls still running
    hops: int = 0  # hops running
    progress: float = 0.0  # time.monotonic() when a hop last started or claimed a read
    watcher: _Job | None = None  # the waiter that watches for a stalled hop
    waiters: dict[_Job, None] = attrs.Factory(dict)  # reads whose owners wait behind a hop, in order


@attrs.define(eq=False)
class _Job:
    session_id: str
    registry: ProjectionRegistry | None
    group: _Group
    state: int = _PENDING  # changed only under the reader's lock
    wanted: bool = True  # False once its call has ended: never started after that
    result: ColdRead | BaseException | None = None
    done: trio.Event = attrs.Factory(trio.Event)


class ColdReader:
    def __init__(self, store: LogStore, *, max_in_flight: int = 4) -> None:
        self.store = store
        self.limiter = trio.CapacityLimiter(max_in_flight)
        self._lock = threading.Lock()
        self._groups: dict[object, _Group] = {}  # by abort (see the docstring)

    async def read_many(
        self,
        ids: Sequence[str],
        abort: Abort | None = None,
        *,
        registry: ProjectionRegistry | None = None,
        group: ReadGroup | None = None,
    ) -> list[ColdRead | StorageError]:
        """Read every id (at most `max_in_flight` at a time), aligned with `ids`; with a
        `registry`, each result carries its cells folded over its events (closers included).
        Reads share hops with the other calls of their `group` (without one: of their abort)."""
        if abort is not None and abort.is_set():
            raise ReadAborted
        key: object = group if group is not None else abort if abort is not None else object()
        with self._lock:
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _Group()
            group.calls += 1
            jobs = [_Job(session_id, registry, group) for session_id in ids]
            group.queue.extend(jobs)
        try:
            # The abort becomes cancellation here, once: below, reads are cancelled the Trio
            # way (their threads poll `check_cancelled` between decode chunks).
            async with cancelled_when(abort):
                if len(jobs) == 1:
                    # One read (an observation): no task of its own — whoever awaits it owns
                    # the cancel scope.
                    await self._run(jobs[0], alone=True)
                else:
                    async with trio.open_nursery() as reads:
                        for job in jobs:
                            reads.start_soon(partial(self._run, job, alone=False))
        except BaseExceptionGroup as group_error:
            # Only an enclosing cancellation gets here (the tasks keep everything else as
            # values): hand it on as the bare Cancelled the enclosing scope expects.
            raise_bare_cancelled(group_error)
        finally:
            with self._lock:
                for job in jobs:
                    job.wanted = False
                group.calls -= 1
                if not group.calls:
                    del self._groups[key]
        if abort is not None and abort.is_set():
            raise ReadAborted
        results: list[ColdRead | StorageError] = []
        for job in jobs:
            result = job.result
            if isinstance(result, (ColdRead, StorageError)):
                results.append(result)
            elif isinstance(result, Exception):
                raise result  # a bug: fails the call, bare
            else:  # pragma: no cover - every job ends with a result unless aborted or cancelled
                raise AssertionError(f"cold read of {job.session_id!r} ended without a result")
        return results

    async def _run(self, job: _Job, *, alone: bool) -> None:
        """Until `job` is read (or aborted): claim it and pump its group, or wait for the hop
        that has it or will claim it. `alone`: the only read of its call (an observation)."""
        group = job.group
        while True:
            state = job.state
            if state == _DONE:
                return
            if state == _CLAIMED or (alone and self._busy(group)):
                # Read by a hop of the group, or soon to be claimed by the one at work: a
                # second CPU-bound hop would only fight it for the GIL. Wait without a slot.
                await self._wait_behind(job)
                continue
            async with self.limiter:
                while True:
                    with self._lock:
                        state = job.state
                        mine = state == _PENDING and not self._busy(group)
                        if mine:
                            self._claim(job)
                    if mine:
                        await self._pump(job)
                        return
                    if state != _PENDING:
                        break  # another hop has it: wait without the slot
                    await self._defer(job)  # holding the slot (a call of several reads)

    @staticmethod
    def _busy(group: _Group) -> bool:
        return group.hops > 0 and time.monotonic() - group.progress < STALL_SECONDS

    def _claim(self, job: _Job) -> None:
        """Under the lock: `job` is this hop's now."""
        job.state = _CLAIMED
        job.group.hops += 1
        job.group.progress = time.monotonic()

    async def _wait_behind(self, job: _Job) -> None:
        """Wait until `job`'s read is handed over, or there is something to look at again.

        The first waiter of a group watches: it wakes every `STALL_SECONDS`, and when no hop has
        started a read for that long (a slow or hung read), it hands over every read already
        done (a hop hands its reads over when it ends, and a hung one does not end) and wakes
        the waiters whose reads nobody has started, so that they start hops of their own. When
        it stops waiting, the watch passes to the waiter that came last."""
        group = job.group
        group.waiters[job] = None
        try:
            if group.watcher is None:
                group.watcher = job
                with trio.move_on_after(STALL_SECONDS):
                    await job.done.wait()
                if not job.done.is_set() and not self._busy(group):
                    with self._lock:
                        stuck = [w for w in group.waiters if w.state != _CLAIMED]
                    for waiter in stuck:  # read, or never started: its owner looks again
                        waiter.done.set()
            else:
                await job.done.wait()
        finally:
            del group.waiters[job]
            if group.watcher is job:
                group.watcher = None
                if group.waiters:
                    next(reversed(group.waiters)).done.set()  # looks again, and watches
        if job.done.is_set() and job.state != _DONE:
            job.done = trio.Event()  # woken, or handed back unread: look again

    async def _defer(self, job: _Job) -> None:
        """Wait (at most `STALL_SECONDS`) for the hop that will likely claim `job`."""
        with trio.move_on_after(STALL_SECONDS):
            await job.done.wait()
        if job.done.is_set() and job.state == _PENDING:
            job.done = trio.Event()  # handed back unread

    async def _pump(self, job: _Job) -> None:
        """Read `job` in a hop, then keep hopping while the group has reads nobody started
        (the tasks of those reads wait without a slot meanwhile)."""
        group = job.group
        await self._hop(job)
        while True:  # a cancelled pump stops as its next hop starts (or inside it)
            with self._lock:
                nxt = self._next_pending(group)
                if nxt is None:
                    return
                self._claim(nxt)
            await self._hop(nxt)

    async def _hop(self, first: _Job) -> None:
        claimed: list[_Job] = [first]
        try:
            await trio.to_thread.run_sync(self._work, claimed)
        finally:
            with self._lock:
                first.group.hops -= 1
                for job in reversed(claimed):
                    if job.result is not None:
                        job.state = _DONE
                    else:  # cancelled before its read finished: hand it back, queued again
                        job.state = _PENDING
                        first.group.queue.appendleft(job)
            for job in claimed:
                job.done.set()

    def _work(self, claimed: list[_Job]) -> None:
        """In a worker thread: the first claimed read, then queued reads of its group. A read
        is marked done as soon as it is; its owner is woken when the hop ends (or by the
        group's watcher, if a later read of the hop hangs)."""
        first = claimed[0]
        group = first.group
        self._finish(first, self._attempt(first))
        started = time.perf_counter()
        while time.perf_counter() - started < HOP_SECONDS:
            trio.from_thread.check_cancelled()
            job = self._claim_next(group)
            if job is None:
                return
            claimed.append(job)
            self._finish(job, self._attempt(job))

    def _finish(self, job: _Job, result: ColdRead | BaseException) -> None:
        with self._lock:
            job.result = result
            job.state = _DONE

    def _claim_next(self, group: _Group) -> _Job | None:
        """In a worker thread: the next queued read of the group, claimed for this hop."""
        with self._lock:
            job = self._next_pending(group)
            if job is not None:
                job.state = _CLAIMED
                group.progress = time.monotonic()
            return job

    @staticmethod
    def _next_pending(group: _Group) -> _Job | None:
        """Under the lock: the first queued read nobody has started and its call still wants."""
        queue = group.queue
        while queue:
            job = queue.popleft()
            if job.state == _PENDING and job.wanted:
                return job
        return None

    def _attempt(self, job: _Job) -> ColdRead | BaseException:
        try:
            return self._read(job.session_id, job.registry)
        except StorageError as exc:
            return exc
        except Exception as exc:  # a bug: fails its call
            return exc

    def _read(self, session_id: str, registry: ProjectionRegistry | None = None) -> ColdRead:
        store = self.store
        handle = store.open_read(session_id)
        try:
            # Between decode chunks: a cancelled scope (an abort, or an enclosing cancellation)
            # raises `trio.Cancelled` in this thread.
            events = store.read(handle, poll=trio.from_thread.check_cancelled)
        finally:
            store.close(handle)
        closers = interrupted_closers(events, session_id=handle.session_id)
        every = tuple(events) + tuple(closers) if closers else tuple(events)
        cells = None
        if registry is not None:
            cells = registry.cells(handle.header, handle.inherited_event_count)
            cells.fold(every)
        return ColdRead(
            session_id=handle.session_id,
            header=handle.header,
            inherited_event_count=handle.inherited_event_count,
            events=every,
            closers=len(closers),
            cells=cells,
        )
