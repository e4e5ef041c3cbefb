"""The durable feed: who hears of a session's events once they are durable (SPEC §8, "Event
stream").

Theory of operation. The session store owns one `DurableFeed`; each of its actors calls
`publish` right after a group commit's fsync, in the same synchronous stretch as the acks (so
an ask that has been answered has always been published too). `publish` never blocks and never
raises: it appends the batch to every subscription's buffer. A buffer is bounded (in events):
a batch that would overflow it is dropped and its session marked *lagged* — the subscriber then
reads the log for that session, which holds every durable event. So a slow subscriber never
slows an actor, its memory stays bounded, and it loses nothing.

An *observer* (`add_observer`) is the synchronous form, for a fold that keeps only a little state
(counts, a few labels): it is called with each batch inside `publish`, so it must be quick and
must not raise (a raise is logged by the actor); it holds no buffer and so never lags. It stays
for the life of the feed (that is, of its session store) unless removed.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager

import attrs
import trio
from subagents.storage import Event

__all__ = ["DurableBatch", "DurableFeed", "FeedObserver", "FeedSubscription"]


@attrs.frozen(kw_only=True)
class DurableBatch:
    """Consecutive events of one session, durable (fsynced) when published."""

    session_id: str
    inherited_event_count: int
    events: tuple[Event, ...]


# Called with every published batch, in the publishing actor's synchronous stretch.
FeedObserver = Callable[[DurableBatch], None]


class FeedSubscription:
    """One subscriber's bounded buffer of durable batches, and the sessions it lost pushes of."""

    def __init__(self, capacity: int) -> None:
        if type(capacity) is not int or capacity < 1:
            raise ValueError(f"a feed subscription's capacity must be an int >= 1, got {capacity!r}")
        self.capacity = capacity
        self._batches: list[DurableBatch] = []
        self._held = 0  # events buffered
        self._lagged: set[str] = set()
        self._changed = trio.Event()
        # Where each session made live since the subscription started was then (its durable
        # end): the boundary of "what came after" for a session that was not live before.
        self.opened: dict[str, int] = {}

    def push(self, batch: DurableBatch) -> None:
        """Buffer `batch`, or drop it and mark its session lagged when the buffer is full."""
        if self._held + len(batch.events) > self.capacity:
            self._lagged.add(batch.session_id)
        else:
            self._batches.append(batch)
            self._held += len(batch.events)
        self._changed.set()

    def take(self) -> tuple[list[DurableBatch], set[str]]:
        """Everything buffered (in publication order) and the lagged sessions; both emptied."""
        batches, lagged = self._batches, self._lagged
        self._batches, self._lagged, self._held = [], set(), 0
        if self._changed.is_set():
            self._changed = trio.Event()
        return batches, lagged

    def wake(self) -> None:
        """Wake a `wait_pushed` (the subscriber has something else to look at)."""
        self._changed.set()

    async def wait_pushed(self) -> None:
        """Until something was pushed (or `wake`) since the last `take`."""
        await self._changed.wait()


class DurableFeed:
    """The subscriptions of one session store (no module state)."""

    def __init__(self) -> None:
        self._subscriptions: list[FeedSubscription] = []
        self._observers: list[FeedObserver] = []

    def opened(self, session_id: str, durable_next: int) -> None:
        """Called by the session store when a session becomes live (its durable end then)."""
        for subscription in self._subscriptions:
            subscription.opened.setdefault(session_id, durable_next)

    def publish(self, session_id: str, inherited_event_count: int, events: Sequence[Event]) -> None:
        """Called by an actor once `events` are durable; never blocks."""
        if not events or not (self._subscriptions or self._observers):
            return
        batch = DurableBatch(session_id=session_id, inherited_event_count=inherited_event_count, events=tuple(events))
        for subscription in self._subscriptions:
            subscription.push(batch)
        for observer in self._observers:
            observer(batch)

    def add_observer(self, observer: FeedObserver) -> None:
        """Call `observer` with every batch published from now on (see the module docstring)."""
        self._observers.append(observer)

    def remove_observer(self, observer: FeedObserver) -> None:
        """Stop calling `observer` (`ValueError` if it was not added)."""
        self._observers.remove(observer)

    @contextmanager
    def subscribe(self, capacity: int = 4096) -> Generator[FeedSubscription]:
        """A subscription for the length of the block (`capacity`: events it buffers)."""
        subscription = FeedSubscription(capacity)
        self._subscriptions.append(subscription)
        try:
            yield subscription
        finally:
            self._subscriptions.remove(subscription)
