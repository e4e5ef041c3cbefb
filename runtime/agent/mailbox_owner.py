"""The owner's side of the durable mailbox: every resident session drains its own (SPEC §9;
docs/format.md, "The mailbox"; docs/design.md, "The mailbox: owners and routing").

Theory of operation. Each agent resident in a runtime (a root session, or a child) gets one
owner task, started with the agent and cancelled when it stops, in the registry's nursery. The
task watches the session's mailbox (the watch's fd, plus its poll interval where the kernel
cannot vouch for other processes' deliveries), drains it in delivery order and records each
delivery in the session's log, acknowledging it only once that record is durable:

- `message` becomes a steered input (`Delivery.delivery_id`), recorded by the `user/message`
  that carries its `delivery_id`; the agent reports that write after its fsync
  (`Agent.note_recorded`), and the owner acks then. Until then it is *pending*: a drain that sees
  it again does not hand it over twice.
- `interrupt` cancels the running turn (the agent's two-phase cancel) and is recorded by the
  `turn/end {aborted}` it causes: the owner acks once the turn is closed (that write is durable
  before the agent is idle again). With no turn running it is a no-op and acked at once. A
  message delivered before it is not parked (as an in-process `interrupt_agent` parks what is
  queued): it was delivered durably and must be recorded, so it starts the next turn and is
  answered — never left unrecorded in the mailbox with nothing to wake the agent.
- `stop` records the session's stopped marker first (`session/stopped`, issue 27), then ends the
  running turn the same way, and every turn that a message delivered before it starts, each as
  soon as it has recorded its input (no model answers it) — and, if it recorded any, the marker
  again (an explicit message after a marker clears it: the stop must stay in force). Then (a
  resident continuable child) it settles the child as the service's stop does
  (`subagent/settled` in its parent): the messages are in the child's log before its settlement.
- `settled` appends the `subagent/settled` (with the envelope's `delivery_id`) to this session
  — a parent whose child another process hosted — and delivers its notice (`Settlement`). It
  waits for the agent to be quiet (never amid its step's writes), in a task of its own, so the
  drain goes on meanwhile (an interrupt behind it is not held up); one of a run the log records
  already is dropped and acked (settled once, runtime/delegation/settled_keys.py).

Recorded once: the agent keeps the ids its log records (`Agent.recorded_deliveries`, folded from
its events when it starts and updated after each durable write); a redelivered id is acked and
dropped. An interrupt or stop records no id of its own; instead one whose `created_at` is older
than this owner is stale and is acked without effect: the turn it was meant for ran under an
earlier owner (a crash between the cancel and the ack, or a sender that saw the old host's lock),
and that turn was closed then or by the resume's closers. So a redelivered interrupt never
aborts a later turn. Sender and owner read one clock, the mailbox's (`Mailbox.now_ms`): the
wall clock the file form's processes share on one host, and on PostgreSQL the database's (each
host's wall clock plus its measured offset), so hosts whose clocks disagree judge alike.

A bad envelope never stops the owner: what the drain moved aside is a log line, a body this
runtime cannot use is a log line and an ack, and a storage error is a log line and a retry at
the next poll.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import trio
from subagents.actors import ActorStopped
from subagents.storage import Envelope, EnvelopeKind, Mailbox, MailboxWatch, StorageError
from trio_util import wait_any

from ..models.messages import text_blocks
from .inbox import Delivery
from .loop import Agent, Cause

__all__ = ["MailboxOwners", "OwnerActions", "message_content", "new_envelope"]

log = logging.getLogger(__name__)

Json = dict[str, Any]
RETRY_AFTER = 1.0  # seconds before an owner looks again after its mailbox could not be read
SETTLED_QUEUE = 16  # settlements an owner holds while its agent is not quiet (then the drain waits)
CLOSE_GRACE = 5.0  # seconds a stopping session's owner may spend acking what was recorded


def new_envelope(mailbox: Mailbox, kind: EnvelopeKind, body: Json, *, sender: str | None = None) -> Envelope:
    """An envelope of `kind` with the mailbox's next delivery id, created now on the mailbox's
    clock (`Mailbox.now_ms`: the wall clock, or PostgreSQL's for every host alike)."""
    ids = mailbox.ids  # the file forms' `DeliveryIds`
    return Envelope.new(ids, mailbox.now_ms(), kind, body, sender=sender)


def message_content(sender: str | None, text: str) -> tuple[list[Json], Json]:
    """The content blocks and `source` of a message: an operator's as a user's own words, an
    agent's prefixed as `send_message` does."""
    if sender is None:
        return text_blocks(text), {"kind": "user"}
    content = [
        {"type": "text", "text": f"Agent {sender} sent a message: "},
        {"type": "text", "text": text},
    ]
    return content, {"kind": "agent-message", "sender_session_id": sender}


class OwnerActions(Protocol):
    """What an owner asks of the subagent service (it implements this)."""

    async def mark_stopped(self, session_id: str, stop: Envelope) -> None:
        """Record the stopped marker of a `stop` delivery (before its turn is ended), durably."""
        ...

    async def stop_resident(self, session_id: str, cause: str, stop: Envelope | None = None) -> None:
        """Settle and dispose the session if it is a resident continuable child (else nothing);
        `stop`, the envelope of a `stop` delivery (a tree stop takes what runs below it too)."""
        ...

    async def record_settled(self, parent: Agent, body: Json, delivery_id: str) -> None:
        """Record a `settled` delivery in `parent`'s log (with `delivery_id`) and deliver its
        notice; durable when it returns. Raises `ValueError` for a body it cannot use."""
        ...


@attrs.define(eq=False)
class MailboxOwners:
    """Starts and stops the owner task of each resident agent (the registry calls `start` and
    `stop`); `actions` is what an owner asks of the subagent service."""

    mailbox: Mailbox
    nursery: trio.Nursery
    actions: OwnerActions
    now_ms: Callable[[], int] | None = None  # None: the mailbox's clock (`Mailbox.now_ms`)
    _scopes: dict[str, trio.CancelScope] = attrs.field(factory=dict)
    _drained: dict[str, trio.Event] = attrs.field(factory=dict)  # set after each owner's first drain
    _owners: dict[str, _Owner] = attrs.field(factory=dict)

    def start(self, agent: Agent) -> None:
        """Start `agent`'s owner task (one per session)."""
        self.stop(agent.session_id)
        scope = trio.CancelScope()
        self._scopes[agent.session_id] = scope
        drained = self._drained[agent.session_id] = trio.Event()
        # Read now, not when the task first runs: an interrupt sent once the agent exists is
        # never taken for a stale one.
        now_ms = self.now_ms if self.now_ms is not None else self.mailbox.now_ms
        self.nursery.start_soon(self._own, agent, scope, now_ms(), drained)

    async def first_drain(self, session_id: str) -> None:
        """Until the session's owner has handed its agent what the mailbox held when it started
        (or stopped trying): a placed child's first prompt is in its inbox before anyone asks
        whether it has work."""
        drained = self._drained.get(session_id)
        if drained is not None:
            await drained.wait()

    def stop(self, session_id: str) -> None:
        """Cancel the session's owner task (what it has not acked is redelivered later)."""
        scope = self._scopes.pop(session_id, None)
        if scope is not None:
            scope.cancel()

    async def close(self, session_id: str) -> None:
        """Ack the deliveries the session's log has recorded, then stop its owner: a session
        let go right after recording a delivery does not leave it to be redelivered (and its
        next host to drop it). Bounded: a mailbox that cannot be written leaves them."""
        owner = self._owners.get(session_id)
        if owner is not None:
            with trio.move_on_after(CLOSE_GRACE):
                await owner.ack_recorded()
        self.stop(session_id)

    async def _own(self, agent: Agent, scope: trio.CancelScope, started: int, drained: trio.Event) -> None:
        owner = self._owners[agent.session_id] = _Owner(self, agent, started=started, drained=drained)
        try:
            with scope:
                await owner.run()
        finally:
            if self._owners.get(agent.session_id) is owner:
                del self._owners[agent.session_id]
            drained.set()  # nobody waits for a drain that will not come
            if self._scopes.get(agent.session_id) is scope:
                del self._scopes[agent.session_id]
            if self._drained.get(agent.session_id) is drained:
                del self._drained[agent.session_id]


@attrs.define(eq=False)
class _Owner:
    owners: MailboxOwners
    agent: Agent
    started: int  # wall ms: interrupts and stops created before it are stale
    drained: trio.Event  # set once the first drain has handed over what it found
    _pending: dict[str, Envelope] = attrs.field(factory=dict)  # handed to the agent, not yet recorded
    _stuck: set[str] = attrs.field(factory=set)  # bad files that could not be moved aside (logged)
    # `settled` envelopes for the recorder task, in delivery order (bounded: the drain waits).
    _settled: tuple[trio.MemorySendChannel[Envelope], trio.MemoryReceiveChannel[Envelope]] = attrs.field(
        factory=lambda: trio.open_memory_channel[Envelope](SETTLED_QUEUE)
    )
    _settling: int = 0  # settlements queued for the recorder and not finished (they keep their order)
    # Interrupts and stops whose effect is durable, not acked yet (`close` acks them too).
    _effective: dict[str, Envelope] = attrs.field(factory=dict)

    @property
    def sid(self) -> str:
        return self.agent.session_id

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._record_settlements)
            try:
                await self._run()
            finally:
                nursery.cancel_scope.cancel()

    async def _run(self) -> None:
        mailbox = self.owners.mailbox
        failing = False  # a streak of failures is logged once, as a warning
        while True:
            try:
                watch = await trio.to_thread.run_sync(mailbox.watch, self.sid)
                break
            except StorageError as exc:
                log.log(
                    logging.DEBUG if failing else logging.WARNING,
                    "session %s: its mailbox cannot be watched (retrying): %s",
                    self.sid,
                    exc,
                )
                failing = True
                if await self._agent_stopped_within(RETRY_AFTER):
                    return
        try:
            while self.agent.status != "stopped":
                if self._lost():
                    return
                watch.clear()
                try:
                    await self._drain_once()
                except (StorageError, ActorStopped) as exc:
                    if self._lost():
                        return
                    log.log(
                        logging.DEBUG if failing else logging.WARNING,
                        "session %s: mailbox drain failed (retrying): %s",
                        self.sid,
                        exc,
                    )
                    failing = True
                    if await self._agent_stopped_within(RETRY_AFTER):
                        return
                    continue
                failing = False
                self.drained.set()
                await self._wait(watch)
        finally:
            watch.close()

    def _lost(self) -> bool:
        """The session's actor stopped under its agent (another host took it over): nothing here
        may act for it — not even ack an interrupt without effect, which is its new owner's."""
        if not self.agent.session.stopped:
            return False
        log.info("session %s: its session stopped here (%s): its mailbox owner stops", self.sid, self._why())
        return True

    def _why(self) -> str:
        lost = self.agent.session.ownership_lost
        return "taken over by another host" if lost is not None else "released"

    async def _agent_stopped_within(self, seconds: float) -> bool:
        with trio.move_on_after(seconds):
            await self.agent.wait_stopped()
        return self.agent.status == "stopped"

    async def _wait(self, watch: MailboxWatch) -> None:
        """Until a delivery may be waiting, a handed-over message was recorded, or the agent
        stopped."""
        seen = self.agent.deliveries_recorded

        async def readable() -> None:
            poll = watch.poll_interval
            with trio.move_on_after(poll if poll is not None else float("inf")):
                await trio.lowlevel.wait_readable(watch.fileno())

        async def recorded() -> None:
            # wait_any starts this a checkpoint later: a delivery recorded meanwhile counts.
            if not any(d in self.agent.recorded_deliveries for d in self._pending):
                await seen.wait()

        waits = [readable, self.agent.wait_stopped]
        if self._pending:
            waits.append(recorded)
        await wait_any(*waits)

    async def _drain_once(self) -> None:
        mailbox = self.owners.mailbox
        report = await trio.to_thread.run_sync(mailbox.drain_report, self.sid)
        for bad in report.rejected:
            if bad.moved_to is None:
                if bad.name in self._stuck:
                    continue  # reported by every drain while it stays: said once
                self._stuck.add(bad.name)
            where = f"moved aside as {bad.moved_to!r}" if bad.moved_to else "left in place"
            log.warning(
                "session %s: mailbox entry %r is not a delivery (%s): %s", self.sid, bad.name, where, bad.reason
            )
        for envelope in report.envelopes:
            if self.agent.session.stopped:
                return  # not this host's to record or ack any more (`_lost`)
            if envelope.delivery_id in self._pending:
                continue
            if envelope.delivery_id in self.agent.recorded_deliveries:
                await self._ack(envelope)  # recorded before: a redelivery (e.g. a crash before its ack)
                continue
            await self._apply(envelope)
        await self._ack_recorded_pending()

    async def _ack_recorded_pending(self) -> None:
        for delivery_id in list(self._effective):
            effective = self._effective.pop(delivery_id, None)
            if effective is not None:
                await self._ack(effective)
        for delivery_id in [d for d in self._pending if d in self.agent.recorded_deliveries]:
            # `close` may ack them while the owner's loop does (each waits on its own acks).
            envelope = self._pending.pop(delivery_id, None)
            if envelope is not None:
                await self._ack(envelope)

    async def ack_recorded(self) -> None:
        """Ack every handed-over delivery whose recording event is durable now."""
        try:
            await self._ack_recorded_pending()
        except StorageError as exc:
            log.warning("session %s: acking its recorded deliveries failed (redelivered later): %s", self.sid, exc)

    async def _ack(self, envelope: Envelope) -> None:
        await trio.to_thread.run_sync(self.owners.mailbox.ack, self.sid, envelope.delivery_id)

    async def _apply(self, envelope: Envelope) -> None:
        kind = envelope.kind
        if kind == "message":
            text = envelope.body.get("text")
            if not isinstance(text, str):
                return await self._drop(envelope, 'a message body needs a string "text"')
            content, source = message_content(envelope.sender, text)
            if envelope.body.get("first") is True:
                # A placed child's first prompt (runtime/delegation/spawning.py): the words its
                # parent gave it, as a child started in place receives them.
                guidance = envelope.body.get("guidance")
                content = [*text_blocks(text), *(text_blocks(guidance) if isinstance(guidance, str) else [])]
                source = {"kind": "user"}
            delivery = Delivery(content=content, source=source, trigger="message", delivery_id=envelope.delivery_id)
            self._pending[envelope.delivery_id] = envelope

            async def hand_over() -> None:
                await self.agent.inbox.put(delivery, "steer")

            # Bounded: waits for room in the agent's inbox (what is behind it waits too), or
            # until the agent stops (the envelope stays for the next host).
            await wait_any(hand_over, self.agent.wait_stopped)
        elif kind in ("interrupt", "stop"):
            if envelope.created_at < self.started:
                log.info(
                    "session %s: %s %s predates this host: acked without effect", self.sid, kind, envelope.delivery_id
                )
            else:
                cause: Cause = "user" if envelope.sender is None else "parent"
                if kind == "stop":  # its durable stopped marker first (issue 27): nothing resumes it now
                    await self.owners.actions.mark_stopped(self.sid, envelope)
                recorded_input = await self._end_turns(cause, stop=kind == "stop")
                # Its effect is durable: acked by whoever comes first — this, or `close` when the
                # session settles and goes meanwhile (an interrupted child with nothing queued
                # settles at once, and its disposal ends this task).
                self._effective[envelope.delivery_id] = envelope
                if recorded_input:
                    # Messages delivered before the stop were recorded after its marker, which
                    # an explicit message clears (storage/stop_verdict.py): the marker again.
                    await self.owners.actions.mark_stopped(self.sid, envelope)
                if self._effective.pop(envelope.delivery_id, None) is None:
                    return  # acked by `close`
            await self._ack(envelope)
            if kind == "stop" and envelope.created_at >= self.started:
                # After the ack: the stop disposes this session, and with it this task.
                self.owners.nursery.start_soon(self.owners.actions.stop_resident, self.sid, "user", envelope)
        elif kind == "settled":
            if not self._settling and self.agent.quiet:
                # Recorded here and now, as the drain goes (the first drain of a resumed parent
                # records what waited for it before anyone asks whether its tree is idle).
                try:
                    await self.owners.actions.record_settled(self.agent, envelope.body, envelope.delivery_id)
                except ValueError as exc:
                    return await self._drop(envelope, str(exc))
                await self._ack(envelope)  # recorded, or a second settlement of its run: dropped
                return
            self._pending[envelope.delivery_id] = envelope
            self._settling += 1
            await self._settled[0].send(envelope)

    async def _end_turns(self, cause: Cause, *, stop: bool) -> bool:
        """An interrupt: end the running turn (two-phase); what was delivered before it starts
        the next turn. A stop: also end each turn that input delivered before it starts, once
        that turn has recorded it, until none is left — so the input is in the log (before the
        settlement that follows) and no model answers it. True when a stop ended such a turn
        (input was recorded after the stop arrived)."""
        agent = self.agent
        entry = agent.turn  # a turn started after the stop arrived has a higher number
        while True:
            if agent.status == "running":
                turn = agent.turn
                agent.cancel(cause)  # (no-op for a turn whose abort is set already)
                # Until that turn has closed (its turn/end {aborted} is durable): not
                # `wait_turn_closed` alone, which returns only once the agent is idle when this
                # task runs — after the next turn, answering what was queued, for an interrupt
                # (this drain, and an interrupt meant for that turn, would wait for it). A claim
                # changes the inbox as the next turn starts.
                while agent.status == "running" and agent.turn == turn:
                    await wait_any(agent.wait_turn_closed, agent.inbox.wait_changed, agent.wait_stopped)
                if not stop:
                    return False
                continue  # a stop: a turn that started meanwhile has recorded its input: end it
            if not stop or agent.status == "stopped" or not agent.inbox.wakes():
                return stop and agent.turn > entry
            # Input waits that will start a turn: once claimed, the driver is running it.
            await wait_any(agent.inbox.wait_changed, agent.wait_stopped)

    async def _record_settlements(self) -> None:
        """Record the `settled` deliveries, one by one in delivery order (each waits for its
        agent to be quiet: `Settlement.record_delivered`), and ack each once recorded (or
        dropped). A storage failure is retried here; the agent stopping ends it (not acked: the
        next host records it)."""
        async for envelope in self._settled[1]:
            try:
                await self._record_settlement(envelope)
            finally:
                self._settling -= 1

    async def _record_settlement(self, envelope: Envelope) -> None:
        while True:
            try:
                await self.owners.actions.record_settled(self.agent, envelope.body, envelope.delivery_id)
            except ValueError as exc:
                self._pending.pop(envelope.delivery_id, None)
                log.warning("session %s: settled delivery %s dropped: %s", self.sid, envelope.delivery_id, exc)
                await self._ack_logged(envelope)
            except (StorageError, ActorStopped) as exc:
                if self._lost() or self.agent.status == "stopped":
                    return
                log.warning(
                    "session %s: recording settlement %s failed (retrying): %s", self.sid, envelope.delivery_id, exc
                )
                if await self._agent_stopped_within(RETRY_AFTER):
                    return
                continue
            else:
                # Recorded (the drain may ack it too: whoever pops it acks), or a second
                # settlement of a recorded run, dropped: acked either way.
                if self._pending.pop(envelope.delivery_id, None) is not None:
                    await self._ack_logged(envelope)
            break

    async def _ack_logged(self, envelope: Envelope) -> None:
        try:
            await self._ack(envelope)
        except StorageError as exc:
            log.warning("session %s: ack of %s failed (redelivered later): %s", self.sid, envelope.delivery_id, exc)

    async def _drop(self, envelope: Envelope, why: str) -> None:
        log.warning("session %s: %s delivery %s dropped: %s", self.sid, envelope.kind, envelope.delivery_id, why)
        await self._ack(envelope)
