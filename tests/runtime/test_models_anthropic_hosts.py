"""The hosts with `anthropic:` models (issue 30, item 1), against the local fake Messages API
(tests/helpers/fake_anthropic.py), which refuses any request the API or the SDK's request types
would refuse: `run --stream` whose parent thinks, then starts two children with parallel
`tool_use` blocks of the `subagent` tool, then gets both results back in one user message with
its thinking replayed; a piped `chat`; `acp` with a child started by a `tool_use` and an
overloaded stream; a 401 that is one line with the key nowhere.

The subprocess tests wait for the process to end; their timeouts are only hang guards.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block
from acp.schema import AgentMessageChunk, ClientCapabilities, SessionNotification, ToolCallProgress, ToolCallStart
from cli_process import CLI, clean_env, kill_when_held
from fake_anthropic import AnthropicServer, Block, Reply

pytestmark = pytest.mark.slow  # every test runs a host process

KEY = "sk-ant-fake-HOSTS-7c1e9a2b5d3f"
GRAMS = {KEY[i : i + 8] for i in range(len(KEY) - 7)}
TIMEOUT = 60
MODEL = "claude-test"


def leaks(data: str | bytes) -> list[str]:
    raw = data.encode() if isinstance(data, str) else data
    return [g for g in GRAMS if g.encode() in raw]


def assert_store_clean(root: Path) -> None:
    files = [p for p in root.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert not leaks(path.read_bytes()), path


def cli(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args, "--root", str(root)],
        cwd=root.parent,
        env=env if env is not None else clean_env(ANTHROPIC_API_KEY=KEY),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def has_results(body: dict[str, Any]) -> bool:
    return any(b["type"] == "tool_result" for b in body["messages"][-1]["content"])


def assistant_messages(events: list[dict[str, Any]], session: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["session_id"] == session and e["type"] == "assistant/message"]


def test_run_with_thinking_and_two_children_from_parallel_tool_use(tmp_path: Path) -> None:
    root = tmp_path / "root"
    a = {"description": "Greet", "prompt": "Say HI", "run_in_background": False}
    b = {"description": "Part", "prompt": "Say BYE", "run_in_background": False}
    replies = [
        Reply.tool_uses(
            Block.tool_use("subagent", a, id="toolu_a", fragments=4),
            Block.tool_use("subagent", b, id="toolu_b", fragments=2),
            text="Two helpers.",
            usage=(12, 40, 0, 900),
            when="Delegate",
        ),
        Reply.text("HI", usage=(20, 2, 0, 0), when="Say HI"),
        Reply.text("BYE", usage=(21, 2, 0, 0), when="Say BYE"),
        Reply.text("They said ", "HI and BYE", usage=(30, 6, 900, 50), when=has_results),
    ]
    # The parent's first reply thinks first (the signature the fake checks on the way back).
    first = replies[0]
    replies[0] = Reply(
        blocks=(Block.thinking("Two ", "children.", signature="sig-parent-1"), *first.blocks),
        stop_reason="tool_use",
        usage=first.usage,
        when=first.when,
    )
    with AnthropicServer(replies) as server:
        done = cli(
            root,
            "run",
            "--model",
            f"anthropic:{MODEL},thinking=2048",
            "--base-url",
            server.base_url,
            "--stream",
            "Delegate two greetings.",
        )
        assert done.returncode == 0, (done.stdout, done.stderr, server.leftovers())
        assert server.leftovers() == {}
        bodies = server.bodies()
        headers = [seen.headers for seen in server.requests]
    *events, result = [json.loads(line) for line in done.stdout.splitlines()]
    parent = result["session_id"]
    assert result["output"] == "They said HI and BYE"
    # Each request: the key only in x-api-key, the API version, thinking on, at most 4 cache marks.
    assert all(h["x-api-key"] == KEY and h["anthropic-version"] == "2023-06-01" for h in headers)
    assert all("authorization" not in h for h in headers)
    assert all(body["thinking"] == {"type": "enabled", "budget_tokens": 2048} for body in bodies)
    [back] = [body for body in bodies if has_results(body)]
    assert back["messages"][0] == {
        "role": "user",
        "content": [{"type": "text", "text": "Delegate two greetings.", "cache_control": {"type": "ephemeral"}}],
    }
    assistant = back["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"][0] == {"type": "thinking", "thinking": "Two children.", "signature": "sig-parent-1"}
    assert [c["type"] for c in assistant["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert [c["input"] for c in assistant["content"][2:]] == [a, b]
    results = back["messages"][2]["content"]
    assert [(r["type"], r["tool_use_id"]) for r in results] == [("tool_result", "toolu_a"), ("tool_result", "toolu_b")]
    assert [r["content"][0]["text"] for r in results] == ["HI", "BYE"]
    assert results[-1]["cache_control"] == {"type": "ephemeral"}
    assert back["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    # The log keeps the thinking block and the cache counts of each call.
    replies_logged = assistant_messages(events, parent)
    assert replies_logged[0]["message"]["content"][0] == {
        "type": "thinking",
        "thinking": "Two children.",
        "signature": "sig-parent-1",
    }
    assert replies_logged[0]["usage"] == {"input_tokens": 12, "output_tokens": 40, "cache_write_tokens": 900}
    assert replies_logged[1]["usage"] == {
        "input_tokens": 30,
        "output_tokens": 6,
        "cache_read_tokens": 900,
        "cache_write_tokens": 50,
    }
    children = {e["session_id"] for e in events} - {parent}
    assert len(children) == 2
    model_records = [e["data"] for e in events if e["type"] == "session/model"]
    assert {r["model"] for r in model_records} == {f"anthropic:{MODEL},thinking=2048"}
    assert not leaks(done.stdout) and not leaks(done.stderr)
    assert_store_clean(root)

    shown = cli(root, "show", parent)
    assert shown.returncode == 0, shown.stderr
    assert "They said HI and BYE" in shown.stdout and not leaks(shown.stdout)
    assert "usage: 42 in, 46 out tokens, cache 900 read, 950 written (2 model calls)" in shown.stdout
    shown_json = cli(root, "show", parent, "--json")
    calls = [e for e in json.loads(shown_json.stdout) if e["type"] == "assistant/message"]
    assert calls[-1]["usage"]["cache_read_tokens"] == 900


def test_a_run_killed_mid_turn_resumes_with_its_thinking_sent_back(tmp_path: Path) -> None:
    """SIGKILL while the parent's one-shot child streams; `run --session` continues the turn (the
    call is in doubt) and issues the parent's model call again: its tool-use message must still
    start with the thinking block (and signature) the log kept, or the fake refuses it."""
    root = tmp_path / "root"
    arguments = {"description": "Slow", "prompt": "take your time", "run_in_background": False}
    thinking = Block.thinking("I will ", "delegate.", signature="sig-kept")
    replies = [
        Reply(
            blocks=(thinking, Block.tool_use("subagent", arguments, id="toolu_s")),
            stop_reason="tool_use",
            when="delegate",
        ),
        Reply.text("still ", "going", hold_after=4, when="take your time"),
        Reply.text("in doubt", when=has_results),
        Reply.text("resumed ", "fine", when="again"),
    ]
    spec = f"anthropic:{MODEL},thinking=1024"
    command = [*CLI, "run", "--root", str(root), "--session", "s1", "--model", spec]
    with AnthropicServer(replies) as server:
        kill_when_held(
            [*command, "--base-url", server.base_url, "delegate it"],
            server.holding,
            cwd=tmp_path,
            env=clean_env(ANTHROPIC_API_KEY=KEY),
            timeout=TIMEOUT,
        )
        done = cli(root, "run", "--session", "s1", "--model", spec, "--base-url", server.base_url, "again")
        assert done.returncode == 0, (done.stdout, done.stderr, server.leftovers())
        assert server.leftovers() == {}
        bodies = server.bodies()
    assert done.stdout.strip() == "resumed fine"
    continued = [b for b in bodies if has_results(b)][-1]
    assistant = continued["messages"][1]["content"]
    assert assistant[0] == {"type": "thinking", "thinking": "I will delegate.", "signature": "sig-kept"}
    assert continued["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    [result] = continued["messages"][2]["content"]
    assert result["tool_use_id"] == "toolu_s" and "outcome is unknown" in result["content"][0]["text"]
    assert_store_clean(root)


def test_piped_chat_on_anthropic_streams_and_sends_the_history(tmp_path: Path) -> None:
    root = tmp_path / "root"
    replies = [
        Reply.text("Hel", "lo", usage=(5, 2, 0, 100), when="first line"),
        Reply.tool_uses(Block.tool_use("list_agents", {"scope": "children"}, id="toolu_l"), when="second line"),
        Reply.text("no helpers", usage=(9, 3, 100, 10), when=has_results),
    ]
    with AnthropicServer(replies) as server:
        proc = subprocess.run(
            [*CLI, "chat", "--root", str(root), "--model", f"anthropic:{MODEL}", "--base-url", server.base_url],
            cwd=tmp_path,
            env=clean_env(ANTHROPIC_API_KEY=KEY, COLUMNS="200"),
            input="first line\nsecond line\n/quit\n",
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        assert server.leftovers() == {}
        bodies = server.bodies()
    assert re.search(r"^assistant: Hello$", proc.stdout, re.MULTILINE), proc.stdout
    assert re.search(r"^assistant: no helpers$", proc.stdout, re.MULTILINE), proc.stdout
    second = bodies[1]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"] == [{"type": "text", "text": "Hello"}]
    # The previous call's final message and this one's carry the cache marks (plus the tools).
    assert second["messages"][0]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert second["messages"][2]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "thinking" not in second
    assert not leaks(proc.stdout) and not leaks(proc.stderr)
    assert_store_clean(root)


def test_a_401_is_one_line_with_the_key_redacted(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with AnthropicServer([Reply.error(401, f"invalid x-api-key {KEY}", kind="authentication_error")]) as server:
        done = cli(root, "run", "--model", f"anthropic:{MODEL}", "--base-url", server.base_url, "hello")
    assert done.returncode == 1
    [line] = [ln for ln in done.stderr.splitlines() if "authentication failed" in ln]
    assert "(401)" in line and "[redacted]" in line
    assert not leaks(done.stdout) and not leaks(done.stderr)
    assert_store_clean(root)


def test_the_base_url_from_the_environment_and_a_missing_key(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with AnthropicServer([Reply.text("ok")]) as server:
        done = cli(
            root,
            "run",
            "--model",
            f"anthropic:{MODEL}",
            "hi",
            env=clean_env(ANTHROPIC_API_KEY=KEY, ANTHROPIC_BASE_URL=server.base_url),
        )
        assert done.returncode == 0, done.stderr
        assert server.leftovers() == {}
    missing = cli(root, "run", "--model", f"anthropic:{MODEL}", "hi", env=clean_env())
    assert missing.returncode != 0
    assert "ANTHROPIC_API_KEY is not set" in missing.stderr and "Traceback" not in missing.stderr


class Recorder:
    """The ACP client side: every `session/update` kept, validated by the SDK's schema types."""

    def __init__(self) -> None:
        self.updates: list[Any] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        raw = {"sessionId": session_id, "update": update.model_dump(by_alias=True, exclude_none=True)}
        SessionNotification.model_validate(raw)
        self.updates.append(update)

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no permission is asked for")


def test_acp_prompt_with_a_child_from_tool_use_then_an_overloaded_stream(tmp_path: Path) -> None:
    root = tmp_path / "root"
    arguments = {"description": "Say hi", "prompt": "Reply HI please", "run_in_background": False}
    replies = [
        Reply.tool_uses(Block.tool_use("subagent", arguments, id="toolu_p"), usage=(50, 10, 0, 700), when="delegate"),
        Reply.text("H", "I", when="Reply HI please"),
        Reply.text("The child ", "said HI", usage=(8, 4, 700, 0), when=has_results),
        Reply.text("never", "whole", error_after=3, when="second prompt"),
    ]

    async def main() -> None:
        recorder = Recorder()
        command = (*CLI, "acp", "--root", str(root), "--model", f"anthropic:{MODEL}", "--base-url", server.base_url)
        async with spawn_agent_process(
            recorder,
            command[0],
            *command[1:],
            env=clean_env(ANTHROPIC_API_KEY=KEY),
            transport_kwargs={"stderr": (tmp_path / "stderr").open("wb")},
            use_unstable_protocol=True,
        ) as (conn, _process):
            await asyncio.wait_for(
                conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities()), TIMEOUT
            )
            new = await asyncio.wait_for(conn.new_session(cwd=str(tmp_path), mcp_servers=[]), TIMEOUT)
            sid = new.session_id
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("delegate it")]), TIMEOUT)
            assert response.stop_reason == "end_turn"
            kinds = [type(u) for u in recorder.updates]
            assert kinds[:2] == [ToolCallStart, ToolCallProgress] and set(kinds[2:]) == {AgentMessageChunk}
            start, progress, *chunks = recorder.updates
            assert start.raw_input == arguments and progress.content[0].content.text == "HI"
            assert "".join(c.content.text for c in chunks) == "The child said HI"
            with pytest.raises(RequestError) as caught:
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("second prompt")]), TIMEOUT)
            detail = json.dumps(caught.value.to_error_obj())
            assert "overloaded_error: Overloaded" in detail and not leaks(detail)
            await asyncio.wait_for(conn.close_session(session_id=sid), TIMEOUT)

    with AnthropicServer(replies) as server:
        asyncio.run(main())
        assert server.leftovers() == {}
    assert (tmp_path / "stderr").read_bytes() == b""
    assert_store_clean(root)
