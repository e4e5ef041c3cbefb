"""The events a listing row's flags come from (issue 27): the stopped marker, messages that do or
do not clear it, and tool results in doubt — as events to fold or persist, and as drafts to
append through a session actor."""

from __future__ import annotations

from typing import Any

from subagents.actors import EventDraft
from subagents.storage import Event, make_event

UNKNOWN = {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"}


def stopped_data(by: str = "operator", tree: bool = False) -> dict[str, Any]:
    return {"by": by, "tree": tree}


def message_data(kind: str = "user", turn: int = 1) -> dict[str, Any]:
    """A `user/message` from a source of `kind` (`user`, `agent-message` clear a stop; a
    `subagent-settled` notice does not)."""
    source: dict[str, Any] = {"kind": kind}
    if kind in ("agent-message", "subagent-settled"):
        source["sender_session_id"] = "p"
    message = {"id": f"m-{kind}", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": source}
    return {"turn": turn, "step": 0, "message": message}


def call_data(call_id: str, turn: int = 1) -> dict[str, Any]:
    """The `assistant/message` that asks for the tool call `call_id`."""
    message = {
        "id": f"a-{call_id}",
        "role": "assistant",
        "content": [{"type": "tool-call", "id": call_id, "name": "run_command", "arguments": "{}"}],
        "source": {"kind": "model"},
    }
    return {"turn": turn, "step": 1, "message": message, "finish": "tool-calls"}


def result_data(call_id: str, turn: int = 1, *, in_doubt: bool = True) -> dict[str, Any]:
    """The `tool/result` of `call_id`: in doubt (its process died mid-call), or an ordinary one."""
    block = {
        "type": "tool-result",
        "call_id": call_id,
        "content": [{"type": "text", "text": "?"}],
        "is_error": in_doubt,
    }
    message = {"id": f"r-{call_id}", "role": "user", "content": [block], "source": {"kind": "tool", "call_id": call_id}}
    data: dict[str, Any] = {"turn": turn, "step": 1, "message": message}
    if in_doubt:
        data |= {"error": UNKNOWN, "in_doubt": True}
    return data


def stopped_event(seq: int, time: int = 1) -> Event:
    return make_event(seq, "session/stopped", time, stopped_data())


def message_event(seq: int, kind: str = "user", turn: int = 1) -> Event:
    return make_event(seq, "user/message", 1, message_data(kind, turn), surface_op="append")


def call_event(seq: int, call_id: str, turn: int = 1) -> Event:
    return make_event(seq, "assistant/message", 1, call_data(call_id, turn), surface_op="append")


def result_event(seq: int, call_id: str, turn: int = 1, *, in_doubt: bool = True) -> Event:
    return make_event(seq, "tool/result", 1, result_data(call_id, turn, in_doubt=in_doubt), surface_op="append")


def stopped_draft() -> EventDraft:
    return EventDraft(type="session/stopped", data=stopped_data())


def in_doubt_drafts(call_id: str, turn: int = 1) -> list[EventDraft]:
    """A turn's tool call and its in-doubt result (as a continued turn records it)."""
    return [
        EventDraft(type="assistant/message", data=call_data(call_id, turn), surface_op="append"),
        EventDraft(type="tool/result", data=result_data(call_id, turn), surface_op="append"),
    ]


def message_draft(kind: str = "user", turn: int = 1) -> EventDraft:
    return EventDraft(type="user/message", data=message_data(kind, turn), surface_op="append")
