"""Runtime events → ACP `session/update` payloads (SPEC §8, "ACP mapping").

Pure: durable events of one session in, update objects out (the `update` field of a
`session/update` notification). `updates_for` is the one place a host source plugs in: today
the `acp` server feeds it the events its sessions append; the shared event stream can feed it
the same records later.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

import msgspec
from subagents.storage import Event, decode_payload

from ...foundation.json_values import JsonObject as Json
from ...foundation.json_values import JsonValue

__all__ = ["TOOL_KINDS", "agent_text", "message_text", "stop_reason", "tool_kind", "updates_for"]


_TITLE_WIDTH = 80

# The ACP tool kind of every tool the runtime offers (SPEC §8): the one place a tool name becomes
# a kind. The five subagent tools act on agents, not on the workspace; MCP tools (`mcp__*`) and
# anything unknown are "other".
TOOL_KINDS: Mapping[str, str] = {
    "read_file": "read",
    "list_dir": "read",
    "glob": "read",
    "grep": "read",
    "write_file": "edit",
    "edit_file": "edit",
    "run_command": "execute",
    "subagent": "other",
    "subagent_fork": "other",
    "list_agents": "other",
    "send_message": "other",
    "interrupt_agent": "other",
}


def tool_kind(name: str) -> str:
    """The ACP `kind` of a call to tool `name` (read/edit/execute/other)."""
    return TOOL_KINDS.get(name, "other")


def agent_text(text: str, message_id: str) -> Json:
    """An `agent_message_chunk` of answer text (streamed as it arrives, or a reply's rest)."""
    return {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}, "messageId": message_id}


def updates_for(events: Iterable[Event], *, session_id: str = "", replay: bool = False) -> list[Json]:
    """The ACP updates for `events`, in order. Live (`replay` False) a user message is not
    echoed (the client sent it); a replay (`session/load`) includes the person's messages as
    `user_message_chunk`. Events with no ACP meaning (turn and step bounds, subagent records)
    give nothing."""
    out: list[Json] = []
    for event in events:
        kind = event.type
        if kind not in _MAPPED:
            continue
        data = msgspec.to_builtins(decode_payload(event, session_id=session_id))
        if kind == "user/message":
            message = data["message"]
            if replay and message["source"]["kind"] == "user":
                out.extend(_chunks("user_message_chunk", message))
        elif kind == "assistant/message":
            out.extend(_chunks("agent_message_chunk", data["message"]))
        elif kind == "tool/call":
            out.append(_tool_call(data))
        elif kind == "tool/result":
            out.extend(_tool_result(data["message"]))
    return out


_MAPPED = frozenset({"user/message", "assistant/message", "tool/call", "tool/result"})


def _chunks(update: str, message: Mapping[str, JsonValue]) -> list[Json]:
    text = message_text(message)
    if not text:
        return []
    return [{"sessionUpdate": update, "content": {"type": "text", "text": text}, "messageId": message["id"]}]


def message_text(message: Mapping[str, JsonValue]) -> str:
    """The text of a durable message (its text blocks, joined)."""
    return "".join(b["text"] for b in message["content"] if b.get("type") == "text")


def _tool_call(data: Mapping[str, JsonValue]) -> Json:
    name, arguments = data["name"], data["arguments"]
    update: Json = {
        "sessionUpdate": "tool_call",
        "toolCallId": data["call_id"],
        "title": _title(name, arguments),
        "kind": tool_kind(name),
        "status": "in_progress",
    }
    try:
        update["rawInput"] = json.loads(arguments)
    except ValueError:  # malformed arguments are recorded as they came; the title shows them
        pass
    return update


def _tool_result(message: Mapping[str, JsonValue]) -> list[Json]:
    out = []
    for block in message["content"]:
        if block.get("type") != "tool-result":
            continue
        text = "\n".join(_texts(block.get("content", ())))
        out.append(
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": block["call_id"],
                "status": "failed" if block.get("is_error") else "completed",
                "content": [{"type": "content", "content": {"type": "text", "text": text}}],
            }
        )
    return out


def _texts(blocks: Sequence[Mapping[str, JsonValue]]) -> Iterable[str]:
    for block in blocks:
        if block.get("type") == "text":
            yield block["text"]


def _title(name: str, arguments: str) -> str:
    line = " ".join(f"{name}({arguments})".split())
    return line if len(line) <= _TITLE_WIDTH else line[: _TITLE_WIDTH - 1] + "…"


def stop_reason(reason: Mapping[str, JsonValue]) -> str | None:
    """The ACP stop reason of a `turn/end` reason, or None for a turn that ended in error (a
    JSON-RPC error instead). A reason kind this mapping does not know counts as an error, as
    format 1 readers treat it."""
    return {
        "completed": "end_turn",
        "aborted": "cancelled",
        "max-tokens": "max_tokens",
        "budget": "max_turn_requests",
        "blocked": "max_turn_requests",  # the step limit: the turn made too many model requests
    }.get(reason.get("kind", "error"))
