"""The ACP server in process, over memory streams (`serve_acp`): what needs a hand on the agent
or exact timing — a turn no prompt started streams as notifications, a cancel that arrives
before its turn has begun, a second prompt while one runs. Messages are checked against the
SDK's schema types."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio.testing
from acp.schema import NewSessionResponse, PromptResponse, SessionNotification
from cli_process import write_script
from subagents.runtime.app import Runtime, open_runtime
from subagents.runtime.hosts.acp.host import TextRelay, serve_acp
from subagents.runtime.hosts.acp.record import RECORD_TYPE
from subagents.runtime.hosts.acp.rpc import Incoming
from subagents.runtime.hosts.acp.server import AcpServer
from subagents.runtime.models.base import Chunk, Finish, ModelRequest, TextDelta, ToolCallDelta
from subagents.runtime.models.specs import build_model, parse_model_spec
from subagents.runtime.models.tee import TeeModel


class Client:
    """Lines to the server, parsed lines back."""

    def __init__(self, send: trio.abc.SendStream, receive: trio.abc.ReceiveStream) -> None:
        self._send = send
        self._receive = receive
        self._buffer = b""
        self.notifications: list[dict[str, Any]] = []
        self._next = 0

    async def request(self, method: str, params: Any) -> int:
        self._next += 1
        await self.notify(method, params, msg_id=self._next)
        return self._next

    async def notify(self, method: str, params: Any, *, msg_id: int | None = None) -> None:
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
        if message.get("method") == "session/update":
            SessionNotification.model_validate(message["params"])
            self.notifications.append(message["params"]["update"])
        return message

    async def reply(self, msg_id: int) -> dict[str, Any]:
        while True:
            message = await self.read()
            if message.get("id") == msg_id and "method" not in message:
                return message

    async def call(self, method: str, params: Any) -> dict[str, Any]:
        return await self.reply(await self.request(method, params))


@asynccontextmanager
async def serving(tmp_path: Path, script: Any, *, model: Any = None) -> AsyncIterator[tuple[Client, Runtime]]:
    """A server over a runtime on `script` (or `model`), its text streamed as `acp` streams it."""
    relay = TextRelay()
    inner = (
        model if model is not None else build_model(parse_model_spec(write_script(tmp_path / "script.json", script)))
    )
    to_server, server_in = trio.testing.memory_stream_pair()
    server_out, from_server = trio.testing.memory_stream_pair()
    async with (
        open_runtime(tmp_path / "root", model=TeeModel(inner, relay)) as runtime,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(lambda: serve_acp(runtime, server_in, server_out, version="test", relay=relay))
        client = Client(to_server, from_server)
        yield client, runtime
        await to_server.aclose()  # end of input: the server stops


class GatedModel:
    """Answers each call from `plan` in turn: "tool" calls `list_agents`; "text" streams "Hel",
    waits for `go` (a fresh event per call), then streams "lo" and stops."""

    def __init__(self, plan: list[str]) -> None:
        self.plan = list(plan)
        self.go = trio.Event()
        self.waiting = trio.Event()  # set while a "text" call waits for `go`

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        step = self.plan.pop(0)
        if step == "tool":
            yield ToolCallDelta(0, id=f"call-{len(self.plan)}", name="list_agents", arguments="{}")
            yield Finish("tool-calls")
            return
        yield TextDelta("Hel")
        self.waiting.set()
        await self.go.wait()
        self.go, self.waiting = trio.Event(), trio.Event()
        yield TextDelta("lo")
        yield Finish("stop")


async def _until_update(client: Client, kind: str) -> dict[str, Any]:
    while not client.notifications or client.notifications[-1]["sessionUpdate"] != kind:
        await client.read()
    return client.notifications[-1]


async def _replies(runtime: Runtime, sid: str) -> int:
    async with runtime.query.observe_session(sid) as observation:
        return sum(1 for e in observation.events if e.type == "assistant/message")


async def _new(client: Client, tmp_path: Path) -> str:
    reply = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
    return NewSessionResponse.model_validate(reply["result"]).session_id


async def test_a_turn_no_prompt_started_streams_as_notifications(tmp_path: Path) -> None:
    async with serving(tmp_path, {"agents": [{"responses": [{"text": "noticed"}]}]}) as (client, runtime):
        sid = await _new(client, tmp_path)
        agent = runtime.agents.get(sid)
        assert agent is not None
        # What the subagent service does when a child settles while its parent is idle.
        await agent.send("child finished", trigger="notice")
        # Streamed or sent from the record (timing decides): one message, the reply's text.
        while "".join(u.get("content", {}).get("text", "") for u in client.notifications) != "noticed":
            await client.read()
        assert {u["sessionUpdate"] for u in client.notifications} == {"agent_message_chunk"}
        assert len({u["messageId"] for u in client.notifications}) == 1


async def test_a_cancel_before_the_turn_begins_still_cancels_it(tmp_path: Path) -> None:
    # A notice turn runs (its tool ran, its second model call hangs); the prompt's message waits
    # behind it; the cancel stops the notice turn and, when the prompt's turn begins, that too.
    script = {
        "agents": [
            {"responses": [{"tool_calls": [{"name": "list_agents", "arguments": {}}]}, {"hang": True}, {"hang": True}]}
        ]
    }
    async with serving(tmp_path, script) as (client, runtime):
        sid = await _new(client, tmp_path)
        agent = runtime.agents.get(sid)
        assert agent is not None
        await agent.send("child finished", trigger="notice")
        while not any(u["sessionUpdate"] == "tool_call_update" for u in client.notifications):
            await client.read()
        mark = agent.inbox.received
        prompt = await client.request("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "x"}]})
        await agent.inbox.wait_received(mark)  # the prompt is registered and its message queued
        await client.notify("session/cancel", {"sessionId": sid})
        with trio.fail_after(60):  # a hang guard only
            reply = await client.reply(prompt)
        assert PromptResponse.model_validate(reply["result"]).stop_reason == "cancelled"
        async with runtime.query.observe_session(sid) as observation:
            ends = [json.loads(bytes(e.data)) for e in observation.events if e.type == "turn/end"]
            starts = [json.loads(bytes(e.data)) for e in observation.events if e.type == "turn/start"]
        assert [s["trigger"]["kind"] for s in starts] == ["notice", "message"]
        assert [e["reason"] for e in ends] == [{"kind": "aborted", "cause": "user"}] * 2


async def test_a_second_prompt_while_one_runs_is_refused(tmp_path: Path) -> None:
    async with serving(tmp_path, {"agents": [{"responses": [{"hang": True}]}]}) as (client, runtime):
        sid = await _new(client, tmp_path)
        agent = runtime.agents.get(sid)
        assert agent is not None
        mark = agent.inbox.received
        first = await client.request("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "a"}]})
        await agent.inbox.wait_received(mark)  # the first prompt is registered
        second = await client.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "b"}]})
        assert second["error"]["code"] == -32600
        await client.notify("session/cancel", {"sessionId": sid})
        assert (await client.reply(first))["result"] == {"stopReason": "cancelled"}


async def test_prompt_text_streams_while_the_model_writes_after_the_tool_updates_before_it(tmp_path: Path) -> None:
    model = GatedModel(["tool", "text"])
    async with serving(tmp_path, None, model=model) as (client, runtime):
        sid = await _new(client, tmp_path)
        prompt = await client.request("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]})
        with trio.fail_after(60):  # a hang guard only
            first = await _until_update(client, "agent_message_chunk")
        # The model is still held after "Hel": the chunk went out before its reply was durable.
        assert model.waiting.is_set() and await _replies(runtime, sid) == 1  # the tool step's reply only
        assert first["content"]["text"] == "Hel"
        assert [u["sessionUpdate"] for u in client.notifications] == [
            "tool_call",
            "tool_call_update",
            "agent_message_chunk",
        ]
        model.go.set()
        reply = await client.reply(prompt)
        assert PromptResponse.model_validate(reply["result"]).stop_reason == "end_turn"
        chunks = [u for u in client.notifications if u["sessionUpdate"] == "agent_message_chunk"]
        # The durable reply sent only what had not streamed, as the same message.
        assert "".join(c["content"]["text"] for c in chunks) == "Hello"
        assert len({c["messageId"] for c in chunks}) == 1
        assert await _replies(runtime, sid) == 2


async def test_a_notice_turn_while_no_prompt_runs_streams_its_text_as_it_is_written(tmp_path: Path) -> None:
    model = GatedModel(["text"])
    async with serving(tmp_path, None, model=model) as (client, runtime):
        sid = await _new(client, tmp_path)
        agent = runtime.agents.get(sid)
        assert agent is not None
        await agent.send("child finished", trigger="notice")  # as the subagent service does
        with trio.fail_after(60):  # a hang guard only
            first = await _until_update(client, "agent_message_chunk")
        assert first["content"]["text"] == "Hel" and model.waiting.is_set()
        assert await _replies(runtime, sid) == 0
        model.go.set()
        with trio.fail_after(60):
            while "".join(u["content"]["text"] for u in client.notifications) != "Hello":
                await client.read()
        await agent.wait_idle()
        assert await _replies(runtime, sid) == 1


async def _handle(server: AcpServer, replies: trio.MemoryReceiveChannel[bytes], method: str, params: Any) -> Any:
    await server.handle(Incoming(method=method, params=params, id=1))
    while True:
        message = json.loads(replies.receive_nowait())
        if message.get("id") == 1:
            assert "error" not in message, message
            return message["result"]


async def _records(runtime: Runtime, sid: str) -> list[dict[str, Any]]:
    async with runtime.query.observe_session(sid) as observation:
        return [json.loads(bytes(e.data)) for e in observation.events if e.type == RECORD_TYPE]


async def test_the_clients_cwd_servers_and_capabilities_survive_a_restart(tmp_path: Path) -> None:
    model = write_script(tmp_path / "script.json", {"agents": [{"responses": [{"text": "ok"}]}]})
    root = tmp_path / "root"
    server_env = {"name": "TOKEN", "value": "s3cret"}
    servers = [{"name": "files", "command": "/bin/mcp-files", "args": ["--ro"], "env": [server_env]}]
    capabilities = {"fs": {"readTextFile": True, "writeTextFile": False}, "terminal": True}

    async with open_runtime(root, model=model) as runtime, trio.open_nursery() as nursery:
        send, replies = trio.open_memory_channel[bytes](64)
        server = AcpServer(runtime, nursery, send, version="test")
        await _handle(server, replies, "initialize", {"protocolVersion": 1, "clientCapabilities": capabilities})
        new = await _handle(server, replies, "session/new", {"cwd": str(tmp_path), "mcpServers": servers})
        sid = new["sessionId"]
        made, restored = server.client_record(sid)
        assert restored is None and made.mcp_servers[0]["env"] == [{"name": "TOKEN"}]
        assert made.client_capabilities == capabilities and made.cwd == str(tmp_path)
        await server.aclose()
        nursery.cancel_scope.cancel()

    # A new process: another client, other capabilities, no MCP servers this time.
    async with open_runtime(root, model=model) as runtime, trio.open_nursery() as nursery:
        send, replies = trio.open_memory_channel[bytes](64)
        server = AcpServer(runtime, nursery, send, version="test")
        await _handle(server, replies, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        await _handle(server, replies, "session/load", {"sessionId": sid, "cwd": str(tmp_path), "mcpServers": []})
        now, restored = server.client_record(sid)
        assert restored == made  # read back from the log
        assert now.mcp_servers == () and now.client_capabilities == {"fs": {}, "terminal": False}
        records = await _records(runtime, sid)
        assert len(records) == 2 and records[-1]["mcp_servers"] == []  # the load's own, recorded
        assert "s3cret" not in json.dumps(records)  # a secret value is never written
        await server.aclose()
        nursery.cancel_scope.cancel()

    # Loading again with what is already recorded writes nothing more.
    async with open_runtime(root, model=model) as runtime, trio.open_nursery() as nursery:
        send, replies = trio.open_memory_channel[bytes](64)
        server = AcpServer(runtime, nursery, send, version="test")
        await _handle(server, replies, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        await _handle(server, replies, "session/load", {"sessionId": sid, "cwd": str(tmp_path), "mcpServers": []})
        assert server.client_record(sid)[1] == now
        assert len(await _records(runtime, sid)) == 2
        await server.aclose()
        nursery.cancel_scope.cancel()
