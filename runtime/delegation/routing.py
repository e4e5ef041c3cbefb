"""Where a child is, and how to reach one that is not live here (SPEC §9; docs/design.md,
"The mailbox: owners and routing").

A child that is not resident here is either held by another process — reached through its
mailbox (`post`), whose owner there records the delivery — or is a log to resume: one
observation of it (`observe_child`) gives its header (the direct-parent check) and its identity
(the own-suffix descriptor, last wins); no provider is dispatched.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio
from subagents.actors import Abort
from subagents.storage import (
    EnvelopeKind,
    LogInfo,
    Mailbox,
    PersistenceFailed,
    SessionHeader,
    SessionNotFound,
    StorageError,
)

from ..agent.mailbox_owner import new_envelope
from ..agent.registry import AgentRegistry
from ..foundation.errors import NotResumable, QueryAborted, SessionQueryError, SubagentCancelled, Unauthorized
from ..query import SessionQuery
from .residency import unavailable
from .units import IDENTITY_UNIT

__all__ = ["Routing"]

Json = dict[str, Any]


@attrs.define(eq=False)
class Routing:
    """Reads of children that are not live here, and deliveries to another process's sessions."""

    agents: AgentRegistry
    query: SessionQuery
    # Deliveries to sessions another process holds (runtime/agent/mailbox_owner.py); None: none.
    mailbox: Mailbox | None = None

    async def held_elsewhere(self, session_id: str) -> LogInfo | None:
        """The session's stat when another process holds it (its owner drains its mailbox);
        None when this runtime has no mailbox, the session is not held elsewhere, or it cannot
        be told."""
        if self.mailbox is None or self.agents.sessions.get(session_id) is not None:
            return None
        try:
            info, held = await self.query.stat(session_id)
        except StorageError:
            return None
        return info if held and info is not None else None

    async def post(self, target_id: str, kind: EnvelopeKind, body: Json, sender: str | None) -> None:
        """Deliver to the target's mailbox, durably; its owner records it."""
        assert self.mailbox is not None
        envelope = new_envelope(self.mailbox, kind, body, sender=sender)
        try:
            await trio.to_thread.run_sync(self.mailbox.deliver, target_id, envelope)
        except StorageError as exc:
            raise NotResumable(f'subagent "{target_id}" is unavailable: its mailbox failed: {exc}') from None

    async def observe_child(
        self, target_id: str, abort: Abort | None, *, parent_id: str | None = None
    ) -> tuple[SessionHeader, Json]:
        """The header and identity of a continuable child that is not live here (of `parent_id`,
        when given), from one observation of its log."""
        if self.agents.get(target_id) is not None or self.agents.sessions.get(target_id) is not None:
            raise unavailable(target_id)  # live but not an Activation: refused, not adopted
        try:
            async with self.query.observe_session(target_id, abort) as observation:
                header = observation.header
                identity = observation.projections.get(IDENTITY_UNIT.key)
                k = observation.inherited_event_count
        except QueryAborted:
            raise SubagentCancelled("message delivery was cancelled") from None
        except SessionQueryError as exc:
            raise unavailable(target_id) from exc  # the cause tells a damaged log from a failed read
        if parent_id is not None and header.parent_session != parent_id:
            raise Unauthorized(f'subagent "{target_id}" belongs to another parent session')
        if not isinstance(identity, dict) or identity.get("seq", -1) < k or identity.get("mode") != "continuable":
            raise NotResumable(
                f'subagent "{target_id}" has no supported continuation state and cannot be resumed; '
                "choose a different target"
            )
        return header, identity

    async def exists(self, session_id: str) -> bool:
        """Whether any session — live, or a log on disk, damaged or not — has this id."""
        if self.agents.sessions.get(session_id) is not None:
            return True
        (info,) = await self.query.stat_many([session_id])
        if isinstance(info, (SessionNotFound, PersistenceFailed)):
            return False  # no such log, or none that can be found: unavailable either way
        if isinstance(info, Exception):
            raise info
        return info is not None
