"""`interrupted_closers(events)`: the synthetic events that close a turn a crash left open.

Pure (docs/format.md, "Interrupted turns", gives the exact events and texts). The scan is
`plan_continuation`'s (continuation.py): it tracks the open turn, the open step and the tool
calls still waiting for a result: every `tool-call`
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

from ._codec import Event, make_event
from .continuation import plan_continuation

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


def interrupted_closers(events: Sequence[Event], *, session_id: str = "") -> list[Event]:
    """The events closing an interrupted last turn, or `[]` for a balanced or empty log.

    The scan is `plan_continuation`'s (what a continuation of the same turn would take up:
    its open step and the calls no result answered). Payloads are validated as they are used:
    a malformed one raises `InvalidPayload`.
    """
    plan = plan_continuation(events, session_id=session_id)
    if plan is None or not events:
        return []
    open_turn = plan.turn
    open_step = plan.step if plan.step_open else None
    last = events[-1]
    seq = last.seq + 1
    time = last.time
    closers: list[Event] = []
    for p in plan.pending:
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
