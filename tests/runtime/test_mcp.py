"""MCP tool servers through the runtime (issue 16 item 3), against a real server written with the
same SDK (tests/helpers/mcp_server.py) run as a stdio subprocess: the tools offered to the model as
`mcp__<server>__<tool>` with the server's own schemas, called, the results durable; an error
result; a server dying mid-call and one that never starts (the agent goes on); a cancelled turn
cancelling its call at the server; a call timeout; and permissions on MCP tools."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp_runs import Offering, call, one_turn, results, stdio_spec, turn_ends
from subagents.runtime import (
    DEFAULT_PERMISSIONS,
    CountingIds,
    McpServerSpec,
    PermissionAnswer,
    PermissionRequest,
    Permissions,
    ScenarioClock,
    open_runtime,
)

Json = dict[str, Any]
ALLOW = Permissions({"mcp__*": "allow"})
UNAVAILABLE = {"name": "McpError", "code": "MCP_SERVER_UNAVAILABLE"}
TOOL_ERROR = {"name": "McpError", "code": "MCP_TOOL_ERROR"}


async def run_turns(
    tmp_path: Path, script: Json, prompts: list[str], servers: list[McpServerSpec], **options: Any
) -> Offering:
    model = Offering(script)
    with trio.fail_after(60):
        async with open_runtime(
            tmp_path / "root", model=model, clock=ScenarioClock(), compression="none", mcp_servers=servers, **options
        ) as rt:
            agent = await rt.agents.create(session_id="s")
            for prompt in prompts:
                await agent.send(prompt)
                await agent.wait_idle()
    return model


@pytest.mark.slow  # a real MCP server subprocess
async def test_a_stdio_servers_tools_are_offered_called_and_their_results_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_asyncio(*_args: Any) -> None:
        raise AssertionError("an asyncio event loop was made: the runtime process runs Trio only")

    monkeypatch.setattr(asyncio.BaseEventLoop, "__init__", no_asyncio)
    calls = [
        call("mcp__t__echo", text="héllo"),
        call("mcp__t__add", a=2, b=40),
        call("mcp__t__optional"),  # its schema is an anyOf the framework's own subset would refuse
        call("mcp__t__optional", x=3),
        call("mcp__t__picture"),
    ]
    model = await run_turns(tmp_path, one_turn(calls), ["go"], [stdio_spec()], permissions=ALLOW)
    offered = model.offered[0]
    assert {"mcp__t__echo", "mcp__t__add", "mcp__t__exit", "mcp__t__sleep"} <= set(offered)
    echo = offered["mcp__t__echo"]
    assert echo.description == "Say `text` back."
    assert echo.parameters["properties"]["text"]["type"] == "string" and echo.parameters["required"] == ["text"]
    assert offered["mcp__t__optional"].parameters["properties"]["x"]["anyOf"] == [
        {"type": "integer"},
        {"type": "null"},
    ]
    assert results(tmp_path / "root", "s") == [
        {"tool": "mcp__t__echo", "text": "héllo", "error": None},
        {"tool": "mcp__t__add", "text": "42", "error": None},
        {"tool": "mcp__t__optional", "text": "no x", "error": None},
        {"tool": "mcp__t__optional", "text": "x=3", "error": None},
        {"tool": "mcp__t__picture", "text": "a caption\n[image: image/png, 4 bytes]", "error": None},
    ]
    assert turn_ends(tmp_path / "root", "s") == [{"kind": "completed"}]


@pytest.mark.slow  # a real MCP server subprocess
async def test_a_tool_error_and_arguments_the_server_refuses_are_error_results(tmp_path: Path) -> None:
    calls = [
        call("mcp__t__fail", message="the disk is full"),
        call("mcp__t__add", a="two"),
        call("mcp__t__echo", text="still here"),
    ]
    await run_turns(tmp_path, one_turn(calls), ["go"], [stdio_spec()], permissions=ALLOW)
    out = results(tmp_path / "root", "s")
    assert out[0] == {
        "tool": "mcp__t__fail",
        "text": "Error: Error executing tool fail: the disk is full",
        "error": TOOL_ERROR,
    }
    assert out[1]["error"] == TOOL_ERROR
    assert "validation error" in out[1]["text"] and "Field required" in out[1]["text"]  # b is missing
    assert out[2] == {"tool": "mcp__t__echo", "text": "still here", "error": None}
    assert turn_ends(tmp_path / "root", "s") == [{"kind": "completed"}]


@pytest.mark.slow  # a real MCP server subprocess that dies
async def test_a_server_dying_mid_call_fails_that_call_and_every_later_one_and_the_agent_goes_on(
    tmp_path: Path,
) -> None:
    calls = [call("mcp__t__echo", text="before"), call("mcp__t__exit", code=7), call("mcp__t__echo", text="after")]
    await run_turns(tmp_path, one_turn(calls), ["go"], [stdio_spec()], permissions=ALLOW)
    out = results(tmp_path / "root", "s")
    assert out[0]["text"] == "before"
    reason = "Error: the MCP server 't' is unavailable: its process ended; its stderr ended: exiting with 7 on request"
    assert out[1:] == [
        {"tool": "mcp__t__exit", "text": reason, "error": UNAVAILABLE},
        {"tool": "mcp__t__echo", "text": reason, "error": UNAVAILABLE},
    ]
    assert turn_ends(tmp_path / "root", "s") == [{"kind": "completed"}]


@pytest.mark.slow  # real MCP server subprocesses, two of which never start
async def test_servers_that_fail_to_start_offer_no_tools_say_why_and_the_rest_work(tmp_path: Path) -> None:
    servers = [
        McpServerSpec(name="missing", command=str(tmp_path / "no-such-server")),
        stdio_spec("broken", mode="broken"),
        stdio_spec("t"),
    ]
    model = Offering(one_turn([call("mcp__t__echo", text="fine"), call("mcp__broken__echo", text="x")]))
    with trio.fail_after(60):
        async with open_runtime(
            tmp_path / "root",
            model=model,
            clock=ScenarioClock(),
            compression="none",
            mcp_servers=servers,
            permissions=ALLOW,
        ) as rt:
            assert rt.mcp is not None
            status = {s.name: s for s in rt.mcp.status()}
            assert (status["missing"].state, status["missing"].tools) == ("failed", ())
            assert status["missing"].error == f"its command was not found ({tmp_path / 'no-such-server'})"
            assert (status["broken"].state, status["broken"].tools) == ("failed", ())
            assert status["broken"].error == (
                "its process ended; its stderr ended: refusing to start: this server is broken on purpose"
            )
            assert status["t"].state == "ready" and status["t"].error is None
            agent = await rt.agents.create(session_id="s")
            await agent.send("go")
            await agent.wait_idle()
    assert not any(name.startswith(("mcp__missing__", "mcp__broken__")) for name in model.offered[0])
    assert results(tmp_path / "root", "s") == [
        {"tool": "mcp__t__echo", "text": "fine", "error": None},
        {
            "tool": "mcp__broken__echo",
            "text": 'Error: unknown tool "mcp__broken__echo"',
            "error": {"name": "ToolNotFoundError", "code": "UNKNOWN_TOOL"},
        },
    ]


@pytest.mark.slow  # a real MCP server subprocess
async def test_a_server_that_does_not_initialize_in_time_is_failed(tmp_path: Path) -> None:
    # It reads the initialize request and never answers it (and ends when its stdin closes).
    spec = McpServerSpec(name="silent", command="sh", args=["-c", "cat >/dev/null"], startup_timeout=0.5)
    async with open_runtime(tmp_path / "root", model=Offering(one_turn([])), mcp_servers=[spec]) as rt:
        assert rt.mcp is not None
        (status,) = rt.mcp.status()
    assert (status.state, status.error) == ("failed", "it did not start within 0.5s")


@pytest.mark.slow  # a real MCP server subprocess and a real (short) timeout
async def test_a_call_over_its_timeout_fails_and_the_server_stays_usable(tmp_path: Path) -> None:
    calls = [call("mcp__t__sleep"), call("mcp__t__cancellations")]
    await run_turns(tmp_path, one_turn(calls), ["go"], [stdio_spec(call_timeout=0.5)], permissions=ALLOW)
    assert results(tmp_path / "root", "s") == [
        {
            "tool": "mcp__t__sleep",
            "text": "Error: mcp__t__sleep did not answer within 0.5s (the call was cancelled)",
            "error": {"name": "McpError", "code": "MCP_TIMEOUT"},
        },
        {"tool": "mcp__t__cancellations", "text": "1", "error": None},  # the server was told
    ]


@pytest.mark.slow  # a real MCP server subprocess
async def test_a_cancelled_turn_cancels_its_call_at_the_server(tmp_path: Path) -> None:
    fifo = tmp_path / "sleeping"
    os.mkfifo(fifo)
    script = {
        "agents": [
            {
                "session": "s",
                "responses": [
                    {"tool_calls": [call("mcp__t__sleep", fifo=str(fifo))]},
                    {"tool_calls": [call("mcp__t__cancellations")]},
                    {"text": "done"},
                ],
            }
        ]
    }
    with trio.fail_after(60):
        async with open_runtime(
            tmp_path / "root",
            model=Offering(script),
            # The real clock: the scenario clock would jump over the loop's grace for running
            # tools while this test waits on the server (a real process), cutting the call's
            # own answer short.
            compression="none",
            mcp_servers=[stdio_spec()],
            permissions=ALLOW,
        ) as rt:
            agent = await rt.agents.create(session_id="s")
            await agent.send("go")
            # The server writes to the pipe once the call has reached it.
            line = await trio.to_thread.run_sync(lambda: fifo.read_text(), abandon_on_cancel=True)
            assert line == "sleeping\n"
            assert agent.cancel()
            await agent.wait_idle()
            await agent.send("again")
            await agent.wait_idle()
    assert results(tmp_path / "root", "s") == [
        {
            "tool": "mcp__t__sleep",
            "text": "Error: mcp__t__sleep was cancelled with its turn",
            "error": {"name": "McpError", "code": "MCP_CALL_CANCELLED"},
        },
        {"tool": "mcp__t__cancellations", "text": "1", "error": None},
    ]
    assert turn_ends(tmp_path / "root", "s") == [{"kind": "aborted", "cause": "user"}, {"kind": "completed"}]


@pytest.mark.slow  # a real MCP server subprocess
async def test_mcp_tools_ask_by_default_and_obey_allow_and_deny(tmp_path: Path) -> None:
    asked: list[PermissionRequest] = []

    async def approver(request: PermissionRequest) -> PermissionAnswer:
        asked.append(request)
        return (
            PermissionAnswer("deny", "not this one")
            if request.arguments.get("text") == "no"
            else PermissionAnswer("allow")
        )

    calls = [call("mcp__t__echo", text="yes"), call("mcp__t__echo", text="no"), call("mcp__t__add", a=1, b=2)]
    policy = DEFAULT_PERMISSIONS.with_rules({"mcp__t__add": "deny"})
    await run_turns(tmp_path, one_turn(calls), ["go"], [stdio_spec()], permissions=policy, approver=approver)
    assert [(r.tool, r.arguments) for r in asked] == [
        ("mcp__t__echo", {"text": "yes"}),
        ("mcp__t__echo", {"text": "no"}),
    ]
    denied = {"name": "PermissionDenied", "code": "PERMISSION_DENIED"}
    assert results(tmp_path / "root", "s") == [
        {"tool": "mcp__t__echo", "text": "yes", "error": None},
        {"tool": "mcp__t__echo", "text": "Error: not this one", "error": denied},
        {
            "tool": "mcp__t__add",
            "text": "Error: mcp__t__add is not allowed here (its permission is deny)",
            "error": denied,
        },
    ]


@pytest.mark.slow  # a real MCP server subprocess
async def test_without_a_policy_mcp_servers_get_the_default_one_and_headless_ask_is_denied(tmp_path: Path) -> None:
    await run_turns(tmp_path, one_turn([call("mcp__t__echo", text="hi")]), ["go"], [stdio_spec()])
    assert results(tmp_path / "root", "s") == [
        {
            "tool": "mcp__t__echo",
            "text": "Error: mcp__t__echo needs permission and there is no one to ask here: denied",
            "error": {"name": "PermissionDenied", "code": "PERMISSION_DENIED"},
        }
    ]


@pytest.mark.slow  # a real MCP server subprocess
async def test_a_subagent_gets_the_mcp_tools_too(tmp_path: Path) -> None:
    script = {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    {"tool_calls": [call("subagent", description="helper", prompt="use the server")]},
                    {"wait_for": {"settled": "helper"}, "text": "waited"},
                    {"text": "noted"},
                ],
            },
            {
                "label": "helper",
                "responses": [{"tool_calls": [call("mcp__t__add", a=20, b=22)]}, {"text": "42 it is"}],
            },
        ]
    }
    with trio.fail_after(60):
        async with open_runtime(
            tmp_path / "root",
            model=Offering(script),
            clock=ScenarioClock(),
            id_factory=CountingIds("child"),
            compression="none",
            mcp_servers=[stdio_spec()],
            permissions=ALLOW,
        ) as rt:
            parent = await rt.agents.create(session_id="parent")
            await parent.send("go")
            await rt.subagents.wait_tree_idle(parent)
    assert results(tmp_path / "root", "child-1") == [{"tool": "mcp__t__add", "text": "42", "error": None}]
