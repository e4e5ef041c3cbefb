"""Descendants as ACP child sessions (acp/children.py and the server around it): the pure mapping
from a tree's durable events to `subagent_update`, child updates and `session_message`, in
tables; then the server in process, over memory streams, for a client that opts in (announcement
order, a child's cancel, a permission question under the child's id, `session/load`) and one
that does not (no child update at all). The end-to-end run with the TypeScript SDK's own schema
is test_acp_children_node.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from acp.schema import SessionNotification
from cli_process import write_script
from subagents.runtime.app import Runtime, open_runtime
from subagents.runtime.hosts.acp.children import META_KEY, ChildTree, catalog_children, idle_state
from subagents.runtime.hosts.acp.host import TextRelay, serve_acp
from subagents.runtime.hosts.acp.session import liveness_every
from subagents.runtime.models.specs import build_model, parse_model_spec
from subagents.runtime.models.tee import TeeModel
from subagents.runtime.tools.permissions import Permissions
from subagents.storage import Event, make_event

ROOT, CHILD, GRANDCHILD = "root-1", "child-1", "grandchild-1"
T = 1_789_000_000_000


# --- events ---------------------------------------------------------------------------------


def _message(seq: int, kind: str, text: str, source: dict[str, Any], **more: Any) -> Event:
    role = "assistant" if kind == "assistant/message" else "user"
    data = {
        "turn": 1,
        "step": 1,
        "message": {"id": f"m{seq}", "role": role, "content": [{"type": "text", "text": text}], "source": source},
        **more,
    }
    return make_event(seq, kind, T + seq, data, surface_op="append")


def user(seq: int, text: str, **source: Any) -> Event:
    return _message(seq, "user/message", text, {"kind": "user", **source})


def notice(seq: int, sender: str, text: str = "Background subagent finished.") -> Event:
    return _message(seq, "user/message", text, {"kind": "subagent-settled", "sender_session_id": sender})


def agent_message(seq: int, sender: str, text: str) -> Event:
    return _message(seq, "user/message", text, {"kind": "agent-message", "sender_session_id": sender})


def reply(seq: int, text: str, usage: tuple[int, int] | None = None) -> Event:
    more: dict[str, Any] = {"finish": "stop"}
    if usage is not None:
        more["usage"] = {"input_tokens": usage[0], "output_tokens": usage[1]}
    return _message(seq, "assistant/message", text, {"kind": "model"}, **more)


def call(seq: int, call_id: str, name: str, arguments: Any) -> Event:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return make_event(
        seq, "tool/call", T + seq, {"turn": 1, "step": 1, "call_id": call_id, "name": name, "arguments": raw}
    )


def catalog(seq: int, child: str, label: str | None = None, call_id: str | None = None) -> Event:
    data: dict[str, Any] = {"version": 1, "child_id": child, "child_created_at": T, "mode": "continuable"}
    if label is not None:
        data["label"] = label
    if call_id is not None:
        data["call_id"] = call_id
    return make_event(seq, "subagent/catalog", T + seq, data)


def turn_start(seq: int, turn: int = 1) -> Event:
    return make_event(seq, "turn/start", T + seq, {"turn": turn})


def turn_end(seq: int, reason: dict[str, Any], turn: int = 1) -> Event:
    return make_event(seq, "turn/end", T + seq, {"turn": turn, "reason": reason})


def announced_tree() -> ChildTree:
    """A tree whose root announced CHILD (label Alpha, from call c1)."""
    tree = ChildTree(ROOT)
    tree.event(ROOT, call(0, "c1", "subagent", {"description": "Alpha", "prompt": "Find the bug.\nDetails."}))
    tree.event(ROOT, catalog(1, CHILD, "Alpha", "c1"))
    return tree


def _valid(notifications: list[tuple[str, dict[str, Any]]]) -> None:
    """The updates the Python SDK (0.12, which predates subagents) knows are checked by it."""
    for sid, update in notifications:
        if update["sessionUpdate"] not in ("subagent_update", "session_message"):
            SessionNotification.model_validate({"sessionId": sid, "update": update})


# --- the mapping ----------------------------------------------------------------------------


def test_a_catalog_announces_its_child_on_the_parent_then_links_the_call() -> None:
    tree = ChildTree(ROOT)
    assert (
        tree.event(ROOT, call(0, "c1", "subagent", {"description": "Alpha", "prompt": "Find the bug.\nDetails."})) == []
    )
    out = tree.event(ROOT, catalog(1, CHILD, "Alpha", "c1"))
    assert out == [
        (
            ROOT,
            {
                "sessionUpdate": "subagent_update",
                "sessionId": CHILD,
                "title": "Alpha",
                "description": "Find the bug.",
                "capabilities": {"cancel": {}},
                "state": {"state": "running"},
                "_meta": {META_KEY: {"parentSessionId": ROOT, "mode": "continuable", "toolCallId": "c1"}},
            },
        ),
        (
            ROOT,
            {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "_meta": {META_KEY: {"childSessionId": CHILD}}},
        ),
    ]
    _valid(out)
    assert tree.parents == {CHILD: ROOT} and tree.knows(CHILD) and tree.knows(ROOT) and not tree.knows("other")
    assert tree.event(ROOT, catalog(2, CHILD, "Alpha", "c1")) == []  # announced once


def test_a_catalog_without_label_or_call_announces_what_it_has() -> None:
    tree = ChildTree(ROOT)
    (only,) = tree.event(ROOT, catalog(0, CHILD))
    assert only[1] == {
        "sessionUpdate": "subagent_update",
        "sessionId": CHILD,
        "capabilities": {"cancel": {}},
        "state": {"state": "running"},
        "_meta": {META_KEY: {"parentSessionId": ROOT, "mode": "continuable"}},
    }


@pytest.mark.parametrize(
    ("arguments", "description"),
    [
        ("{not json", None),
        ({"description": "x"}, None),
        ({"description": "x", "prompt": 7}, None),
        ({"description": "x", "prompt": "  many   spaces\there \nsecond line"}, "many spaces here"),
        ({"description": "x", "prompt": "y" * 300}, "y" * 199 + "…"),
    ],
)
def test_the_description_is_the_tasks_first_line(arguments: Any, description: str | None) -> None:
    tree = ChildTree(ROOT)
    tree.event(ROOT, call(0, "c1", "subagent_fork", arguments))
    (announce, _link) = tree.event(ROOT, catalog(1, CHILD, "x", "c1"))
    assert announce[1].get("description") == description


def test_a_childs_own_events_go_out_under_its_id_and_its_turns_as_states_on_its_parent() -> None:
    tree = announced_tree()
    out = [
        n
        for e in [
            turn_start(0),
            user(1, "Find the bug."),
            reply(2, "looking", usage=(10, 2)),
            call(3, "k1", "list_agents", {}),
            reply(4, "found it", usage=(5, 1)),
            turn_end(5, {"kind": "completed"}),
        ]
        for n in tree.event(CHILD, e)
    ]
    _valid(out)
    kinds = [(sid, u["sessionUpdate"]) for sid, u in out]
    assert kinds == [
        (CHILD, "session_message"),  # its first prompt, from its parent (turn/start: still running)
        (CHILD, "agent_message_chunk"),
        (CHILD, "tool_call"),
        (CHILD, "agent_message_chunk"),
        (ROOT, "subagent_update"),
    ]
    assert out[0][1] == {
        "sessionUpdate": "session_message",
        "messageId": "m1",
        "senderSessionId": ROOT,
        "recipientSessionId": CHILD,
        "content": [{"type": "text", "text": "Find the bug."}],
    }
    assert out[-1][1] == {
        "sessionUpdate": "subagent_update",
        "sessionId": CHILD,
        "state": {
            "state": "idle",
            "stopReason": "end_turn",
            "usage": {"totalTokens": 18, "inputTokens": 15, "outputTokens": 3},
        },
    }
    # A second turn: running again, and a person's later message is the child's user turn.
    again = tree.event(CHILD, turn_start(6, 2)) + tree.event(CHILD, user(7, "and now?"))
    assert again == [
        (ROOT, {"sessionUpdate": "subagent_update", "sessionId": CHILD, "state": {"state": "running"}}),
        (
            CHILD,
            {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "and now?"}, "messageId": "m7"},
        ),
    ]


@pytest.mark.parametrize(
    ("reason", "usage", "state"),
    [
        ({"kind": "completed"}, None, {"state": "idle", "stopReason": "end_turn"}),
        ({"kind": "completed"}, (0, 0), {"state": "idle", "stopReason": "end_turn"}),
        (
            {"kind": "aborted", "cause": "parent"},
            (1, 2),
            {
                "state": "idle",
                "stopReason": "cancelled",
                "usage": {"totalTokens": 3, "inputTokens": 1, "outputTokens": 2},
            },
        ),
        ({"kind": "max-tokens"}, None, {"state": "idle", "stopReason": "max_tokens"}),
        (
            {"kind": "budget", "message": "max_turns 1 reached"},
            None,
            {"state": "idle", "stopReason": "max_turn_requests"},
        ),
        (
            {"kind": "error", "message": "boom"},
            None,
            {
                "state": "idle",
                "stopReason": "error",
                "error": {"code": -32603, "message": "boom"},
            },
        ),
        (
            {"kind": "interrupted"},
            None,
            {
                "state": "idle",
                "stopReason": "error",
                "error": {"code": -32603, "message": "the turn ended in error (interrupted)"},
            },
        ),
    ],
)
def test_idle_states_carry_the_stop_reason_and_the_turns_usage(
    reason: dict[str, Any], usage: tuple[int, int] | None, state: dict[str, Any]
) -> None:
    assert idle_state(reason, usage) == state


def test_messages_between_sessions_are_session_messages_on_the_recipient() -> None:
    tree = announced_tree()
    tree.event(CHILD, call(0, "g", "subagent", {"description": "Gamma", "prompt": "Count."}))
    grand = tree.event(CHILD, catalog(1, GRANDCHILD, "Gamma", "g"))
    assert [(sid, u["sessionUpdate"], u.get("sessionId")) for sid, u in grand] == [
        (CHILD, "subagent_update", GRANDCHILD),  # announced on its own parent, the child
        (CHILD, "tool_call_update", None),
    ]
    out = (
        tree.event(ROOT, notice(2, CHILD))
        + tree.event(CHILD, notice(2, GRANDCHILD))
        + tree.event(CHILD, agent_message(3, ROOT, "Agent root sent a message: hurry"))
        + tree.event(ROOT, agent_message(3, "stranger", "Agent stranger sent a message: hi"))
    )
    assert [(sid, u.get("senderSessionId"), u["recipientSessionId"], u["content"][0]["text"]) for sid, u in out] == [
        (ROOT, CHILD, ROOT, "Background subagent finished."),
        (CHILD, GRANDCHILD, CHILD, "Background subagent finished."),
        (CHILD, ROOT, CHILD, "Agent root sent a message: hurry"),
        (ROOT, None, ROOT, "Agent stranger sent a message: hi"),  # never announced: not named
    ]


def test_the_roots_own_events_give_only_what_its_mapping_lacks() -> None:
    tree = ChildTree(ROOT)
    for event in [turn_start(0), user(1, "hi"), reply(2, "hello", usage=(1, 1)), turn_end(3, {"kind": "completed"})]:
        assert tree.event(ROOT, event) == []


def test_unannounced_sessions_inherited_events_and_events_sent_already_give_nothing() -> None:
    tree = announced_tree()
    assert tree.event("stranger", reply(0, "hi")) == []
    assert tree.event(CHILD, reply(0, "inherited"), inherited_event_count=3) == []
    assert tree.event(CHILD, reply(3, "own"), inherited_event_count=3) != []
    assert tree.next_seq[CHILD] == 4
    assert tree.event(CHILD, reply(3, "own")) == []  # the replay sent it; the stream brings it again
    assert tree.event(CHILD, make_event(4, "step/start", T, {"turn": 1, "step": 1})) == []
    assert tree.unreadable("stranger") == []
    assert tree.unreadable(CHILD) == [
        (ROOT, {"sessionUpdate": "subagent_update", "sessionId": CHILD, "state": {"state": "unknown"}})
    ]


def test_catalog_children_reads_own_catalogs_in_order_and_skips_damaged_ones() -> None:
    broken = make_event(2, "acp/other", T, {"x": 1}, ignorable=True)
    events = [catalog(0, "inherited"), catalog(1, "a"), broken, catalog(3, "b")]
    assert catalog_children(events, inherited_event_count=1) == ["a", "b"]
    assert catalog_children([]) == []


# --- the server in process --------------------------------------------------------------------


class Client:
    """JSON lines to the server and back; requests of the server are answered from `answers`."""

    def __init__(self, send: trio.abc.SendStream, receive: trio.abc.ReceiveStream) -> None:
        self._send, self._receive = send, receive
        self._buffer = b""
        self._next = 0
        self.seen: list[dict[str, Any]] = []
        self.answers: list[str] = []

    async def send(self, method: str, params: Any, msg_id: int | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        if msg_id is not None:
            message["id"] = msg_id
        await self._send.send_all(json.dumps(message).encode() + b"\n")

    async def read(self) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            chunk = await self._receive.receive_some()
            assert chunk, "the server closed its output"
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message = json.loads(line)
        self.seen.append(message)
        if message.get("method") == "session/request_permission":
            outcome = {"outcome": "selected", "optionId": self.answers.pop(0)}
            await self._send.send_all(
                json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {"outcome": outcome}}).encode() + b"\n"
            )
        return message

    async def call(self, method: str, params: Any) -> dict[str, Any]:
        self._next += 1
        await self.send(method, params, self._next)
        while True:
            message = await self.read()
            if message.get("id") == self._next and "method" not in message:
                return message

    async def until(self, predicate: Any) -> dict[str, Any]:
        for message in self.seen:
            if predicate(message):
                return message
        while True:
            message = await self.read()
            if predicate(message):
                return message

    def updates(self) -> list[tuple[str, dict[str, Any]]]:
        return [
            (m["params"]["sessionId"], m["params"]["update"]) for m in self.seen if m.get("method") == "session/update"
        ]


@asynccontextmanager
async def serving(tmp_path: Path, script: Any, **options: Any) -> AsyncIterator[tuple[Client, Runtime]]:
    relay = TextRelay()
    inner = build_model(parse_model_spec(write_script(tmp_path / "script.json", script)))
    to_server, server_in = trio.testing.memory_stream_pair()
    server_out, from_server = trio.testing.memory_stream_pair()
    async with (
        open_runtime(tmp_path / "root", model=TeeModel(inner, relay), approver=relay.approve, **options) as runtime,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(lambda: serve_acp(runtime, server_in, server_out, version="test", relay=relay))
        yield Client(to_server, from_server), runtime
        await to_server.aclose()


def _subagent(label: str, prompt: str) -> dict[str, Any]:
    return {"name": "subagent", "arguments": {"description": label, "prompt": prompt}}


# The parent starts Alpha (a tool call, then it hangs until cancelled) and waits for it.
CANCEL_SCRIPT = {
    "agents": [
        {
            "responses": [
                {"tool_calls": [_subagent("Alpha", "Work until you are stopped.")]},
                {"wait_for": {"settled": "Alpha"}, "text": "Alpha stopped."},
                {"text": "noted"},
            ]
        },
        {"label": "Alpha", "responses": [{"tool_calls": [{"name": "list_agents", "arguments": {}}]}, {"hang": True}]},
    ]
}


async def _open(client: Client, tmp_path: Path, capabilities: dict[str, Any]) -> str:
    await client.call("initialize", {"protocolVersion": 1, "clientCapabilities": capabilities})
    return (await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["result"]["sessionId"]


def _first_index(messages: list[dict[str, Any]], session_id: str) -> int:
    """Where `session_id` first appears in a message other than its own announcement."""
    for i, message in enumerate(messages):
        params = message.get("params") or {}
        update = params.get("update") or {}
        if update.get("sessionUpdate") == "subagent_update" and update.get("sessionId") == session_id:
            continue
        if session_id in json.dumps(params):
            return i
    return len(messages)


def _announced_at(messages: list[dict[str, Any]], session_id: str) -> int:
    for i, message in enumerate(messages):
        update = (message.get("params") or {}).get("update") or {}
        if update.get("sessionUpdate") == "subagent_update" and update.get("sessionId") == session_id:
            return i
    raise AssertionError(f"{session_id} was never announced")


async def test_an_opted_in_client_sees_the_child_and_cancels_it_by_its_session_id(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with serving(tmp_path, CANCEL_SCRIPT) as (client, _runtime):
            sid = await _open(client, tmp_path, {"subagents": {}})
            await client.send("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]}, 99)
            announce = await client.until(
                lambda m: (m.get("params") or {}).get("update", {}).get("sessionUpdate") == "subagent_update"
            )
            child = announce["params"]["update"]["sessionId"]
            assert announce["params"]["sessionId"] == sid
            assert announce["params"]["update"]["title"] == "Alpha"
            await client.until(
                lambda m: (
                    m.get("params", {}).get("sessionId") == child and m["params"]["update"].get("status") == "completed"
                )
            )
            await client.send("session/cancel", {"sessionId": child})
            response = await client.until(lambda m: m.get("id") == 99)
    assert response["result"]["stopReason"] == "end_turn"
    updates = client.updates()
    states = [u["state"] for s, u in updates if u["sessionUpdate"] == "subagent_update" and "state" in u]
    assert states == [{"state": "running"}, {"state": "idle", "stopReason": "cancelled"}]
    assert _announced_at(client.seen, child) < _first_index(client.seen, child)
    assert [u["sessionUpdate"] for s, u in updates if s == child] == [
        "session_message",
        "tool_call",
        "tool_call_update",
    ]
    notices = [u for s, u in updates if s == sid and u["sessionUpdate"] == "session_message"]
    assert [n["senderSessionId"] for n in notices] == [child]
    _valid(updates)


async def test_a_client_that_did_not_opt_in_sees_no_child_and_cannot_cancel_one(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with serving(tmp_path, CANCEL_SCRIPT) as (client, runtime):
            sid = await _open(client, tmp_path, {"subagents": None})
            await client.send("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]}, 99)
            await client.until(lambda m: m.get("params", {}).get("update", {}).get("status") == "completed")
            async with runtime.query.observe_session(sid) as observation:
                (child,) = catalog_children(list(observation.events))
            await client.send("session/cancel", {"sessionId": child})  # not a session of this client
            await client.call("session/list", {})  # the cancel was handled before this answer
            agent = runtime.agents.get(child)
            assert agent is not None and agent.status == "running"
            await client.send("session/cancel", {"sessionId": sid})
            response = await client.until(lambda m: m.get("id") == 99)
            assert response["result"]["stopReason"] == "cancelled"
    assert all(s == sid for s, _u in client.updates())
    assert {u["sessionUpdate"] for _s, u in client.updates()} <= {
        "tool_call",
        "tool_call_update",
        "agent_message_chunk",
    }
    assert "usage" not in response["result"]


async def test_a_childs_permission_question_is_asked_under_its_own_session_id(tmp_path: Path) -> None:
    script = {
        "agents": [
            {
                "responses": [
                    {"tool_calls": [_subagent("Alpha", "List.")]},
                    {"wait_for": {"settled": "Alpha"}, "text": "done"},
                    {"text": "noted"},
                ]
            },
            {
                "label": "Alpha",
                "responses": [{"tool_calls": [{"name": "list_agents", "arguments": {}}]}, {"text": "ok"}],
            },
        ]
    }
    with trio.fail_after(30):
        async with serving(tmp_path, script, permissions=Permissions({"list_agents": "ask"})) as (client, _runtime):
            client.answers = ["allow_once"]
            sid = await _open(client, tmp_path, {"subagents": {}})
            response = await client.call(
                "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]}
            )
    assert response["result"]["stopReason"] == "end_turn"
    (asked,) = [m for m in client.seen if m.get("method") == "session/request_permission"]
    child = asked["params"]["sessionId"]
    assert child != sid and "(subagent" not in asked["params"]["toolCall"]["title"]
    assert _announced_at(client.seen, child) < client.seen.index(asked)


async def test_session_load_replays_the_children_and_streams_what_follows(tmp_path: Path) -> None:
    script = {
        "agents": [
            {
                "responses": [
                    {"tool_calls": [_subagent("Alpha", "Say hi.")]},
                    {"wait_for": {"settled": "Alpha"}, "text": "done"},
                    {"text": "noted"},
                    {"text": "again"},
                ]
            },
            {"label": "Alpha", "responses": [{"text": "hi", "usage": {"input_tokens": 3, "output_tokens": 1}}]},
        ]
    }
    with trio.fail_after(30):
        async with serving(tmp_path, script) as (first, _runtime):
            sid = await _open(first, tmp_path, {"subagents": {}})
            await first.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]})
            await first.until(
                lambda m: (m.get("params") or {}).get("update", {}).get("state", {}).get("state") == "idle"
            )
        async with serving(tmp_path, script) as (second, _runtime):
            await second.call("initialize", {"protocolVersion": 1, "clientCapabilities": {"subagents": {}}})
            loaded = await second.call("session/load", {"sessionId": sid, "cwd": str(tmp_path), "mcpServers": []})
            replayed = list(second.seen)
    assert loaded["result"] == {}
    child = next(u["sessionId"] for _s, u in first.updates() if u["sessionUpdate"] == "subagent_update")
    live_child = [(s, u) for s, u in first.updates() if s == child or u.get("sessionId") == child]
    replay_child = [(s, u) for s, u in second.updates() if s == child or u.get("sessionId") == child]
    assert replay_child == live_child  # announcement, its updates, its state: the same whole
    assert _announced_at(replayed, child) < _first_index(replayed, child)
    idle = [
        u["state"] for s, u in replay_child if u["sessionUpdate"] == "subagent_update" and u["state"]["state"] == "idle"
    ]
    assert idle == [
        {"state": "idle", "stopReason": "end_turn", "usage": {"totalTokens": 4, "inputTokens": 3, "outputTokens": 1}}
    ]


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("subagents", [True, "yes", 1, [], None])
async def test_a_subagents_capability_that_is_not_an_object_does_not_opt_in(tmp_path: Path, subagents: Any) -> None:
    with trio.fail_after(30):
        async with serving(tmp_path, CANCEL_SCRIPT) as (client, _runtime):
            sid = await _open(client, tmp_path, {"subagents": subagents})
            await client.send("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]}, 99)
            await client.until(lambda m: m.get("params", {}).get("update", {}).get("status") == "completed")
            await client.send("session/cancel", {"sessionId": sid})
            response = await client.until(lambda m: m.get("id") == 99)
    assert response["result"] == {"stopReason": "cancelled"}
    assert all(s == sid and u["sessionUpdate"] != "subagent_update" for s, u in client.updates())


async def test_a_cancel_of_an_unknown_session_or_of_an_idle_child_is_answered_not_raised(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with serving(tmp_path, CANCEL_SCRIPT) as (client, _runtime):
            sid = await _open(client, tmp_path, {"subagents": {}})
            unknown = await client.call("session/cancel", {"sessionId": "no-such-session"})
            assert unknown["error"]["code"] == -32002
            await client.send("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]}, 99)
            announce = await client.until(lambda m: m.get("params", {}).get("update", {}).get("title") == "Alpha")
            child = announce["params"]["update"]["sessionId"]
            await client.until(
                lambda m: (
                    m.get("params", {}).get("sessionId") == child and m["params"]["update"].get("status") == "completed"
                )
            )
            assert (await client.call("session/cancel", {"sessionId": child}))["result"] == {}
            await client.until(lambda m: m.get("id") == 99)
            # Idle now (its turn was cancelled and it settled): a second cancel stops nothing.
            assert (await client.call("session/cancel", {"sessionId": child}))["result"] == {}
            bad = await client.call("session/cancel", {"sessionId": 7})
            assert bad["error"]["code"] == -32602
    states = [u["state"] for _s, u in client.updates() if u["sessionUpdate"] == "subagent_update"]
    assert states == [{"state": "running"}, {"state": "idle", "stopReason": "cancelled"}]


async def test_a_child_whose_log_is_damaged_is_replayed_as_unknown(tmp_path: Path) -> None:
    script = {
        "agents": [
            {
                "responses": [
                    {"tool_calls": [_subagent("Alpha", "Say hi.")]},
                    {"wait_for": {"settled": "Alpha"}, "text": "done"},
                    {"text": "noted"},
                ]
            },
            {"label": "Alpha", "responses": [{"text": "hi"}]},
        ]
    }
    with trio.fail_after(30):
        async with serving(tmp_path, script) as (first, _runtime):
            sid = await _open(first, tmp_path, {"subagents": {}})
            await first.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]})
            child = next(u["sessionId"] for _s, u in first.updates() if u["sessionUpdate"] == "subagent_update")
        (log,) = (tmp_path / "root" / "sessions" / child).glob("session.jsonl*")
        log.write_bytes(b'{"this is": "not a session log"}\n')
        async with serving(tmp_path, script) as (second, _runtime):
            await second.call("initialize", {"protocolVersion": 1, "clientCapabilities": {"subagents": {}}})
            loaded = await second.call("session/load", {"sessionId": sid, "cwd": str(tmp_path), "mcpServers": []})
    assert loaded["result"] == {}
    about = [u for _s, u in second.updates() if u.get("sessionId") == child]
    assert [u.get("title") for u in about] == ["Alpha", None]
    assert about[-1]["state"] == {"state": "unknown"}
    assert not [s for s, _u in second.updates() if s == child]  # nothing of its history


# --- liveness (issue 29 item 4) -------------------------------------------------------------------


def test_liveness_is_sent_when_it_changes_and_never_over_an_ended_turn() -> None:
    tree = announced_tree()
    child = next(iter(tree.parents))
    parent = tree.parents[child]
    assert tree.liveness(child, None, 5, None) == []  # nothing said yet, nothing to take back
    (stalled,) = tree.liveness(child, "stalled", 1_000, "pid 42")
    assert stalled == (
        parent,
        {
            "sessionUpdate": "subagent_update",
            "sessionId": child,
            "state": {"state": "running"},
            "_meta": {"trio-subagents": {"liveness": "stalled", "lastEvent": 1_000, "runner": "pid 42"}},
        },
    )
    assert tree.liveness(child, "stalled", 2_000, "pid 42") == []  # unchanged
    (orphaned,) = tree.liveness(child, "orphaned", 2_000, None)
    assert orphaned[1]["state"] == {"state": "unknown"}
    assert orphaned[1]["_meta"] == {"trio-subagents": {"liveness": "orphaned", "lastEvent": 2_000}}
    assert tree.liveness("not-announced", "orphaned", 1, None) == []
    # Its turn ends (a resume closed it): that state is sent, and a stale listing says nothing over it.
    (idle,) = tree.event(child, turn_end(9, {"kind": "interrupted"}))
    assert idle[1]["state"]["state"] == "idle"
    assert tree.liveness(child, "orphaned", 2_000, None) == []
    _valid([stalled, orphaned, idle])


async def test_an_open_tree_is_listed_again_and_a_child_without_progress_is_sent_stalled(tmp_path: Path) -> None:
    """While a session is open its tree is listed every `liveness_every` (a fifth of
    `stall_after`, at least a second): a child running here whose open turn made no durable
    progress for `stall_after` is sent as still `running`, `stalled` in `_meta`, once."""
    with trio.fail_after(30):
        async with serving(tmp_path, CANCEL_SCRIPT, stall_after=0.001) as (client, runtime):
            assert liveness_every(runtime) == 1.0
            sid = await _open(client, tmp_path, {"subagents": {}})
            await client.send("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]}, 99)
            stalled = await client.until(
                lambda m: (
                    (m.get("params") or {}).get("update", {}).get("_meta", {}).get("trio-subagents", {}).get("liveness")
                    == "stalled"
                )
            )
            child = stalled["params"]["update"]["sessionId"]
            assert (await client.call("session/cancel", {"sessionId": child}))["result"] == {}
            await client.until(lambda m: m.get("id") == 99)
    update = stalled["params"]["update"]
    assert stalled["params"]["sessionId"] == sid and update["state"] == {"state": "running"}
    meta = update["_meta"]["trio-subagents"]
    assert meta["runner"] == "this process" and isinstance(meta["lastEvent"], int)
    said = [u for _s, u in client.updates() if u.get("sessionId") == child and u["sessionUpdate"] == "subagent_update"]
    assert [u["state"]["state"] for u in said] == ["running", "running", "idle"]  # announced, stalled, cancelled
