"""What callers of a session actor hold and send: `SessionRef`, the drafts and results of an
append, the requests a ref posts, and `snapshot_all` (one task asking many sessions at once).

The actor itself (session_actor.py) stays private: a ref reaches it only through its mailbox,
except for reads that cannot race it (its durable seq; an idle actor's cells, see `snapshot_all`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import trio
from subagents.storage import Event, Offset, OwnershipLost, ProjectionCells, SurfaceOp, WriteHandle

from .errors import ActorStopped
from .mailbox import Mailbox, Request

__all__ = [
    "AppendRequest",
    "ActorState",
    "AppendResult",
    "CheckpointRequest",
    "EventDraft",
    "FlushRequest",
    "SessionRef",
    "SnapshotRequest",
    "snapshot_all",
]

JsonValue = Any


class ActorState(Protocol):
    """What a ref reads of its actor (session_actor.SessionActor) without asking it."""

    mailbox: Mailbox
    handle: WriteHandle
    cells: ProjectionCells
    ownership_lost: OwnershipLost | None
    finished: trio.Event


@attrs.frozen(kw_only=True)
class EventDraft:
    """An event without its seq: the actor numbers it when the group is written."""

    type: str
    data: Mapping[str, Any]
    time: int | None = None  # None: the actor's clock
    ignorable: bool = False
    surface_op: SurfaceOp | None = None
    source_event_seqs: list[int] | None = None


@attrs.frozen
class AppendResult:
    first_seq: int
    next_seq: Offset
    events: tuple[Event, ...]


class AppendRequest(Request[AppendResult]):
    __slots__ = ("drafts", "expected_seq")

    def __init__(self, drafts: Sequence[EventDraft], expected_seq: int | None) -> None:
        super().__init__()
        self.drafts = drafts
        self.expected_seq = expected_seq


class SnapshotRequest(Request[dict[str, JsonValue]]):
    __slots__ = ("keys",)

    def __init__(self, keys: Iterable[str] | None) -> None:
        super().__init__()
        self.keys = None if keys is None else list(keys)

    @classmethod
    def sharing(cls, keys: list[str] | None) -> SnapshotRequest:
        """A request that uses `keys` as it is (a fan-out shares one list across requests)."""
        request = cls(None)
        request.keys = keys
        return request


class FlushRequest(Request[Offset]):
    __slots__ = ()


class CheckpointRequest(Request[bool]):
    __slots__ = ()


class SessionRef:
    """What callers hold: asks go through the mailbox; the actor object stays private."""

    def __init__(self, actor: ActorState) -> None:
        self._actor = actor
        self.session_id = actor.handle.session_id
        self.header = actor.handle.header
        self.inherited_event_count = actor.handle.inherited_event_count

    @property
    def stopped(self) -> bool:
        return self._actor.mailbox.stopped

    @property
    def ownership_lost(self) -> OwnershipLost | None:
        """Why the actor stopped, when another host took the session over (its new owner
        writes now: nothing here may act for the session any more); else None."""
        return self._actor.ownership_lost

    async def append(self, drafts: Sequence[EventDraft], *, expected_seq: int | None = None) -> AppendResult:
        """Durably append `drafts` as consecutive events; returns their seqs once fsynced."""
        return await self._actor.mailbox.ask(AppendRequest(list(drafts), expected_seq))

    async def snapshot(self, keys: Iterable[str] | None = None) -> dict[str, JsonValue]:
        """Views of the selected projection keys after every event acknowledged so far."""
        return await self._actor.mailbox.ask(SnapshotRequest(keys))

    async def flush(self) -> Offset:
        """Wait until every append queued before this is durable; returns the next seq."""
        return await self._actor.mailbox.ask(FlushRequest())

    async def checkpoint(self) -> bool:
        """Write the projection checkpoint now (after the appends queued before this)."""
        return await self._actor.mailbox.ask(CheckpointRequest())

    @property
    def durable_next(self) -> Offset:
        """The seq after the last durable event (the handle advances only after its fsync)."""
        return self._actor.handle.next_seq

    def is_own_seq(self, seq: int) -> bool:
        """True only for an existing, durable seq of the session's own suffix."""
        return self.inherited_event_count <= seq < self._actor.handle.next_seq

    async def wait_finished(self) -> None:
        await self._actor.finished.wait()


async def snapshot_all(
    refs: Sequence[SessionRef], keys: Iterable[str] | None = None
) -> list[dict[str, JsonValue] | Exception]:
    """Ask every session for a snapshot at once, from one task: post every request first, then
    collect the replies in order. Results are aligned with `refs`; a failure (`ActorStopped`, a
    broken unit) is returned as that entry's value, never raised. Starting a task per ask costs
    about as much as the ask itself; this is how a listing fans out to live children.

    An idle actor (`Mailbox.idle`: parked, nothing queued or being served) is not asked: its
    cells are read here, which is exactly what it would answer (nothing can change them before
    it would run). A busy one is asked, so its answer follows the appends queued before it."""
    wanted = None if keys is None else list(keys)  # one list for all: the actors only read it
    results: list[Any] = []  # a dict or an Exception per ref once done
    asked: list[tuple[int, SnapshotRequest]] = []
    for ref in refs:
        actor = ref._actor  # pyright: ignore[reportPrivateUsage]  # same module as SessionRef
        mailbox = actor.mailbox
        if mailbox.idle():
            # Parked with nothing queued, handed over or being served: asked, it would answer
            # next, from these very cells, which nothing changes before it would run. So it is
            # answered here, in this task: no request, no wake-up of its task (the actor's
            # `_snapshot`, errors kept as values the same way).
            try:
                results.append(actor.cells.snapshot(wanted))
            except Exception as exc:  # a broken unit or an unknown key: that entry's value
                results.append(exc)
            continue
        request = SnapshotRequest.sharing(wanted)
        try:
            if not mailbox.try_post(request):
                await mailbox.post(request)
        except ActorStopped as exc:
            results.append(exc)
            continue
        asked.append((len(results), request))
        results.append(None)  # its reply, collected below
    if not asked:
        await trio.lowlevel.checkpoint()  # an async call is always a checkpoint
    for at, request in asked:
        reply = request.reply
        try:
            # Most replies are in by the time the first one is: no coroutine for those.
            results[at] = reply.result() if reply.done else await reply.wait()
        except Exception as exc:  # returned as a value: one bad session never hides the rest
            results[at] = exc
    return results
