"""Permission questions to the ACP client: a tool call the runtime's approver asks about becomes
a `session/request_permission` request of ours, and the client's response (or its error) the
approver's answer. Anything but a chosen allow option denies, and says why."""

from __future__ import annotations

import attrs
import trio

from ...foundation.json_values import JsonObject as Json
from ...foundation.json_values import JsonValue
from ...tools.permissions import PermissionAnswer, PermissionRequest
from .rpc import Incoming, request_line
from .updates import tool_kind

__all__ = ["Asked", "PermissionAsker", "answer"]


_PERMISSION_OPTIONS = [
    {"optionId": "allow_once", "name": "Allow", "kind": "allow_once"},
    {"optionId": "allow_always", "name": "Always allow", "kind": "allow_always"},
    {"optionId": "reject_once", "name": "Reject", "kind": "reject_once"},
]


@attrs.define
class Asked:
    """A request of ours waiting for the client's response."""

    done: trio.Event = attrs.field(factory=trio.Event)
    result: JsonValue = None  # the response's `result`, any JSON the client sent
    error: JsonValue = None  # the response's `error`, any JSON the client sent


def answer(asked: Asked) -> PermissionAnswer:
    """The client's response as the approver's answer: a chosen allow option allows, anything
    else (a reject, a cancelled request, an error, a malformed result) denies and says why."""
    if asked.error is not None:
        message = asked.error.get("message") if isinstance(asked.error, dict) else None
        return PermissionAnswer("deny", f"the client could not ask: {message or asked.error}")
    outcome = asked.result.get("outcome") if isinstance(asked.result, dict) else None
    if isinstance(outcome, dict) and outcome.get("outcome") == "selected":
        chosen = outcome.get("optionId")
        if chosen == "allow_once":
            return PermissionAnswer("allow")
        if chosen == "allow_always":
            return PermissionAnswer("always")
        return PermissionAnswer("deny", "the person declined the permission request")
    if isinstance(outcome, dict) and outcome.get("outcome") == "cancelled":
        return PermissionAnswer("deny", "the permission request was cancelled")
    return PermissionAnswer("deny", "the client's answer to the permission request was not understood")


class PermissionAsker:
    """Our `session/request_permission` requests of one connection, by id; requests go to `out`
    as encoded lines."""

    def __init__(self, out: trio.MemorySendChannel[bytes]) -> None:
        self._out = out
        self._asked: dict[str, Asked] = {}
        self._next_request = 0

    async def ask(self, session_id: str, request: PermissionRequest) -> PermissionAnswer:
        """Ask the client about `request` under its open session `session_id` (the request's
        own session or an ancestor of it) and wait for the answer."""
        self._next_request += 1
        msg_id = f"permission-{self._next_request}"
        asked = self._asked[msg_id] = Asked()
        call: Json = {
            "toolCallId": request.call_id,
            "title": request.title,
            "kind": tool_kind(request.tool),
            "status": "pending",
            "rawInput": dict(request.arguments),
        }
        if request.session_id != session_id:
            call["title"] = f"{request.title} (subagent {request.session_id})"
        params = {"sessionId": session_id, "toolCall": call, "options": _PERMISSION_OPTIONS}
        try:
            await self._out.send(request_line(msg_id, "session/request_permission", params))
            await asked.done.wait()
        finally:
            self._asked.pop(msg_id, None)
        return answer(asked)

    def on_response(self, message: Incoming) -> None:
        """The client's response to a request of ours (one we did not send is ignored)."""
        asked = self._asked.get(str(message.id))
        if asked is None or asked.done.is_set():
            return
        asked.result, asked.error = message.result, message.error
        asked.done.set()
