"""The pure parts of `subagents acp`, in process: the JSON-RPC framing, the line reader, the
event → update mapping (validated against the SDK's schema types) and the stop reasons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import trio.testing
from acp.schema import (
    AgentMessageChunk,
    SessionNotification,
    ToolCallProgress,
    ToolCallStart,
    UserMessageChunk,
)
from cli_process import write_script
from subagents.runtime.app import open_runtime
from subagents.runtime.hosts.acp.host import MAX_LINE, _lines
from subagents.runtime.hosts.acp.rpc import Incoming, error_line, notification_line, parse_line, result_line
from subagents.runtime.hosts.acp.updates import stop_reason, updates_for


def test_parse_line_sorts_requests_notifications_responses_and_garbage() -> None:
    assert parse_line(b'{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":1}}') == Incoming(
        method="initialize", params={"protocolVersion": 1}, id=7
    )
    assert parse_line(b'{"jsonrpc":"2.0","method":"session/cancel","params":{}}') == Incoming(
        method="session/cancel", params={}, id=None
    )
    assert parse_line(b'{"jsonrpc":"2.0","id":"x","result":{}}').is_response  # type: ignore[union-attr]  # parse_line returns a message here, never an error
    for line, code, msg_id in [
        (b"{not json", -32700, None),
        (b'"a string"', -32600, None),
        (b'{"jsonrpc":"2.0","id":true,"method":"m"}', -32600, None),
        (b'{"jsonrpc":"2.0","id":3,"method":7}', -32600, 3),
        (b'{"id":4,"method":"m"}', -32600, 4),
        (b'{"jsonrpc":"2.0","id":5,"method":"m","params":3}', -32602, 5),
    ]:
        reply = parse_line(line)
        assert isinstance(reply, bytes), line
        decoded = json.loads(reply)
        assert decoded["error"]["code"] == code and decoded["id"] == msg_id, line


def test_encoded_lines_are_one_json_object_each() -> None:
    for line in (result_line(1, {"a": "b\nc"}), error_line("x", -32601, "nope"), notification_line("m", {"k": 1})):
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert json.loads(line)["jsonrpc"] == "2.0"


async def test_the_line_reader_skips_blank_lines_and_refuses_an_overlong_one() -> None:
    send, receive = trio.testing.memory_stream_pair()
    got: list[bytes | None] = []

    async def read() -> None:
        async for line in _lines(receive):
            got.append(line)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await send.send_all(b'{"a":1}\n\n  \n')
        await send.send_all(b"x" * (MAX_LINE + 10))
        await send.send_all(b"still the long line\n" + b'{"b":2}\n{"c":3}')
        await send.aclose()
    assert got == [b'{"a":1}', None, b'{"b":2}', b'{"c":3}']


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ({"kind": "completed"}, "end_turn"),
        ({"kind": "aborted", "cause": "user"}, "cancelled"),
        ({"kind": "max-tokens"}, "max_tokens"),
        ({"kind": "budget", "message": "m"}, "max_turn_requests"),
        ({"kind": "blocked", "message": "step limit"}, "max_turn_requests"),
        ({"kind": "error", "message": "boom"}, None),
        ({"kind": "something-new"}, None),
    ],
)
def test_stop_reasons_follow_the_spec(reason: dict[str, str], expected: str | None) -> None:
    assert stop_reason(reason) == expected


async def test_updates_for_a_turn_with_tool_calls_validate_against_the_sdk(tmp_path: Path) -> None:
    script = {
        "agents": [
            {
                "responses": [
                    {
                        "text": "checking",
                        "tool_calls": [
                            {"name": "list_agents", "arguments": {}},
                            {"name": "send_message", "arguments": "{not json"},
                        ],
                    },
                    {"text": "done"},
                ]
            }
        ]
    }
    model = write_script(tmp_path / "script.json", script)
    async with open_runtime(tmp_path / "root", model=model) as runtime:
        agent = await runtime.agents.create()
        await agent.send("hello")
        await agent.wait_idle()
        async with runtime.query.observe_session(agent.session_id) as observation:
            events = list(observation.events)
    live = updates_for(events, session_id=agent.session_id)
    replay = updates_for(events, session_id=agent.session_id, replay=True)
    parsed = [SessionNotification.model_validate({"sessionId": agent.session_id, "update": u}).update for u in replay]
    assert [type(u) for u in parsed] == [
        UserMessageChunk,
        AgentMessageChunk,
        ToolCallStart,
        ToolCallStart,
        ToolCallProgress,
        ToolCallProgress,
        AgentMessageChunk,
    ]
    assert live == replay[1:]  # live, the person's own message is not echoed
    first, second = parsed[2], parsed[3]
    assert first.raw_input == {} and second.raw_input is None  # malformed arguments: title only
    assert second.title == "send_message({not json)"
    results = {u.tool_call_id: u for u in parsed[4:6]}
    assert results[first.tool_call_id].status == "completed"
    assert results[second.tool_call_id].status == "failed"
    assert results[second.tool_call_id].content[0].content.text.startswith("Error")
    assert parsed[6].content.text == "done"


def test_a_permission_response_becomes_the_approvers_answer() -> None:
    from subagents.runtime.hosts.acp.permission import Asked as _Asked
    from subagents.runtime.hosts.acp.permission import answer as _answer
    from subagents.runtime.tools.permissions import PermissionAnswer

    def answer(result: object = None, error: object = None) -> PermissionAnswer:
        return _answer(_Asked(result=result, error=error))

    def selected(option: str) -> dict[str, object]:
        return {"outcome": {"outcome": "selected", "optionId": option}}

    assert answer(selected("allow_once")) == PermissionAnswer("allow")
    assert answer(selected("allow_always")) == PermissionAnswer("always")
    assert answer(selected("reject_once")).outcome == "deny"
    assert answer(selected("something_else")).outcome == "deny"
    assert answer({"outcome": {"outcome": "cancelled"}}) == PermissionAnswer(
        "deny", "the permission request was cancelled"
    )
    assert answer(error={"code": -32603, "message": "no UI"}) == PermissionAnswer(
        "deny", "the client could not ask: no UI"
    )
    assert answer("junk").reason == "the client's answer to the permission request was not understood"
