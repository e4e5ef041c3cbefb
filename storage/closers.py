"""`interrupted_closers(events)`: the synthetic events that close a turn a crash left open.

Pure (docs/format.md, "Interrupted turns", gives the exact events and texts). The scan tracks
the open turn, the open step and the tool calls still waiting for a result: every `tool-call`
block of an `assistant/message` registers a pending call with its step, a later `tool/call` with
the same id records that it started, a `tool/result` answers it; `turn/start`, `turn/end` and
`step/end` reset the pending set. If a turn is open, each pending call (in the order it was
registered) gets an error `tool/result`, then an open step gets `step/end`, then the turn gets
`turn/end {reason: {kind: interrupted}}`. The closers take consecutive seqs after the last event
and reuse its time. Cold readers keep them in memory; resuming an agent appends them durably
first.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ._codec import Event, decode_payload, make_event
from .events import (
    AssistantMessageData,
    ToolCallBlock,
    ToolCallData,
    ToolResultBlock,
    ToolResultData,
    ToolSource,
)

__all__ = [
    "TOOL_NOT_STARTED_TEXT",
    "TOOL_OUTCOME_UNKNOWN_TEXT",
    "interrupted_closers",
]

TOOL_OUTCOME_UNKNOWN_TEXT = (
    "The tool call was interrupted after it was recorded, but no result was durably recorded. "
    "Its outcome is unknown. Decide whether to retry from the tool semantics: retry only if the "
    "operation is read-only or idempotent; if it may have side effects, first verify external "
    "state or ask the user. Do not retry blindly."
)
TOOL_NOT_STARTED_TEXT = (
    "The tool call was interrupted before the Harness recorded it as started. Retry it if it is still needed."
)


@attrs.define
class _Pending:
    call_id: str
    step: int
    call_seq: int | None = None


def interrupted_closers(events: Sequence[Event], *, session_id: str = "") -> list[Event]:
    """The events closing an interrupted last turn, or `[]` for a balanced or empty log.

    Payloads are validated as they are used: a malformed one raises `InvalidPayload`.
    """
    open_turn: int | None = None
    open_step: int | None = None
    pending: dict[str, _Pending] = {}
    # Every turn/start resets the scan, so only the last turn can be open: start there and
    # leave the payloads of every earlier turn undecoded (a listing observes whole logs).
    start = next((i for i in range(len(events) - 1, -1, -1) if events[i].type == "turn/start"), None)
    if start is None:
        return []
    for event in events[start:]:
        kind = event.type
        if kind == "turn/start":
            open_turn = decode_payload(event, session_id=session_id).turn
            open_step = None
            pending.clear()
        elif kind == "turn/end":
            open_turn = None
            open_step = None
            pending.clear()
        elif kind == "step/start":
            open_step = decode_payload(event, session_id=session_id).step
        elif kind == "step/end":
            open_step = None
            pending.clear()
        elif kind == "assistant/message":
            data: AssistantMessageData = decode_payload(event, session_id=session_id)
            for block in data.message.content:
                if isinstance(block, ToolCallBlock):
                    pending[block.id] = _Pending(block.id, data.step)
        elif kind == "tool/call":
            call: ToolCallData = decode_payload(event, session_id=session_id)
            if call.call_id in pending:
                pending[call.call_id].call_seq = event.seq
        elif kind == "tool/result":
            result: ToolResultData = decode_payload(event, session_id=session_id)
            for block in result.message.content:
                if isinstance(block, ToolResultBlock):
                    pending.pop(block.call_id, None)
            if isinstance(result.message.source, ToolSource):
                pending.pop(result.message.source.call_id, None)
    if open_turn is None or not events:
        return []

    last = events[-1]
    seq = last.seq + 1
    time = last.time
    closers: list[Event] = []
    for p in pending.values():
        started = p.call_seq is not None
        message = {
            "id": f"interrupted-tool-result-{p.call_id}-{seq}",
            "role": "user",
            "content": [
                {
                    "type": "tool-result",
                    "call_id": p.call_id,
                    "content": [
                        {"type": "text", "text": TOOL_OUTCOME_UNKNOWN_TEXT if started else TOOL_NOT_STARTED_TEXT}
                    ],
                    "is_error": True,
                }
            ],
            "source": {"kind": "tool", "call_id": p.call_id},
        }
        error = (
            {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"}
            if started
            else {"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"}
        )
        closers.append(
            make_event(
                seq,
                "tool/result",
                time,
                {"turn": open_turn, "step": p.step, "message": message, "error": error},
                surface_op="append",
                source_event_seqs=[p.call_seq] if p.call_seq is not None else None,
            )
        )
        seq += 1
    if open_step is not None:
        closers.append(make_event(seq, "step/end", time, {"turn": open_turn, "step": open_step}))
        seq += 1
    closers.append(make_event(seq, "turn/end", time, {"turn": open_turn, "reason": {"kind": "interrupted"}}))
    return closers
