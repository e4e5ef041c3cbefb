"""`subagents acp` driven by the official `agent-client-protocol` client (asyncio, in this test
process; the agent is its own Trio process). Every update and response is parsed into the SDK's
schema types by the SDK itself, and checked again here with strict `model_validate`.

The tests are synchronous (`asyncio.run` inside), so pytest-trio leaves them alone. Waits are on
messages, never on time; `TIMEOUT` is only a hang guard.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    FileSystemCapabilities,
    RequestPermissionResponse,
    SessionNotification,
    ToolCallProgress,
    ToolCallStart,
    UserMessageChunk,
)
from cli_process import CLI, clean_env, write_script

GATED_AGENT = Path(__file__).parent.parent / "helpers" / "acp_gated_agent.py"
TIMEOUT = 60.0  # real seconds: only reached if the agent never answers

pytestmark = pytest.mark.slow

TOOL_THEN_TEXT = {
    "agents": [
        {
            "responses": [
                {"tool_calls": [{"name": "list_agents", "arguments": {}}]},
                {"text": "all done"},
                {"tool_calls": [{"name": "list_agents", "arguments": {}}]},
                {"hang": True},
            ]
        }
    ]
}


class Recorder:
    """The client side: every `session/update` kept, re-validated strictly, and announced."""

    def __init__(self, permission_answers: list[str] | None = None) -> None:
        self.updates: list[Any] = []
        self.changed = asyncio.Event()
        self.permission_answers = list(permission_answers or [])
        self.asked: list[tuple[str, Any, list[str]]] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        raw = {"sessionId": session_id, "update": update.model_dump(by_alias=True, exclude_none=True)}
        SessionNotification.model_validate(raw, strict=False)
        self.updates.append(update)
        self.changed.set()

    def merged(self) -> list[Any]:
        """The updates with each reply's streamed `agent_message_chunk`s (consecutive, one
        `messageId`) joined into one: how many chunks a reply streams in depends on timing."""
        out: list[Any] = []
        for update in self.updates:
            last = out[-1] if out else None
            if (
                isinstance(update, AgentMessageChunk)
                and isinstance(last, AgentMessageChunk)
                and last.message_id == update.message_id
            ):
                text = last.content.text + update.content.text
                out[-1] = last.model_copy(update={"content": last.content.model_copy(update={"text": text})})
            else:
                out.append(update)
        return out

    async def wait_until(self, condition: Any) -> None:
        while not condition():
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), TIMEOUT)

    async def wait_for(self, predicate: Any) -> None:
        while not any(predicate(u) for u in self.updates):
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), TIMEOUT)

    # The client's answers to `session/request_permission`, in order (a test that expects no
    # question leaves it empty: a question then fails the test).
    permission_answers: list[str]

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any) -> Any:
        self.asked.append((session_id, tool_call, [o.option_id for o in options]))
        if not self.permission_answers:
            raise AssertionError(f"an unexpected permission question: {tool_call}")
        answer = self.permission_answers.pop(0)
        if answer == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(option_id=answer, outcome="selected"))


def _agent(root: Path, model: str) -> tuple[str, ...]:
    return (*CLI, "acp", "--root", str(root), "--model", model)


async def _connect(
    recorder: Recorder,
    root: Path,
    model: str,
    stderr: Path,
    command: tuple[str, ...] | None = None,
    env: dict[str, str] | None = None,
) -> Any:
    command = command or _agent(root, model)
    return spawn_agent_process(
        recorder,
        command[0],
        *command[1:],
        env=env or clean_env(),
        transport_kwargs={"stderr": stderr.open("wb")},
        use_unstable_protocol=True,
    )


async def _initialize(conn: Any) -> Any:
    return await asyncio.wait_for(
        conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=ClientCapabilities(fs=FileSystemCapabilities(read_text_file=True)),
        ),
        TIMEOUT,
    )


def _log(root: Path, session_id: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [*CLI, "show", session_id, "--json", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr
    entries = json.loads(done.stdout)
    # `show --json` ends with the session's usage summary, then its subtree's when it has subagents
    if entries[-1]["type"] == "tree-usage":
        entries = entries[:-1]
    assert entries[-1]["type"] == "usage"
    return entries[:-1]  # the transcript entries, in log order


def test_a_prompt_streams_its_tool_call_and_text_then_ends_the_turn(tmp_path: Path) -> None:
    model = write_script(tmp_path / "script.json", TOOL_THEN_TEXT)

    async def main() -> None:
        recorder = Recorder()
        async with await _connect(recorder, tmp_path / "root", model, tmp_path / "stderr") as (conn, _process):
            init = await _initialize(conn)
            assert init.protocol_version == 1
            assert init.agent_capabilities.load_session is True
            assert init.agent_capabilities.session_capabilities.list is not None
            new = await asyncio.wait_for(conn.new_session(cwd=str(tmp_path), mcp_servers=[]), TIMEOUT)
            response = await asyncio.wait_for(
                conn.prompt(session_id=new.session_id, prompt=[text_block("hello")]), TIMEOUT
            )
            assert response.stop_reason == "end_turn"
            kinds = [type(u) for u in recorder.merged()]
            assert kinds == [ToolCallStart, ToolCallProgress, AgentMessageChunk]
            start, progress, chunk = recorder.merged()
            assert start.title.startswith("list_agents(") and start.status == "in_progress"
            assert start.kind == "other" and start.raw_input == {}
            assert progress.tool_call_id == start.tool_call_id and progress.status == "completed"
            assert progress.content[0].content.text  # the result text
            assert chunk.content.text == "all done"
            listed = await asyncio.wait_for(conn.list_sessions(cwd=str(tmp_path)), TIMEOUT)
            assert [s.session_id for s in listed.sessions] == [new.session_id]
            await asyncio.wait_for(conn.close_session(session_id=new.session_id), TIMEOUT)

    asyncio.run(main())
    assert (tmp_path / "stderr").read_bytes() == b""


def test_cancel_mid_turn_ends_the_prompt_cancelled_and_the_log_closes_the_turn(tmp_path: Path) -> None:
    script = {
        "agents": [
            {"responses": [{"tool_calls": [{"name": "list_agents", "arguments": {}}]}, {"hang": True}]},
        ]
    }
    model = write_script(tmp_path / "script.json", script)
    root = tmp_path / "root"

    async def main() -> str:
        recorder = Recorder()
        async with await _connect(recorder, root, model, tmp_path / "stderr") as (conn, _process):
            await _initialize(conn)
            new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            prompt = asyncio.ensure_future(conn.prompt(session_id=new.session_id, prompt=[text_block("go")]))
            # The tool ran: the second model call (the hang) is next.
            await recorder.wait_for(lambda u: isinstance(u, ToolCallProgress) and u.status == "completed")
            await conn.cancel(session_id=new.session_id)
            response = await asyncio.wait_for(prompt, TIMEOUT)
            assert response.stop_reason == "cancelled"
            return new.session_id

    session_id = asyncio.run(main())
    entries = _log(root, session_id)
    ends = [e for e in entries if e["type"] == "turn/end"]
    assert ends[-1]["reason"] == {"kind": "aborted", "cause": "user"}
    assert entries[-1]["type"] == "turn/end"


def test_load_after_a_kill_replays_the_history_and_prompts_again(tmp_path: Path) -> None:
    model = write_script(tmp_path / "script.json", TOOL_THEN_TEXT)
    root = tmp_path / "root"

    async def first() -> str:
        recorder = Recorder()
        async with await _connect(recorder, root, model, tmp_path / "stderr1") as (conn, process):
            await _initialize(conn)
            new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            response = await asyncio.wait_for(
                conn.prompt(session_id=new.session_id, prompt=[text_block("hi")]), TIMEOUT
            )
            assert response.stop_reason == "end_turn"
            process.kill()  # no drain, no goodbye
            await process.wait()
            return new.session_id

    session_id = asyncio.run(first())

    async def second() -> None:
        recorder = Recorder()
        async with await _connect(recorder, root, model, tmp_path / "stderr2") as (conn, _process):
            await _initialize(conn)
            await asyncio.wait_for(conn.load_session(cwd=str(tmp_path), session_id=session_id, mcp_servers=[]), TIMEOUT)
            replay = recorder.merged()
            assert [type(u) for u in replay] == [UserMessageChunk, ToolCallStart, ToolCallProgress, AgentMessageChunk]
            assert replay[0].content.text == "hi"
            assert replay[1].tool_call_id == replay[2].tool_call_id
            assert replay[3].content.text == "all done"
            # A new process: the script starts over, and the resumed session answers again.
            response = await asyncio.wait_for(conn.prompt(session_id=session_id, prompt=[text_block("again")]), TIMEOUT)
            assert response.stop_reason == "end_turn"
            assert [type(u) for u in recorder.merged()[len(replay) :]] == [
                ToolCallStart,
                ToolCallProgress,
                AgentMessageChunk,
            ]
            assert recorder.merged()[len(replay)].tool_call_id != replay[1].tool_call_id

    asyncio.run(second())
    users = [e["text"] for e in _log(root, session_id) if e["type"] == "user/message" and e["source"] == "user"]
    assert users == ["hi", "again"]


def test_a_background_child_streams_its_tool_call_and_the_settlement_steered_into_the_turn(tmp_path: Path) -> None:
    script = {
        "agents": [
            {
                "responses": [
                    {
                        "tool_calls": [
                            {
                                "name": "subagent",
                                "arguments": {"description": "Helper", "prompt": "work", "run_in_background": True},
                            }
                        ]
                    },
                    {"wait_for": {"settled": "Helper"}, "text": "started"},
                    {"text": "noted"},
                ]
            },
            {"label": "Helper", "responses": [{"text": "child result"}]},
        ]
    }
    model = write_script(tmp_path / "script.json", script)
    root = tmp_path / "root"

    async def main() -> str:
        recorder = Recorder()
        async with await _connect(recorder, root, model, tmp_path / "stderr") as (conn, _process):
            await _initialize(conn)
            new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            response = await asyncio.wait_for(
                conn.prompt(session_id=new.session_id, prompt=[text_block("go")]), TIMEOUT
            )
            assert response.stop_reason == "end_turn"
            updates = recorder.merged()
            start, progress, chunk = updates[:3]
            assert isinstance(start, ToolCallStart) and start.title.startswith("subagent(")
            assert isinstance(progress, ToolCallProgress) and progress.status == "completed"
            assert "started" in progress.content[0].content.text  # the tool's own result text
            assert isinstance(chunk, AgentMessageChunk) and chunk.content.text == "started"
            # The child settled while the parent's model call waited for it: the notice is steered
            # into the same turn, whose every update is written before the prompt's response.
            assert [type(u) for u in updates[3:]] == [AgentMessageChunk]
            assert updates[3].content.text == "noted"
            return new.session_id

    session_id = asyncio.run(main())
    turns = [e for e in _log(root, session_id) if e["type"] == "turn/start"]
    assert [t["trigger"] for t in turns] == ["message"]


def test_after_a_restart_send_message_cold_resumes_the_background_child(tmp_path: Path) -> None:
    first_script = {
        "agents": [
            {
                "responses": [
                    {
                        "tool_calls": [
                            {
                                "name": "subagent",
                                "arguments": {"description": "Helper", "prompt": "work", "run_in_background": True},
                            }
                        ]
                    },
                    {"wait_for": {"settled": "Helper"}, "text": "started"},
                    {"text": "noted"},
                ]
            },
            {"label": "Helper", "responses": [{"text": "child result"}]},
        ]
    }
    # The second process: a new script instance, so the parent's entry starts again.
    second_script = {
        "agents": [
            {
                "responses": [
                    {
                        "tool_calls": [
                            {
                                "name": "send_message",
                                "arguments": {
                                    "agent_id": "{{from_request:started subagent (\\S+)}}",
                                    "message": "more please",
                                },
                            }
                        ]
                    },
                    {"wait_for": {"settled": "Helper", "count": 2}, "text": "sent"},
                    {"text": "noted again"},
                ]
            },
            {"label": "Helper", "responses": [{"text": "child again"}]},
        ]
    }
    root = tmp_path / "root"

    async def first() -> str:
        recorder = Recorder()
        model = write_script(tmp_path / "one.json", first_script)
        async with await _connect(recorder, root, model, tmp_path / "stderr1") as (conn, process):
            await _initialize(conn)
            new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            response = await asyncio.wait_for(
                conn.prompt(session_id=new.session_id, prompt=[text_block("go")]), TIMEOUT
            )
            assert response.stop_reason == "end_turn"
            process.kill()
            await process.wait()
            return new.session_id

    session_id = asyncio.run(first())

    async def second() -> None:
        recorder = Recorder()
        model = write_script(tmp_path / "two.json", second_script)
        async with await _connect(recorder, root, model, tmp_path / "stderr2") as (conn, _process):
            await _initialize(conn)
            await asyncio.wait_for(conn.load_session(cwd=str(tmp_path), session_id=session_id, mcp_servers=[]), TIMEOUT)
            replayed = len(recorder.merged())
            assert any(isinstance(u, ToolCallStart) and u.title.startswith("subagent(") for u in recorder.updates)
            response = await asyncio.wait_for(conn.prompt(session_id=session_id, prompt=[text_block("again")]), TIMEOUT)
            assert response.stop_reason == "end_turn"
            live = recorder.merged()[replayed:]
            start, progress = live[0], live[1]
            assert isinstance(start, ToolCallStart) and start.title.startswith("send_message(")
            assert isinstance(progress, ToolCallProgress) and progress.status == "completed", progress
            assert [u.content.text for u in live[2:]] == ["sent", "noted again"]

    asyncio.run(second())
    assert (tmp_path / "stderr2").read_bytes() == b""


def test_text_streams_as_the_model_writes_it(tmp_path: Path) -> None:
    # The agent's model streams "Hel", then waits for a byte on the FIFO, then streams "lo": the
    # client sees "Hel" while the reply is not written yet (the model is held), never timing.
    fifo = tmp_path / "gate"
    os.mkfifo(fifo)
    gate = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # held open: a write waits in the pipe
    command = (sys.executable, str(GATED_AGENT), str(tmp_path / "root"), str(fifo))

    async def main() -> None:
        recorder = Recorder()
        async with await _connect(recorder, tmp_path / "root", "", tmp_path / "stderr", command) as (conn, _):
            await _initialize(conn)
            new = await asyncio.wait_for(conn.new_session(cwd=str(tmp_path), mcp_servers=[]), TIMEOUT)
            prompt = asyncio.ensure_future(conn.prompt(session_id=new.session_id, prompt=[text_block("hi")]))
            await recorder.wait_for(lambda u: isinstance(u, AgentMessageChunk))
            assert [u.content.text for u in recorder.updates] == ["Hel"]
            assert not prompt.done()
            os.write(gate, b"x")  # the model may finish its reply
            response = await asyncio.wait_for(prompt, TIMEOUT)
            assert response.stop_reason == "end_turn"
            chunks = recorder.updates
            assert [type(u) for u in chunks] == [AgentMessageChunk] * len(chunks) and len(chunks) == 2
            assert "".join(u.content.text for u in chunks) == "Hello"
            assert len({u.message_id for u in chunks}) == 1  # one message, streamed in two chunks

    try:
        asyncio.run(main())
    finally:
        os.close(gate)
    assert (tmp_path / "stderr").read_bytes() == b""


def test_a_child_settling_while_no_prompt_runs_starts_a_turn_that_streams_as_notifications(tmp_path: Path) -> None:
    # Session A starts a background child whose answer waits until session B's model call is
    # held; B is prompted only after A's prompt has ended, so the child settles while A is
    # idle, and A's notice turn streams with no prompt of A's running.
    script = {
        "agents": [
            {
                "responses": [
                    {
                        "tool_calls": [
                            {
                                "name": "subagent",
                                "arguments": {
                                    "description": "Helper",
                                    "prompt": "peer={{from_request:peer=(\\S+)}}",
                                    "run_in_background": True,
                                },
                            }
                        ]
                    },
                    {"text": "started"},
                    {"text": "the helper is done"},
                ]
            },
            {"responses": [{"wait_for": {"steered": True}}]},
            {
                "label": "Helper",
                "responses": [{"wait_for": {"waiting": "{{from_request:peer=(\\S+)}}"}, "text": "child result"}],
            },
        ]
    }
    model = write_script(tmp_path / "script.json", script)
    root = tmp_path / "root"

    async def main() -> str:
        recorder = Recorder()
        async with await _connect(recorder, root, model, tmp_path / "stderr") as (conn, _process):
            await _initialize(conn)
            peer = await asyncio.wait_for(conn.new_session(cwd=str(tmp_path), mcp_servers=[]), TIMEOUT)
            new = await asyncio.wait_for(conn.new_session(cwd=str(tmp_path), mcp_servers=[]), TIMEOUT)
            sid = new.session_id
            response = await asyncio.wait_for(
                conn.prompt(session_id=sid, prompt=[text_block(f"peer={peer.session_id}")]), TIMEOUT
            )
            assert response.stop_reason == "end_turn"
            ended = len(recorder.merged())
            assert [type(u) for u in recorder.merged()] == [ToolCallStart, ToolCallProgress, AgentMessageChunk]
            # B's model call holds: the child answers and settles, and A's notice turn streams.
            held = asyncio.ensure_future(conn.prompt(session_id=peer.session_id, prompt=[text_block("hold")]))
            await recorder.wait_until(
                lambda: (
                    [type(u) for u in recorder.merged()[ended:]] == [AgentMessageChunk]
                    and recorder.merged()[-1].content.text == "the helper is done"
                )
            )
            notice = recorder.merged()[ended:]
            assert [type(u) for u in notice] == [AgentMessageChunk]
            assert notice[0].content.text == "the helper is done"
            await conn.cancel(session_id=peer.session_id)
            assert (await asyncio.wait_for(held, TIMEOUT)).stop_reason == "cancelled"
            return sid

    sid = asyncio.run(main())
    turns = [e for e in _log(root, sid) if e["type"] == "turn/start"]
    assert [t["trigger"] for t in turns] == ["message", "notice"]
    assert (tmp_path / "stderr").read_bytes() == b""


def test_session_list_pages_with_titles_and_last_activity(tmp_path: Path) -> None:
    model = write_script(
        tmp_path / "script.json", {"agents": [{"responses": [{"text": "one"}]}, {"responses": [{"text": "two"}]}]}
    )
    other = tmp_path / "elsewhere"
    other.mkdir()

    async def main() -> None:
        recorder = Recorder()
        async with await _connect(recorder, tmp_path / "root", model, tmp_path / "stderr") as (conn, _process):
            await _initialize(conn)
            made = [(await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id for _ in range(22)]
            await conn.new_session(cwd=str(other), mcp_servers=[])  # filtered out by cwd
            first, last = made[0], made[-1]
            for sid, text in [(first, "fix the\nbuild   please"), (last, "write docs")]:
                done = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block(text)]), TIMEOUT)
                assert done.stop_reason == "end_turn"
            pages = []
            cursor = None
            while True:
                listed = await asyncio.wait_for(conn.list_sessions(cwd=str(tmp_path), cursor=cursor), TIMEOUT)
                pages.append(listed.sessions)
                cursor = listed.next_cursor
                if cursor is None:
                    break
            assert [len(p) for p in pages] == [20, 2]
            rows = [s for p in pages for s in p]
            assert sorted(s.session_id for s in rows) == sorted(made)  # each once, none of `other`
            titles = {s.session_id: s.title for s in rows}
            assert titles[first] == "fix the build please" and titles[last] == "write docs"
            assert sum(t is not None for t in titles.values()) == 2
            for row in rows:
                assert row.updated_at is not None and row.cwd == str(tmp_path)
                datetime.datetime.fromisoformat(row.updated_at.replace("Z", "+00:00"))
            with pytest.raises(RequestError) as bad:
                await asyncio.wait_for(conn.list_sessions(cursor="not-a-cursor"), TIMEOUT)
            assert bad.value.code == -32602

    asyncio.run(main())
    assert (tmp_path / "stderr").read_bytes() == b""


def test_a_tool_whose_permission_is_ask_asks_the_client_and_its_answer_decides(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    calls = [
        {"name": "write_file", "arguments": {"path": "a.txt", "content": "one"}},
        {"name": "write_file", "arguments": {"path": "b.txt", "content": "two"}},
        {"name": "run_command", "arguments": {"command": "touch c.txt"}},
        {"name": "run_command", "arguments": {"command": "touch d.txt"}},
        {"name": "run_command", "arguments": {"command": "touch e.txt"}},
    ]
    script = {"agents": [{"responses": [*({"tool_calls": [c]} for c in calls), {"text": "done"}]}]}
    model = write_script(tmp_path / "script.json", script)
    root = tmp_path / "root"
    # Unconfined, run_command asks (with the sandbox on, a boxed command is allowed: test_sandbox*).
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "subagents.toml").write_text('[sandbox]\nmode = "off"\n')
    unconfined = clean_env(SUBAGENTS_CONFIG_DIR=str(tmp_path / "user"))
    command = (*_agent(root, model), "--workspace", str(ws))

    async def main() -> tuple[str, Recorder]:
        # write a: allowed once; write b: rejected; run c: always; run d: remembered (not asked);
        # a second question for run e never comes.
        recorder = Recorder(["allow_once", "reject_once", "allow_always"])
        async with await _connect(recorder, root, model, tmp_path / "stderr", command, unconfined) as (conn, _process):
            await _initialize(conn)
            new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            response = await asyncio.wait_for(
                conn.prompt(session_id=new.session_id, prompt=[text_block("go")]), TIMEOUT
            )
            assert response.stop_reason == "end_turn"
            return new.session_id, recorder

    session_id, recorder = asyncio.run(main())
    assert [(sid, call.kind, call.raw_input, options) for sid, call, options in recorder.asked] == [
        (session_id, "edit", {"path": "a.txt", "content": "one"}, ["allow_once", "allow_always", "reject_once"]),
        (session_id, "edit", {"path": "b.txt", "content": "two"}, ["allow_once", "allow_always", "reject_once"]),
        (session_id, "execute", {"command": "touch c.txt"}, ["allow_once", "allow_always", "reject_once"]),
    ]
    results = [e["text"] for e in _log(root, session_id) if e["type"] == "tool/result"]
    assert results == [
        "created a.txt (3 bytes)",
        "Error: the person declined the permission request",
        "exit code: 0",
        "exit code: 0",
        "exit code: 0",
    ]
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt", "c.txt", "d.txt", "e.txt"]
    assert (tmp_path / "stderr").read_bytes() == b""


def test_the_workspace_tools_act_in_the_cwd_the_client_gives_each_session(tmp_path: Path) -> None:
    projects = [tmp_path / "one", tmp_path / "two"]
    for i, project in enumerate(projects):
        project.mkdir()
        (project / "note.txt").write_text(f"project {i}\n")
    script = {
        "agents": [
            {
                "responses": [
                    {"tool_calls": [{"name": "read_file", "arguments": {"path": "note.txt"}}]},
                    {"text": "read"},
                ]
            },
            {
                "responses": [
                    {"tool_calls": [{"name": "read_file", "arguments": {"path": "note.txt"}}]},
                    {"text": "read"},
                ]
            },
        ]
    }
    model = write_script(tmp_path / "script.json", script)
    root = tmp_path / "root"

    async def main() -> list[str]:
        recorder = Recorder()
        async with await _connect(recorder, root, model, tmp_path / "stderr") as (conn, _process):
            await _initialize(conn)
            sessions = []
            for project in projects:
                new = await conn.new_session(cwd=str(project), mcp_servers=[])
                await asyncio.wait_for(conn.prompt(session_id=new.session_id, prompt=[text_block("read")]), TIMEOUT)
                sessions.append(new.session_id)
            return sessions

    sessions = asyncio.run(main())
    for i, session_id in enumerate(sessions):
        results = [e["text"] for e in _log(root, session_id) if e["type"] == "tool/result"]
        assert results == [f"     1\tproject {i}"]
    assert (tmp_path / "stderr").read_bytes() == b""
