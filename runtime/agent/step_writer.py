"""How the agent loop writes (docs/design.md, "The agent loop and models"): a step's events are
staged, then flushed through the session actor, so each write is durable before the loop moves
on; what a flush made durable is applied to the in-memory surface in the same stretch (and the
mailbox deliveries it records are noted, for their owner to ack).

`StepWriter` is the part of an `Agent` (runtime/agent/loop.py) its model and tool steps share;
the attributes it reads are the agent's, set in `Agent.__init__`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from subagents.actors import Abort, EventDraft, SessionRef
from subagents.storage import Event
from trio_util import RepeatedEvent

from ..foundation.budgets import CALL_TYPES
from ..foundation.clock import Clock
from ..models.messages import Surface, message, text_blocks
from .agent_config import AgentConfig
from .inbox import Delivery

__all__ = ["SURFACE_TYPES", "StepWriter"]

Json = dict[str, Any]

SURFACE_TYPES = frozenset({"system/message", "user/message", "assistant/message", "tool/result"})


class StepWriter:
    """Stages a turn's events and flushes them durably (see the module docstring)."""

    session: SessionRef
    session_id: str
    clock: Clock
    config: AgentConfig
    surface: Surface
    closed_prefix: int
    _staged: list[EventDraft]
    _messages: int
    _turn_deadline: float  # the budget's deadline on Trio's clock, for this turn
    recorded_deliveries: set[str]
    deliveries_recorded: RepeatedEvent
    _turn_called: bool  # the turn in progress has recorded a model call (budgets.py `turn_counted`)

    def note_recorded(self, *delivery_ids: str) -> None:
        """Mailbox deliveries whose recording event is durable now (the owner acks them)."""
        self.recorded_deliveries.update(delivery_ids)
        self.deliveries_recorded.set()

    def _expire(self, abort: Abort) -> None:
        """The budget's deadline passed mid-turn: stop the turn as a cancel does (the agent's)."""
        raise NotImplementedError

    def _stage(self, type: str, data: Json, **envelope: Any) -> None:
        if type in CALL_TYPES:
            self._turn_called = True
        self._staged.append(EventDraft(type=type, data=data, time=self.clock.now_ms(), **envelope))

    async def _flush(self) -> list[Event]:
        if not self._staged:
            return []
        drafts, self._staged = self._staged, []
        result = await self.session.append(drafts)
        recorded = [d.data["delivery_id"] for d in drafts if d.type == "user/message" and "delivery_id" in d.data]
        if recorded:
            self.note_recorded(*recorded)
        for event in result.events:
            if event.type in SURFACE_TYPES:
                self.surface.apply(event, session_id=self.session_id)
            elif event.type == "turn/end":
                self.closed_prefix = event.seq + 1
        return list(result.events)

    def _next_message_id(self) -> str:
        self._messages += 1
        return f"msg-{self._messages}"

    def _stage_input(self, turn: int, step: int, deliveries: Sequence[Delivery]) -> None:
        system = self.config.system_prompt
        if step == 1 and system is not None and self.surface.last_system_text() != system:
            msg = message(self._next_message_id(), "system", text_blocks(system), {"kind": "user"})
            self._stage("system/message", {"turn": turn, "step": step, "message": msg}, surface_op="append")
        for d in deliveries:
            msg = message(self._next_message_id(), "user", d.content, d.source)
            seqs = list(d.source_event_seqs) if d.source_event_seqs else None
            data: Json = {"turn": turn, "step": step, "message": msg}
            if d.delivery_id is not None:
                data["delivery_id"] = d.delivery_id
            self._stage(
                "user/message",
                data,
                surface_op="append",
                source_event_seqs=seqs,
            )
