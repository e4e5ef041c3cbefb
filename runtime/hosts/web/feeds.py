"""The live feeds' source: the runtime's event stream (runtime/event_stream.py), with the logs it
stops following because they cannot be read any more said in the stream itself (issue 31, item
4: a log damaged while its page follows it must not go quiet).

The stream reports such a log once, through its `on_broken` callback, after delivering every
event it read before; `open_feed` hands it on as a `Broken` item in the same order: whatever
the stream holds is delivered first, then the notice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import attrs
import trio
from subagents.storage import CorruptLog, StorageError, UnsupportedLog

from ...event_stream import EventStream, StreamEvent, open_event_stream

if TYPE_CHECKING:
    from ...log_follow import Mark
    from ...query import SessionQuery

__all__ = ["Broken", "open_feed"]


@attrs.frozen
class Broken:
    """A session of the feed whose log could not be read any more: no longer followed."""

    session_id: str
    problem: str
    seq: int | None  # where the damage is, when the store says
    damaged: bool = True  # its log is damaged (else it could not be read: a store gone, a failed read)


@asynccontextmanager
async def open_feed(
    query: SessionQuery, root_id: str, *, from_seq: int, descendants: bool, known: Mapping[str, Mark] | None = None
) -> AsyncIterator[AsyncIterator[StreamEvent | Broken]]:
    """The events of `root_id` (and its descendants) from `from_seq` (`known`: as
    `open_event_stream`'s), and a `Broken` for each log the stream stops following."""
    broken: list[Broken] = []
    noticed = trio.Event()

    def on_broken(session_id: str, error: StorageError) -> None:
        nonlocal noticed
        damaged = isinstance(error, CorruptLog | UnsupportedLog)
        broken.append(Broken(session_id, str(error), getattr(error, "seq", None), damaged))
        noticed.set()

    async with open_event_stream(
        query, root_id, from_seq=from_seq, descendants=descendants, known=known, on_broken=on_broken
    ) as stream:
        # A page opens its feed after it was rendered: what its sessions write from now on must
        # reach it, so the feed says it is open only once the stream has read them.
        await stream.wait_started()

        async def items() -> AsyncIterator[StreamEvent | Broken]:
            nonlocal noticed
            while True:
                try:
                    yield stream.receive_nowait()
                    continue
                except trio.WouldBlock:
                    pass
                except trio.EndOfChannel:
                    return
                if broken:
                    yield broken.pop(0)
                    continue
                noticed = trio.Event()
                item = await _first(stream, noticed)
                if isinstance(item, StreamEvent):
                    yield item
                elif item is _ENDED:
                    return

        yield items()


_ENDED = object()


async def _first(stream: EventStream, noticed: trio.Event) -> StreamEvent | object | None:
    """The stream's next event, `_ENDED` when it ended, or None once `noticed` is set first."""
    got: StreamEvent | object | None = None
    async with trio.open_nursery() as nursery:

        async def take() -> None:
            nonlocal got
            try:
                got = await stream.receive()
            except trio.EndOfChannel:
                got = _ENDED
            nursery.cancel_scope.cancel()

        async def notice() -> None:
            await noticed.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(take)
        nursery.start_soon(notice)
    return got
