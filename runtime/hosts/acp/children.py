"""The descendants of an ACP session as child sessions, for a client that advertised
`clientCapabilities.subagents` (ACP v1, the SDK's unstable schema: `subagent_update`,
`session_message`).

Theory of operation. Pure: the durable events of a session's tree (the session itself and every
descendant, as the event stream delivers them: each session's events in seq order, a child's
`subagent/catalog` before any event of that child) go in, `(sessionId, update)` pairs come out.
One `ChildTree` per ACP session; the same tree maps a `session/load` replay and the live stream
after it, so nothing is announced twice and a child's event the replay sent is skipped when the
stream brings it again (`next_seq`).

- A `subagent/catalog` in a session's log announces its child on that session (its parent):
  `subagent_update` with the catalog's label as `title`, the first line of the task the
  `subagent` call gave as `description`, `capabilities.cancel` (a `session/cancel` with the
  child's id interrupts its turn) and `state: running` (a child starts working when it is
  catalogued). The `subagent` tool call is then linked to the child: the schema's tool call
  content has no `session` type, so a `tool_call_update` carries the child's id in `_meta`
  (and the announcement the call id).
- A child's own events go out under its own id with the mapping of `updates_for` (its replies,
  tool calls and results); its `turn/start` and `turn/end` become `state` snapshots on its
  parent (`running`; `idle` with the stop reason, an error's message, and the turn's token
  usage).
- Liveness (issue 29 item 4): what a listing of the tree says of a child it announced, when it
  changed (`liveness`): `stalled` (running, no durable progress for `stall_after`) stays
  `running`, `orphaned` (its turn open, its runner gone) is `unknown`; the word, the last durable
  event's time and who runs it go in `_meta`. The server lists the tree after a load's replay and
  then every `LIVENESS_EVERY` seconds while the session is open.
- Messages between sessions are `session_message` upserts, on the session that received them:
  a child's first prompt (from its parent), a message an agent sent (`agent-message`) and a
  settlement notice (`subagent-settled`, from the child that settled). A sender this client was
  not told of is left out rather than named before its announcement.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import msgspec
from subagents.storage import Event, decode_payload

from ...foundation.json_values import JsonObject as Json
from ...foundation.json_values import JsonValue
from .updates import stop_reason, updates_for

__all__ = ["META_KEY", "ChildTree", "Notification", "catalog_children", "idle_state", "turn_usage", "usage_object"]

Notification = tuple[str, Json]
"""One `session/update`: the session it is about and the update."""

META_KEY = "trio-subagents"  # our `_meta` namespace: the links the schema has no field for
_DESCRIPTION_WIDTH = 200
_DELEGATING_TOOLS = frozenset({"subagent", "subagent_fork"})
_MESSAGE_SOURCES = frozenset({"agent-message", "subagent-settled"})
_TREE_TYPES = frozenset(
    {"user/message", "assistant/message", "tool/call", "tool/result", "turn/start", "turn/end", "subagent/catalog"}
)


class ChildTree:
    """The child sessions of ACP session `root_id` this connection was told of."""

    def __init__(self, root_id: str) -> None:
        self.root_id = root_id
        self.parents: dict[str, str] = {}  # each announced descendant: its parent
        self.next_seq: dict[str, int] = {}  # each descendant: the next seq to map
        self._states: dict[str, str] = {}  # each descendant: the state last sent
        self._tasks: dict[tuple[str, str], str] = {}  # (session, call id): a delegating call's task
        self._usage: dict[str, tuple[int, int]] = {}  # each descendant: its open turn's tokens so far
        self._prompted: set[str] = set()  # descendants whose first prompt (from their parent) was mapped
        self._liveness: dict[str, str | None] = {}  # each descendant: the liveness last sent

    def knows(self, session_id: str) -> bool:
        """`session_id` is the root or a descendant announced to the client."""
        return session_id == self.root_id or session_id in self.parents

    def event(self, session_id: str, event: Event, inherited_event_count: int = 0) -> list[Notification]:
        """The notifications for one durable event of the tree. For the root only what its own
        mapping (`updates_for`) lacks: announcements, links, inter-session messages."""
        if event.type not in _TREE_TYPES or event.seq < inherited_event_count:
            return []  # a fork's inherited events are its parent's, shown there
        own = session_id != self.root_id
        if own:
            if session_id not in self.parents or event.seq < self.next_seq.get(session_id, 0):
                return []  # never announced (the stream delivers a catalog first), or sent already
            self.next_seq[session_id] = event.seq + 1
        data = msgspec.to_builtins(decode_payload(event, session_id=session_id))
        kind = event.type
        if kind == "subagent/catalog":
            return self._announce(session_id, data)
        if kind == "tool/call" and data["name"] in _DELEGATING_TOOLS:
            self._tasks[(session_id, data["call_id"])] = _task_of(data["arguments"])
        if kind == "user/message":
            return self._message(session_id, data["message"])
        if not own:
            return []
        if kind == "turn/start":
            self._usage[session_id] = (0, 0)
            return self._state(session_id, {"state": "running"})
        if kind == "turn/end":
            return self._state(session_id, idle_state(data["reason"], self._usage.pop(session_id, None)))
        if kind == "assistant/message" and isinstance(data.get("usage"), dict):
            self._usage[session_id] = turn_usage(self._usage.get(session_id, (0, 0)), data["usage"])
        return [(session_id, update) for update in updates_for([event], session_id=session_id)]

    def liveness(
        self, child_id: str, liveness: str | None, last_event: int | None, runner: str | None
    ) -> list[Notification]:
        """A listing's liveness of an announced child (issue 29 item 4), sent when it changed: a
        `stalled` child is still `running`, an `orphaned` one (its turn open, its runner gone)
        `unknown`; the words, the last durable event's time and who runs it in `_meta`."""
        if child_id not in self.parents or self._liveness.get(child_id) == liveness:
            return []
        if liveness is None and child_id not in self._liveness:
            return []  # nothing was said: its turns' states say the rest
        if self._states.get(child_id) == "idle":
            return []  # its turn ended since the listing read it: that state was sent
        self._liveness[child_id] = liveness
        state: Json = {"state": "unknown" if liveness == "orphaned" else "running"}
        self._states[child_id] = state["state"]
        meta: Json = {"liveness": liveness}
        if last_event is not None:
            meta["lastEvent"] = last_event
        if runner is not None:
            meta["runner"] = runner
        update: Json = {"sessionUpdate": "subagent_update", "sessionId": child_id, "state": state}
        update["_meta"] = {META_KEY: meta}
        return [(self.parents[child_id], update)]

    def unreadable(self, child_id: str) -> list[Notification]:
        """An announced child whose log could not be read: its activity is not known."""
        if child_id not in self.parents:
            return []
        return self._state(child_id, {"state": "unknown"})

    def _announce(self, parent_id: str, data: Mapping[str, JsonValue]) -> list[Notification]:
        child = data["child_id"]
        if child in self.parents or child == self.root_id:
            return []
        self.parents[child] = parent_id
        self._states[child] = "running"
        update: Json = {"sessionUpdate": "subagent_update", "sessionId": child}
        if isinstance(data.get("label"), str):
            update["title"] = data["label"]
        call_id = data.get("call_id")
        task = self._tasks.pop((parent_id, call_id), None) if isinstance(call_id, str) else None
        if task:
            update["description"] = task
        update["capabilities"] = {"cancel": {}}
        update["state"] = {"state": "running"}
        meta: Json = {"parentSessionId": parent_id, "mode": data["mode"]}
        if isinstance(call_id, str):
            meta["toolCallId"] = call_id
        update["_meta"] = {META_KEY: meta}
        out: list[Notification] = [(parent_id, update)]
        if isinstance(call_id, str):
            link = {
                "sessionUpdate": "tool_call_update",
                "toolCallId": call_id,
                "_meta": {META_KEY: {"childSessionId": child}},
            }
            out.append((parent_id, link))
        return out

    def _message(self, session_id: str, message: Mapping[str, JsonValue]) -> list[Notification]:
        source = message["source"]
        kind = source.get("kind")
        if kind in _MESSAGE_SOURCES:
            sender = source.get("sender_session_id")
        elif kind == "user" and session_id != self.root_id and session_id not in self._prompted:
            # A child's first prompt is its parent's task (format.md, "What this runtime writes").
            self._prompted.add(session_id)
            sender = self.parents[session_id]
        elif kind == "user" and session_id != self.root_id:
            # Later ones came from a person (`subagents send`): the child's user turn.
            return [(session_id, u) for u in _user_chunks(message)]
        else:
            return []
        content = [{"type": "text", "text": b["text"]} for b in message["content"] if b.get("type") == "text"]
        if not content:
            return []
        update: Json = {"sessionUpdate": "session_message", "messageId": message["id"]}
        if isinstance(sender, str) and self.knows(sender):
            update["senderSessionId"] = sender
        update["recipientSessionId"] = session_id
        update["content"] = content
        return [(session_id, update)]

    def _state(self, child: str, state: Json) -> list[Notification]:
        if state["state"] == "running" and self._states.get(child) == "running":
            return []  # announced running, and its first turn starts: nothing new
        self._states[child] = state["state"]
        self._liveness.pop(child, None)  # a turn's own state says it is alive
        return [(self.parents[child], {"sessionUpdate": "subagent_update", "sessionId": child, "state": state})]


def catalog_children(events: Sequence[Event], inherited_event_count: int = 0) -> list[str]:
    """The children a session's own `subagent/catalog` events name, in order (a catalog that
    does not parse names none: the session's readers refuse such a log anyway)."""
    out = []
    for event in events:
        if event.type != "subagent/catalog" or event.seq < inherited_event_count:
            continue
        try:
            data = msgspec.json.decode(event.data)
        except msgspec.DecodeError:
            continue
        child = data.get("child_id") if isinstance(data, dict) else None
        if isinstance(child, str) and child:
            out.append(child)
    return out


def idle_state(reason: Mapping[str, JsonValue], usage: tuple[int, int] | None) -> Json:
    """The `idle` state snapshot of a turn that ended with `reason` (its stop reason; a turn
    that failed is `error` with the message), with the turn's token usage if any was recorded."""
    mapped = stop_reason(reason)
    state: Json = {"state": "idle", "stopReason": mapped or "error"}
    if mapped is None:
        message = reason.get("message")
        kind = reason.get("kind")
        text = message if isinstance(message, str) and message else f"the turn ended in error ({kind})"
        state["error"] = {"code": -32603, "message": text}
    if usage is not None and usage != (0, 0):
        state["usage"] = usage_object(usage)
    return state


def turn_usage(so_far: tuple[int, int], usage: Mapping[str, JsonValue]) -> tuple[int, int]:
    """`so_far` (input, output tokens) plus one reply's recorded `usage`."""
    return so_far[0] + int(usage.get("input_tokens", 0)), so_far[1] + int(usage.get("output_tokens", 0))


def usage_object(usage: tuple[int, int]) -> Json:
    """An ACP `Usage` of (input, output) tokens."""
    return {"totalTokens": usage[0] + usage[1], "inputTokens": usage[0], "outputTokens": usage[1]}


def _task_of(arguments: str) -> str:
    """The first line of a delegating call's `prompt`, shortened; "" when there is none."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return ""
    prompt = args.get("prompt") if isinstance(args, dict) else None
    if not isinstance(prompt, str):
        return ""
    line = " ".join(prompt.strip().split("\n", 1)[0].split())
    return line if len(line) <= _DESCRIPTION_WIDTH else line[: _DESCRIPTION_WIDTH - 1] + "…"


def _user_chunks(message: Mapping[str, JsonValue]) -> list[Json]:
    text = "".join(b["text"] for b in message["content"] if b.get("type") == "text")
    if not text:
        return []
    return [
        {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": text}, "messageId": message["id"]}
    ]
