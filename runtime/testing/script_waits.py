"""What a scripted `wait_for` holds on (docs/scripts.md): `ScriptWaits`, and the waits the
scripted model derives from what the runtime publishes of a session (`SessionWaits`).

Nothing here is a hook in the runtime. `steered` reads the session's published inbox counts
(`received_in_turn`) and wakes on its change notification. `settled` reads a `SettledTally`: per
session, the `subagent/settled` records of its own log, per child, and the labels its
`subagent/catalog` records give those children. The tally is seeded from the events the log held
when the session was bound (the top-up of a resume: a count only grows to the log's, so what this
process counted already is not counted twice) and follows the store's durable feed through an
observer, which the feed calls in the appending actor's synchronous stretch — the same stretch
that answers the append, so a hold is released as the settlement's own code goes on (it delivers
the notice before any checkpoint: the released call sees it in the inbox at its next step).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import Protocol

from subagents.actors import DurableBatch, DurableFeed
from subagents.storage import Event, StorageError, decode_payload
from trio_util import RepeatedEvent

from ..foundation.errors import ScriptWaitUnavailable
from ..models.base import SessionWaits

__all__ = ["PublishedWaits", "ScriptWaits", "SettledTally"]


class ScriptWaits(Protocol):
    """What a scripted response can hold on (`wait_for`)."""

    async def steered(self) -> None:
        """Return once this session's inbox has received a message (now or earlier in the turn)."""
        ...

    async def settled(self, child: str, count: int = 1) -> None:
        """Return once `count` `subagent/settled` records of the child named by label or id are
        durable in this session's log (those an earlier process recorded count too)."""
        ...


class SettledTally:
    """Settlements per parent session, as its own log holds them (see the module docstring)."""

    def __init__(self) -> None:
        self._counts: dict[str, dict[str, int]] = {}  # parent → child id → settled records
        self._labels: dict[str, dict[str, str]] = {}  # parent → child id → its catalog label
        self._observed: weakref.WeakSet[DurableFeed] = weakref.WeakSet()
        self._changed = RepeatedEvent()

    def observe(self, feed: DurableFeed) -> None:
        """Follow `feed` from now on (once per feed)."""
        if feed not in self._observed:
            feed.add_observer(self._on_batch)
            self._observed.add(feed)

    def seed(self, session_id: str, history: Sequence[Event], inherited_event_count: int) -> None:
        """Top the session's counts up to what its log held (`history`, own suffix only)."""
        logged: dict[str, int] = {}
        self._fold(session_id, (e for e in history[inherited_event_count:]), logged)
        if not logged:
            return
        counts = self._counts.setdefault(session_id, {})
        for child_id, n in logged.items():
            counts[child_id] = max(counts.get(child_id, 0), n)
        self._changed.set()

    def count(self, session_id: str, child: str) -> int:
        """Settled records of the child of `session_id` whose id or label is `child`."""
        labels = self._labels.get(session_id, {})
        return sum(n for cid, n in self._counts.get(session_id, {}).items() if child == cid or labels.get(cid) == child)

    async def wait(self, session_id: str, child: str, count: int = 1) -> None:
        """Until `count` settlements of that child are durable in the session's log."""
        while self.count(session_id, child) < count:
            await self._changed.wait()

    def _on_batch(self, batch: DurableBatch) -> None:
        own = (e for e in batch.events if e.seq >= batch.inherited_event_count)
        if self._fold(batch.session_id, own, self._counts.setdefault(batch.session_id, {})):
            self._changed.set()

    def _fold(self, session_id: str, events: Iterable[Event], counts: dict[str, int]) -> bool:
        """Count `events`' settlements into `counts` and note their catalog labels; True when a
        settlement was counted. Called from a feed observer, so it never raises: a payload that
        does not decode is left out (a log holding one is corrupt for every reader alike)."""
        settled = False
        for event in events:
            if event.type not in ("subagent/settled", "subagent/catalog"):
                continue
            try:
                data = decode_payload(event, session_id=session_id)
            except StorageError:
                continue
            if event.type == "subagent/catalog":
                if isinstance(data.label, str):
                    self._labels.setdefault(session_id, {})[data.child_id] = data.label
            else:
                counts[data.child_id] = counts.get(data.child_id, 0) + 1
                settled = True
        return settled


class PublishedWaits:
    """`ScriptWaits` of one session, derived from what the runtime publishes of it."""

    def __init__(self, session_id: str, published: SessionWaits, tally: SettledTally) -> None:
        self._session_id = session_id
        self._inbox = published.inbox
        self._feed = published.feed
        self._tally = tally

    async def steered(self) -> None:
        while self._inbox.statistics().received_in_turn == 0:
            await self._inbox.wait_changed()

    async def settled(self, child: str, count: int = 1) -> None:
        if self._feed is None:
            raise ScriptWaitUnavailable("wait_for settled needs the runtime's durable feed")
        await self._tally.wait(self._session_id, child, count)
