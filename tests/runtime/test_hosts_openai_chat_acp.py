"""`subagents chat` (stdin piped) and `subagents acp` (driven by the official
`agent-client-protocol` client) with an `openai:` model against a local OpenAI-compatible server
(tests/helpers/openai_server.py): answers whose text arrives in several deltas, tool calls split
over several chunks (the `subagent` tool among them), usage, a cancel while the model streams, and
a provider error that ends the turn but not the host.

Waits are on output lines, ACP messages or the server's `holding` event, never on time; the
timeouts are only hang guards.
"""

from __future__ import annotations

import asyncio
import json
import queue
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block
from acp.schema import (
    AgentMessageChunk,
    ClientCapabilities,
    SessionNotification,
    ToolCallProgress,
    ToolCallStart,
)
from cli_process import CLI, clean_env
from log_lines import log_file, plain_bytes
from openai_server import OpenAIServer, Reply, last_message, tool_messages

KEY = "sk-fake-CHATACP-8d2c5e0b7a1f9364"
GRAMS = {KEY[i : i + 8] for i in range(len(KEY) - 7)}
TIMEOUT = 60  # real seconds: only reached if a host hangs
MODEL = "test-model"

pytestmark = pytest.mark.slow  # every test runs a host process


def leaks(data: str | bytes) -> list[str]:
    raw = data.encode() if isinstance(data, str) else data
    return [g for g in GRAMS if g.encode() in raw]


def records(root: Path, session_id: str, compression: str = "none") -> list[dict[str, Any]]:
    """The session's log records, header left out."""
    data = plain_bytes(log_file(root, session_id, compression))
    return [json.loads(line) for line in data.splitlines()[1:]]


def assert_store_clean(root: Path) -> None:
    files = [p for p in root.rglob("*") if p.is_file()]
    assert any(p.name.startswith("session.jsonl") for p in files)  # positive control: the scan reads the logs
    for path in files:
        assert not leaks(path.read_bytes()) and not leaks(plain_bytes(path)), path


def is_tool_result(body: dict[str, Any]) -> bool:
    return last_message(body)["role"] == "tool"


# -- chat ------------------------------------------------------------------------------------------


class Chat:
    """`subagents chat` with stdin piped; stdout read in a thread, in pieces (an answer that is
    still streaming has no newline yet)."""

    def __init__(self, tmp_path: Path, server: OpenAIServer, *args: str) -> None:
        self.root = tmp_path / "root"
        self.proc = subprocess.Popen(
            [
                *CLI,
                "chat",
                "--root",
                str(self.root),
                "--compression",
                "none",
                "--model",
                f"openai:{MODEL}",
                "--base-url",
                server.base_url,
                *args,
            ],
            cwd=tmp_path,
            env=clean_env(OPENAI_API_KEY=KEY, COLUMNS="200"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.out = ""
        self._pieces: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while piece := self.proc.stdout.read1(65536):
            self._pieces.put(piece)
        self._pieces.put(b"")

    def line(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def expect(self, pattern: str) -> re.Match[str]:
        """Wait until the output so far matches `pattern` (multiline)."""
        while not (match := re.search(pattern, self.out, re.MULTILINE)):
            try:
                piece = self._pieces.get(timeout=TIMEOUT)
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"no output matching {pattern!r}; seen:\n{self.out}") from None
            if not piece:
                raise AssertionError(f"the chat ended before {pattern!r}; seen:\n{self.out}")
            self.out += piece.decode()
        return match

    def finish(self) -> tuple[int, str]:
        """Close stdin, wait for the exit: (status, stderr); `out` then holds all of stdout."""
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.close()
        status = self.proc.wait(timeout=TIMEOUT)
        while piece := self._pieces.get(timeout=TIMEOUT):
            self.out += piece.decode()
        return status, self.proc.stderr.read().decode()


def test_piped_chat_streams_answers_shows_a_split_tool_call_and_usage(tmp_path: Path) -> None:
    replies = [
        Reply.text("Hel", "lo ", "there", usage=(5, 2), when="first line"),
        Reply.tool_call("list_agents", {"scope": "children"}, fragments=3, usage=(40, 9), when="second line"),
        Reply.text("no ", "helpers ", "yet", usage=(60, 4), when=is_tool_result),
    ]
    with OpenAIServer(replies) as server:
        chat = Chat(tmp_path, server)
        session = chat.expect(r"^session (\S+) \(/help for commands\)$").group(1)
        chat.line("first line")
        chat.expect(r"^assistant: Hello there$")
        chat.line("second line")
        chat.expect(r"^  → list_agents\(.*children.*\)$")
        chat.expect(r"^  ← \(no subagents\)$")
        chat.expect(r"^assistant: no helpers yet$")
        chat.line("/usage")
        chat.expect(r"^turn 2: 100 in, 13 out tokens \(2 model calls\)$")
        chat.expect(rf"^session {re.escape(session)}: 105 in, 15 out tokens \(3 model calls\)$")
        chat.line("/quit")
        status, stderr = chat.finish()
    assert status == 0, (chat.out, stderr)
    assert stderr == ""
    assert re.search(r"^turn 1: 5 in, 2 out tokens \(1 model call\)$", chat.out, re.MULTILINE)
    assert "Traceback" not in chat.out
    assert server.leftovers() == {}
    first, second, back = server.bodies()
    assert first["messages"] == [{"role": "user", "content": "first line"}]
    assert second["messages"] == [
        {"role": "user", "content": "first line"},
        {"role": "assistant", "content": "Hello there"},
        {"role": "user", "content": "second line"},
    ]
    assert tool_messages(back) == [{"role": "tool", "tool_call_id": "call_0", "content": "(no subagents)"}]
    assert not leaks(chat.out) and not leaks(stderr)
    assert_store_clean(chat.root)


def test_chat_shows_text_as_it_streams_ctrl_c_cancels_and_a_401_ends_only_its_turn(tmp_path: Path) -> None:
    replies = [
        Reply.text("Thinking ", "about ", "it", hold_after=2, when="a long one"),
        Reply.error(401, f"Incorrect API key provided: {KEY}", when="after the cancel"),
        Reply.text("still ", "here", usage=(3, 2), when="are you there"),
    ]
    with OpenAIServer(replies) as server:
        chat = Chat(tmp_path, server)
        session = chat.expect(r"^session (\S+) \(/help for commands\)$").group(1)
        chat.line("a long one")
        # The reply's first two deltas are shown while the model is still streaming.
        chat.expect(r"^assistant: Thinking about $")
        assert server.holding.wait(TIMEOUT)  # it holds (set just after it sent what came before)
        chat.proc.send_signal(signal.SIGINT)
        chat.expect(r"^assistant: Thinking about  \[interrupted\]$")
        chat.line("after the cancel")
        chat.expect(r"^── turn 2 ended: error .*authentication failed \(401\).*\[redacted\]$")
        chat.line("are you there")
        chat.expect(r"^assistant: still here$")
        chat.line("/quit")
        status, stderr = chat.finish()
    assert status == 0, (chat.out, stderr)
    assert stderr == "" and "Traceback" not in chat.out
    assert not leaks(chat.out)
    assert server.leftovers() == {}
    log = records(chat.root, session)
    ends = [r["data"]["reason"] for r in log if r["type"] == "turn/end"]
    assert [e["kind"] for e in ends] == ["aborted", "error", "completed"]
    assert ends[0] == {"kind": "aborted", "cause": "user"}
    assert "authentication failed (401)" in ends[1]["message"]
    [cut] = [r["data"] for r in log if r["type"] == "assistant/message" and r["data"].get("interrupted")]
    assert cut["message"]["content"] == [{"type": "text", "text": "Thinking about "}]
    assert_store_clean(chat.root)


def test_chat_resumed_with_session_shows_its_last_turns_and_sends_its_history(tmp_path: Path) -> None:
    replies = [
        Reply.tool_call("list_agents", {}, call_id="c_list", when="look around"),
        Reply.text("nobody ", "here", usage=(4, 2), when=is_tool_result),
        Reply.text("welcome ", "back", usage=(9, 3), when="hello again"),
    ]
    with OpenAIServer(replies) as server:
        chat = Chat(tmp_path, server)
        session = chat.expect(r"^session (\S+) \(/help for commands\)$").group(1)
        chat.line("look around")
        chat.expect(r"^assistant: nobody here$")
        chat.line("/quit")
        assert chat.finish()[0] == 0
        again = Chat(tmp_path, server, "--session", session)
        again.expect(r"^user: look around$")  # its last turns first
        again.expect(rf"^session {re.escape(session)} \(/help for commands\)$")
        again.line("hello again")
        again.expect(r"^assistant: welcome back$")
        again.line("/quit")
        status, stderr = again.finish()
    assert status == 0 and stderr == "", (again.out, stderr)
    assert server.leftovers() == {}
    assert [m["role"] for m in server.bodies()[-1]["messages"]] == ["user", "assistant", "tool", "assistant", "user"]


# -- acp -------------------------------------------------------------------------------------------


class Recorder:
    """The ACP client side: every `session/update` kept, validated by the SDK's schema types."""

    def __init__(self) -> None:
        self.updates: list[Any] = []
        self.changed = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        raw = {"sessionId": session_id, "update": update.model_dump(by_alias=True, exclude_none=True)}
        SessionNotification.model_validate(raw)
        self.updates.append(update)
        self.changed.set()

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no permission is asked for yet")


def _acp(recorder: Recorder, root: Path, server: OpenAIServer, stderr: Path) -> Any:
    command = (*CLI, "acp", "--root", str(root), "--model", f"openai:{MODEL}", "--base-url", server.base_url)
    return spawn_agent_process(
        recorder,
        command[0],
        *command[1:],
        env=clean_env(OPENAI_API_KEY=KEY),
        transport_kwargs={"stderr": stderr.open("wb")},
        use_unstable_protocol=True,
    )


def test_acp_prompt_with_a_subagent_and_deltas_then_a_provider_error_then_a_cancel_mid_stream(tmp_path: Path) -> None:
    root = tmp_path / "root"
    arguments = {"description": "Say hi", "prompt": "Reply HI please", "run_in_background": False}
    replies = [
        Reply.tool_call("subagent", arguments, call_id="call_p", fragments=4, usage=(100, 20), when="delegate"),
        Reply.text("H", "I", usage=(30, 2), when="Reply HI please"),
        Reply.text("The child ", "said: ", "HI", usage=(150, 5), when=is_tool_result),
        Reply.error(401, f"Incorrect API key provided: {KEY}", when="second prompt"),
        Reply.text("part ", "one ", "and", hold_after=2, when="third prompt"),
    ]

    async def main() -> str:
        recorder = Recorder()
        async with _acp(recorder, root, server, tmp_path / "stderr") as (conn, _process):
            await asyncio.wait_for(
                conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities()), TIMEOUT
            )
            new = await asyncio.wait_for(conn.new_session(cwd=str(tmp_path), mcp_servers=[]), TIMEOUT)
            sid = new.session_id
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("delegate it")]), TIMEOUT)
            assert response.stop_reason == "end_turn"
            # The text may come as one chunk per reply or one per delta: both read the same.
            kinds = [type(u) for u in recorder.updates]
            assert kinds[:2] == [ToolCallStart, ToolCallProgress] and set(kinds[2:]) == {AgentMessageChunk}
            start, progress, *chunks = recorder.updates
            assert start.title.startswith("subagent(") and start.raw_input == arguments
            assert progress.tool_call_id == start.tool_call_id and progress.status == "completed"
            assert progress.content[0].content.text == "HI"  # the child's answer, from the same server
            assert "".join(c.content.text for c in chunks) == "The child said: HI"  # three deltas

            # A provider error is the prompt's JSON-RPC error (the key redacted); the agent lives on.
            with pytest.raises(RequestError) as caught:
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("second prompt")]), TIMEOUT)
            detail = json.dumps(caught.value.to_error_obj())
            assert "authentication failed (401)" in detail and "[redacted]" in detail
            assert not leaks(detail)

            # A cancel while the model streams: stop reason `cancelled`.
            prompt = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text_block("third prompt")]))
            assert await asyncio.to_thread(server.holding.wait, TIMEOUT)
            await conn.cancel(session_id=sid)
            response = await asyncio.wait_for(prompt, TIMEOUT)
            assert response.stop_reason == "cancelled"
            await asyncio.wait_for(conn.close_session(session_id=sid), TIMEOUT)
            return sid

    with OpenAIServer(replies) as server:
        session_id = asyncio.run(main())
    assert (tmp_path / "stderr").read_bytes() == b""  # a provider error is the client's to show
    assert server.leftovers() == {}
    bodies = server.bodies()
    assert "subagent" in [t["function"]["name"] for t in bodies[0]["tools"]]
    assert tool_messages(bodies[2]) == [{"role": "tool", "tool_call_id": "call_p", "content": "HI"}]
    log = records(root, session_id, "zstd")  # acp writes zstd logs
    ends = [r["data"]["reason"] for r in log if r["type"] == "turn/end"]
    assert [e["kind"] for e in ends] == ["completed", "error", "aborted"]
    assert ends[2] == {"kind": "aborted", "cause": "user"}
    [cut] = [r["data"] for r in log if r["type"] == "assistant/message" and r["data"].get("interrupted")]
    assert cut["message"]["content"] == [{"type": "text", "text": "part one "}]
    assert_store_clean(root)


def test_acp_cancel_while_a_one_shot_childs_model_streams(tmp_path: Path) -> None:
    """The parent waits on a one-shot child whose model is mid-stream: `session/cancel` ends the
    prompt `cancelled`, the child's request is dropped (the held stream sees the client leave),
    and both logs close their turns as aborted."""
    root = tmp_path / "root"
    arguments = {"description": "Slow", "prompt": "take your time", "run_in_background": False}
    replies = [
        Reply.tool_call("subagent", arguments, usage=(10, 5), when="delegate"),
        Reply.text("still ", "thinking", "...", hold_after=2, when="take your time"),
        Reply.text("the next ", "prompt", usage=(3, 2), when="next"),
    ]

    async def main() -> str:
        recorder = Recorder()
        async with _acp(recorder, root, server, tmp_path / "stderr") as (conn, _process):
            await asyncio.wait_for(
                conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities()), TIMEOUT
            )
            sid = (await asyncio.wait_for(conn.new_session(cwd=str(tmp_path), mcp_servers=[]), TIMEOUT)).session_id
            prompt = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text_block("delegate it")]))
            assert await asyncio.to_thread(server.holding.wait, TIMEOUT)
            await conn.cancel(session_id=sid)
            assert (await asyncio.wait_for(prompt, TIMEOUT)).stop_reason == "cancelled"
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("next")]), TIMEOUT)
            assert response.stop_reason == "end_turn"
            chunks = [u for u in recorder.updates if isinstance(u, AgentMessageChunk)]
            assert "".join(c.content.text for c in chunks) == "the next prompt"
            return sid

    with OpenAIServer(replies) as server:
        session_id = asyncio.run(main())
    assert (tmp_path / "stderr").read_bytes() == b""
    assert server.leftovers() == {}
    log = records(root, session_id, "zstd")
    ends = [r["data"]["reason"] for r in log if r["type"] == "turn/end"]
    assert ends == [{"kind": "aborted", "cause": "user"}, {"kind": "completed"}]
    [catalog] = [r["data"] for r in log if r["type"] == "subagent/catalog"]
    child = records(root, catalog["child_id"], "zstd")
    assert [r["data"]["reason"]["kind"] for r in child if r["type"] == "turn/end"] == ["aborted"]
    [cut] = [r["data"] for r in child if r["type"] == "assistant/message"]
    assert cut["interrupted"] is True and cut["message"]["content"] == [{"type": "text", "text": "still thinking"}]


def test_acp_load_after_a_kill_sends_the_replayed_history_to_the_model(tmp_path: Path) -> None:
    root = tmp_path / "root"
    replies = [
        Reply.tool_call("list_agents", {}, call_id="c_list", when="look around"),
        Reply.text("nobody ", "here", usage=(4, 2), when=is_tool_result),
        Reply.text("welcome ", "back", usage=(9, 3), when="hello again"),
    ]

    async def first() -> str:
        async with _acp(Recorder(), root, server, tmp_path / "stderr1") as (conn, process):
            await asyncio.wait_for(
                conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities()), TIMEOUT
            )
            sid = (await asyncio.wait_for(conn.new_session(cwd=str(tmp_path), mcp_servers=[]), TIMEOUT)).session_id
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("look around")]), TIMEOUT)
            assert response.stop_reason == "end_turn"
            process.kill()  # no drain
            await process.wait()
            return str(sid)

    async def second(sid: str) -> None:
        recorder = Recorder()
        async with _acp(recorder, root, server, tmp_path / "stderr2") as (conn, _process):
            await asyncio.wait_for(
                conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities()), TIMEOUT
            )
            await asyncio.wait_for(conn.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[]), TIMEOUT)
            replayed = len(recorder.updates)
            assert replayed > 0
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("hello again")]), TIMEOUT)
            assert response.stop_reason == "end_turn"
            chunks = [u for u in recorder.updates[replayed:] if isinstance(u, AgentMessageChunk)]
            assert "".join(c.content.text for c in chunks) == "welcome back"

    with OpenAIServer(replies) as server:
        session_id = asyncio.run(first())
        asyncio.run(second(session_id))
    assert (tmp_path / "stderr2").read_bytes() == b""
    assert server.leftovers() == {}
    history = server.bodies()[-1]["messages"]
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "user"]
    assert history[-1] == {"role": "user", "content": "hello again"}
