"""Settlement of continuable children: the durable `subagent/settled` record, its notice, and the
notices redelivered on resume (docs/design.md, "Subagents: activations and settlement").

A child is settled when its agent is idle with an empty inbox and no resident children of its
own (the Activation body of residency.py decides that). Settlement then appends `subagent/settled` to
the parent, durably, and only after that delivers the notice: steered into a running parent,
starting a turn in an idle one. While the family is stopping (a drain, or the parent being
released) the notice is not delivered: the durable record waits for the parent's next resume,
where every own-suffix `subagent/settled` no notice references is delivered again, first.

Settled once: each settlement carries the key of the child's run it settles (`run_key`), and a
parent records one settlement per key (settled_keys.py): a second settlement of the same run —
another host that claimed the same work — is dropped, with no notice. A settlement that comes
through the parent's mailbox (its child ran in another process) is recorded, like a local one,
only while the parent is quiet, so it never lands amid one of the parent's steps.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import attrs
import trio
from subagents.actors import Activation, ContinuationManager, EventDraft
from subagents.storage import Event, Mailbox, StorageError, decode_payload

from ..agent.inbox import Delivery
from ..agent.loop import Agent
from ..agent.mailbox_owner import new_envelope
from ..agent.registry import AgentRegistry
from ..query import SessionQuery
from .settled_keys import SettledKeys, agent_run_key
from .stopped_tree import tree_stop_reason

__all__ = ["Settlement", "notice_blocks", "settled_pending"]

log = logging.getLogger(__name__)

Json = dict[str, Any]

# A settlement posted to a parent's mailbox is tried this many times, waiting 0.5 s, 1 s, 2 s, …
_POST_ATTEMPTS = 5
_POST_FIRST_DELAY = 0.5

_SUMMARIES = {
    "completed": "finished and will do no further work unless you send it more.",
    "aborted": "was stopped before it finished.",
    "max-tokens": "ran out of room before it finished.",
    "error": "failed before it finished.",
}


def notice_blocks(
    child_id: str, reason_kind: str, closing_text: str | None, reason_message: str | None = None
) -> list[Json]:
    """The content blocks of the notice a parent is given when `child_id` settles; a budget stop
    names the budget that ran out (`reason_message`, the child's `turn/end` reason message), a
    failure its reason when it has one (a placed child no serving host could run).

    The notice is described in docs/design.md, "Subagents: activations and settlement"."""
    if reason_kind == "budget":
        tail = "ran out of its budget before it finished" + (f" ({reason_message})." if reason_message else ".")
    elif reason_kind == "error" and reason_message:
        tail = f"failed before it finished ({reason_message})."  # e.g. no serving host could run it
    elif reason_kind == "aborted" and reason_message:
        tail = f"was stopped before it finished, {reason_message}."  # a tree stop names its descendants
    else:
        tail = _SUMMARIES.get(reason_kind, f"ended abnormally ({reason_kind}) before it finished.")
    blocks = [{"type": "text", "text": f"Background subagent {child_id} {tail}"}]
    if closing_text is None:
        blocks.append({"type": "text", "text": "It left no closing message."})
    else:
        blocks += [{"type": "text", "text": "Its closing message:"}, {"type": "text", "text": closing_text}]
    return blocks


def settled_pending(events: Sequence[Event], inherited_event_count: int) -> list[int]:
    """Seqs of own-suffix `subagent/settled` records no own-suffix notice references."""
    referenced: set[int] = set()
    settled: list[int] = []
    for event in events[inherited_event_count:]:
        if event.type == "subagent/settled":
            settled.append(event.seq)
        elif event.type == "user/message" and isinstance(event.source_event_seqs, list):
            referenced.update(event.source_event_seqs)
    return [s for s in settled if s not in referenced]


@attrs.define(eq=False)
class Settlement:
    """Records settlements in the parent's log and delivers their notices."""

    agents: AgentRegistry
    manager: ContinuationManager
    # Where a settlement goes when its parent is not live here (hosted by another process, or
    # by none): the parent's mailbox, drained by its owner (runtime/agent/mailbox_owner.py).
    mailbox: Mailbox | None = None
    _disposing: set[str] = attrs.field(factory=set)  # sessions being released: no notices into them
    _gates: dict[str, trio.CancelScope] = attrs.field(factory=dict)  # child id → its settlement's wait
    _undelivered: set[str] = attrs.field(factory=set)  # children whose settlement `post` could not deliver
    keys: SettledKeys = attrs.field(factory=SettledKeys)  # the run keys each parent records
    # Reads the stopped descendants a tree stop's notice names (none without it).
    query: SessionQuery | None = None

    @contextmanager
    def disposing(self, session_id: str) -> Iterator[None]:
        """While a session is being released: settlements of its children are recorded, not
        delivered (and none waits for it to be quiet)."""
        self._disposing.add(session_id)
        try:
            yield
        finally:
            self._disposing.discard(session_id)

    def open_gate(self, child_id: str) -> None:
        """Let a settlement that waits for its parent to be quiet go on: its family is stopping."""
        gate = self._gates.get(child_id)
        if gate is not None:
            gate.cancel()

    async def wait_parent_quiet(self, activation: Activation) -> bool:
        """Hold a settlement until its live parent is quiet (waiting on its model, or between
        turns), so `subagent/settled` never lands amid the parent's own step writes: where it
        lands — and which step claims its notice — then follows the parent's order, not the
        child's speed. Not while the family is being stopped (drain or disposal cancel the
        wait). True when it waited."""
        parent = self.agents.get(activation.parent_id)
        if (
            parent is None
            or parent.quiet
            or activation.cause is not None
            or self.manager.draining
            or activation.parent_id in self._disposing
        ):
            return False
        with trio.CancelScope() as gate:
            self._gates[activation.child_id] = gate
            try:
                await parent.wait_quiet()
            finally:
                del self._gates[activation.child_id]
        return True

    async def settle(self, activation: Activation, child: Agent) -> None:
        """Record the settlement of `child` in its parent's log, then deliver its notice (not
        while the family is stopping: the record is redelivered at the parent's next resume)."""
        if activation.cause is not None and child.status == "running":
            child.cancel(activation.cause)  # type: ignore[arg-type]  # one of the three causes
            with trio.move_on_after(self.manager.stop_grace):
                await child.wait_turn_closed()
        lost = child.session.ownership_lost
        if lost is not None:
            # Another host took the child over (this one was paused or cut off past its lease):
            # the settlement is the new owner's to make, never two of them.
            log.warning("subagent %s is not settled here: %s", activation.child_id, lost)
            return
        result = child.last_result
        if child.failure is not None:
            kind = "error"  # the agent stopped: its log could not be written
        else:
            kind = str(result.reason["kind"]) if result is not None else "aborted"
        closing = result.closing_text if result is not None and child.failure is None else None
        message = result.reason.get("message") if result is not None and kind == "budget" else None
        parent = self.agents.get(activation.parent_id)
        parent_ref = parent.session if parent is not None else self.agents.sessions.get(activation.parent_id)
        data: Json = {"child_id": activation.child_id, "reason_kind": kind}
        if closing is not None:
            data["closing_text"] = closing
        if isinstance(message, str):
            data["reason_message"] = message  # which budget ran out, for the notice (and its redelivery)
        elif kind == "aborted" and self.query is not None:
            detail = await tree_stop_reason(self.query, activation.child_id)
            if detail is not None:
                data["reason_message"] = detail  # the descendants stopped with it, named once
        run_key = agent_run_key(child)
        if run_key is not None:
            data["run_key"] = run_key
        if parent_ref is None:
            if not await self.post(activation.parent_id, activation.child_id, data):
                self._undelivered.add(activation.child_id)
            return
        if not self.keys.claim(parent_ref, run_key):
            log.info("subagent %s: its run %s is settled already: not recorded twice", activation.child_id, run_key)
            return
        try:
            appended = await parent_ref.append(
                [EventDraft(type="subagent/settled", data=data, time=self.agents.clock.now_ms())]
            )
        except BaseException as exc:
            self.keys.release(parent_ref, run_key)
            if not isinstance(exc, Exception):
                raise
            log.warning("could not record the settlement of %s: %s", activation.child_id, exc)
            return  # the child still lists as ready; only the notice is lost
        parent_activation = self.manager.get(activation.parent_id)
        if (
            parent is None
            or self.manager.draining
            or activation.parent_id in self._disposing
            or (parent_activation is not None and parent_activation.closing)
        ):
            return  # the durable record is delivered at the parent's next resume
        parent.inbox.put_nowait(
            Delivery(
                content=notice_blocks(activation.child_id, kind, closing, data.get("reason_message")),
                source={"kind": "subagent-settled", "sender_session_id": activation.child_id},
                source_event_seqs=[appended.first_seq],
                trigger="notice",
            ),
            "steer",
            force=True,
        )

    async def post(self, parent_id: str, child_id: str, data: Json) -> bool:
        """Leave a settlement in the mailbox of a parent that is not live here, where its owner —
        in another process, or whichever host resumes it next — records it. A failed delivery is
        tried again (the same envelope: its delivery id makes a repeat harmless); False when it
        never went through (the caller must not let the child go as settled)."""
        if self.mailbox is None:
            log.warning("subagent %s settled but its parent %s is not live: the notice is lost", child_id, parent_id)
            return True  # nowhere to send it, now or later
        envelope = new_envelope(self.mailbox, "settled", data, sender=child_id)
        delay = _POST_FIRST_DELAY
        for attempt in range(1, _POST_ATTEMPTS + 1):
            try:
                await trio.to_thread.run_sync(self.mailbox.deliver, parent_id, envelope)
                break
            except StorageError as exc:
                log.warning(
                    "could not post the settlement of %s to its parent's mailbox (try %d): %s", child_id, attempt, exc
                )
            if attempt == _POST_ATTEMPTS:
                return False
            await trio.sleep(delay)
            delay *= 2
        return True

    def take_undelivered(self, child_id: str) -> bool:
        """Whether the last settlement of `child_id` never reached its parent's mailbox (asked
        once: the placement of such a child is given back, so it is settled again)."""
        if child_id in self._undelivered:
            self._undelivered.discard(child_id)
            return True
        return False

    async def record_delivered(self, parent: Agent, body: Json, delivery_id: str) -> None:
        """A `settled` delivery from the parent's mailbox: once the parent is quiet (as a local
        settlement waits, `wait_parent_quiet`), append `subagent/settled` with its `delivery_id`
        (durably), then deliver the notice as `settle` does. A settlement of a run the parent
        records already is dropped (returns with nothing written: its envelope is acked).
        `ValueError` for a body that is not a settlement."""
        child_id, kind = body.get("child_id"), body.get("reason_kind")
        if not isinstance(child_id, str) or not isinstance(kind, str):
            raise ValueError('a settled body needs string "child_id" and "reason_kind"')
        run_key = body.get("run_key")
        if run_key is not None and not isinstance(run_key, str):
            raise ValueError('a settled body\'s "run_key" must be a string')
        data: Json = {"child_id": child_id, "reason_kind": kind, "delivery_id": delivery_id}
        for key in ("closing_text", "reason_message", "run_key"):
            if isinstance(body.get(key), str):
                data[key] = body[key]
        # Never amid the parent's own step writes (a settlement mid-step lands between a step's
        # catalog events and its tool results): the same rule as a local settlement's.
        while not (parent.quiet or self.manager.draining or parent.session_id in self._disposing):
            await parent.wait_quiet()
        if not self.keys.claim(parent.session, run_key):
            log.info("subagent %s: its run %s is settled already: delivery %s dropped", child_id, run_key, delivery_id)
            return
        try:
            appended = await parent.session.append(
                [EventDraft(type="subagent/settled", data=data, time=self.agents.clock.now_ms())]
            )
        except BaseException:
            self.keys.release(parent.session, run_key)
            raise
        parent.note_recorded(delivery_id)
        if self.manager.draining or parent.session_id in self._disposing:
            return  # the durable record is delivered at the parent's next resume
        parent.inbox.put_nowait(
            Delivery(
                content=notice_blocks(child_id, kind, data.get("closing_text"), data.get("reason_message")),
                source={"kind": "subagent-settled", "sender_session_id": child_id},
                source_event_seqs=[appended.first_seq],
                trigger="notice",
            ),
            "steer",
            force=True,
        )

    def redeliver_notices(self, agent: Agent, events: list[Event]) -> None:
        """On resume: every own-suffix `subagent/settled` that no own-suffix notice references
        is delivered again, in one first turn (`trigger: resume`). The run keys the log records
        are kept for `settle` and `record_delivered` (settled once)."""
        self.keys.load(agent.session, events)
        pending = [events[seq] for seq in settled_pending(events, agent.session.inherited_event_count)]
        for i, event in enumerate(pending):
            data = decode_payload(event, session_id=agent.session_id)
            closing = data.closing_text if isinstance(data.closing_text, str) else None
            message = data.reason_message if isinstance(data.reason_message, str) else None
            delivery = Delivery(
                content=notice_blocks(data.child_id, data.reason_kind, closing, message),
                source={"kind": "subagent-settled", "sender_session_id": data.child_id},
                source_event_seqs=[event.seq],
                trigger="resume",
            )
            agent.inbox.put_nowait(delivery, "follow-up" if i == len(pending) - 1 else "inject", force=True)
