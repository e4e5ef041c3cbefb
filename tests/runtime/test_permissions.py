"""Tool permissions through the runtime: the policy's decisions, the approver asked once per `ask`
call after the call is durable, `always` remembered, denials as error results the model reads,
`ask` without an approver denied, and an embedder's own tools untouched without a policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from log_lines import read_all
from subagents.runtime import (
    DEFAULT_PERMISSIONS,
    PermissionAnswer,
    PermissionRequest,
    Permissions,
    ScenarioClock,
    ScriptedModel,
    load_script,
    open_runtime,
)
from subagents.storage import FileLogStore

Json = dict[str, Any]


def call(name: str, **arguments: Any) -> Json:
    return {"name": name, "arguments": arguments}


def results(root: Path, session_id: str) -> list[Json]:
    out = []
    for event in read_all(FileLogStore(str(root), use_index=False), session_id):
        if event.type == "tool/result":
            data = msgspec.json.decode(event.data)
            (block,) = data["message"]["content"]
            out.append({"text": block["content"][0]["text"], "error": data.get("error")})
    return out


def durable_types(root: Path, session_id: str) -> list[str]:
    return [e.type for e in read_all(FileLogStore(str(root), use_index=False), session_id)]


async def run_script(tmp_path: Path, calls: list[Json], **options: Any) -> list[Json]:
    script = {"agents": [{"session": "s", "responses": [{"tool_calls": [c]} for c in calls] + [{"text": "done"}]}]}
    with trio.fail_after(30):
        async with open_runtime(
            tmp_path / "root",
            model=ScriptedModel(load_script(json.dumps(script))),
            clock=ScenarioClock(),
            compression="none",
            **options,
        ) as rt:
            agent = await rt.agents.create(session_id="s")
            await agent.send("go")
            await agent.wait_idle()
    return results(tmp_path / "root", "s")


def test_the_policy_picks_exact_names_then_the_longest_glob_then_the_default() -> None:
    policy = Permissions({"mcp__*": "ask", "mcp__docs__*": "allow", "mcp__docs__delete": "deny"}, default="allow")
    assert policy.decision("mcp__git__push") == "ask"
    assert policy.decision("mcp__docs__search") == "allow"
    assert policy.decision("mcp__docs__delete") == "deny"
    assert policy.decision("read_file") == "allow"
    assert [
        DEFAULT_PERMISSIONS.decision(t) for t in ("read_file", "grep", "write_file", "edit_file", "run_command")
    ] == [
        "allow",
        "allow",
        "ask",
        "ask",
        "ask",
    ]
    with pytest.raises(ValueError, match="must be allow, ask or deny"):
        Permissions({"x": "maybe"})  # type: ignore[dict-item]  # the wrong value under test


async def test_ask_goes_to_the_approver_once_per_call_and_always_is_remembered(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    asked: list[PermissionRequest] = []
    answers = iter([PermissionAnswer("deny", "not now, please"), PermissionAnswer("allow"), PermissionAnswer("always")])
    root = tmp_path / "root"

    async def approver(request: PermissionRequest) -> PermissionAnswer:
        # The call it asks about is durable already (a client has seen it).
        assert durable_types(root, request.session_id)[-1] == "tool/call"
        asked.append(request)
        return next(answers)

    out = await run_script(
        tmp_path,
        [
            call("write_file", path="a.txt", content="1"),  # denied
            call("write_file", path="a.txt", content="2"),  # allowed once
            call("read_file", path="a.txt"),  # allowed by the policy: not asked
            call("edit_file", path="a.txt", old_string="2", new_string="3"),  # always
            call("edit_file", path="a.txt", old_string="3", new_string="4"),  # remembered: not asked
        ],
        workspace=ws,
        approver=approver,
    )
    assert [(r.tool, r.arguments) for r in asked] == [
        ("write_file", {"path": "a.txt", "content": "1"}),
        ("write_file", {"path": "a.txt", "content": "2"}),
        ("edit_file", {"path": "a.txt", "old_string": "2", "new_string": "3"}),
    ]
    assert asked[0].title == 'write_file({"path":"a.txt","content":"1"})' and asked[0].session_id == "s"
    assert out[0] == {
        "text": "Error: not now, please",
        "error": {"name": "PermissionDenied", "code": "PERMISSION_DENIED"},
    }
    assert [r["text"] for r in out[1:]] == [
        "created a.txt (1 bytes)",
        "     1\t2",
        "edited a.txt (1 replacement)",
        "edited a.txt (1 replacement)",
    ]
    assert (ws / "a.txt").read_text() == "4"


async def test_ask_without_an_approver_and_deny_are_error_results_and_touch_nothing(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    out = await run_script(
        tmp_path,
        [call("write_file", path="a.txt", content="1"), call("run_command", command="touch b")],
        workspace=ws,
        permissions=DEFAULT_PERMISSIONS.with_rules({"run_command": "deny"}),
    )
    assert out == [
        {
            "text": "Error: write_file needs permission and there is no one to ask here: denied",
            "error": {"name": "PermissionDenied", "code": "PERMISSION_DENIED"},
        },
        {
            "text": "Error: run_command is not allowed here (its permission is deny)",
            "error": {"name": "PermissionDenied", "code": "PERMISSION_DENIED"},
        },
    ]
    assert list(ws.iterdir()) == []


async def test_without_a_workspace_there_are_no_workspace_tools(tmp_path: Path) -> None:
    out = await run_script(tmp_path, [call("read_file", path="x")])
    assert out == [
        {"text": 'Error: unknown tool "read_file"', "error": {"name": "ToolNotFoundError", "code": "UNKNOWN_TOOL"}}
    ]
