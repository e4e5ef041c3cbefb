"""Issue 13 item 6: the subagent tools tell the truth. `interrupt_agent` names an unknown (or
invalid) id as unavailable and says when an existing target is not running; an agent at the
depth limit is not offered the delegation tools at all."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import trio
from log_lines import read_all
from subagents.runtime import (
    CountingIds,
    Model,
    ModelRequest,
    ScenarioClock,
    ScriptedModel,
    SessionBinding,
    load_script,
    open_runtime,
)
from subagents.storage import FileLogStore
from wrapped_models import WrappedModel

Json = dict[str, Any]


class _Recording(WrappedModel):
    """The scripted model, remembering the tool names each session's requests offered."""

    def __init__(self, script: Json) -> None:
        self.inner = ScriptedModel(load_script(json.dumps(script)))
        self.offered: dict[str, list[list[str]]] = {}

    def answer(self, session: SessionBinding, inner: Model, request: ModelRequest) -> AsyncIterator[Any]:
        if request.purpose == "turn":
            self.offered.setdefault(session.session_id, []).append([t.name for t in request.tools])
        return inner.stream(request)


def _call(name: str, **arguments: Any) -> Json:
    return {"name": name, "arguments": arguments}


def _results(root: Path, session_id: str) -> list[Json]:
    events = read_all(FileLogStore(str(root), use_index=False), session_id)
    out = []
    for event in events:
        if event.type == "tool/result":
            data = msgspec.json.decode(event.data)
            (block,) = data["message"]["content"]
            out.append({"text": block["content"][0]["text"], "error": data.get("error")})
    return out


async def test_interrupt_agent_tells_unknown_invalid_and_not_running_targets_apart(tmp_path: Path) -> None:
    script = {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    {"tool_calls": [_call("subagent", description="done soon", prompt="answer")]},
                    {"wait_for": {"settled": "done soon"}, "text": "waited"},
                    {"text": "noted"},
                    {
                        "tool_calls": [
                            _call("interrupt_agent", agent_id="child-1"),  # settled: on disk only
                            _call("interrupt_agent", agent_id="nobody"),  # no session at all
                            _call("interrupt_agent", agent_id="bad\u0007id"),
                        ]
                    },  # not a session id
                    {"text": "over"},
                ],
            },
            {"label": "done soon", "responses": [{"wait_for": {"waiting": "parent"}, "text": "ANSWER"}]},
        ]
    }
    model = _Recording(script)
    with trio.fail_after(30):
        async with open_runtime(
            tmp_path, model=model, clock=ScenarioClock(), id_factory=CountingIds("child"), compression="none"
        ) as rt:
            parent = await rt.agents.create(session_id="parent")
            await parent.send("go")
            await rt.subagents.wait_tree_idle(parent)
            assert rt.agents.get("child-1") is None
            await parent.send("interrupt them")
            await rt.subagents.wait_tree_idle(parent)
    results = _results(tmp_path, "parent")[-3:]
    assert results == [
        {"text": "interrupt requested for agent child-1 (it is not running)", "error": None},
        {
            "text": 'Error: subagent "nobody" is unavailable',
            "error": {"name": "SubagentError", "code": "NOT_RESUMABLE"},
        },
        {
            "text": 'Error: subagent "bad\u0007id" is unavailable',
            "error": {"name": "SubagentError", "code": "NOT_RESUMABLE"},
        },
    ]
    assert not (tmp_path / "sessions" / "nobody").exists()


async def _offered(tmp_path: Path, max_depth: int) -> dict[str, list[list[str]]]:
    script = {
        "agents": [
            {
                "session": "top",
                "responses": [
                    {"tool_calls": [_call("subagent", description="helper", prompt="help")]},
                    {"wait_for": {"settled": "helper"}, "text": "waited"},
                    {"text": "noted"},
                ],
            },
            {"label": "helper", "responses": [{"wait_for": {"waiting": "top"}, "text": "HELPED"}]},
        ]
    }
    model = _Recording(script)
    with trio.fail_after(30):
        async with open_runtime(
            tmp_path,
            model=model,
            clock=ScenarioClock(),
            id_factory=CountingIds("child"),
            compression="none",
            max_depth=max_depth,
        ) as rt:
            top = await rt.agents.create(session_id="top")
            await top.send("go")
            await rt.subagents.wait_tree_idle(top)
    return model.offered


async def test_a_child_at_the_depth_limit_is_not_offered_the_delegation_tools(tmp_path: Path) -> None:
    offered = await _offered(tmp_path / "limit", max_depth=1)
    assert all({"subagent", "subagent_fork"} <= set(names) for names in offered["top"])
    (child,) = offered["child-1"]
    assert "subagent" not in child and "subagent_fork" not in child
    assert {"list_agents", "send_message", "interrupt_agent"} <= set(child)

    deeper = await _offered(tmp_path / "deeper", max_depth=2)
    (child,) = deeper["child-1"]
    assert {"subagent", "subagent_fork"} <= set(child)  # depth 1 of 2: it may still delegate


async def test_a_session_at_depth_zero_with_max_depth_zero_is_not_offered_them_either(tmp_path: Path) -> None:
    model = _Recording({"agents": [{"session": "solo", "responses": [{"text": "alone"}]}]})
    async with open_runtime(tmp_path, model=model, clock=ScenarioClock(), compression="none", max_depth=0) as rt:
        solo = await rt.agents.create(session_id="solo")
        await solo.send("hi")
        await solo.wait_idle()
        resumed_tools = [t.name for t in solo.tools]
    assert "subagent" not in offered_names(model, "solo") and "subagent" not in resumed_tools


def offered_names(model: _Recording, session_id: str) -> list[str]:
    (names,) = model.offered[session_id]
    return names
