"""Stop means stop: the durable stopped marker and the stop of a whole tree (issue 27, item 5;
README, "Stopping a tree"; docs/format.md, `session/stopped`).

Theory of operation. A stopped session carries `session/stopped {by, tree, delivery_id?}` in its
own log. It stays stopped until a later *explicit* message — a `user/message` whose source is a
person (`user`) or another agent (`agent-message`; a parent's `send_message`, an operator's
`send`) — is recorded; notices, tool results, takeovers, sweeps and restarts never clear it
(`stopped`, a pure function of the events, decides). Every resume path asks it: a stopped
session is resumed only to record such a message (redelivered notices are left durable and
undelivered; see `StopHooks` for the call sites of the paths other parts own).

A tree stop walks the target's descendants (the corpus's lineage, `lineage.walk_descendants`)
and stops each wherever it is:

- live here: the marker is appended first (durable before anything else, so a crash right after
  still leaves it stopped), then its turn is cancelled and it is settled as any stopped child
  (its own children first: `ContinuationManager.stop`);
- held by another process or host: a `stop` envelope with `{tree: true, by}` goes to its mailbox;
  its owner there does the same (`SubagentService.stop_resident`), and this side waits (bounded)
  until the marker is in the log or the session was let go, then writes it itself if missing
  (an envelope judged stale by a host that took the session over meanwhile does nothing);
- nobody runs it: the marker is written cold — open, append (the interrupted turn's closers
  first, so nothing is left to continue), release — under the log's lock like every cold write.

The notice a stopped child's parent is given names every stopped descendant once
(`tree_notice_tail`).
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import Any, Literal

import attrs
import msgspec
import trio
from subagents.actors import ContinuationManager, EventDraft
from subagents.storage import (
    AlreadyOwned,
    Event,
    Mailbox,
    SessionNotFound,
    StorageError,
    interrupted_closers,
    is_explicit_message,
    stop_marker,
    stopped,
)

from ..agent.loop import Agent
from ..agent.registry import AgentRegistry
from ..foundation.errors import SubagentError
from ..query import SessionQuery
from .lineage import walk_descendants
from .residency import Residency
from .routing import Routing
from .stopped_tree import is_stopped, stopped_descendants, tree_notice_tail

__all__ = [
    "StopOutcome",
    "Stopping",
    "TreeStop",
    "is_explicit_message",
    "is_stopped",
    "stopped_descendants",
    "stop_marker",
    "stopped",
    "tree_notice_tail",
]

log = logging.getLogger(__name__)

Json = dict[str, Any]

# How long a tree stop waits for another process to record the marker of a session it runs,
# and how often it looks (no event crosses processes: the log is read again).
CONFIRM_TIMEOUT = 15.0
CONFIRM_POLL = 0.1

StopOutcome = Literal["live", "elsewhere", "cold", "already"]


def marker_data(by: str, tree: bool, delivery_id: str | None = None) -> Json:
    """The data of a `session/stopped` event (its append checks it against the payload struct)."""
    data: Json = {"by": by, "tree": tree}
    if delivery_id is not None:
        data["delivery_id"] = delivery_id
    return data


@attrs.frozen
class TreeStop:
    """What a tree stop did: every session of the tree in pre-order (the target first), how each
    was reached, and the ones whose marker could not be confirmed (`unconfirmed`)."""

    target: str
    sessions: tuple[tuple[str, StopOutcome], ...]
    unconfirmed: tuple[str, ...] = ()

    @property
    def stopped(self) -> list[str]:
        """The sessions stopped now or before, marker durable."""
        return [sid for sid, _ in self.sessions if sid not in self.unconfirmed]

    @property
    def descendants(self) -> list[str]:
        return [sid for sid, _ in self.sessions[1:]]


@attrs.define(eq=False)
class Stopping:
    """Writes stopped markers and stops trees (see the module docstring)."""

    agents: AgentRegistry
    manager: ContinuationManager
    residency: Residency
    routing: Routing
    query: SessionQuery
    mailbox: Mailbox | None = None
    confirm_timeout: float = CONFIRM_TIMEOUT

    # --- the marker ----------------------------------------------------------------------------

    async def is_stopped(self, session_id: str) -> bool:
        """`is_stopped` through this runtime's session query."""
        return await is_stopped(self.query, session_id)

    async def mark_live(self, agent: Agent, data: Json) -> bool:
        """Append the marker to a session live here (durable when this returns); False when it
        was stopped already (one marker per stop), or its log can no longer be written here."""
        try:
            inherited, events = await self.query.read_from(agent.session_id, 0)
            if stopped(events, inherited):
                return False
            await agent.session.append([EventDraft(type="session/stopped", data=data, time=self.agents.clock.now_ms())])
        except StorageError as exc:
            log.warning("session %s: its stopped marker could not be written here: %s", agent.session_id, exc)
            return False
        return True

    async def mark_cold(self, session_id: str, data: Json) -> StopOutcome | None:
        """Write the marker into a session nobody runs: open it (its lock), append the closers
        of an interrupted last turn and the marker in one durable write, release. "already"
        when it was stopped; None when another process holds it now (the caller's to judge)."""
        if self.agents.sessions.get(session_id) is not None:
            return None  # open here after all (its agent is being started or stopped): not cold
        try:
            ref, events = await self.agents.sessions.open_with_events(session_id)
        except (AlreadyOwned, SessionNotFound):  # held elsewhere; or in its creation window
            return None
        try:
            if stopped(events, ref.inherited_event_count):
                return "already"
            drafts = [_as_draft(e) for e in interrupted_closers(events, session_id=session_id)]
            drafts.append(EventDraft(type="session/stopped", data=data, time=self.agents.clock.now_ms()))
            await ref.append(drafts, expected_seq=len(events))
            return "cold"
        finally:
            with trio.CancelScope(shield=True):
                await self.agents.sessions.release(session_id)

    # --- one delivery of `stop` ------------------------------------------------------------------

    async def mark_delivered(self, session_id: str, *, by: str, tree: bool, delivery_id: str) -> None:
        """A `stop` envelope reached this session's owner here, before its turn is ended: its
        marker (with the envelope's delivery id) — and with `tree`, the markers of what runs
        below it here, which its stop takes down with it (`stop_delivered`)."""
        agent = self.agents.get(session_id)
        if agent is None:
            return
        await self.mark_live(agent, marker_data(by, tree, delivery_id))
        if tree:
            for child_id in self._resident_below(session_id):
                child = self.agents.get(child_id)
                if child is not None:
                    await self.mark_live(child, marker_data(by, True))

    async def stop_delivered(self, session_id: str, cause: str) -> None:
        """After a tree stop's delivery was recorded (`mark_delivered`) and its turn ended: stop
        and settle the session and what runs below it here, settlements among them recorded
        without starting a turn (`_stop_live_here`)."""
        await self._stop_live_here([session_id, *self._resident_below(session_id)], cause)

    def _resident_below(self, session_id: str) -> list[str]:
        return [cid for cid in self.manager.resident if session_id in self.manager.ancestors(cid)]

    async def tree_notice(self, child_id: str) -> str | None:
        """The notice tail of a child stopped with its tree (`tree_notice_tail` over
        `stopped_descendants`), or None when its marker is not a tree stop's."""
        below = await stopped_descendants(self.query, child_id)
        return None if below is None else tree_notice_tail(below)

    # --- a tree ----------------------------------------------------------------------------------

    async def subtree(self, root_id: str) -> list[str]:
        """`root_id` and its descendants, in pre-order: the corpus's lineage, and the children
        resident here that the corpus does not list yet (their creation window)."""
        corpus = await self.query.list_sessions()
        ids = [root_id] + [node.id for node, _parent, _depth in walk_descendants(corpus, root_id)]
        ids += [cid for cid in self._resident_below(root_id) if cid not in ids]
        return ids

    async def stop_tree(self, root_id: str, *, by: str, cause: str = "user") -> TreeStop:
        """Stop `root_id` and every descendant, wherever each runs (see the module docstring);
        the stop of each is durable (its marker) before this returns, or it is `unconfirmed`.

        Top-down, one session at a time: a session's stop takes down what its host runs below
        it (marked, then settled as records only), so a settlement never starts the turn of a
        parent not yet stopped; a descendant is stopped on its own only when no ancestor's stop
        reached it (another host runs it, or nobody does)."""
        ids = await self.subtree(root_id)
        data = marker_data(by, True)
        outcomes: dict[str, StopOutcome] = {}
        for sid in ids:
            if await self.is_stopped(sid):
                outcomes[sid] = "already"
        live = [sid for sid in ids if sid not in outcomes and self.agents.get(sid) is not None]
        for sid in live:  # every marker first: durable before any turn is cancelled
            agent = self.agents.get(sid)
            if agent is not None and await self.mark_live(agent, data):
                outcomes[sid] = "live"
        await self._stop_live_here(live, cause)
        unconfirmed: list[str] = []
        sender = None if by == "operator" else by
        for sid in ids:
            if sid in outcomes:
                continue
            if await self.is_stopped(sid):
                outcomes[sid] = "elsewhere"  # its ancestor's host stopped it with its own tree
                continue
            if await self.routing.held_elsewhere(sid) is None:
                cold = await self.mark_cold(sid, data)
                if cold is not None:
                    outcomes[sid] = cold
                    continue
                if self.manager.get(sid) is not None or self.agents.sessions.get(sid) is not None:
                    # Starting or stopping here right now (its creation window, its disposal):
                    # nothing to append to yet; said, never guessed.
                    outcomes[sid] = "live"
                    unconfirmed.append(sid)
                    continue
            # Run by another process or host (or taken by one meanwhile): its owner there stops
            # it and what runs below it there; the next session waits for that.
            outcomes[sid] = "elsewhere"
            if self.mailbox is None:
                unconfirmed.append(sid)  # no road to another process's sessions here
                continue
            try:
                await self.routing.post(sid, "stop", {"tree": True, "by": by}, sender)
            except SubagentError as exc:  # its mailbox failed: said, and the others go on
                log.warning("session %s: its stop could not be delivered: %s", sid, exc)
                unconfirmed.append(sid)
                continue
            unconfirmed += await self._confirm([sid], data)
        return TreeStop(root_id, tuple((sid, outcomes[sid]) for sid in ids), tuple(unconfirmed))

    async def _stop_live_here(self, ids: list[str], cause: str) -> None:
        """End the turns of the tree's sessions live here and settle them: the top-most resident
        children through the continuation manager (their own children first), the rest — a
        root, a one-shot child — by cancelling their turn. Meanwhile every member takes
        settlements as records only (`Settlement.disposing`): a notice must not start the turn
        of a session being stopped."""
        live = [sid for sid in ids if self.agents.get(sid) is not None]
        resident = {sid for sid in live if self.manager.get(sid) is not None}
        with ExitStack() as disposing:
            for sid in live:
                disposing.enter_context(self.residency.settlement.disposing(sid))
            for sid in live:
                agent = self.agents.get(sid)
                if agent is not None and sid not in resident and agent.status == "running":
                    agent.inbox.park()
                    agent.cancel(cause)  # type: ignore[arg-type]  # "user" or "parent"
            for sid in live:
                activation = self.manager.get(sid)
                if sid in resident and activation is not None and activation.parent_id not in resident:
                    await self.residency.stop_resident(sid, cause)  # its resident children first

    async def _confirm(self, remote: list[str], data: Json) -> list[str]:
        # (a list, for a caller that posts several before it waits)
        """Until each session stopped through its mailbox has its marker, or was let go (then it
        is written cold here); the ones still held without a marker at the timeout."""
        waiting = list(remote)
        with trio.move_on_after(self.confirm_timeout):
            while waiting:
                still = []
                for sid in waiting:
                    if await self.is_stopped(sid):
                        continue
                    if await self.routing.held_elsewhere(sid) is None and await self.mark_cold(sid, data) is not None:
                        continue
                    still.append(sid)
                waiting = still
                if waiting:
                    await trio.sleep(CONFIRM_POLL)  # another process's write raises nothing here
        for sid in waiting:
            log.warning("session %s: its stop was delivered, but its marker is not written yet", sid)
        return waiting


def _as_draft(event: Event) -> EventDraft:
    return EventDraft(
        type=event.type,
        data=msgspec.json.decode(event.data),
        time=event.time,
        ignorable=event.ignorable is True,
        surface_op=None if event.surface_op is msgspec.UNSET else event.surface_op,
        source_event_seqs=None if event.source_event_seqs is msgspec.UNSET else list(event.source_event_seqs),
    )
