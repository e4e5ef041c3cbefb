"""The event stream: every durable event of a session and its descendants (SPEC §8).

Theory of operation. A stream tracks a tree of sessions: the root, and every session an own
`subagent/catalog` event of a tracked session names (`seq >= inherited_event_count`: a fork's
inherited catalogs name its parent's children, not its own), children that start while it runs
included. Per session it keeps a *cursor*, the next seq to deliver, so each event is delivered
once and in seq order per session, whatever way it arrived. Events arrive two ways:

- pushed by the session store's `DurableFeed` right after their fsync (the fast path);
- read from the log, through the session query (`SessionQuery.read_from`, a few reads at a
  time): a session's first read when it joins the tree (so a child whose first
  events were written before its catalog loses nothing), a gap before a pushed batch, a
  session whose pushes were dropped because this stream's feed buffer was full (*lagged*),
  and a session not live in this runtime whose log grew (*followed*: run by another process
  on the same folder, placed on another host, or released here; runtime/log_follow.py).
  A read of a session live in this runtime is cut at its actor's durable end (its handle
  advances only after the fsync), so no read can show an event that is not yet durable; a
  session live elsewhere is read as far as its writer's complete records go (a store's reads
  never show a torn tail; another writer's append is acknowledged only after its fsync).

`from_seq` says where the root starts: 0 delivers its whole log and every child's from seq 0,
so a subscriber that asks from 0 misses nothing however late it subscribes. With a later
`from_seq`, the root's earlier events are read only to find its existing children (their
catalogs are history), whose deliveries start at their durable end when the stream reads them.

Followed sessions: one follower task per stream looks at every tracked session not live here
(one stat of each, in one index hop) each `follow_interval` seconds, or at once when the file
store's change notification says a followed log changed; a log past the stream's cursor is
marked *grown* and the pump reads it (the follower never delivers: the pump alone moves the
cursors, so order and exactly-once hold as for the other ways). `finish` looks at them once
more, so what another process made durable before it is delivered too.

Bounds: the feed subscription buffers at most `feed_capacity` events; delivery to the consumer
goes through a memory channel of `buffer` items. A slow consumer blocks only this stream's pump
(backpressure); the pump's feed buffer then overflows into lagged sessions, re-read from the log
later — the runtime never waits for a stream and the stream never loses a durable event. The
pump and follower tasks are owned by the nursery `open_event_stream` opens.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager

import attrs
import msgspec
import trio
from subagents.actors import DurableBatch, FeedSubscription
from subagents.storage import Event, LogWatch, SessionNotFound, StorageError

from .foundation.json_values import JsonObject
from .log_follow import DEFAULT_FOLLOW_INTERVAL, Mark, check_interval, look, wait_for_change
from .query import SessionQuery

__all__ = ["EventStream", "StreamEvent", "open_event_stream"]

log = logging.getLogger(__name__)

CATALOG_TYPE = "subagent/catalog"
_encode = msgspec.json.Encoder().encode


@attrs.frozen
class StreamEvent:
    """One durable event of one session: the log record plus its session id (and, not in the
    record, the session's inherited cut: `event.seq < inherited_event_count` is a fork's copy
    of its parent's event)."""

    session_id: str
    event: Event
    inherited_event_count: int = 0

    def json_bytes(self) -> bytes:
        """`{"session_id": ..., "seq", "type", "time", "data", ...}` as one JSON object
        (the log record's optional keys, such as `surface_op`, included as stored)."""
        return b'{"session_id":' + _encode(self.session_id) + b"," + _encode(self.event)[1:]

    def to_json(self) -> JsonObject:
        """The record as plain JSON values."""
        value: JsonObject = msgspec.json.decode(self.json_bytes())
        return value


@attrs.define(eq=False)
class _Tracked:
    start: int | None  # deliver seqs >= start; None: history, set to its end by the first read
    cursor: int = 0  # the next seq to look at
    inherited: int = 0
    read: bool = False  # its first read from the log is done
    broken: bool = False  # its log could not be read: no longer followed
    mark: Mark | None = None  # a boundary of its log at or before the cursor (a stat proved it)
    seen: Mark | None = None  # the boundary its last stat proved: its mark once the cursor is past it

    def promote(self) -> None:
        if self.seen is not None and self.seen[1] <= self.cursor:  # a cursor only moves on
            self.mark = self.seen


class EventStream:
    """An async iterable of `StreamEvent`s; see the module docstring."""

    def __init__(
        self, receive: trio.MemoryReceiveChannel[StreamEvent], finish: Callable[[], None], started: trio.Event
    ) -> None:
        self._receive = receive
        self._finish = finish
        self._started = started

    async def wait_started(self) -> None:
        """Until the logs of the sessions tracked at the start (the root's, and those of the
        children its history names, and theirs) have been read once: an event appended to any
        of them after this returns is delivered (one appended before may count as history)."""
        await self._started.wait()

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self._receive.__aiter__()

    async def receive(self) -> StreamEvent:
        """The next event; `trio.EndOfChannel` after `finish` once everything is delivered."""
        return await self._receive.receive()

    def receive_nowait(self) -> StreamEvent:
        """The next event already delivered; `trio.WouldBlock` if there is none yet."""
        return self._receive.receive_nowait()

    def finish(self) -> None:
        """End the stream once every event durable by now has been delivered (iteration then
        stops); the stream goes on delivering until then."""
        self._finish()


class _Pump:
    def __init__(
        self,
        query: SessionQuery,
        subscription: FeedSubscription,
        send: trio.MemorySendChannel[StreamEvent],
        finish: trio.Event,
        inherited: bool = True,
        descendants: bool = True,
        follow_interval: float = DEFAULT_FOLLOW_INTERVAL,
        on_broken: Callable[[str, StorageError], None] | None = None,
    ) -> None:
        self.on_broken = on_broken
        self.follow_interval = follow_interval
        self.inherited = inherited
        self.descendants = descendants
        self.query = query
        self.sessions = sessions = query.sessions
        self.subscription = subscription
        self.send = send
        self.finish = finish
        self.tracked: dict[str, _Tracked] = {}
        # The durable end of every session live when the subscription started (taken with no
        # checkpoint in between, so every later push is at or past it).
        self.live_ends: dict[str, int] = {ref.session_id: int(ref.durable_next) for ref in sessions.list()}
        self.unread: list[str] = []  # tracked sessions waiting for their first read
        self.grown: set[str] = set()  # followed sessions whose log grew: the pump reads them
        self.looked_last = False  # `finish` looked at the followed sessions once more
        self.followed_changed = trio.Event()  # a session joined the followed ones: watch it too
        self.started = trio.Event()  # the sessions tracked at the start have been read once

    def boundary(self, session_id: str, read_end: int) -> int:
        """The first seq made durable after the subscription started: the end a live session
        had then, or the end it had when it was made live since, or (never live here since:
        nothing was appended) the end of the log read now."""
        end = self.live_ends.get(session_id)
        if end is None:
            end = self.subscription.opened.get(session_id)
        return read_end if end is None else min(end, read_end)

    def track(self, session_id: str, start: int | None) -> None:
        if session_id not in self.tracked:
            self.tracked[session_id] = _Tracked(start)
            self.unread.append(session_id)

    async def run(self) -> None:
        async with self.send:
            while True:
                await self.read_unread()
                self.started.set()
                batches, lagged = self.subscription.take()
                for batch in batches:
                    await self.on_batch(batch)
                for session_id in sorted(lagged):
                    if session_id in self.tracked:
                        await self.catch_up(session_id)
                grown, self.grown = self.grown, set()
                for session_id in sorted(grown):
                    await self.catch_up(session_id)
                if batches or lagged or self.unread or grown:
                    continue
                if self.finish.is_set():
                    if not self.looked_last:
                        # What other processes made durable before `finish` is due too.
                        self.looked_last = True
                        await self.look()
                        continue
                    return  # everything durable before `finish` has been delivered
                await self.subscription.wait_pushed()

    async def follow(self) -> None:
        """Look at the followed sessions' logs until cancelled (the module docstring)."""
        # Opened once there is something to follow: inotify instances are a small per-user
        # budget (128 by default), and a stream whose sessions all live here needs none.
        watch: LogWatch | None = None
        opened = False

        def watch_only(followed: Collection[str]) -> None:
            nonlocal watch, opened
            if followed and not opened:
                opened, watch = True, self.query.log_watch()
            if watch is not None:
                watch.follow(followed)

        try:
            while True:
                self.followed_changed = trio.Event()
                followed = self.followed()
                watch_only(followed)
                await self.look(followed)
                deadline = trio.current_time() + self.follow_interval
                while True:
                    if await wait_for_change(deadline, watch, self.followed_changed):
                        break
                    # Sessions joined: watched from now on, and looked at once (what they
                    # wrote between their read and their watch raised nothing).
                    self.followed_changed = trio.Event()
                    now = self.followed()
                    watch_only(now)
                    await self.look({s: c for s, c in now.items() if s not in followed})
                    followed = now
        finally:
            if watch is not None:
                watch.close()

    def followed(self) -> dict[str, int | None]:
        """The tracked sessions no feed pushes: not live here, not waiting for a first read,
        not broken; each with its cursor (None: its log was not found yet)."""
        live = self.sessions.get
        return {
            session_id: tracked.cursor if tracked.read else None
            for session_id, tracked in self.tracked.items()
            if not tracked.broken and session_id not in self.unread and live(session_id) is None
        }

    async def look(self, followed: dict[str, int | None] | None = None) -> None:
        """Stat the followed sessions (all, or those of `followed`) and mark those that grew."""
        grown, marks = await look(self.query, self.followed() if followed is None else followed)
        for session_id, mark in marks.items():
            tracked = self.tracked[session_id]
            tracked.seen = mark
            tracked.promote()
        if grown:
            self.grown |= grown
            self.subscription.wake()

    async def read_unread(self) -> None:
        while self.unread:
            await self.catch_up(self.unread[0])  # left in `unread` (not followed) until read

    async def on_batch(self, batch: DurableBatch) -> None:
        tracked = self.tracked.get(batch.session_id)
        if tracked is None or tracked.broken:
            return  # not in the tree (yet: joining it reads the log)
        if not tracked.read or batch.events[0].seq > tracked.cursor:
            await self.catch_up(batch.session_id)  # its first read, or a gap a dropped push left
        tracked.inherited = batch.inherited_event_count
        await self.deliver(batch.session_id, tracked, batch.events)

    async def catch_up(self, session_id: str) -> None:
        """Read the session's durable events from its cursor and deliver them."""
        tracked = self.tracked[session_id]
        try:
            if tracked.broken:
                return
            inherited, events = await self.query.read_from(session_id, tracked.cursor, after=tracked.mark)
        except SessionNotFound:
            inherited, events = None, []  # not published yet: its first push (or a look) brings it
        except StorageError as exc:
            log.warning("event stream: session %r cannot be read, no longer followed: %s", session_id, exc)
            tracked.broken = True
            if self.on_broken is not None:
                self.on_broken(session_id, exc)
            return
        finally:
            if session_id in self.unread:
                self.unread.remove(session_id)
        ref = self.sessions.get(session_id)
        if ref is not None:
            # Live here: bytes past its durable end may be a write whose fsync is not done.
            durable_next = ref.durable_next
            events = [e for e in events if e.seq < durable_next]
        if inherited is not None:
            tracked.inherited = inherited
            if not tracked.read:
                tracked.read = True
                self.followed_changed.set()
                if tracked.start is None:  # history: deliver what came after the subscription
                    tracked.start = self.boundary(session_id, tracked.cursor + len(events))
        await self.deliver(session_id, tracked, events)
        tracked.promote()

    async def deliver(self, session_id: str, tracked: _Tracked, events: Sequence[Event]) -> None:
        for event in events:
            if event.seq < tracked.cursor:
                continue  # delivered already (read and pushed both)
            if event.seq > tracked.cursor:
                return  # a gap: the next push or read fills it from the cursor
            shown = (
                tracked.start is not None
                and event.seq >= tracked.start
                and (self.inherited or event.seq >= tracked.inherited)
            )
            if self.descendants and event.type == CATALOG_TYPE and event.seq >= tracked.inherited:
                child = _catalog_child(event)
                if child is not None:
                    # A catalog delivered now names a new child (all of it is delivered); one in
                    # the history names an existing child (only what it does next is).
                    self.track(child, 0 if shown else None)
            tracked.cursor = event.seq + 1
            if shown:
                await self.send.send(StreamEvent(session_id, event, tracked.inherited))


def _catalog_child(event: Event) -> str | None:
    try:
        data = msgspec.json.decode(event.data)
    except msgspec.DecodeError:
        return None
    child = data.get("child_id") if isinstance(data, dict) else None
    return child if isinstance(child, str) and child else None


@asynccontextmanager
async def open_event_stream(
    query: SessionQuery,
    root_id: str,
    *,
    from_seq: int = 0,
    buffer: int = 256,
    feed_capacity: int = 4096,
    inherited: bool = True,
    descendants: bool = True,
    follow_interval: float = DEFAULT_FOLLOW_INTERVAL,
    known: Mapping[str, Mark] | None = None,
    on_broken: Callable[[str, StorageError], None] | None = None,
) -> AsyncIterator[EventStream]:
    """Stream the durable events of `root_id` (from `from_seq`) and of its descendants (SPEC
    §8), read through `query` (the runtime's: `runtime.query`) and pushed by its session store's
    feed. `buffer`: items waiting for the consumer; `feed_capacity`: pushed events waiting for
    the pump before its sessions are re-read from the log. `inherited=False` leaves out a
    fork's inherited prefix (its seqs below `inherited_event_count`: copies of its parent's
    events), so a forked session starts at its `session/end-seed` marker. `descendants=False`
    follows the root alone (its children's logs are never read). `follow_interval`: seconds
    between two looks at the logs of tracked sessions not live in this runtime (where no change
    notification wakes it sooner). `known`: sessions of the tree, each with a record boundary
    of its log (`(log size, event count)`, as a listing's record has it), followed from that
    end on: only the bytes past it are read and its history is not (the root's too, whatever
    `from_seq`; so the children its history names must be among them — the web console's tree
    feed gives the root and its listed descendants). `on_broken(session_id, error)` is called
    (in the pump's task, after every event read before it was delivered) when a tracked
    session's log cannot be read any more and the stream stops following it. Leaving the block
    stops the stream."""
    if type(from_seq) is not int or from_seq < 0:
        raise ValueError(f"from_seq must be an int >= 0, got {from_seq!r}")
    follow_interval = check_interval(follow_interval)
    send, receive = trio.open_memory_channel[StreamEvent](buffer)
    finish = trio.Event()
    # Subscribed before the first read, so nothing durable after that read can be missed.
    with query.sessions.feed.subscribe(feed_capacity) as subscription:
        pump = _Pump(query, subscription, send, finish, inherited, descendants, follow_interval, on_broken)
        for session_id, (size, end) in (known or {}).items():
            pump.tracked[session_id] = _Tracked(end, cursor=end, mark=(size, end))
            pump.unread.append(session_id)
        pump.track(root_id, from_seq)

        def finish_stream() -> None:
            finish.set()
            subscription.wake()

        # The body's own error is re-raised after the nursery closes, unchanged rather than
        # wrapped in an ExceptionGroup.
        body_error: BaseException | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump.run)
            nursery.start_soon(pump.follow)
            try:
                yield EventStream(receive, finish_stream, pump.started)
            except BaseException as exc:  # re-raised bare once the pump's nursery has closed
                body_error = exc
            finally:
                nursery.cancel_scope.cancel()
        if body_error is not None:
            raise body_error
