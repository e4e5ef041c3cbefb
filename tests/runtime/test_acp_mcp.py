"""The MCP servers an ACP client names in `session/new` / `session/load`: started for that session
(acp/client_servers.py), their tools offered to it and its subagents and to no other session,
asked about through `session/request_permission`, stopped when the session closes. Driven by the
official `agent-client-protocol` client against `subagents acp` in a subprocess, with the real
FastMCP test server (tests/helpers/mcp_server.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from acp import RequestError, text_block
from acp.schema import EnvVariable, HttpHeader, HttpMcpServer, McpServerStdio, SseMcpServer
from acp_client import TIMEOUT, Asking, initialize, show, spawn_acp
from cli_process import write_script
from mcp_runs import SERVER
from subagents.runtime.app import open_runtime
from subagents.runtime.hosts.acp.host import serve_acp

pytestmark = pytest.mark.slow  # the agent, and the MCP servers, are real processes


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def stdio(name: str, *args: str) -> McpServerStdio:
    return McpServerStdio(
        name=name, command=sys.executable, args=[SERVER, *args], env=[EnvVariable(name="TOKEN", value="s3cret")]
    )


def running(marker: str) -> list[int]:
    """The processes whose command line holds `marker` (the test server's unused last argument)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if marker.encode() in argv:
            found.append(int(entry))
    return found


def results(root: Path, session_id: str) -> list[tuple[str, str]]:
    """(tool, result text) of each call (the scripts make one call a step: results in call order)."""
    entries = show(root, session_id)
    calls = [e["name"] for e in entries if e["type"] == "tool/call"]
    texts = [e["text"] for e in entries if e["type"] == "tool/result"]
    assert len(calls) == len(texts)
    return list(zip(calls, texts, strict=True))


def test_a_client_stdio_servers_tools_are_asked_for_called_durable_and_the_server_stops_on_close(
    tmp_path: Path,
) -> None:
    marker = f"marker-{tmp_path.name}"
    script = {
        "agents": [
            {
                "responses": [
                    call("mcp__my_tools__echo", text="hi"),
                    call("subagent", description="helper", prompt="add them"),
                    {"wait_for": {"settled": "helper"}, "text": "waited"},
                    {"text": "noted"},
                ]
            },
            {"label": "helper", "responses": [call("mcp__my_tools__add", a=20, b=22), {"text": "42"}]},
            {"responses": [call("mcp__my_tools__echo", text="not mine"), {"text": "ok"}]},
        ]
    }
    model = write_script(tmp_path / "script.json", script)
    root = tmp_path / "root"

    async def main() -> tuple[str, str, Asking]:
        recorder = Asking(["allow_once", "allow_once"])
        async with spawn_acp(recorder, root, model, tmp_path / "stderr") as (conn, _process):
            init = await asyncio.wait_for(initialize(conn), TIMEOUT)
            assert init.agent_capabilities.mcp_capabilities.http is True
            assert init.agent_capabilities.mcp_capabilities.sse is False
            # "my tools" is no tool-name part: it is mended to "my_tools".
            server = stdio("my tools", "stdio", marker)
            new = await asyncio.wait_for(conn.new_session(cwd=str(tmp_path), mcp_servers=[server]), TIMEOUT)
            assert len(running(marker)) == 1
            done = await asyncio.wait_for(conn.prompt(session_id=new.session_id, prompt=[text_block("go")]), TIMEOUT)
            assert done.stop_reason == "end_turn"
            other = await asyncio.wait_for(conn.new_session(cwd=str(tmp_path), mcp_servers=[]), TIMEOUT)
            done = await asyncio.wait_for(conn.prompt(session_id=other.session_id, prompt=[text_block("go")]), TIMEOUT)
            assert done.stop_reason == "end_turn"
            assert len(running(marker)) == 1
            await asyncio.wait_for(conn.close_session(session_id=new.session_id), TIMEOUT)
            assert running(marker) == []  # closed with its session, the connection still open
            return new.session_id, other.session_id, recorder

    sid, other, recorder = asyncio.run(main())
    (root_ask, child_ask) = recorder.asked
    assert root_ask[0] == sid and root_ask[1].raw_input == {"text": "hi"}
    assert root_ask[1].title.startswith("mcp__my_tools__echo")
    # The subagent's question goes to the session the client opened, naming the subagent.
    assert child_ask[0] == sid and child_ask[1].raw_input == {"a": 20, "b": 22}
    child = child_ask[1].title.rpartition("(subagent ")[2].rstrip(")")
    assert results(root, sid)[0] == ("mcp__my_tools__echo", "hi")
    assert results(root, child) == [("mcp__my_tools__add", "42")]
    # Another session of the same connection is not offered them.
    assert results(root, other) == [("mcp__my_tools__echo", 'Error: unknown tool "mcp__my_tools__echo"')]
    assert (tmp_path / "stderr").read_bytes() == b""


def test_servers_that_fail_to_start_or_are_not_supported_are_logged_and_the_session_works(tmp_path: Path) -> None:
    script = {
        "agents": [
            {
                "responses": [
                    call("mcp__broken__echo", text="x"),
                    call("mcp__t__echo", text="still here"),
                    {"text": "done"},
                ]
            }
        ]
    }
    model = write_script(tmp_path / "script.json", script)
    root = tmp_path / "root"
    marker = f"marker-{tmp_path.name}"

    async def main() -> str:
        recorder = Asking(["allow_once"])
        async with spawn_acp(recorder, root, model, tmp_path / "stderr") as (conn, _process):
            await asyncio.wait_for(initialize(conn), TIMEOUT)
            servers = [
                stdio("broken", "broken"),
                SseMcpServer(type="sse", name="old", url="http://127.0.0.1:9/sse", headers=[]),
                McpServerStdio(name="gone", command=str(tmp_path / "no-such-server"), args=[], env=[]),
                stdio("t", "stdio"),
            ]
            new = await asyncio.wait_for(conn.new_session(cwd=str(tmp_path), mcp_servers=servers), TIMEOUT)
            done = await asyncio.wait_for(conn.prompt(session_id=new.session_id, prompt=[text_block("go")]), TIMEOUT)
            assert done.stop_reason == "end_turn"
            # A load that fails stops the servers it started for it.
            missing = "00000000-0000-4000-8000-000000000000"
            with pytest.raises(RequestError) as refused:
                await asyncio.wait_for(
                    conn.load_session(cwd=str(tmp_path), session_id=missing, mcp_servers=[stdio("t", "stdio", marker)]),
                    TIMEOUT,
                )
            assert refused.value.code == -32002
            assert running(marker) == []
            return new.session_id

    sid = asyncio.run(main())
    assert results(root, sid) == [
        ("mcp__broken__echo", 'Error: unknown tool "mcp__broken__echo"'),
        ("mcp__t__echo", "still here"),
    ]
    lines = (tmp_path / "stderr").read_text().splitlines()
    assert lines == [
        f"subagents: warning: MCP server 'old' of session {sid} left out: "
        "SSE servers are not supported (use stdio or streamable HTTP)",
        f"subagents: warning: MCP server 'broken' of session {sid} did not start: its process ended; its stderr "
        "ended: refusing to start: this server is broken on purpose; the session goes on without its tools",
        f"subagents: warning: MCP server 'gone' of session {sid} did not start: its command was not found "
        f"({tmp_path / 'no-such-server'}); the session goes on without its tools",
    ]


def _http_server() -> tuple[subprocess.Popen[bytes], str]:
    process = subprocess.Popen([sys.executable, SERVER, "http"], stdout=subprocess.PIPE)
    assert process.stdout is not None
    port = int(process.stdout.readline().split()[1])  # printed once the socket listens
    return process, f"http://127.0.0.1:{port}/mcp"


def test_a_client_server_named_like_a_configured_one_replaces_it_in_that_session_only(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "subagents.toml").write_text(f'[mcp_servers.t]\ncommand = "{sys.executable}"\nargs = ["{SERVER}"]\n')
    script = {
        "agents": [
            {
                "responses": [
                    call("mcp__t__header", key="x-who"),
                    {"text": "one"},
                    call("mcp__t__header", key="x-who"),
                    {"text": "three"},
                ]
            },
            {"responses": [call("mcp__t__header", key="x-who"), {"text": "two"}]},
        ]
    }
    model = write_script(tmp_path / "script.json", script)
    root = tmp_path / "root"
    process, url = _http_server()

    async def prompt(conn: Any, sid: str) -> None:
        done = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("go")]), TIMEOUT)
        assert done.stop_reason == "end_turn"

    async def main() -> tuple[str, str]:
        recorder = Asking(["allow_once"] * 3)
        # In the project folder, where it reads subagents.toml.
        async with spawn_acp(recorder, root, model, tmp_path / "stderr", cwd=project) as (conn, _process):
            await asyncio.wait_for(initialize(conn), TIMEOUT)
            web = HttpMcpServer(type="http", name="t", url=url, headers=[HttpHeader(name="x-who", value="client")])
            first = (await asyncio.wait_for(conn.new_session(cwd=str(project), mcp_servers=[web]), TIMEOUT)).session_id
            await prompt(conn, first)
            plain = (await asyncio.wait_for(conn.new_session(cwd=str(project), mcp_servers=[]), TIMEOUT)).session_id
            await prompt(conn, plain)
            await asyncio.wait_for(conn.close_session(session_id=first), TIMEOUT)
            await asyncio.wait_for(conn.load_session(cwd=str(project), session_id=first, mcp_servers=[web]), TIMEOUT)
            await prompt(conn, first)
            return first, plain

    try:
        first, plain = asyncio.run(main())
    finally:
        process.kill()
        process.wait()
    # The client's server (HTTP, with its header) in its sessions; the configured one (stdio: no
    # request headers) in the session that names none.
    # (Loaded again after a close, the session starts the client's server again.)
    assert results(root, first) == [("mcp__t__header", "client"), ("mcp__t__header", "client")]
    ((tool, text),) = results(root, plain)
    assert tool == "mcp__t__header" and text != "client" and not text.startswith("Error")
    assert (tmp_path / "stderr").read_bytes() == b""


async def test_the_end_of_the_connection_stops_the_sessions_servers_before_the_runtime_closes(
    tmp_path: Path,
) -> None:
    marker = f"marker-{tmp_path.name}"
    model = write_script(tmp_path / "script.json", {"agents": [{"responses": [{"text": "x"}]}]})
    to_server, server_in = trio.testing.memory_stream_pair()
    server_out, from_server = trio.testing.memory_stream_pair()
    server = {"name": "t", "command": sys.executable, "args": [SERVER, "stdio", marker], "env": []}
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}},
        {"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": str(tmp_path), "mcpServers": [server]}},
    ]
    with trio.fail_after(TIMEOUT):
        async with open_runtime(tmp_path / "root", model=model) as runtime, trio.open_nursery() as nursery:
            served = trio.Event()

            async def serve() -> None:
                await serve_acp(runtime, server_in, server_out, version="test")
                served.set()

            nursery.start_soon(serve)
            for line in lines:
                await to_server.send_all(json.dumps(line).encode() + b"\n")
            received = b""
            while received.count(b"\n") < 2:  # both replies
                received += await from_server.receive_some()
            reply = json.loads(received.splitlines()[1])
            assert "sessionId" in reply["result"], reply
            assert len(running(marker)) == 1
            await to_server.aclose()  # the client has gone
            await served.wait()
            assert running(marker) == []  # stopped with the connection, the runtime still open
            assert runtime.agents.get(reply["result"]["sessionId"]) is not None
