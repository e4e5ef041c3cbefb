"""Running a model script through `open_runtime` with MCP servers: the test server's specs, a
model that remembers the tools each request offered, and the durable results read back."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
from log_lines import read_all
from subagents.runtime import McpServerSpec, Model, ModelRequest, ScriptedModel, SessionBinding, load_script
from subagents.storage import FileLogStore
from wrapped_models import WrappedModel

Json = dict[str, Any]
SERVER = str(Path(__file__).resolve().parent / "mcp_server.py")


def stdio_spec(name: str = "t", mode: str = "stdio", **options: Any) -> McpServerSpec:
    """The test server (tests/helpers/mcp_server.py) over stdio, run by this Python."""
    return McpServerSpec(name=name, command=sys.executable, args=[SERVER, mode], **options)


def call(name: str, **arguments: Any) -> Json:
    return {"name": name, "arguments": arguments}


class Offering(WrappedModel):
    """The scripted model, remembering each turn request's tools (name -> spec)."""

    def __init__(self, script: Json) -> None:
        self.inner = ScriptedModel(load_script(json.dumps(script)))
        self.offered: list[dict[str, Any]] = []

    def answer(self, session: SessionBinding, inner: Model, request: ModelRequest) -> AsyncIterator[Any]:
        if request.purpose == "turn":
            self.offered.append({t.name: t for t in request.tools})
        return inner.stream(request)


def one_turn(calls: list[Json], session: str = "s") -> Json:
    """A script: one turn making `calls` one step each, then saying "done"."""
    return {"agents": [{"session": session, "responses": [{"tool_calls": [c]} for c in calls] + [{"text": "done"}]}]}


def events(root: Path, session_id: str) -> list[tuple[str, Json]]:
    return [
        (e.type, msgspec.json.decode(e.data)) for e in read_all(FileLogStore(str(root), use_index=False), session_id)
    ]


def results(root: Path, session_id: str) -> list[Json]:
    """Each durable `tool/result`: its tool, text and error record."""
    calls = {d["call_id"]: d["name"] for t, d in events(root, session_id) if t == "tool/call"}
    out = []
    for kind, data in events(root, session_id):
        if kind == "tool/result":
            (block,) = data["message"]["content"]
            out.append(
                {
                    "tool": calls.get(block.get("call_id")),
                    "text": block["content"][0]["text"],
                    "error": data.get("error"),
                }
            )
    return out


def turn_ends(root: Path, session_id: str) -> list[Json]:
    return [data["reason"] for kind, data in events(root, session_id) if kind == "turn/end"]
