"""Messages and interrupts between agents of one family (docs/design.md, "Subagents:
activations and settlement"; SPEC §9 for sessions another process holds).

Theory of operation. A message goes to its target's inbox when the target is live here, to its
mailbox when another process holds it (or a serving host runs it), and otherwise cold-resumes
it from its log (routing.py: one observation gives the direct-parent check and the identity; no
provider is dispatched) — or, with serving hosts up, places it again with the message waiting in
its mailbox. Per-child order is kept by the Activation's lock. An interrupt stops a live
descendant's turn; a target that exists but is not resident is an accepted no-op, never a cold
resume.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import attrs
from subagents.actors import Abort, ContinuationManager
from subagents.storage import AlreadyOwned, InvalidSessionId, StorageError, check_session_id

from ..agent.inbox import Delivery, DeliveryCancelled
from ..agent.loop import Agent
from ..agent.registry import AgentRegistry
from ..foundation.errors import (
    AgentError,
    FamilyDraining,
    ParentUnavailable,
    SubagentCancelled,
    Unauthorized,
)
from .placement import Placement
from .residency import DRAINING_TEXT, Residency, unavailable
from .routing import Routing

__all__ = ["InterruptOutcome", "Messaging"]

log = logging.getLogger(__name__)

Json = dict[str, Any]
InterruptOutcome = Literal["requested", "not-running", "idle"]


@attrs.define(eq=False)
class Messaging:
    """`send_message` and `interrupt`, wherever the target is."""

    agents: AgentRegistry
    manager: ContinuationManager
    residency: Residency
    routing: Routing
    placement: Placement

    async def send_message(self, sender: Agent, target_id: str, text: str, abort: Abort | None = None) -> None:
        """Deliver `text` from `sender` to its direct parent or to one of its own children
        (resumed from its log when it is not resident)."""
        if self.agents.get(sender.session_id) is not sender:
            raise Unauthorized("message delivery requires the exact live sender agent")
        if self.manager.draining:
            raise FamilyDraining(DRAINING_TEXT)
        try:
            check_session_id(target_id)
        except InvalidSessionId:
            raise unavailable(target_id) from None
        content = [
            {"type": "text", "text": f"Agent {sender.session_id} sent a message: "},
            {"type": "text", "text": text},
        ]
        source = {"kind": "agent-message", "sender_session_id": sender.session_id}
        own = self.manager.get(sender.session_id)
        if sender.session.header.parent_session == target_id:
            if own is None:
                raise Unauthorized(
                    f'agent "{sender.session_id}" is not a resident continuable child and '
                    f'cannot send to parent "{target_id}"'
                )
            parent = self.agents.get(target_id)
            if parent is None:
                if await self.routing.held_elsewhere(target_id) is not None:
                    await self.routing.post(target_id, "message", {"text": text}, sender.session_id)
                    return
                raise ParentUnavailable("direct parent is not live; the message was not delivered")
            await self._deliver(parent, content, source, abort)
            return
        while True:
            activation = self.manager.get(target_id)
            if activation is None:
                elsewhere = await self.routing.held_elsewhere(target_id)
                if elsewhere is not None:
                    if elsewhere.header is None or elsewhere.header.parent_session != sender.session_id:
                        raise Unauthorized(f'subagent "{target_id}" belongs to another parent session')
                    await self.routing.post(target_id, "message", {"text": text}, sender.session_id)
                    return
                if await self._cold_resume(sender, target_id, text, content, source, abort):
                    return
                continue
            async with activation.lock:
                if activation.closing:
                    pass  # wait for its disposal below, then cold-resume it
                else:
                    if activation.parent_id != sender.session_id:
                        raise Unauthorized(f'subagent "{target_id}" belongs to another parent session')
                    if target_id in self.residency.placed:  # served by another host: its mailbox
                        await self.routing.post(target_id, "message", {"text": text}, sender.session_id)
                        # Placed again if its host let go meanwhile (idempotent while it holds it).
                        await self.placement.enqueue(target_id)
                        return
                    child = self.agents.get(target_id)
                    if child is None:
                        raise unavailable(target_id)
                    await self._deliver(child, content, source, abort)
                    return
            await activation.disposed.wait()

    async def _deliver(
        self,
        agent: Agent,
        content: list[Json],
        source: Json,
        abort: Abort | None,
        mode: Literal["steer", "follow-up"] = "steer",
    ) -> None:
        try:
            await agent.inbox.put(Delivery(content=content, source=source, trigger="message"), mode, abort)
        except DeliveryCancelled:
            raise SubagentCancelled("message delivery was cancelled") from None

    async def _cold_resume(
        self, sender: Agent, target_id: str, text: str, content: list[Json], source: Json, abort: Abort | None
    ) -> bool:
        _header, identity = await self.routing.observe_child(target_id, abort, parent_id=sender.session_id)
        await self.residency.wait_room(sender.session_id, abort)
        if self.manager.get(target_id) is not None:
            return False  # someone resumed it meanwhile: deliver through its Activation
        activation = self.residency.admit(target_id, sender.session_id)
        if await self.placement.serving_hosts_up():
            # Not pinned here either: the message waits in its mailbox for a serving host (the
            # placement first: a sweep would take a session with mail and no placement).
            try:
                await self.placement.enqueue(target_id)
                await self.routing.post(target_id, "message", {"text": text}, sender.session_id)
            except BaseException:  # a placement that failed frees its slot (re-raised)
                self.manager.forget(activation)
                raise
            self.placement.stand_in(activation)
            return True
        try:
            # Its options come back from its descriptor (`resume_setup`, as on every resume).
            child = await self.agents.resume(target_id, label=identity.get("label"))
        except (AlreadyOwned, StorageError, AgentError) as exc:
            log.info("subagent %r: not resumable: %s", target_id, exc)
            self.manager.forget(activation)
            raise unavailable(target_id) from None
        except BaseException:
            self.manager.forget(activation)
            raise
        try:
            # A follow-up, not a steer: notices redelivered on resume take the first turn alone.
            await self._deliver(child, content, source, abort, mode="follow-up")
        finally:
            self.residency.run(activation, child)
        return True

    async def interrupt(self, target_id: str, by: Agent) -> InterruptOutcome:
        """Stop a live descendant's current turn (`requested`). A target that exists but is not
        resident is an accepted no-op, never a cold resume (`not-running`), as is one resident but
        between turns (`idle`); an id no session has — or an invalid one — is `NOT_RESUMABLE`
        (unavailable)."""
        if target_id == by.session_id:
            raise Unauthorized(f'agent "{target_id}" cannot interrupt itself')
        try:
            check_session_id(target_id)
        except InvalidSessionId:
            raise unavailable(target_id) from None
        activation = self.manager.get(target_id)
        if activation is None or activation.closing:
            live = self.agents.get(target_id) if activation is None else None
            if live is not None and live.session.header.parent_session == by.session_id:
                live.cancel("parent")  # the caller's own one-shot child, running in the foreground
                return "requested"
            if live is not None:
                # live, but not a child running under the caller: not the caller's to stop
                raise Unauthorized(f'subagent "{target_id}" is not a live descendant of agent "{by.session_id}"')
            elsewhere = await self.routing.held_elsewhere(target_id) if activation is None else None
            if elsewhere is not None:
                if elsewhere.header is None or elsewhere.header.parent_session != by.session_id:
                    raise Unauthorized(f'subagent "{target_id}" is not a live descendant of agent "{by.session_id}"')
                await self.routing.post(target_id, "interrupt", {}, by.session_id)
                return "requested"
            if activation is None and not await self.routing.exists(target_id):
                raise unavailable(target_id)
            return "not-running"
        if by.session_id not in self.manager.ancestors(target_id):
            raise Unauthorized(f'subagent "{target_id}" is not a live descendant of agent "{by.session_id}"')
        if target_id in self.residency.placed:  # served by another host: its owner there interrupts it
            await self.routing.post(target_id, "interrupt", {}, by.session_id)
            return "requested"
        child = self.agents.get(target_id)
        if child is not None:
            # Resident but between turns, with nothing queued to start one: nothing to stop.
            idle = child.status != "running" and not child.inbox.wakes()
            child.inbox.park()
            child.cancel("parent")
            if idle:
                return "idle"
        return "requested"
