"""Following the logs no feed pushes: a stream's sessions that are not live in this runtime.

Why. The session store's `DurableFeed` pushes only what this runtime's actors make durable. A
tracked session run by another process on the same folder store, placed on another host on
PostgreSQL, or one that stopped being live here (released, moved) grows without a push: the
event stream (runtime/event_stream.py) must look at its log.

How cheaply. One look is one `SessionQuery.stat_many` of every session followed — one index hop
for all of them, whatever their number: the file store answers an unchanged log from a stat of
its folder and its index row and scans only what a grown log grew by; PostgreSQL answers from
the `sessions` row. Each stat's `event_count` is compared with the stream's cursor, and only a
log past it is read, from the boundary an earlier stat proved (a `Mark`: that revision's size
and event count, handed to `SessionQuery.read_from(after=)`): the file store then reads the
bytes past it, not the whole log; PostgreSQL reads the rows from the cursor's seq anyway.

When. Every `interval` seconds, at once when a session joins the followed ones (its first read
done), or when the store says a followed log changed
(`LogWatch`: inotify on each followed session's folder of a file store on a local file system;
a change notification only wakes the look early, the poll stays as the floor, so a change the
watch cannot vouch for — a folder created after the look, a full event queue — waits one
interval at most). PostgreSQL appends send no notification: its logs are polled.

Bounded: the follower is one task per stream (the stream's nursery owns it); its stats go through
the index's one worker slot and its reads through the query's read limiter; it waits between
looks, never spins.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import trio
from subagents.storage import LogInfo, LogWatch

from .query import SessionQuery

__all__ = ["DEFAULT_FOLLOW_INTERVAL", "Mark", "check_interval", "look", "wait_for_change"]

log = logging.getLogger(__name__)

DEFAULT_FOLLOW_INTERVAL = 0.2  # seconds between looks (as `tail -f`'s)

Mark = tuple[int, int]  # (log_offset, seq): a record boundary that holds `seq` (or is the end)


def check_interval(interval: float) -> float:
    """`interval` if it is a positive number of seconds (a follower must never spin)."""
    if isinstance(interval, bool) or not isinstance(interval, int | float) or not interval > 0:
        raise ValueError(f"follow_interval must be a positive number of seconds, got {interval!r}")
    return float(interval)


async def look(query: SessionQuery, followed: Mapping[str, int | None]) -> tuple[set[str], dict[str, Mark]]:
    """Stat every followed session (id → the stream's cursor, None when its log was not found
    yet) in one index hop. Returns the sessions to read (published and past the cursor,
    published at last, or damaged) and the boundary each healthy log's stat proved. A session
    whose stat failed is looked at again next time."""
    ids = list(followed)
    if not ids:
        return set(), {}
    grown: set[str] = set()
    marks: dict[str, Mark] = {}
    for session_id, info in zip(ids, await query.stat_many(ids), strict=True):
        if isinstance(info, Exception):
            log.debug("event stream: stat of %r failed, looked at again next time: %s", session_id, info)
            continue
        if info is None:
            continue  # not published (yet): nothing to read
        cursor = followed[session_id]
        if cursor is None or info.event_count > cursor or info.damage is not None:
            # Damaged: read once more, to deliver what precedes the damage and let the read's
            # error drop it from the stream (with a warning) rather than stat it forever.
            grown.add(session_id)
        if info.damage is None:
            marks[session_id] = _mark(info)
    return grown, marks


def _mark(info: LogInfo) -> Mark:
    # A stat's event count is what the revision's bytes hold: past a torn tail (a write in
    # flight) the size is no record boundary, and a read from it fails over to a whole read.
    return int(info.revision.size), int(info.event_count)


async def wait_for_change(deadline: float, watch: LogWatch | None, followed_changed: trio.Event) -> bool:
    """Until the watch says a followed log changed or the `deadline` (trio time) passes: True,
    look now; or until the set of followed sessions changed: False, the caller watches the
    new ones too and waits on (a session that joins was just read: nothing to look at)."""
    joined = False
    with trio.move_on_at(deadline):
        async with trio.open_nursery() as nursery:
            if watch is not None and watch.vouches:
                nursery.start_soon(_readable, watch, nursery.cancel_scope)

            async def on_join() -> None:
                nonlocal joined
                await followed_changed.wait()
                joined = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(on_join)
    return not joined


async def _readable(watch: LogWatch, done: trio.CancelScope) -> None:
    while not watch.clear():
        await trio.lowlevel.wait_readable(watch.fileno())
    done.cancel()
