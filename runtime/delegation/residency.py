"""Resident children: the Activations a runtime runs for its continuable subagents
(docs/design.md, "Subagents: activations and settlement").

Theory of operation. A continuable child runs under an Activation of the continuation manager;
its body waits until the child's agent is idle with an empty inbox and no resident children of
its own — *settled* — and then hands over to `Settlement` (settlement.py), which records
`subagent/settled` in the parent and delivers the notice; then the Activation is disposed (the
agent stops, the session is released). Admission (`wait_room`, `admit`) is the family's limit;
stopping (`release_children_of`, `drain`, `stop_resident`, `hand_back`) ends Activations
child-first.

A child a serving host runs has a stand-in Activation here (placement.py). Its entry in
`placed` (child id → set when its settlement reaches this host) lives here, because every way a
family stops must end the stand-in rather than settle it: its settlement is the serving host's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
from subagents.actors import (
    Abort,
    Activation,
    ActivationLimitReached,
    ContinuationManager,
    Draining,
    ParentClosing,
    cancelled_when,
)

from ..agent.loop import Agent, TurnResult
from ..agent.registry import AgentRegistry
from ..foundation.errors import (
    ActivationLimit,
    AgentStopped,
    FamilyDraining,
    NotResumable,
    SubagentCancelled,
    SubagentError,
)
from .settlement import Settlement

__all__ = ["DRAINING_TEXT", "ChildHooks", "Residency", "limit_text", "unavailable"]

Json = dict[str, Any]

ChildHooks = tuple[
    Callable[[Activation], Awaitable[None]],
    Callable[[Activation], bool],
    Callable[[Activation], Awaitable[None]],
    Callable[[Activation], Awaitable[None]],
]

# What the model is told when its family takes no new work (the agent vocabulary, worded here
# and not in the actors, which only count and refuse).
DRAINING_TEXT = "continuable subagents are draining; the operation was not admitted"


def limit_text(limit: int) -> str:
    return (
        f"subagent limit reached (active child limit: {limit}); wait for an existing child to finish "
        "or complete this work with the current agents"
    )


def unavailable(child_id: str) -> SubagentError:
    """The refusal of a child that cannot be reached or resumed (`NOT_RESUMABLE`)."""
    return NotResumable(f'subagent "{child_id}" is unavailable')


@attrs.define(eq=False)
class Residency:
    """Admits, runs, settles and stops the Activations of resident children."""

    agents: AgentRegistry
    manager: ContinuationManager
    settlement: Settlement
    # placed child id -> set when its settlement reaches this host (ends its stand-in Activation)
    placed: dict[str, trio.Event] = attrs.field(factory=dict)
    # adopted children being handed back (`hand_back`): disposed without a settlement
    _handing_back: set[str] = attrs.field(factory=set)

    # --- admission ---------------------------------------------------------------------------

    async def wait_room(self, parent_id: str, abort: Abort | None = None) -> None:
        """Until an admission under `parent_id` is not refused for a slot that is being freed.
        A settled child holds its slot until it is disposed, which ends after its parent was
        given the notice: a start (or resume) the notice invites waits for that slot rather than
        being refused for it. Callers `admit` with no checkpoint after it."""
        while self.manager.making_room(parent_id):
            async with cancelled_when(abort):
                await self.manager.wait_changed()
            if abort is not None and abort.is_set():
                raise SubagentCancelled("message delivery was cancelled")

    def admit(self, child_id: str, parent_id: str) -> Activation:
        """A slot for `child_id` under `parent_id` (the family's limit), as a typed refusal."""
        try:
            return self.manager.admit(child_id, parent_id)
        except ActivationLimitReached as exc:
            raise ActivationLimit(limit_text(exc.limit)) from None
        except Draining:
            raise FamilyDraining(DRAINING_TEXT) from None
        except ParentClosing as exc:  # its family is shutting down
            raise FamilyDraining(f"agent {exc.parent_id!r} is closing; it takes no new subagents") from None

    async def dispose_unannounced(self, activation: Activation) -> None:
        """Undo an admission whose child was created but never announced to its parent."""
        with trio.CancelScope(shield=True):
            await self.agents.stop(activation.child_id, cause="parent")
            self.manager.forget(activation)

    # --- running -----------------------------------------------------------------------------

    def run(self, activation: Activation, child: Agent) -> None:
        """Run `child` under its admitted `activation` until it settles."""
        self.manager.start(activation, *self.child_hooks(child))

    def child_hooks(self, child: Agent) -> ChildHooks:
        """The body, ready check, settle and dispose hooks of a resident child's Activation."""

        async def body(activation: Activation) -> None:
            while True:
                try:
                    await child.wait_idle()
                except AgentStopped:
                    return  # its log cannot be written: it settles as failed

                if child.inbox.wakes():
                    continue
                if len(child.inbox):  # parked by an interrupt: pending work, not settled
                    await child.inbox.wait_changed()
                    continue
                if any(self.manager.get(o) is not None for o in activation.owned):
                    await self.manager.wait_changed()
                    continue
                if await self.settlement.wait_parent_quiet(activation):
                    continue  # the parent moved on meanwhile: look again before settling
                return

        def ready(_a: Activation) -> bool:
            return child.status == "stopped" or (child.status != "running" and not len(child.inbox))

        async def settle(a: Activation) -> None:
            await self._settle(a, child)

        async def dispose(a: Activation) -> None:
            await self.agents.stop(a.child_id, cause=a.cause or "disposed")

        return body, ready, settle, dispose

    async def _settle(self, activation: Activation, child: Agent) -> None:
        # One seam for the Activation's settle step (the crash driver of the tests holds it).
        if activation.child_id in self._handing_back:
            return  # handed back to the placement queue: the host that takes it over settles it
        await self.settlement.settle(activation, child)

    async def wait_tree_idle(self, agent: Agent) -> TurnResult | None:
        """Until the agent is idle and no Activation of its family is resident. `AgentStopped`
        when another host took the agent's session over meanwhile: its family's settlements
        reach that host now, so this one would wait for ever."""
        while True:
            result = await agent.wait_idle()
            lost = agent.session.ownership_lost
            if lost is not None:
                raise AgentStopped(
                    f"session {agent.session_id!r} was taken over by another host (its lease, epoch {lost.epoch}): "
                    "it runs there now"
                )
            if not any(a.root_id == agent.session_id for a in self.manager.resident.values()):
                if agent.status != "running" and not agent.inbox.wakes():
                    return result
                continue
            # Called right after the look (no checkpoint between): a change made meanwhile is not
            # missed. A session lost to another host wakes it too (`ContinuationManager.poke`).
            await self.manager.wait_changed()

    # --- stopping ----------------------------------------------------------------------------

    def end_placed(self, child_id: str) -> bool:
        """End a placed child's stand-in here (settled, or this host lets go); False if the
        child is not placed from here."""
        settled = self.placed.pop(child_id, None)
        if settled is None:
            return False
        settled.set()
        return True

    async def drain(self) -> None:
        """Stop every family (the runtime closes): children first, settled now."""
        await self.manager.drain(self.interrupt_disposed)

    async def release_children_of(self, session_id: str) -> None:
        """Before a session is released: stop its resident children (child-first). Their
        settlements are recorded in its log; the notices wait for its next resume."""
        with self.settlement.disposing(session_id):
            for activation in [a for a in self.manager.resident.values() if a.parent_id == session_id]:
                await self.manager.stop(activation.child_id, "disposed", self.interrupt_disposed)

    def interrupt_disposed(self, activation: Activation) -> None:
        """The interrupt of an Activation stopped because its family stops."""
        if self.end_placed(activation.child_id):
            return  # served elsewhere: it goes on there, its settlement reaches the parent's mailbox
        self.settlement.open_gate(activation.child_id)  # the family is stopping: settle now
        child = self.agents.get(activation.child_id)
        if child is not None:
            child.cancel("disposed")

    async def stop_resident(self, session_id: str, cause: str) -> None:
        """A `stop` delivery (runtime/agent/mailbox_owner.py): settle and dispose the session if it is
        a resident continuable child; its turn was ended already."""
        if self.manager.get(session_id) is None:
            return

        def interrupt(activation: Activation) -> None:
            self.settlement.open_gate(activation.child_id)
            child = self.agents.get(activation.child_id)
            if child is not None:
                child.cancel(cause)  # type: ignore[arg-type]  # one of the three causes

        await self.manager.stop(session_id, cause, interrupt)

    async def record_settled(self, parent: Agent, body: Json, delivery_id: str) -> None:
        """A `settled` delivery (runtime/agent/mailbox_owner.py): `Settlement.record_delivered`."""
        await self.settlement.record_delivered(parent, body, delivery_id)
        child_id = body.get("child_id")
        if isinstance(child_id, str):
            self.end_placed(child_id)  # a child served elsewhere has settled

    async def hand_back(self, child_id: str) -> bool:
        """Let go of an adopted child without settling it (a serving host stopping cleanly):
        its turn is ended, it is disposed and its session released, so that another host (its
        placement given back by the caller) takes it over and settles it — once. False when it
        is not resident here or is settling already (its settlement goes on; the caller waits
        for its disposal and finishes the placement as usual)."""
        activation = self.manager.get(child_id)
        if activation is None or activation.closing or child_id in self.placed:
            return False
        self._handing_back.add(child_id)
        try:
            await self.manager.stop(child_id, "disposed", self.interrupt_disposed)
        finally:
            self._handing_back.discard(child_id)
        return True
