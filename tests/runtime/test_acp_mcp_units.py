"""The pieces behind an ACP client's MCP servers, in process: the client's server shapes as
`McpServerSpec`s (acp/client_servers.py), and the registry's session tools — offered to one
session and its subagents (a cold-resumed one too, while its root's entry stands), to no other
session, guarded like every tool, hiding the shared tools they replace."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from subagents.runtime import (
    CountingIds,
    FunctionTool,
    PermissionAnswer,
    PermissionRequest,
    ScenarioClock,
    ScriptedModel,
    load_script,
    open_runtime,
)
from subagents.runtime.agent.registry import SessionTools
from subagents.runtime.hosts.acp.client_servers import ClientServers, client_specs
from subagents.runtime.models.base import Model, ModelRequest, SessionBinding
from subagents.runtime.tools.mcp_spec import McpServerSpec
from wrapped_models import WrappedModel

Json = dict[str, Any]


# --- the client's server shapes --------------------------------------------------------------


def test_stdio_and_http_servers_become_specs_with_their_env_headers_and_the_sessions_cwd() -> None:
    specs = client_specs(
        [
            {"name": "files", "command": "/bin/srv", "args": ["--x"], "env": [{"name": "TOKEN", "value": "t"}]},
            {"type": "stdio", "name": "plain", "command": "/bin/other", "args": [], "env": []},
            {
                "type": "http",
                "name": "web",
                "url": "http://h/mcp",
                "headers": [{"name": "Authorization", "value": "b"}],
            },
        ],
        "/work",
        "s1",
    )
    assert specs == [
        McpServerSpec(name="files", command="/bin/srv", args=["--x"], env={"TOKEN": "t"}, cwd="/work"),
        McpServerSpec(name="plain", command="/bin/other", env={}, cwd="/work"),
        McpServerSpec(name="web", url="http://h/mcp", headers={"Authorization": "b"}),
    ]


def test_names_a_tool_name_cannot_carry_are_mended_and_a_name_given_twice_keeps_its_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    servers = [
        {"name": "my tools", "command": "/a", "args": [], "env": []},
        {"name": "my__tools", "command": "/b", "args": [], "env": []},  # mended to the same name
        {"name": "git.hub", "command": "/c", "args": [], "env": []},
    ]
    with caplog.at_level(logging.WARNING):
        specs = client_specs(servers, "/w", "s1")
    assert [(s.name, s.command) for s in specs] == [("my_tools", "/a"), ("git_hub", "/c")]
    assert caplog.messages == ["MCP server 'my__tools' of session s1 left out: the name 'my_tools' is given twice"]


@pytest.mark.parametrize(
    ("server", "reason"),
    [
        ({"type": "sse", "name": "old", "url": "http://h/sse", "headers": []}, "SSE servers are not supported"),
        ({"type": "acp", "name": "x", "id": "1"}, "unknown server type 'acp'"),
        ({"name": "x", "args": [], "env": []}, "give exactly one of command (stdio) or url"),
        ({"name": "x", "command": "/a", "args": [], "env": [{"name": "K"}]}, "each of env must be {name, value}"),
        ({"name": "x", "command": "/a", "args": "-v", "env": []}, "args must be a list"),
        ({"name": "x", "command": "/a", "args": [1], "env": []}, "args must be strings"),
        ({"type": "http", "name": "x", "url": "ftp://h", "headers": []}, "url must start with http://"),
        ({"name": "", "command": "/a"}, "it has no name"),
        ("not an object", "not an object"),
    ],
)
def test_a_server_that_cannot_be_served_is_logged_and_left_out(
    server: Any, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert client_specs([server], "/w", "s1") == []
    (message,) = caplog.messages
    assert message.startswith("MCP server ") and " of session s1 left out: " in message and reason in message


def test_a_client_server_hides_the_configured_tools_of_its_name_only() -> None:
    configured = [_tool("mcp__t__echo"), _tool("mcp__t__add"), _tool("mcp__tt__echo"), _tool("read_file")]
    (spec,) = client_specs([{"name": "t", "command": "/a", "args": [], "env": []}], "/w", "s1")
    tools = ClientServers([spec], None).session_tools(configured)
    assert tools == SessionTools((), frozenset({"mcp__t__echo", "mcp__t__add"}))
    assert ClientServers([], None).session_tools(configured) == SessionTools()


# --- the registry's session tools ------------------------------------------------------------


def _tool(name: str, calls: list[str] | None = None) -> FunctionTool:
    async def run(args: Json, ctx: Any) -> str:
        if calls is not None:
            calls.append(name)
        return "pong"

    return FunctionTool(name=name, description=f"the {name} tool", fn=run)


class Offered(WrappedModel):
    """The scripted model, keeping the tool names each session's turn requests offered."""

    def __init__(self, script: Json) -> None:
        self.inner = ScriptedModel(load_script(json.dumps(script)))
        self.offered: dict[str, list[set[str]]] = {}

    def answer(self, session: SessionBinding, inner: Model, request: ModelRequest) -> AsyncIterator[Any]:
        if request.purpose == "turn":
            self.offered.setdefault(session.session_id, []).append({t.name for t in request.tools})
        return inner.stream(request)


SCRIPT = {
    "agents": [
        {"session": "root", "responses": [{"text": "noted"}] * 3},
        {"session": "other", "responses": [{"text": "other"}]},
        {
            "label": "helper",
            "responses": [{"tool_calls": [{"name": "mcp__x__ping", "arguments": {}}]}, {"text": "pinged"}],
        },
    ]
}


class Asked:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []

    async def __call__(self, request: PermissionRequest) -> PermissionAnswer:
        self.requests.append((request.session_id, request.tool))
        return PermissionAnswer("allow")


async def test_session_tools_go_to_the_session_and_its_children_guarded_and_to_no_other_session(
    tmp_path: Path,
) -> None:
    model, asked, calls = Offered(SCRIPT), Asked(), []
    with trio.fail_after(30):
        async with open_runtime(
            tmp_path, model=model, clock=ScenarioClock(), id_factory=CountingIds("c"), approver=asked
        ) as rt:
            # No workspace and no policy given: the session's tools get the default one (mcp__* ask).
            rt.agents.add_session_tools("root", SessionTools([_tool("mcp__x__ping", calls)]))
            root = await rt.agents.create(session_id="root")
            other = await rt.agents.create(session_id="other")
            child = await rt.subagents.start_continuable(root, "spawn", "helper", "ping it")
            await rt.subagents.wait_tree_idle(root)
            await other.send("hello")
            await other.wait_idle()
            await root.send("hello")
            await root.wait_idle()
    assert "mcp__x__ping" in model.offered["root"][0]
    assert "mcp__x__ping" in model.offered[child][0]
    assert "mcp__x__ping" not in model.offered["other"][0]
    assert calls == ["mcp__x__ping"] and asked.requests == [(child, "mcp__x__ping")]


async def test_a_cold_resumed_child_gets_its_roots_session_tools_only_while_the_root_has_them(
    tmp_path: Path,
) -> None:
    first = Offered(SCRIPT)
    async with open_runtime(tmp_path, model=first, clock=ScenarioClock(), id_factory=CountingIds("c")) as rt:
        rt.agents.add_session_tools("root", SessionTools([_tool("mcp__x__ping")]))
        root = await rt.agents.create(session_id="root")
        child = await rt.subagents.start_continuable(root, "spawn", "helper", "ping it")
        await rt.subagents.wait_tree_idle(root)
    for registered in (True, False):
        again = Offered(SCRIPT)
        async with open_runtime(tmp_path, model=again, clock=ScenarioClock(), id_factory=CountingIds("d")) as rt:
            if registered:
                rt.agents.add_session_tools("root", SessionTools([_tool("mcp__x__ping")]))
            root = await rt.agents.resume("root")
            await rt.subagents.send_message(root, child, "once more")  # a cold resume
            await rt.subagents.wait_tree_idle(root)
        assert ("mcp__x__ping" in again.offered[child][0]) is registered


async def test_session_tools_hide_the_shared_tools_they_replace_for_that_session_only(tmp_path: Path) -> None:
    model = Offered(SCRIPT)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with open_runtime(
        tmp_path / "root", model=model, clock=ScenarioClock(), id_factory=CountingIds("c"), workspace=workspace
    ) as rt:
        rt.agents.add_session_tools("root", SessionTools([_tool("mcp__x__ping")], hides={"read_file"}))
        for sid in ("root", "other"):
            agent = await rt.agents.create(session_id=sid)
            await agent.send("hello")
            await agent.wait_idle()
        rt.agents.drop_session_tools("root")
        assert "mcp__x__ping" not in {s.name for s in rt.agents.tools("root").specs()}
    assert "read_file" not in model.offered["root"][0] and "mcp__x__ping" in model.offered["root"][0]
    assert "read_file" in model.offered["other"][0] and "mcp__x__ping" not in model.offered["other"][0]
