"""The hosts with `openai:` and `deepseek:` models (issue 15: "must also work with `deepseek:` and
`openai:` models"), against a local OpenAI-compatible server (tests/helpers/openai_server.py)
speaking the chat-completions streaming format: `subagents run --stream` with a subagent whose
model calls hit the same server, `deepseek:` through `--base-url`, and the faults a provider
can produce (401, 429/5xx, a connection cut mid-stream, a malformed chunk). `chat` and `acp` are
in test_hosts_openai_chat_acp.py.

The first tests check the fake server itself with the real client in-process: what it sends is
what `OpenAIChatModel` reads. The subprocess tests wait for the process to end; their timeouts are
only hang guards. Retries in fault tests are told `retry-after-ms: 0`, so nothing sleeps.
"""

from __future__ import annotations

import io
import json
import subprocess
import threading
from collections import defaultdict
from contextlib import aclosing
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
import zstandard
from cli_process import CLI, clean_env, kill_when_held
from log_lines import log_file
from openai_server import OpenAIServer, Reply, last_message, request_problem, tool_messages
from subagents.runtime import Chunk, Finish, ModelRequest, OpenAIChatModel, TextDelta, ToolCallDelta, ToolSpec, Usage
from subagents.runtime.foundation.errors import (
    ModelAuthFailed,
    ModelBadStream,
    ModelError,
    ModelStreamInterrupted,
    ModelUnavailable,
)

KEY = "sk-fake-HOSTS-4b9e1d7c2a6f0e83"
GRAMS = {KEY[i : i + 8] for i in range(len(KEY) - 7)}  # any 8-character run of the key is a leak
TIMEOUT = 60  # real seconds: only reached if a subprocess hangs
MODEL = "test-model"


def leaks(data: str | bytes) -> list[str]:
    raw = data.encode() if isinstance(data, str) else data
    return [g for g in GRAMS if g.encode() in raw]


def plain_files(root: Path) -> list[tuple[Path, bytes]]:
    """Every file under `root`, and the plain form of every zstd log too."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            found.append((path, data))
            if path.name.endswith(".zst"):
                with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
                    found.append((path, reader.read()))
    return found


def assert_no_leak(root: Path, *outputs: str) -> None:
    for output in outputs:
        assert not leaks(output), output
    files = plain_files(root)
    assert files  # positive control: the scan reads the store
    for path, data in files:
        assert not leaks(data), path


def run(
    root: Path, server: OpenAIServer, *args: str, model: str = f"openai:{MODEL}", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "run", "--root", str(root), "--model", model, "--base-url", server.base_url, *args],
        cwd=root.parent,
        env=env if env is not None else clean_env(OPENAI_API_KEY=KEY),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def stream_lines(stdout: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`run --stream` output: every line one JSON object, events then the result line."""
    lines = [json.loads(line) for line in stdout.splitlines()]
    *events, result = lines
    assert result["type"] == "result"
    assert all("seq" in e and e["type"] != "result" for e in events)
    return events, result


def by_session(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        grouped[event["session_id"]].append(event)
    return grouped


def tool_names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools", [])]


def is_tool_result(body: dict[str, Any]) -> bool:
    return last_message(body)["role"] == "tool"


# -- the server speaks what the client reads -----------------------------------------------------


async def collect(model: OpenAIChatModel, request: ModelRequest) -> list[Chunk]:
    async with aclosing(model.stream(request)) as chunks:  # type: ignore[type-var]  # the seam types stream() as an AsyncIterator; it is a generator
        return [chunk async for chunk in chunks]


REQUEST = ModelRequest(
    messages=[{"id": "m1", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}],
    tools=[ToolSpec(name="echo", description="Echo.", parameters={"type": "object"})],
)


async def test_the_fake_server_streams_text_a_split_tool_call_and_usage_as_the_client_reads_them() -> None:
    with OpenAIServer(
        [
            Reply.text("Hel", "lo", usage=(5, 2)),
            Reply.tool_call("echo", {"text": "a longer argument"}, call_id="call_x", fragments=4, usage=(7, 3)),
        ]
    ) as server:
        model = OpenAIChatModel(MODEL, base_url=server.base_url, api_key=KEY)
        text = await collect(model, REQUEST)
        call = await collect(model, REQUEST)
    assert text == [TextDelta("Hel"), TextDelta("lo"), Usage(5, 2), Finish("stop")]
    assert isinstance(call[0], ToolCallDelta) and (call[0].id, call[0].name) == ("call_x", "echo")
    pieces = [c for c in call if isinstance(c, ToolCallDelta)]
    assert len(pieces) == 5  # the name first, then the arguments in four fragments
    assert json.loads("".join(p.arguments for p in pieces)) == {"text": "a longer argument"}
    assert call[-2:] == [Usage(7, 3), Finish("tool-calls")]
    first = server.requests[0]
    assert (first.method, first.target) == ("POST", "/v1/chat/completions")
    assert first.headers["authorization"] == f"Bearer {KEY}"
    assert first.json()["stream_options"] == {"include_usage": True}
    assert tool_names(first.json()) == ["echo"]
    assert server.leftovers() == {}


@pytest.mark.parametrize(
    ("replies", "error", "words", "requests"),
    [
        ([Reply.error(401, "Incorrect API key provided")], ModelAuthFailed, "authentication failed (401)", 1),
        ([Reply.error(429, "slow down", retry_after_ms=0)] * 5, ModelUnavailable, "after 5 attempts", 5),
        ([Reply.error(500, "boom", retry_after_ms=0)] * 5, ModelUnavailable, "HTTP 500: boom", 5),
        ([Reply.text("Hel", "lo", "!", cut_after=2)], ModelStreamInterrupted, "stream interrupted after 2 events", 1),
        ([Reply.text("Hel", "lo", malformed_after=1)], ModelBadStream, "event 2 is not JSON", 1),
    ],
    ids=["401", "429", "500", "cut", "malformed"],
)
async def test_the_fake_servers_faults_are_the_clients_model_errors(
    replies: list[Reply], error: type[ModelError], words: str, requests: int
) -> None:
    with OpenAIServer(replies) as server:
        model = OpenAIChatModel(MODEL, base_url=server.base_url, api_key=KEY)
        with pytest.raises(error) as caught:
            await collect(model, REQUEST)
    assert words in str(caught.value)
    assert len(server.requests) == requests and server.leftovers() == {}


async def test_a_stream_held_open_after_done_still_ends_the_reply() -> None:
    """Some servers keep the body open after `[DONE]`: the reply is complete at `[DONE]`."""
    reply = Reply.text("a", "b", usage=(1, 1))
    with OpenAIServer([attrs.evolve(reply, hold_after=len(reply.events(MODEL, True)))]) as server:
        model = OpenAIChatModel(MODEL, base_url=server.base_url, api_key=KEY)
        with trio.fail_after(TIMEOUT):  # a hang guard: the stream never ends by itself
            assert await collect(model, REQUEST) == [TextDelta("a"), TextDelta("b"), Usage(1, 1), Finish("stop")]
        # The server held the body open (it sets `holding` just after sending `[DONE]`).
        assert await trio.to_thread.run_sync(server.holding.wait, TIMEOUT)


async def test_a_retried_429_then_an_answer_succeeds() -> None:
    with OpenAIServer([Reply.error(429, "slow down", retry_after_ms=0), Reply.text("ok", usage=(1, 1))]) as server:
        model = OpenAIChatModel(MODEL, base_url=server.base_url, api_key=KEY)
        assert await collect(model, REQUEST) == [TextDelta("ok"), Usage(1, 1), Finish("stop")]
    assert len(server.requests) == 2 and server.leftovers() == {}


HELLO = [{"role": "user", "content": "hello"}]


def test_the_usage_chunk_comes_only_when_asked_for_and_other_paths_are_404() -> None:
    """The server's own protocol, raw: without `stream_options.include_usage` no chunk carries
    `usage`; with it every chunk has `usage: null` but the last, whose `choices` are empty."""
    with OpenAIServer([Reply.text("a", usage=(1, 2)), Reply.text("b", usage=(1, 2))]) as server:
        url = f"{server.base_url}/chat/completions"
        plain = httpx.post(url, json={"model": "m", "messages": HELLO, "stream": True})
        asked = httpx.post(
            url, json={"model": "m", "messages": HELLO, "stream": True, "stream_options": {"include_usage": True}}
        )
        missing = httpx.post(f"{server.base_url}/completions", json={})
    for response in (plain, asked):
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["transfer-encoding"] == "chunked"
    data = [[line[6:] for line in r.text.splitlines() if line.startswith("data: ")] for r in (plain, asked)]
    assert data[0][-1] == data[1][-1] == "[DONE]"
    plain_chunks = [json.loads(d) for d in data[0][:-1]]
    asked_chunks = [json.loads(d) for d in data[1][:-1]]
    assert all("usage" not in c for c in plain_chunks)
    assert [c["usage"] for c in asked_chunks] == [
        None,
        None,
        {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    ]
    assert asked_chunks[-1]["choices"] == []
    assert plain_chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "a"}
    assert plain_chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert missing.status_code == 404 and len(server.requests) == 2 and server.leftovers() == {}


CALL = {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}
USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ([USER], None),
        (
            [
                USER,
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
                USER,
            ],
            None,
        ),
        ([], "non-empty"),
        ([{"role": "robot", "content": "x"}], "role"),
        ([{"role": "user", "content": None}], "content"),
        ([{"role": "assistant", "content": None}], "got null"),
        ([USER, {"role": "tool", "tool_call_id": "c1", "content": "ok"}], "preceeding message with 'tool_calls'"),
        (
            [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}, USER],
            "did not have response messages: c1",
        ),
        ([USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}], "did not have response messages: c1"),
        (
            [USER, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "t"}}]}],
            "tool_calls[0]",
        ),
    ],
)
def test_the_fake_server_refuses_what_openai_refuses(messages: list[dict[str, Any]], problem: str | None) -> None:
    found = request_problem({"model": "m", "messages": messages})
    assert found is None if problem is None else problem in str(found), found


def test_a_refused_request_is_a_400_with_openais_error_body() -> None:
    with OpenAIServer([Reply.text("never")]) as server:
        answer = httpx.post(
            f"{server.base_url}/chat/completions",
            json={"model": "m", "messages": [USER, {"role": "tool", "tool_call_id": "x", "content": ""}]},
        )
        assert answer.status_code == 400
        assert "preceeding message" in answer.json()["error"]["message"]
        assert list(server.leftovers()) == ["pending", "refused"]


# -- `run --stream` with a subagent ---------------------------------------------------------------

CHILD_PROMPT = "Reply HI, in capitals"


@pytest.mark.slow  # a real `subagents run` process
def test_run_stream_with_a_one_shot_child_on_the_same_server(tmp_path: Path) -> None:
    root = tmp_path / "root"
    arguments = {"description": "Say hi", "prompt": CHILD_PROMPT, "run_in_background": False}
    replies = [
        Reply.tool_call("subagent", arguments, call_id="call_parent", usage=(100, 20), when="Delegate a greeting"),
        Reply.text("H", "I", usage=(30, 2), when=CHILD_PROMPT),
        Reply.text("the child ", "said ", "HI", usage=(150, 5), when=is_tool_result),
    ]
    with OpenAIServer(replies) as server:
        done = run(root, server, "--stream", "Delegate a greeting.")
    assert done.returncode == 0, done.stderr
    events, result = stream_lines(done.stdout)
    parent = result["session_id"]
    assert done.stderr == f"session {parent}\n"
    assert result["output"] == "the child said HI"
    # The tree's usage is what the server reported, summed over its three replies.
    assert result["usage"] == {"input_tokens": 280, "output_tokens": 27, "calls": 3, "reported": 3}
    sessions = by_session(events)
    [child] = [sid for sid in sessions if sid != parent]
    for lines in sessions.values():
        assert [e["seq"] for e in lines] == list(range(lines[0]["seq"], lines[0]["seq"] + len(lines)))
    assert sessions[parent][0]["seq"] == 0 and sessions[child][0]["seq"] == 0
    catalog = next(i for i, e in enumerate(events) if e["type"] == "subagent/catalog")
    assert events[catalog]["data"]["child_id"] == child
    assert events.index(sessions[child][0]) > catalog  # the child's first line after the catalog
    [call] = [e for e in sessions[parent] if e["type"] == "tool/call"]
    assert (call["data"]["call_id"], json.loads(call["data"]["arguments"])) == ("call_parent", arguments)
    [answer] = [e for e in sessions[child] if e["type"] == "assistant/message"]
    assert answer["data"]["message"]["content"] == [{"type": "text", "text": "HI"}]
    assert answer["data"]["usage"] == {"input_tokens": 30, "output_tokens": 2}
    assert [e["data"]["reason"] for e in events if e["type"] == "turn/end"] == [{"kind": "completed"}] * 2

    # What the runtime sent: the subagent tool's schema to the parent (not to the child, which is
    # at the depth limit), the child's prompt as its first message, the tool result going back.
    assert server.leftovers() == {}
    first, to_child, back = server.bodies()
    assert all(b["model"] == MODEL and b["stream"] is True for b in (first, to_child, back))
    assert all(b["stream_options"] == {"include_usage": True} for b in (first, to_child, back))
    assert first["messages"] == [{"role": "user", "content": "Delegate a greeting."}]
    [subagent] = [t["function"] for t in first["tools"] if t["function"]["name"] == "subagent"]
    assert subagent["parameters"]["required"] == ["description", "prompt"]
    assert set(subagent["parameters"]["properties"]) == {
        "description",
        "prompt",
        "run_in_background",
        "max_turns",
        "max_tokens",
        "deadline_seconds",
    }
    workspace = {"read_file", "write_file", "edit_file", "list_dir", "glob", "grep", "run_command"}
    delegation = {"subagent", "subagent_fork", "list_agents", "send_message", "interrupt_agent"}
    assert set(tool_names(first)) == delegation | workspace  # run's workspace tools (README "Workspace tools")
    assert to_child["messages"] == [{"role": "user", "content": CHILD_PROMPT}]
    assert "subagent" not in tool_names(to_child) and "list_agents" in tool_names(to_child)
    assert back["messages"][:2] == [
        first["messages"][0],
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_parent",
                    "type": "function",
                    "function": {"name": "subagent", "arguments": json.dumps(arguments)},
                }
            ],
        },
    ]
    assert tool_messages(back) == [{"role": "tool", "tool_call_id": "call_parent", "content": "HI"}]
    assert [seen.headers["authorization"] for seen in server.requests] == [f"Bearer {KEY}"] * 3
    assert_no_leak(root, done.stdout, done.stderr)


@pytest.mark.slow  # a real `subagents run` process
def test_run_waits_for_a_background_child_whose_requests_overlap_the_parents(tmp_path: Path) -> None:
    """A background child and its parent call the server at the same time; the child's settlement
    notice starts the parent's next turn, and `run` ends with that turn's answer."""
    root = tmp_path / "root"
    arguments = {"description": "Count", "prompt": "Count to three", "run_in_background": True}
    answered = threading.Event()  # the child answers once the parent's next step has asked
    replies = [
        Reply.tool_call("subagent", arguments, usage=(10, 5), when="Start a counter"),
        Reply.text("1, 2, ", "3", usage=(8, 4), when="Count to three", gate=answered),
        Reply.text("started ", "it", usage=(12, 2), when=is_tool_result, taken=answered),
        Reply.text("the counter ", "finished", usage=(20, 3), when="Background subagent"),
    ]
    with OpenAIServer(replies) as server:
        done = run(root, server, "--stream", "Start a counter.")
    assert done.returncode == 0, done.stderr
    events, result = stream_lines(done.stdout)
    assert result["output"] == "the counter finished"
    assert result["usage"] == {"input_tokens": 50, "output_tokens": 14, "calls": 4, "reported": 4}
    assert server.leftovers() == {}
    [notice] = [b for b in server.bodies() if "Background subagent" in str(last_message(b)["content"])]
    assert "1, 2, 3" in last_message(notice)["content"]  # the child's closing message reached the parent
    parent = result["session_id"]
    # The notice starts a second turn, or is steered into the first if the child was quicker.
    ends = [e for e in events if e["type"] == "turn/end" and e["session_id"] == parent]
    assert [e["data"]["reason"]["kind"] for e in ends] in (["completed"], ["completed", "completed"])
    assert [e["type"] for e in events if e["session_id"] == parent][-1] == "turn/end"
    # The model travels with each session (issue 27): recorded once, before its first turn, with
    # its base URL and never its key — the parent's second turn records nothing again.
    grouped = by_session(events)
    assert set(grouped) == {parent, *(e["data"]["child_id"] for e in events if e["type"] == "subagent/catalog")}
    for session_events in grouped.values():
        types = [e["type"] for e in session_events]
        assert types.count("session/model") == 1 and types.index("session/model") < types.index("turn/start"), types
        [record] = [e for e in session_events if e["type"] == "session/model"]
        assert record["data"] == {"model": f"openai:{MODEL}", "base_url": server.base_url}
        assert record["ignorable"] is True
    assert_no_leak(root, done.stdout, done.stderr)


@pytest.mark.slow  # a real `subagents run` process
def test_parallel_tool_calls_start_two_children_at_once_with_the_base_url_from_the_environment(tmp_path: Path) -> None:
    """Two `subagent` calls in one reply (streamed one after the other, by index) run two
    one-shot children whose requests overlap; OPENAI_BASE_URL stands in for `--base-url`."""
    root = tmp_path / "root"
    one = {"description": "One", "prompt": "child one", "run_in_background": False}
    two = {"description": "Two", "prompt": "child two", "run_in_background": False}
    replies = [
        Reply.tool_calls(("subagent", one, "call_a"), ("subagent", two, "call_b"), usage=(10, 10), when="go"),
        Reply.text("ON", "E", usage=(1, 1), when="child one"),
        Reply.text("TW", "O", usage=(2, 1), when="child two"),
        Reply.text("both ", "done", usage=(5, 5), when=is_tool_result),
    ]
    with OpenAIServer(replies) as server:
        done = subprocess.run(
            [*CLI, "run", "--root", str(root), "--model", f"openai:{MODEL}", "--stream", "go"],
            cwd=tmp_path,
            env=clean_env(OPENAI_API_KEY=KEY, OPENAI_BASE_URL=server.base_url),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    assert done.returncode == 0, done.stderr
    events, result = stream_lines(done.stdout)
    assert result["output"] == "both done"
    assert result["usage"] == {"input_tokens": 18, "output_tokens": 17, "calls": 4, "reported": 4}
    assert len(by_session(events)) == 3
    assert server.leftovers() == {}
    [back] = [b for b in server.bodies() if is_tool_result(b)]
    assert [c["id"] for c in back["messages"][1]["tool_calls"]] == ["call_a", "call_b"]
    assert [json.loads(c["function"]["arguments"]) for c in back["messages"][1]["tool_calls"]] == [one, two]
    assert tool_messages(back) == [
        {"role": "tool", "tool_call_id": "call_a", "content": "ONE"},
        {"role": "tool", "tool_call_id": "call_b", "content": "TWO"},
    ]
    assert_no_leak(root, done.stdout, done.stderr)


@pytest.mark.slow  # two `subagents run` processes, one killed
@pytest.mark.parametrize("policy", ["close", "continue"])
def test_a_run_killed_while_a_childs_model_streams_resumes_with_a_request_openai_accepts(
    tmp_path: Path, policy: str
) -> None:
    """SIGKILL while the parent waits on a one-shot child mid-stream; `run --session` then closes
    the interrupted turn (`close`: a synthetic tool result answers the open call) or continues it
    (the default: the call is in doubt, naming the one-shot child, and the turn goes on), and
    every resumed request passes the server's OpenAI checks (every tool call answered before the
    next user message)."""
    root = tmp_path / "root"
    (tmp_path / "subagents.toml").write_text(f'on_interrupted_turn = "{policy}"\n')
    arguments = {"description": "Slow", "prompt": "take your time", "run_in_background": False}
    replies = [
        Reply.tool_call("subagent", arguments, usage=(10, 5), when="delegate"),
        Reply.text("still ", "thinking", "...", hold_after=2, when="take your time"),
        Reply.text("resumed ", "fine", usage=(3, 2), when="again"),
    ]
    if policy == "continue":
        replies.insert(2, Reply.text("in ", "doubt", usage=(4, 1), when=is_tool_result))
    command = [*CLI, "run", "--root", str(root), "--session", "s1", "--model", f"openai:{MODEL}"]
    with OpenAIServer(replies) as server:
        kill_when_held(
            [*command, "--base-url", server.base_url, "delegate it"],
            server.holding,
            cwd=tmp_path,
            env=clean_env(OPENAI_API_KEY=KEY),
            timeout=TIMEOUT,
        )
        done = run(root, server, "--session", "s1", "--stream", "again")
    assert done.returncode == 0, done.stderr
    events, result = stream_lines(done.stdout)
    assert result["output"] == "resumed fine"
    ends = [e["data"]["reason"]["kind"] for e in events if e["type"] == "turn/end"]
    assert ends == (["interrupted", "completed"] if policy == "close" else ["completed", "completed"])
    assert server.leftovers() == {}
    last = server.bodies()[-1]["messages"]
    if policy == "close":
        assert [m["role"] for m in last] == ["user", "assistant", "tool", "user"]
    else:
        assert [m["role"] for m in last] == ["user", "assistant", "tool", "assistant", "user"]
        assert "one-shot subagent" in last[2]["content"] and "outcome is unknown" in last[2]["content"]
    assert last[2]["tool_call_id"] == last[1]["tool_calls"][0]["id"] and "interrupted" in last[2]["content"]
    assert_no_leak(root, done.stdout, done.stderr)


def answers(call_id: str) -> Any:
    """A `when` for the request that carries the result of tool call `call_id` last."""
    return lambda body: is_tool_result(body) and last_message(body)["tool_call_id"] == call_id


@pytest.mark.slow  # two `subagents run` processes
def test_a_fork_in_a_second_turn_sends_the_inherited_history_then_its_prompt(tmp_path: Path) -> None:
    root = tmp_path / "root"
    fork = {"description": "Fork", "prompt": "fork task", "run_in_background": True}
    answered = threading.Event()  # the fork answers once its parent's next step has asked
    replies = [
        Reply.tool_call("list_agents", {}, call_id="c_list", when="first"),
        Reply.text("nothing ", "yet", usage=(1, 1), when=answers("c_list")),
        Reply.tool_call("subagent_fork", fork, call_id="c_fork", when="second"),
        Reply.text("fork ", "did it", usage=(2, 2), when="fork task", gate=answered),
        Reply.text("forked", usage=(3, 3), when=answers("c_fork"), taken=answered),
        Reply.text("noted", usage=(4, 4), when="Background subagent"),
    ]
    with OpenAIServer(replies) as server:
        first = run(root, server, "--session", "s1", "first")
        second = run(root, server, "--session", "s1", "--stream", "second")
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert first.stdout == "nothing yet\n"
    events, result = stream_lines(second.stdout)
    assert result["output"] == "noted"
    # The fork's inherited events are its parent's: its own usage is its one reply.
    assert result["usage"] == {"input_tokens": 9, "output_tokens": 9, "calls": 4, "reported": 3}
    assert server.leftovers() == {}
    [to_fork] = [b for b in server.bodies() if "fork task" in str(last_message(b)["content"])]
    turn_one = [
        {"role": "user", "content": "first"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c_list", "type": "function", "function": {"name": "list_agents", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c_list", "content": "(no subagents)"},
        {"role": "assistant", "content": "nothing yet"},
    ]
    assert to_fork["messages"][:4] == turn_one  # the parent's history up to its last turn end
    assert [m["role"] for m in to_fork["messages"][4:]] == ["user"]  # then only the fork's prompt
    assert_no_leak(root, first.stdout, first.stderr, second.stdout, second.stderr)


@pytest.mark.slow  # a real `subagents run` process
def test_a_background_child_refused_with_401_settles_failed_and_the_parent_is_told(tmp_path: Path) -> None:
    root = tmp_path / "root"
    answered = threading.Event()  # the child is refused once the parent's next step has asked
    replies = [
        Reply.tool_call("subagent", {"description": "Bad", "prompt": "bad child"}, when="go"),
        Reply.error(401, f"Incorrect API key provided: {KEY}", when="bad child", gate=answered),
        Reply.text("started", usage=(3, 3), when=is_tool_result, taken=answered),
        Reply.text("the child failed", usage=(4, 4), when="Background subagent"),
    ]
    with OpenAIServer(replies) as server:
        done = run(root, server, "--stream", "go")
    assert done.returncode == 0, done.stderr  # the parent's own turns completed
    events, result = stream_lines(done.stdout)
    assert result["output"] == "the child failed"
    parent = result["session_id"]
    [child] = [sid for sid in by_session(events) if sid != parent]
    [child_end] = [e for e in events if e["session_id"] == child and e["type"] == "turn/end"]
    assert child_end["data"]["reason"]["kind"] == "error"
    assert "authentication failed (401)" in child_end["data"]["reason"]["message"]
    [settled] = [e for e in events if e["type"] == "subagent/settled"]
    assert settled["session_id"] == parent
    assert server.leftovers() == {}
    [notice] = [b for b in server.bodies() if "Background subagent" in str(last_message(b)["content"])]
    assert f"Background subagent {child} failed before it finished." in last_message(notice)["content"]
    assert_no_leak(root, done.stdout, done.stderr)


# -- deepseek: ------------------------------------------------------------------------------------


@pytest.mark.slow  # a real `subagents run` process
def test_deepseek_through_its_base_url_override(tmp_path: Path) -> None:
    """`deepseek:` takes `--base-url` (its default has no `/v1`; DEEPSEEK_BASE_URL is not read);
    DeepSeek's `reasoning_content` deltas are not part of the answer, its usage comes on the finish
    chunk, and its key comes from DEEPSEEK_API_KEY."""
    root = tmp_path / "root"
    reply = Reply(
        deltas=(
            {"content": None, "reasoning_content": "The user greets; "},
            {"content": None, "reasoning_content": "answer."},
            {"content": "Hel", "reasoning_content": None},
            {"content": "lo", "reasoning_content": None},
        ),
        usage=(11, 7),
        usage_with_finish=True,
    )
    with OpenAIServer([reply]) as server:
        base = server.base_url.removesuffix("/v1")
        done = subprocess.run(
            [
                *CLI,
                "run",
                "--root",
                str(root),
                "--model",
                "deepseek:deepseek-chat",
                "--base-url",
                base,
                "--stream",
                "hi",
            ],
            cwd=tmp_path,
            env=clean_env(DEEPSEEK_API_KEY=KEY, OPENAI_API_KEY="sk-not-this-one"),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    assert done.returncode == 0, done.stderr
    _events, result = stream_lines(done.stdout)
    assert result["output"] == "Hello"
    assert result["usage"] == {"input_tokens": 11, "output_tokens": 7, "calls": 1, "reported": 1}
    assert server.leftovers() == {}
    [seen] = server.requests
    assert seen.target == "/chat/completions"
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.json()["model"] == "deepseek-chat"
    assert_no_leak(root, done.stdout, done.stderr)


# -- faults ------------------------------------------------------------------------------------------


def error_run(
    tmp_path: Path, replies: list[Reply], *words: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """A `run --stream` that must fail: exit 1, `session <id>` then one line on stderr holding
    `words`, no traceback, a result line, the key nowhere; the log's last turn ended with the
    error. Returns the process and the log's `turn/end` entry."""
    root = tmp_path / "root"
    with OpenAIServer(replies) as server:
        done = run(root, server, "--compression", "none", "--stream", "hi")
    assert done.returncode == 1, done.stderr
    session, line = done.stderr.splitlines()
    assert session.startswith("session ")
    assert line.startswith("subagents: ") and all(w in line for w in words), line
    assert "Traceback" not in done.stdout + done.stderr
    _events, result = stream_lines(done.stdout)
    records = [json.loads(line) for line in log_file(root, result["session_id"]).read_text().splitlines()[1:]]
    end = records[-1]
    assert end["type"] == "turn/end" and end["data"]["reason"]["kind"] == "error", end
    assert all(w in end["data"]["reason"]["message"] for w in words)
    # What streamed before the fault is kept as a reply that finished in error (and is the output).
    partial = [r["data"] for r in records if r["type"] == "assistant/message"]
    assert all(p["finish"] == "error" for p in partial)
    assert result["output"] == "".join(b["text"] for p in partial for b in p["message"]["content"])
    assert server.leftovers() == {}
    assert_no_leak(root, done.stdout, done.stderr)
    return done, end


@pytest.mark.slow  # a real `subagents run` process
def test_a_401_is_one_line_exit_1_and_the_turns_error_in_the_log(tmp_path: Path) -> None:
    # The provider echoes the key, as OpenAI does for a wrong one: it is redacted everywhere.
    _done, end = error_run(
        tmp_path, [Reply.error(401, f"Incorrect API key provided: {KEY}.")], "authentication failed (401)", "[redacted]"
    )
    assert MODEL in end["data"]["reason"]["message"]


@pytest.mark.slow  # a real `subagents run` process
def test_a_connection_cut_mid_stream_is_one_line_exit_1_and_the_turns_error_in_the_log(tmp_path: Path) -> None:
    done, _end = error_run(
        tmp_path, [Reply.text("Hel", "lo ", "wor", "ld", cut_after=3)], "stream interrupted after 3 events"
    )
    assert stream_lines(done.stdout)[1]["output"] == "Hello wor"


@pytest.mark.slow  # a real `subagents run` process
def test_a_malformed_chunk_is_one_line_exit_1(tmp_path: Path) -> None:
    error_run(tmp_path, [Reply.text("Hel", "lo", malformed_after=2)], "event 3 is not JSON")


@pytest.mark.slow  # a real `subagents run` process
def test_5xx_until_the_retries_run_out_is_one_line_exit_1(tmp_path: Path) -> None:
    error_run(
        tmp_path, [Reply.error(503, "overloaded", retry_after_ms=0)] * 5, "unavailable after 5 attempts", "overloaded"
    )


@pytest.mark.slow  # a real `subagents run` process
def test_a_child_whose_stream_is_cut_fails_its_tool_call_and_the_parent_goes_on(tmp_path: Path) -> None:
    root = tmp_path / "root"
    arguments = {"description": "Flaky", "prompt": "Be flaky", "run_in_background": False}
    replies = [
        Reply.tool_call("subagent", arguments, usage=(10, 5), when="Try a child"),
        Reply.text("half an ans", "wer", cut_after=2, when="Be flaky"),
        Reply.text("the child failed", usage=(20, 3), when=is_tool_result),
    ]
    with OpenAIServer(replies) as server:
        done = run(root, server, "--stream", "Try a child.")
    assert done.returncode == 0, done.stderr
    events, result = stream_lines(done.stdout)
    assert result["output"] == "the child failed"
    [body] = [b for b in server.bodies() if is_tool_result(b)]
    [message] = tool_messages(body)
    assert message["content"].startswith("Error: ") and "stream interrupted" in message["content"]
    [failed] = [e for e in events if e["type"] == "tool/result"]
    assert failed["data"]["message"]["content"][0]["is_error"] is True
    assert server.leftovers() == {}
    assert_no_leak(root, done.stdout, done.stderr)
