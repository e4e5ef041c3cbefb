"""The cold reader: reads persisted sessions for listings, bounded and cancellable (SPEC 4).

Theory of operation. `read_many(ids, abort)` starts one task per id in a nursery owned by the
call, each taking one of at most `max_in_flight` (4) slots of a `CapacityLimiter` and reading
its log in a worker thread that polls `trio.from_thread.check_cancelled` between decode chunks,
so cancelling the call's scope ends reads promptly. Results are aligned with `ids`, never with
completion order. A typed storage failure of one read is that entry's value; anything else (a
bug) fails the whole call, re-raised bare — never inside an ExceptionGroup. When `abort` is set
(before, during or after the reads) the call raises `ReadAborted` and returns nothing partial;
a `trio.Cancelled` from an enclosing scope passes through unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import trio

from subagents.storage import Event, LogStore, SessionHeader, StorageError, interrupted_closers

from .abort import Abort
from .errors import ActorError
from .groups import raise_bare_cancelled

__all__ = ["ColdRead", "ColdReader", "ReadAborted"]


class ReadAborted(ActorError):
    code = "COLD_READ_ABORTED"

    def __init__(self) -> None:
        super().__init__("the cold read was aborted")


@attrs.frozen(kw_only=True)
class ColdRead:
    """A persisted session as read: its events end with in-memory closers of an interrupted
    turn (never written back)."""

    session_id: str
    header: SessionHeader
    inherited_event_count: int
    events: tuple[Event, ...]
    closers: int  # how many of `events` are in-memory closers


class ColdReader:
    def __init__(self, store: LogStore, *, max_in_flight: int = 4) -> None:
        self.store = store
        self.limiter = trio.CapacityLimiter(max_in_flight)

    async def read_many(
        self, ids: Sequence[str], abort: Abort | None = None
    ) -> list[ColdRead | StorageError]:
        if abort is not None and abort.is_set():
            raise ReadAborted
        results: list[ColdRead | StorageError | None] = [None] * len(ids)
        bugs: list[BaseException] = []
        try:
            async with trio.open_nursery() as nursery:
                if abort is not None:
                    nursery.start_soon(_cancel_on, abort, nursery.cancel_scope)
                async with trio.open_nursery() as reads:
                    for index, session_id in enumerate(ids):
                        reads.start_soon(self._read_into, results, index, session_id, bugs)
                nursery.cancel_scope.cancel()  # the reads are done: stop the abort watcher
        except BaseExceptionGroup as group:
            # Only an enclosing cancellation gets here (the tasks keep everything else as
            # values): hand it on as the bare Cancelled the enclosing scope expects.
            raise_bare_cancelled(group)
        if abort is not None and abort.is_set():
            raise ReadAborted
        if bugs:
            raise bugs[0]
        return results  # type: ignore[return-value]  # every slot was filled

    async def _read_into(
        self,
        results: list[ColdRead | StorageError | None],
        index: int,
        session_id: str,
        bugs: list[BaseException],
    ) -> None:
        async with self.limiter:
            try:
                results[index] = await trio.to_thread.run_sync(self._read, session_id)
            except StorageError as exc:
                results[index] = exc
            except trio.Cancelled:
                raise
            except Exception as exc:  # a bug: fails the call, re-raised bare by read_many
                bugs.append(exc)

    def _read(self, session_id: str) -> ColdRead:
        store = self.store
        handle = store.open_read(session_id)
        try:
            events = store.read(handle, checkpoint=trio.from_thread.check_cancelled)
        finally:
            store.close(handle)
        closers = interrupted_closers(events, session_id=handle.session_id)
        return ColdRead(
            session_id=handle.session_id,
            header=handle.header,
            inherited_event_count=handle.inherited_event_count,
            events=tuple(events) + tuple(closers),
            closers=len(closers),
        )


async def _cancel_on(abort: Abort, scope: trio.CancelScope) -> None:
    await abort.wait()
    scope.cancel()
