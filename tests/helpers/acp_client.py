"""The client side of `subagents acp` for the tests: the official `agent-client-protocol` client
spawning the agent, a client that keeps its permission questions and answers them from a list,
and the session's log read back with `subagents show --json`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, spawn_agent_process
from acp.schema import AllowedOutcome, ClientCapabilities, RequestPermissionResponse
from cli_process import CLI, clean_env

TIMEOUT = 60.0  # real seconds: only reached if the agent never answers


class Asking:
    """A client that ignores the updates and answers each permission question with the next of
    `answers` (option ids); every question is kept in `asked` as (session id, tool call)."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, Any]] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        pass

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any) -> Any:
        self.asked.append((session_id, tool_call))
        if not self.answers:
            raise AssertionError(f"an unexpected permission question: {tool_call}")
        return RequestPermissionResponse(outcome=AllowedOutcome(option_id=self.answers.pop(0), outcome="selected"))


def spawn_acp(client: Any, root: Path, model: str, stderr: Path, cwd: Path | None = None) -> Any:
    """`subagents acp --root ROOT --model MODEL` in `cwd` (where it reads subagents.toml), its
    stderr to the file `stderr`; an async context manager of (connection, process)."""
    return spawn_agent_process(
        client,
        CLI[0],
        *CLI[1:],
        "acp",
        "--root",
        str(root),
        "--model",
        model,
        env=clean_env(),
        cwd=cwd,
        transport_kwargs={"stderr": stderr.open("wb")},
        use_unstable_protocol=True,
    )


async def initialize(conn: Any) -> Any:
    return await conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities())


def show(root: Path, session_id: str) -> list[dict[str, Any]]:
    """The session's transcript entries (`subagents show --json`, without its usage summary)."""
    done = subprocess.run(
        [*CLI, "show", session_id, "--json", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr
    return [e for e in json.loads(done.stdout) if e["type"] != "usage"]
