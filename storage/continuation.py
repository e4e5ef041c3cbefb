"""`plan_continuation(events)`: what continuing a turn a crash left open must do.

Pure, like `closers.py` next to it (docs/format.md, "Continued turns"). The scan reads the last
turn only (every `turn/start` resets it) and tracks what the closers track — the open step and
the tool calls still waiting for a result, each registered by a `tool-call` block of an
`assistant/message`, marked started by a `tool/call` with its id, answered by a `tool/result`
— plus what a continuation needs beyond them: whether the open step's reply is durable (if not,
its model call was lost and is issued again), the finish of the turn's last reply (whether the
loop goes on after the step), the `subagent/catalog` events of the turn by `call_id` (a
`subagent` call is reconciled from them) and the turn's earlier `turn/continue` (the attempt
number counts on from it). A malformed payload raises `InvalidPayload`, as the closers do.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ._codec import Event, decode_payload
from .events import (
    AssistantMessageData,
    SubagentCatalogData,
    ToolCallBlock,
    ToolCallData,
    ToolResultBlock,
    ToolResultData,
    ToolSource,
    TurnContinueData,
)

__all__ = ["CatalogedChild", "Continuation", "PendingCall", "plan_continuation"]


@attrs.frozen(kw_only=True)
class PendingCall:
    """A tool call the open step's reply requested that no `tool/result` answered."""

    call_id: str
    name: str
    arguments: str
    step: int
    call_seq: int | None = None  # the seq of its last `tool/call`: it had started


@attrs.frozen(kw_only=True)
class CatalogedChild:
    """A child the open turn catalogued (`subagent/catalog`)."""

    child_id: str
    mode: str  # "one-shot" | "continuable"
    label: str | None = None


@attrs.frozen(kw_only=True)
class Continuation:
    """What continuing the open last turn of a log appends first and then runs."""

    turn: int
    step: int  # the step open at the crash, else the turn's last step (0: none had started)
    step_open: bool
    attempt: int  # this continuation's: 2 for the turn's first, one more for each later one
    lost_model_call: bool  # the open step's input is durable, its reply is not: issue it again
    # The open step's calls that no `tool/result` answered, in the order they were requested.
    pending: tuple[PendingCall, ...] = ()
    # The finish of the turn's last `assistant/message` (None: none): after the open step's
    # calls, "tool-calls" goes on to the next step as the loop does; anything else ends the turn.
    last_finish: str | None = None
    # The open turn's `subagent/catalog` events that name the call that started the child.
    catalog: dict[str, CatalogedChild] = attrs.field(factory=dict)
    # The open turn catalogued a child without a `call_id` (a log from before the key):
    # a started `subagent` call cannot be matched to its child, so it is in doubt.
    unkeyed_catalog: bool = False

    @property
    def started(self) -> tuple[PendingCall, ...]:
        """The pending calls whose `tool/call` is durable: each runs again or is in doubt."""
        return tuple(c for c in self.pending if c.call_seq is not None)

    @property
    def unstarted(self) -> tuple[PendingCall, ...]:
        """The pending calls never recorded as started: they simply run."""
        return tuple(c for c in self.pending if c.call_seq is None)

    def marker(self) -> dict[str, object]:
        """The `turn/continue` payload that records this continuation."""
        return {"turn": self.turn, "step": self.step, "attempt": self.attempt, "lost_model_call": self.lost_model_call}


def plan_continuation(events: Sequence[Event], *, session_id: str = "") -> Continuation | None:
    """The continuation of the log's open last turn, or None when no turn is open."""
    start = next((i for i in range(len(events) - 1, -1, -1) if events[i].type == "turn/start"), None)
    if start is None:
        return None
    turn: int | None = None
    step = 0
    step_open = False
    replied = False  # the open step has its `assistant/message`
    last_finish: str | None = None
    attempt = 1
    pending: dict[str, PendingCall] = {}
    catalog: dict[str, CatalogedChild] = {}
    unkeyed = False
    for event in events[start:]:
        kind = event.type
        if kind == "turn/start":
            turn = decode_payload(event, session_id=session_id).turn
        elif kind == "turn/end":
            turn = None
            pending.clear()
        elif kind == "turn/continue":
            data: TurnContinueData = decode_payload(event, session_id=session_id)
            attempt = max(attempt, data.attempt)
        elif kind == "step/start":
            step = decode_payload(event, session_id=session_id).step
            step_open = True
            replied = False
        elif kind == "step/end":
            step_open = False
            pending.clear()
        elif kind == "assistant/message":
            reply: AssistantMessageData = decode_payload(event, session_id=session_id)
            replied = True
            last_finish = reply.finish
            for block in reply.message.content:
                if isinstance(block, ToolCallBlock):
                    pending[block.id] = PendingCall(
                        call_id=block.id, name=block.name, arguments=block.arguments, step=reply.step
                    )
        elif kind == "tool/call":
            call: ToolCallData = decode_payload(event, session_id=session_id)
            if call.call_id in pending:
                pending[call.call_id] = attrs.evolve(pending[call.call_id], call_seq=event.seq)
        elif kind == "tool/result":
            result: ToolResultData = decode_payload(event, session_id=session_id)
            for block in result.message.content:
                if isinstance(block, ToolResultBlock):
                    pending.pop(block.call_id, None)
            if isinstance(result.message.source, ToolSource):
                pending.pop(result.message.source.call_id, None)
        elif kind == "subagent/catalog":
            entry: SubagentCatalogData = decode_payload(event, session_id=session_id)
            if isinstance(entry.call_id, str):
                label = entry.label if isinstance(entry.label, str) else None
                catalog[entry.call_id] = CatalogedChild(child_id=entry.child_id, mode=entry.mode, label=label)
            else:
                unkeyed = True
    if turn is None:
        return None
    return Continuation(
        turn=turn,
        step=step,
        step_open=step_open,
        attempt=attempt + 1,
        lost_model_call=step_open and not replied,
        pending=tuple(pending.values()),
        last_finish=last_finish,
        catalog=catalog,
        unkeyed_catalog=unkeyed,
    )
