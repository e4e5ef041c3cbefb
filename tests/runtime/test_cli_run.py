"""`subagents run` end to end (SPEC 5.7), always in a subprocess.

Scripted runs use `--model scripted:PATH`; the OpenAI run talks to a small HTTP/1.1 server on
127.0.0.1 served by this test's own Trio loop, so that subprocess is started with
`trio.run_process` (the server keeps serving while we wait for it). Bad input must be one clear
line on stderr, exit status 2, and must leave an existing root byte-for-byte unchanged (the index
is a cache the spec lets any command refresh, so it is left out of the hash) and a missing root
missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from cli_process import CLI, clean_env, write_script
from http_request import Seen, read_request
from log_lines import plain_bytes, session_folder
from subagents.storage import FileLogStore

SENTINEL_KEY = "sk-CLI-SENTINEL-5e1d7a2b9c4f3086"
TIMEOUT = 60  # real seconds: only reached if a subprocess hangs


# -- helpers -----------------------------------------------------------------------------------


def run_cli(args: Sequence[str], *, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        cwd=cwd,
        env=env if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def text_script(*texts: str) -> dict[str, Any]:
    return {"agents": [{"responses": [{"text": t} for t in texts]}]}


def log_records(root: Path, session_id: str) -> list[dict[str, Any]]:
    """The header record and the events of a session, read straight from its file."""
    folder = session_folder(root, session_id)
    [log] = [p for p in folder.iterdir() if p.name.startswith("session.jsonl")]
    return [json.loads(line) for line in plain_bytes(log).decode().splitlines()]


def events(root: Path, session_id: str, kind: str) -> list[dict[str, Any]]:
    return [r for r in log_records(root, session_id)[1:] if r["type"] == kind]


def session_ids(root: Path) -> list[str]:
    return sorted(
        json.loads(plain_bytes(log).split(b"\n", 1)[0])["id"] for log in (root / "sessions").glob("*/session.jsonl*")
    )


def tree_state(root: Path) -> dict[str, Any]:
    """Every directory and file under `root` (content hash, size, mtime), the index excepted."""
    state: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        state[rel + "/"] = sorted(dirnames)
        for name in filenames:
            if rel == "." and name.startswith("index.sqlite3"):
                continue
            path = Path(dirpath, name)
            st = path.stat()
            state[os.path.join(rel, name)] = (hashlib.sha256(path.read_bytes()).hexdigest(), st.st_size, st.st_mtime_ns)
    return state


def one_error_line(done: subprocess.CompletedProcess[str] | trio.CompletedProcess, *words: str) -> str:
    stderr = done.stderr if isinstance(done.stderr, str) else done.stderr.decode()
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    [line] = lines
    assert line.startswith("subagents: "), line
    assert "Traceback" not in stderr
    for word in words:
        assert word in line, line
    return line


# -- scripted runs -----------------------------------------------------------------------------


@pytest.mark.slow  # a real `subagents run` process
def test_scripted_run_prints_the_answer_and_writes_zstd_by_default(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", text_script("Hello from the script"))
    root = tmp_path / "root"
    done = run_cli(["run", "--root", str(root), "--model", model, "say hi"], cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "Hello from the script\n")
    [sid] = session_ids(root)
    assert done.stderr == f"session {sid}\n"  # the id it created, so a person can resume it
    folder = session_folder(root, sid)
    assert (folder / "session.jsonl.zst").is_file() and not (folder / "session.jsonl").exists()
    records = log_records(root, sid)
    assert records[0]["type"] == "session" and records[0]["id"] == sid
    [end] = events(root, sid, "turn/end")
    assert end["data"]["reason"]["kind"] == "completed"
    [prompt] = events(root, sid, "user/message")
    assert prompt["data"]["message"]["content"] == [{"type": "text", "text": "say hi"}]


@pytest.mark.slow  # a real `subagents run` process
def test_json_output_and_compression_none(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", text_script("Ünïcode ✓ answer"))
    root = tmp_path / "root"
    done = run_cli(["run", "--root", str(root), "--model", model, "--compression", "none", "--json", "q"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert done.stderr == f"session {out['session_id']}\n"
    assert set(out) == {"session_id", "output"}
    assert out["output"] == "Ünïcode ✓ answer"
    assert session_ids(root) == [out["session_id"]]
    folder = session_folder(root, out["session_id"])
    assert (folder / "session.jsonl").is_file() and not (folder / "session.jsonl.zst").exists()
    header = json.loads((folder / "session.jsonl").read_text().splitlines()[0])
    assert (header["type"], header["id"], header["format"]) == ("session", out["session_id"], 1)


@pytest.mark.slow
def test_session_is_created_when_missing_then_resumed(tmp_path: Path) -> None:
    # The reply names what the first prompt said: on the second run it can only come from the
    # history of turn 1 (a new process starts the script entry afresh).
    script = {"agents": [{"session": "my-session", "responses": [{"text": "got {{from_request:first=(\\w+)}}"}]}]}
    model = write_script(tmp_path / "s.json", script)
    root = tmp_path / "root"
    base = ["run", "--root", str(root), "--model", model, "--session", "my-session", "--json"]
    first = run_cli([*base, "first=alpha"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"session_id": "my-session", "output": "got alpha"}
    second = run_cli([*base, "now something else"], cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert first.stderr == second.stderr == "session my-session\n"  # created, then resumed
    assert json.loads(second.stdout) == {"session_id": "my-session", "output": "got alpha"}
    assert session_ids(root) == ["my-session"]
    assert [e["data"]["turn"] for e in events(root, "my-session", "turn/start")] == [1, 2]
    assert [e["data"]["reason"]["kind"] for e in events(root, "my-session", "turn/end")] == ["completed"] * 2
    prompts = [e["data"]["message"]["content"][0]["text"] for e in events(root, "my-session", "user/message")]
    assert prompts == ["first=alpha", "now something else"]


@pytest.mark.slow  # a real `subagents run` process
@pytest.mark.parametrize("shape", [[], ["--json"], ["--stream"]], ids=["text", "json", "stream"])
def test_a_reader_gone_before_the_output_is_no_error_of_the_run(shape: list[str], tmp_path: Path) -> None:
    # `subagents run ... | head -0`: stdout's reader is gone before anything is written. The run
    # does its work, its output goes nowhere, its exit status is its own, and no traceback.
    model = write_script(tmp_path / "s.json", text_script("ANSWER " * 1000))
    root = tmp_path / "root"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [*CLI, "run", "--root", str(root), "--model", model, "--session", "s1", *shape, "go"],
            cwd=tmp_path,
            env=clean_env(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=TIMEOUT,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "session s1\n"
    assert [e["data"]["reason"] for e in events(root, "s1", "turn/end")] == [{"kind": "completed"}]


@pytest.mark.slow  # a real `subagents run` process
def test_a_turn_that_did_not_complete_exits_1_with_the_reason(tmp_path: Path) -> None:
    script = {"agents": [{"responses": [{"error": {"status": 500, "message": "scripted upstream boom"}}]}]}
    model = write_script(tmp_path / "s.json", script)
    root = tmp_path / "root"
    done = run_cli(["run", "--root", str(root), "--model", model, "--json", "q"], cwd=tmp_path)
    assert done.returncode == 1
    [sid] = session_ids(root)
    first, rest = done.stderr.split("\n", 1)
    assert first == f"session {sid}"  # printed before the turn ran
    line = one_error_line(subprocess.CompletedProcess(done.args, 1, done.stdout, rest), "scripted upstream boom")
    assert "error" in line.removeprefix("subagents: ")
    assert json.loads(done.stdout)["session_id"] == sid
    [end] = events(root, sid, "turn/end")
    assert end["data"]["reason"]["kind"] == "error"


def _child_script(step_2: dict[str, Any]) -> dict[str, Any]:
    return {
        "agents": [
            {
                "responses": [
                    {
                        "tool_calls": [
                            {"name": "subagent", "arguments": {"description": "helper", "prompt": "do the thing"}}
                        ]
                    },
                    step_2,
                    {"text": "NOTED"},
                ]
            },
            {"label": "helper", "responses": [{"text": "CHILD_OK"}]},
        ]
    }


def _parent_and_child(root: Path, out: dict[str, Any]) -> tuple[str, str]:
    parent = out["session_id"]
    [child] = [sid for sid in session_ids(root) if sid != parent]
    child_header = log_records(root, child)[0]
    assert (child_header["parent_session"], child_header["origin"]) == (parent, "subagent")
    [settled] = events(root, parent, "subagent/settled")
    run_key = f"{child}@{events(root, child, 'turn/end')[-1]['seq']}"  # its run, by its last turn/end
    assert settled["data"] == {
        "child_id": child,
        "reason_kind": "completed",
        "closing_text": "CHILD_OK",
        "run_key": run_key,
    }
    return parent, child


def _surface(root: Path, session_id: str) -> list[tuple[str, str]]:
    """The parent's messages after the prompt: ("notice", seq of the settled record) or
    ("assistant", its text), in log order."""
    shape = []
    for record in log_records(root, session_id)[1:]:
        if record["type"] == "user/message" and record["data"]["message"]["source"]["kind"] == "subagent-settled":
            shape.append(("notice", str(record["source_event_seqs"])))
        elif record["type"] == "assistant/message":
            texts = [b["text"] for b in record["data"]["message"]["content"] if b["type"] == "text"]
            shape.append(("assistant", "\n".join(texts)))
    return shape


@pytest.mark.slow
def test_run_waits_for_a_background_child_and_its_notice(tmp_path: Path) -> None:
    # The parent's second response waits until the child's settlement is durable (SPEC 5.6:
    # agents are ordered with wait_for) and calls a tool, so the notice is always answered by
    # the third response, "NOTED", whichever step it was steered into.
    step_2 = {
        "wait_for": {"settled": "helper"},
        "text": "STARTED",
        "tool_calls": [{"name": "list_agents", "arguments": {}}],
    }
    model = write_script(tmp_path / "s.json", _child_script(step_2))
    root = tmp_path / "root"
    done = run_cli(["run", "--root", str(root), "--model", model, "--json", "go"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert done.stderr == f"session {out['session_id']}\n"
    assert out["output"] == "NOTED"
    parent, _child = _parent_and_child(root, out)
    [settled] = events(root, parent, "subagent/settled")
    shape = _surface(root, parent)
    assert ("notice", str([settled["seq"]])) in shape
    assert shape[-1] == ("assistant", "NOTED")
    assert [e["data"]["reason"]["kind"] for e in events(root, parent, "turn/end")] == ["completed"]


@pytest.mark.slow
def test_run_prints_the_last_answer_whenever_the_notice_lands(tmp_path: Path) -> None:
    # The script, unordered: the child may settle before the parent's second step claims
    # its input (the notice is steered into it and "STARTED" is the last answer), or after (the
    # notice is steered into a third step or starts a notice turn, answered "NOTED"). Either
    # way `run` waits for the child and the notice and prints the parent's final text.
    model = write_script(tmp_path / "s.json", _child_script({"text": "STARTED"}))
    root = tmp_path / "root"
    done = run_cli(["run", "--root", str(root), "--model", model, "--json", "go"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert done.stderr == f"session {out['session_id']}\n"
    parent, _child = _parent_and_child(root, out)
    shape = _surface(root, parent)
    notice_at = [i for i, (kind, _) in enumerate(shape) if kind == "notice"]
    assert len(notice_at) == 1
    assert shape[-1] == ("assistant", out["output"])
    assert notice_at[0] < len(shape) - 1  # the notice was answered
    assert out["output"] == ("NOTED" if ("assistant", "STARTED") in shape[: notice_at[0]] else "STARTED")
    assert all(e["data"]["reason"]["kind"] == "completed" for e in events(root, parent, "turn/end"))


# -- bad input: exit 2, one line, the root untouched -----------------------------------------


@pytest.fixture(scope="module")
def existing_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("existing")
    model = write_script(base / "ok.json", text_script("ok"))
    root = base / "root"
    done = run_cli(["run", "--root", str(root), "--model", model, "--session", "kept", "seed"], cwd=base)
    assert done.returncode == 0, done.stderr
    return root


BAD_INPUT = {
    # name: (script to write or None, args after the root, extra env, words of the error line)
    "malformed-script": (
        {"agents": [{"responses": [{"txt": "typo"}]}]},
        ["--model", "scripted:{script}"],
        {},
        ["bad script", "$.agents[0].responses[0].txt"],
    ),
    "script-not-json": ("{not json", ["--model", "scripted:{script}"], {}, ["bad script", "not JSON"]),
    "missing-script": (
        None,
        ["--model", "scripted:{dir}/no-such-script.json"],
        {},
        ["bad script", "no-such-script.json"],
    ),
    "unknown-scheme": (None, ["--model", "mistral:large"], {}, ["unknown model scheme", "mistral"]),
    "no-scheme": (None, ["--model", "gpt-4o"], {}, ["gpt-4o"]),
    "missing-openai-key": (
        None,
        ["--model", "openai:m", "--base-url", "http://127.0.0.1:9/v1"],
        {},
        ["OPENAI_API_KEY"],
    ),
    "missing-deepseek-key": (None, [], {"OPENAI_API_KEY": SENTINEL_KEY}, ["DEEPSEEK_API_KEY"]),
    "session-id-81-bytes": (
        text_script("never"),
        ["--model", "scripted:{script}", "--session", "s" * 81],
        {},
        ["81", "80"],
    ),
    "session-id-control-char": (
        text_script("never"),
        ["--model", "scripted:{script}", "--session", "bad\x07id"],
        {},
        ["session id"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_exit_2_and_changes_nothing(case: str, existing_root: Path, tmp_path: Path) -> None:
    script, extra, env, words = BAD_INPUT[case]
    script_path = tmp_path / "bad.json"
    if script is not None:
        script_path.write_text(script if isinstance(script, str) else json.dumps(script))
    args = [a.format(script=script_path, dir=tmp_path) for a in extra]
    missing = tmp_path / "absent" / "root"
    for root in (existing_root, missing):
        before = tree_state(existing_root)
        done = run_cli(["run", "--root", str(root), *args, "a prompt"], cwd=tmp_path, env=clean_env(**env))
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stdout == ""
        one_error_line(done, *words)
        assert SENTINEL_KEY not in done.stderr
        assert tree_state(existing_root) == before
        assert not (tmp_path / "absent").exists()
        assert not (tmp_path / ".subagents").exists()


def _bad_roots(base: Path) -> dict[str, tuple[Path, list[str]]]:
    """Roots `run` and `demo` must refuse: (root, words of the error line)."""
    file_root = base / "a-file"
    file_root.write_text("{}")
    sessions_file = base / "sessions-is-a-file"
    sessions_file.mkdir()
    (sessions_file / "sessions").write_text("x")
    sessions_link = base / "sessions-is-a-link"
    sessions_link.mkdir()
    (sessions_link / "sessions").symlink_to(base)
    return {
        "file": (file_root, ["not a folder", "a-file"]),
        "sessions-file": (sessions_file, ["sessions is not a folder"]),
        "sessions-link": (sessions_link, ["sessions is not a folder"]),
    }


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "demo"])
def test_run_and_demo_refuse_a_root_that_cannot_hold_a_store(command: str, tmp_path: Path) -> None:
    model = write_script(tmp_path / "ok.json", text_script("ok"))
    for name, (root, words) in _bad_roots(tmp_path).items():
        before = tree_state(tmp_path)
        args = (
            ["run", "--root", str(root), "--model", model, "hi"]
            if command == "run"
            else ["demo", "--root", str(root), "--plain"]
        )
        done = run_cli(args, cwd=tmp_path)
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        one_error_line(done, *words)
        assert tree_state(tmp_path) == before, name


@pytest.mark.slow
def test_a_session_that_cannot_be_taken_is_exit_2_in_one_line(existing_root: Path, tmp_path: Path) -> None:
    """Found only once the runtime is open: a corrupt log, a log another process writes."""
    root = tmp_path / "root"
    shutil.copytree(existing_root, root)
    model = write_script(tmp_path / "ok.json", text_script("ok"))
    folder = session_folder(root, "broken")
    folder.mkdir()
    (folder / "session.jsonl").write_bytes(b"not a header\n")
    done = run_cli(["run", "--root", str(root), "--model", model, "--session", "broken", "hi"], cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    one_error_line(done, "broken", "corrupt")

    store = FileLogStore(str(root))
    handle = store.open_write("kept")  # as another process would hold it
    try:
        before = tree_state(root)
        done = run_cli(["run", "--root", str(root), "--model", model, "--session", "kept", "hi"], cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        one_error_line(done, "kept", "already owned")
        assert {k: v for k, v in tree_state(root).items() if "kept" in k} == {
            k: v for k, v in before.items() if "kept" in k
        }
    finally:
        store.close(handle)
        store.close_store()


# -- the OpenAI transport against a real server -----------------------------------------------


class StreamingServer:
    """Answers every chat-completions request with the same event stream ("Hel", "lo")."""

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self.port = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            seen = await read_request(stream)
            if seen is None:
                return
            self.requests.append(seen)
            chunks = [
                {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
            ]
            parts = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]
            head = "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            await stream.send_all(head.encode())
            for part in parts:
                await stream.send_all(b"%x\r\n%s\r\n" % (len(part), part))
            await stream.send_all(b"0\r\n\r\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()


def all_bytes_under(root: Path) -> list[tuple[Path, bytes]]:
    """Every file under `root`, and the plain form of every zstd log too."""
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            found.append((path, path.read_bytes()))
            if path.name.endswith(".zst"):
                found.append((path, plain_bytes(path)))
    return found


@pytest.mark.slow  # a real `subagents run` process
async def test_openai_run_against_a_local_server_never_leaks_the_key(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = StreamingServer()
    listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
    server.port = listeners[0].socket.getsockname()[1]
    root = tmp_path / "root"
    with trio.fail_after(TIMEOUT):
        done = await trio.run_process(
            [
                *CLI,
                "run",
                "--root",
                str(root),
                "--model",
                "openai:my-model",
                "--base-url",
                f"http://127.0.0.1:{server.port}/v1",
                "--json",
                "the prompt text",
            ],
            cwd=tmp_path,
            env=clean_env(OPENAI_API_KEY=SENTINEL_KEY),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    stdout, stderr = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, stderr
    out = json.loads(stdout)
    assert stderr == f"session {out['session_id']}\n"
    assert out["output"] == "Hello"
    [seen] = server.requests
    assert (seen.method, seen.target) == ("POST", "/v1/chat/completions")
    assert seen.headers["authorization"] == f"Bearer {SENTINEL_KEY}"
    body = json.loads(seen.body)
    assert body["model"] == "my-model"
    assert body["stream"] is True
    assert body["messages"][-1] == {"role": "user", "content": "the prompt text"}
    # The key is nowhere: not in any file under the root (zstd logs decompressed), not in the output.
    assert SENTINEL_KEY not in stdout and SENTINEL_KEY not in stderr
    files = all_bytes_under(root)
    assert any(b"the prompt text" in data for _, data in files)  # positive control: the scan reads the log
    for path, data in files:
        assert SENTINEL_KEY.encode() not in data, path
    [end] = events(root, out["session_id"], "turn/end")
    assert end["data"]["reason"]["kind"] == "completed"


async def test_open_runtime_builds_a_model_from_a_spec_and_an_explicit_key(tmp_path: Path, monkeypatch) -> None:
    from subagents.runtime import OpenAIChatModel, open_runtime
    from subagents.runtime.foundation.errors import ModelSpecError

    monkeypatch.setenv("OPENAI_API_KEY", "from-the-environment")
    async with open_runtime(tmp_path, model="openai:m", api_key="sk-explicit", base_url="http://127.0.0.1:9") as rt:
        model = rt.agents.model
        assert isinstance(model, OpenAIChatModel)
        assert "sk-explicit" not in repr(model)
    with pytest.raises(ModelSpecError, match="needs an api_key"):
        async with open_runtime(tmp_path, model="deepseek:deepseek-chat"):
            pass  # the environment is never read below the CLI


class HangingServer:
    """Takes the request, streams a first piece of text, then holds the stream open."""

    def __init__(self) -> None:
        self.port = 0
        self.streaming = trio.Event()

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            if await read_request(stream) is None:
                return
            head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            part = (
                b"data: "
                + json.dumps({"choices": [{"index": 0, "delta": {"content": "thinking about "}}]}).encode()
                + b"\n\n"
            )
            await stream.send_all(head.encode() + b"%x\r\n%s\r\n" % (len(part), part))
            self.streaming.set()
            await stream.receive_some(1)  # until the client goes away
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()


@pytest.mark.slow
async def test_ctrl_c_drains_and_exits_130(nursery: trio.Nursery, tmp_path: Path) -> None:
    """SIGINT while the model streams: the turn is cancelled as the person's (aborted, cause
    `user`, the partial text kept as an interrupted message), the runtime drains, the reason is
    one line on stderr, nothing is printed on stdout and the exit status is 130."""
    import signal

    server = HangingServer()
    listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
    server.port = listeners[0].socket.getsockname()[1]
    root = tmp_path / "root"
    with trio.fail_after(TIMEOUT):
        process = await nursery.start(
            partial(
                trio.run_process,
                [
                    *CLI,
                    "run",
                    "--root",
                    str(root),
                    "--compression",
                    "none",
                    "--session",
                    "s1",
                    "--model",
                    "openai:m",
                    "--base-url",
                    f"http://127.0.0.1:{server.port}/v1",
                    "hi",
                ],
                cwd=tmp_path,
                env=clean_env(OPENAI_API_KEY="sk-test"),
                check=False,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                # A child of a non-interactive shell may inherit SIGINT ignored: give it the default.
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )
        )
        await server.streaming.wait()
        process.send_signal(signal.SIGINT)
        code = await process.wait()
        stderr = (await process.stderr.receive_some(65536)).decode()
        assert code == 130, stderr
    assert stderr == "session s1\nsubagents: the turn ended aborted (user)\n"
    records = log_records(root, "s1")[1:]
    assert [r["type"] for r in records][-2:] == ["step/end", "turn/end"]
    assert records[-1]["data"]["reason"] == {"kind": "aborted", "cause": "user"}
    [message] = [r for r in records if r["type"] == "assistant/message"]
    assert message["data"]["interrupted"] is True and message["data"]["finish"] == "aborted"
    assert message["data"]["message"]["content"] == [{"type": "text", "text": "thinking about "}]
