"""The same MCP test server over streamable HTTP (issue 16 item 3): started as a subprocess on a
free loopback port (ready once it prints the port of its listening socket and a connection to it
succeeds), its tools called through the runtime with the configured headers, and the server
killed: every later call is an error result and the agent goes on."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio
from mcp_runs import SERVER, Offering, call, one_turn, results, turn_ends
from subagents.runtime import McpServerSpec, Permissions, ScenarioClock, open_runtime

ALLOW = Permissions({"mcp__*": "allow"})


@asynccontextmanager
async def http_server() -> AsyncIterator[tuple[str, trio.Process]]:
    """The test server over HTTP: its endpoint url and process, killed on exit."""
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            partial(trio.run_process, [sys.executable, SERVER, "http"], stdout=subprocess.PIPE, check=False)
        )
        try:
            assert process.stdout is not None
            seen = b""
            with trio.fail_after(30):
                while not seen.endswith(b"\n"):
                    chunk = await process.stdout.receive_some(100)
                    assert chunk, "the server exited before it listened"
                    seen += chunk
                port = int(seen.decode().split()[1])
                stream = await trio.open_tcp_stream("127.0.0.1", port)  # it accepts connections
                await stream.aclose()
            yield f"http://127.0.0.1:{port}/mcp", process
        finally:
            process.kill()
            nursery.cancel_scope.cancel()


@pytest.mark.slow  # a real MCP server subprocess over HTTP
async def test_an_http_servers_tools_are_offered_and_called_with_the_configured_headers(tmp_path: Path) -> None:
    calls = [
        call("mcp__web__echo", text="over http"),
        call("mcp__web__header", key="x-test-token"),
        call("mcp__web__fail", message="no"),
    ]
    async with http_server() as (url, _process):
        model = Offering(one_turn(calls))
        spec = McpServerSpec(name="web", url=url, headers={"X-Test-Token": "s3cret"})
        with trio.fail_after(60):
            async with open_runtime(
                tmp_path / "root",
                model=model,
                clock=ScenarioClock(),
                compression="none",
                mcp_servers=[spec],
                permissions=ALLOW,
            ) as rt:
                agent = await rt.agents.create(session_id="s")
                await agent.send("go")
                await agent.wait_idle()
    assert {"mcp__web__echo", "mcp__web__header", "mcp__web__exit"} <= set(model.offered[0])
    assert results(tmp_path / "root", "s") == [
        {"tool": "mcp__web__echo", "text": "over http", "error": None},
        {"tool": "mcp__web__header", "text": "s3cret", "error": None},
        {
            "tool": "mcp__web__fail",
            "text": "Error: Error executing tool fail: no",
            "error": {"name": "McpError", "code": "MCP_TOOL_ERROR"},
        },
    ]


@pytest.mark.slow  # a real MCP server subprocess over HTTP, killed
async def test_a_killed_http_server_fails_its_calls_and_the_agent_goes_on(tmp_path: Path) -> None:
    script = {
        "agents": [
            {
                "session": "s",
                "responses": [
                    {"tool_calls": [call("mcp__web__echo", text="first")]},
                    {"text": "one"},
                    {"tool_calls": [call("mcp__web__echo", text="second")]},
                    {"tool_calls": [call("mcp__web__add", a=1, b=2)]},
                    {"text": "two"},
                ],
            }
        ]
    }
    async with http_server() as (url, process):
        spec = McpServerSpec(name="web", url=url, call_timeout=20)
        with trio.fail_after(60):
            async with open_runtime(
                tmp_path / "root",
                model=Offering(script),
                clock=ScenarioClock(),
                compression="none",
                mcp_servers=[spec],
                permissions=ALLOW,
            ) as rt:
                agent = await rt.agents.create(session_id="s")
                await agent.send("go")
                await agent.wait_idle()
                process.send_signal(signal.SIGKILL)
                await process.wait()
                await agent.send("again")
                await agent.wait_idle()
    out = results(tmp_path / "root", "s")
    assert out[0] == {"tool": "mcp__web__echo", "text": "first", "error": None}
    port = url.split(":")[2].split("/")[0]
    reason = f"Error: the MCP server 'web' is unavailable: its connection failed (all attempts to connect to 127.0.0.1:{port} failed)"
    assert out[1:] == [
        {"tool": "mcp__web__echo", "text": reason, "error": {"name": "McpError", "code": "MCP_SERVER_UNAVAILABLE"}},
        {"tool": "mcp__web__add", "text": reason, "error": {"name": "McpError", "code": "MCP_SERVER_UNAVAILABLE"}},
    ]
    assert turn_ends(tmp_path / "root", "s") == [{"kind": "completed"}, {"kind": "completed"}]


@pytest.mark.slow  # a real MCP server subprocess over HTTP
async def test_http_servers_that_cannot_be_reached_or_answer_an_error_status_are_failed(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    async with http_server() as (url, _process):
        specs = [
            McpServerSpec(name="nobody", url=f"http://127.0.0.1:{closed}/mcp"),
            McpServerSpec(name="wrong", url=url.replace("/mcp", "/nothing-here")),
        ]
        with trio.fail_after(60):
            async with open_runtime(tmp_path / "root", model=Offering(one_turn([])), mcp_servers=specs) as rt:
                assert rt.mcp is not None
                status = [(s.name, s.state, s.tools, s.error) for s in rt.mcp.status()]
    assert status == [
        ("nobody", "failed", (), f"its connection failed (all attempts to connect to 127.0.0.1:{closed} failed)"),
        # The SDK reads a 404 as an ended session, whatever the path.
        ("wrong", "failed", (), "it refused to initialize: Session terminated"),
    ]


@pytest.mark.slow  # a real MCP server subprocess over HTTP that dies mid-call
async def test_an_http_server_dying_mid_call_fails_that_call_and_the_next(tmp_path: Path) -> None:
    calls = [call("mcp__web__exit", code=5), call("mcp__web__echo", text="anyone?")]
    async with http_server() as (url, _process):
        spec = McpServerSpec(name="web", url=url, call_timeout=20)
        with trio.fail_after(60):
            async with open_runtime(
                tmp_path / "root",
                model=Offering(one_turn(calls)),
                clock=ScenarioClock(),
                compression="none",
                mcp_servers=[spec],
                permissions=ALLOW,
            ) as rt:
                agent = await rt.agents.create(session_id="s")
                await agent.send("go")
                await agent.wait_idle()
    out = results(tmp_path / "root", "s")
    assert [(r["tool"], r["error"]) for r in out] == [
        ("mcp__web__exit", {"name": "McpError", "code": "MCP_SERVER_UNAVAILABLE"}),
        ("mcp__web__echo", {"name": "McpError", "code": "MCP_SERVER_UNAVAILABLE"}),
    ]
    assert out[0]["text"].startswith("Error: the MCP server 'web' is unavailable: its connection failed (")
    assert turn_ends(tmp_path / "root", "s") == [{"kind": "completed"}]
