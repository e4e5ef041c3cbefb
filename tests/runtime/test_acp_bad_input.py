"""`subagents acp` under bad input, over raw pipes: a garbage line, JSON that is no request, an
unknown method, wrong params, an unknown session. Each gets its JSON-RPC error (a notification
gets none), nothing reaches stderr or the session's log, and the process keeps serving: the
same session answers a prompt afterwards. Replies are checked against the SDK's schema types."""

from __future__ import annotations

import json
import os
import select
import subprocess
from pathlib import Path
from typing import Any

import pytest
from acp.schema import InitializeResponse, NewSessionResponse, PromptResponse
from cli_process import CLI, clean_env, write_script

TIMEOUT = 60.0  # real seconds: a hang guard only

pytestmark = pytest.mark.slow


class Pipe:
    """The agent process and its stdout read line by line, waiting (bounded) for each line."""

    def __init__(self, root: Path, model: str, stderr: Path) -> None:
        self.process = subprocess.Popen(
            [*CLI, "acp", "--root", str(root), "--model", model],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr.open("wb"),
            env=clean_env(),
            bufsize=0,
        )
        self._buffer = b""

    def send(self, line: bytes | dict[str, Any]) -> None:
        data = line if isinstance(line, bytes) else json.dumps(line).encode()
        assert self.process.stdin is not None
        self.process.stdin.write(data + b"\n")

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], TIMEOUT)
            assert ready, "the agent did not answer"
            chunk = os.read(fd, 65536)
            assert chunk, "the agent closed its stdout"
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def reply(self, msg_id: int) -> dict[str, Any]:
        """The reply to request `msg_id` (notifications before it are skipped)."""
        while True:
            message = self.read()
            if message.get("id") == msg_id and "method" not in message:
                return message

    def close(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.close()
        return self.process.wait(TIMEOUT)


def _request(msg_id: int, method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}


def _events(root: Path) -> dict[str, int]:
    done = subprocess.run(
        [*CLI, "sessions", "--json", "--root", str(root)], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, done.stderr
    return {row["id"]: row["events"] for row in json.loads(done.stdout)}


def test_bad_input_gets_json_rpc_errors_and_the_session_stays_intact(tmp_path: Path) -> None:
    model = write_script(tmp_path / "script.json", {"agents": [{"responses": [{"text": "fine"}]}]})
    root = tmp_path / "root"
    pipe = Pipe(root, model, tmp_path / "stderr")
    try:
        pipe.send(_request(1, "initialize", {"protocolVersion": 1}))
        InitializeResponse.model_validate(pipe.reply(1)["result"])
        pipe.send(_request(2, "session/new", {"cwd": str(tmp_path), "mcpServers": []}))
        session_id = NewSessionResponse.model_validate(pipe.reply(2)["result"]).session_id

        pipe.send(b"this is not json {")
        assert pipe.read() == {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
        pipe.send(b"[1, 2, 3]")
        assert pipe.read()["error"]["code"] == -32600
        pipe.send({"jsonrpc": "1.0", "id": 3, "method": "initialize"})
        assert pipe.reply(3)["error"]["code"] == -32600
        pipe.send(_request(4, "session/teleport", {}))
        assert pipe.reply(4)["error"] == {"code": -32601, "message": "Method not found: session/teleport"}
        pipe.send({"jsonrpc": "2.0", "method": "session/teleport", "params": {}})  # a notification: no reply
        for msg_id, method, params in [
            (5, "session/new", {"cwd": 5}),
            (6, "session/new", {"cwd": "relative/path"}),
            (7, "session/prompt", {"sessionId": session_id}),
            (8, "session/prompt", {"sessionId": session_id, "prompt": [{"type": "image", "data": "x"}]}),
            (9, "session/load", {"sessionId": "", "cwd": str(tmp_path)}),
            (10, "initialize", {"protocolVersion": "one"}),
            (11, "session/prompt", "not an object"),
        ]:
            pipe.send(_request(msg_id, method, params))
            error = pipe.reply(msg_id)["error"]
            assert error["code"] == -32602, (method, params, error)
        pipe.send(_request(12, "session/prompt", {"sessionId": "no-such-session", "prompt": []}))
        assert pipe.reply(12)["error"]["code"] == -32002
        pipe.send(_request(13, "session/load", {"sessionId": "../../etc", "cwd": str(tmp_path)}))
        assert pipe.reply(13)["error"]["code"] == -32002  # an id the store encodes; no such session

        # Nothing of that reached the session's log, and the session still answers.
        # (a new session is published with one event, the client's record: no other session)
        assert _events(root) == {session_id: 1}
        pipe.send(_request(14, "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "hi"}]}))
        assert PromptResponse.model_validate(pipe.reply(14)["result"]).stop_reason == "end_turn"
        assert _events(root)[session_id] > 1
        assert pipe.close() == 0
    finally:
        if pipe.process.poll() is None:
            pipe.process.kill()
            pipe.process.wait()
    assert (tmp_path / "stderr").read_bytes() == b""
