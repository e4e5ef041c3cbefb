"""The model-facing subagent tools (SPEC 5.5, reference-notes §6): exact names, parameters and
the description phrases that steer model behaviour; and the `list_agents` render."""

from __future__ import annotations

from typing import Any

import pytest
from subagents.runtime.delegation.listing import ChildRow, DiagnosticRow
from subagents.runtime.delegation.tools import render_agents, subagent_tools


def _tools() -> dict[str, Any]:
    return {tool.name: tool for tool in subagent_tools(service=None)}  # type: ignore[arg-type]  # descriptions need no service


def test_names_and_parameters_are_exact() -> None:
    tools = _tools()
    assert list(tools) == ["subagent", "subagent_fork", "list_agents", "send_message", "interrupt_agent"]
    for name in ("subagent", "subagent_fork"):
        params = tools[name].parameters
        assert set(params["properties"]) == {
            "description",
            "prompt",
            "run_in_background",
            # optional budget limits (issue 16): they only lower what the child inherits
            "max_turns",
            "max_tokens",
            "deadline_seconds",
        }
        assert params["required"] == ["description", "prompt"]
        assert [params["properties"][k]["type"] for k in ("max_turns", "max_tokens", "deadline_seconds")] == [
            "integer",
            "integer",
            "number",
        ]
        assert params["properties"]["run_in_background"]["type"] == "boolean"
        assert (
            params["properties"]["description"]["description"]
            == "A short (3-5 word) description of the delegated task, for display."
        )
    scope = tools["list_agents"].parameters
    assert scope["properties"] == {
        "scope": {
            "type": "string",
            "enum": ["children", "descendants"],
            "description": "children (default) lists direct children only; descendants walks the complete tree below you.",
        }
    }
    assert "required" not in scope
    send = tools["send_message"].parameters
    assert send["required"] == ["agent_id", "message"]
    assert send["properties"]["agent_id"]["description"] == (
        "The agent id of your direct continuable child, or your direct parent when you are a resident continuable child."
    )
    assert send["properties"]["message"]["description"] == "The message to deliver to the agent."
    interrupt = tools["interrupt_agent"].parameters
    # issue 27: `stop` stops the target's whole tree for good (the runtime offers it)
    assert interrupt["required"] == ["agent_id"] and list(interrupt["properties"]) == ["agent_id", "stop"]
    assert interrupt["properties"]["agent_id"]["description"] == "The agent id of the running agent to interrupt."
    assert interrupt["properties"]["stop"]["type"] == "boolean"


@pytest.mark.parametrize(
    "name, pinned, forbidden",
    [
        (
            "list_agents",
            [
                "send_message",
                "steers a running child at its nearest step boundary",
                "interrupt_agent",
                "you are told when one finishes",
                "resumable, not terminal",
            ],
            ["send_message` starts a new turn"],
        ),
        (
            "send_message",
            ["nearest step", "direct continuable child", "If you are a resident continuable child"],
            ["job_output", "job id"],
        ),
        ("interrupt_agent", ["current turn", "send_message"], []),
        ("subagent", ["immediately returns a durable subagent id", "`run_in_background: false`"], []),
        ("subagent_fork", ["inherits this conversation"], []),
    ],
)
def test_descriptions_keep_the_pinned_phrases(name: str, pinned: list[str], forbidden: list[str]) -> None:
    description = _tools()[name].description
    for phrase in pinned:
        assert phrase in description
    for phrase in forbidden:
        assert phrase not in description


def test_list_agents_render() -> None:
    rows = [
        ChildRow(
            id="a", activity="inactive", has_children=False, mode="continuable", label="first", parent_id="p", depth=1
        ),
        ChildRow(id="b", activity="running", has_children=False, mode="one-shot", parent_id="p", depth=1),
        DiagnosticRow(id="c", reason="corrupt", parent_id="a", depth=2),
    ]
    status = {"a": "idle"}.get
    assert render_agents(rows, False, lambda i: status(i) or "ready") == "a [idle] — first\nc [diagnostic: corrupt]"
    assert render_agents(rows, True, lambda i: "ready") == (
        "a [ready] parent=p depth=1 — first\nc [diagnostic: corrupt] parent=a depth=2"
    )
    assert render_agents([], False, lambda i: "ready") == "(no subagents)"
    assert render_agents(rows[1:2], False, lambda i: "ready") == "(no subagents)"  # one-shot children are hidden


async def test_a_failed_corpus_read_keeps_its_code_in_the_tool_result(tmp_path: Any) -> None:
    import json

    import msgspec
    from subagents.runtime.app import open_runtime
    from subagents.runtime.foundation.clock import ScenarioClock
    from subagents.runtime.testing.script_format import load_script
    from subagents.runtime.testing.scripted_model import ScriptedModel
    from subagents.storage import FileLogStore, PersistenceFailed
    from subagents.storage.testing import FaultyLogStore

    script = {
        "agents": [
            {
                "session": "p",
                "responses": [{"tool_calls": [{"name": "list_agents", "arguments": {}}]}, {"text": "done"}],
            }
        ]
    }
    faulty = FaultyLogStore(FileLogStore(str(tmp_path), compression="none"))
    async with open_runtime(
        tmp_path, model=ScriptedModel(load_script(json.dumps(script))), clock=ScenarioClock(), log_store=faulty
    ) as rt:
        parent = await rt.agents.create(session_id="p")
        faulty.fail("list", PersistenceFailed("disk gone"), times=None)
        await parent.send("list them")
        await parent.wait_idle()
        faulty.release()
        handle = faulty.open_read("p")
        events = list(faulty.read(handle))
        faulty.close(handle)
    (result,) = [msgspec.json.decode(e.data) for e in events if e.type == "tool/result"]
    assert result["error"] == {"name": "SessionQueryError", "code": "SESSION_QUERY_PERSISTENCE_FAILED"}
    text = result["message"]["content"][0]["content"][0]["text"]
    assert text.startswith("Error: session persistence listing failed") and "disk gone" in text


async def test_a_settled_child_whose_disposal_is_under_way_lists_as_ready(tmp_path: Any, monkeypatch: Any) -> None:
    """A parent woken by its child's settlement may list its children while the child is still
    being disposed (agent, then session, released one after the other): the child is `ready`,
    never `idle` or `running` (the demo's determinism rests on it)."""
    import json

    import msgspec
    import trio
    from subagents.runtime.agent.registry import AgentRegistry
    from subagents.runtime.app import open_runtime
    from subagents.runtime.foundation.clock import ScenarioClock
    from subagents.runtime.foundation.ids import CountingIds
    from subagents.runtime.testing.script_format import load_script
    from subagents.runtime.testing.scripted_model import ScriptedModel
    from subagents.storage import FileLogStore

    script = {
        "agents": [
            {
                "session": "p",
                "responses": [
                    {
                        "tool_calls": [
                            {
                                "name": "subagent",
                                "arguments": {"description": "Alpha", "prompt": "hi", "run_in_background": True},
                            }
                        ]
                    },
                    {"wait_for": {"settled": "Alpha"}, "tool_calls": [{"name": "list_agents", "arguments": {}}]},
                    {"text": "done"},
                ],
            },
            {"label": "Alpha", "responses": [{"text": "ok"}]},
        ]
    }
    gate, held = trio.Event(), trio.Event()
    stop = AgentRegistry.stop

    async def held_stop(self: AgentRegistry, session_id: str, *, cause: str = "disposed") -> None:
        if session_id != "p":  # the child's disposal waits until the parent has listed
            held.set()
            await gate.wait()
        await stop(self, session_id, cause=cause)

    monkeypatch.setattr(AgentRegistry, "stop", held_stop)
    with trio.fail_after(60):
        async with open_runtime(
            tmp_path,
            model=ScriptedModel(load_script(json.dumps(script))),
            clock=ScenarioClock(),
            id_factory=CountingIds("child"),
        ) as rt:
            parent = await rt.agents.create(session_id="p")
            await parent.send("go")
            await held.wait()
            await parent.wait_idle()
            gate.set()
            await rt.subagents.wait_tree_idle(parent)
    store = FileLogStore(str(tmp_path))
    handle = store.open_read("p")
    events = list(store.read(handle))
    store.close(handle)
    store.close_store()
    results = [msgspec.json.decode(e.data) for e in events if e.type == "tool/result"]
    listed = results[-1]["message"]["content"][0]["content"][0]["text"]
    assert listed == "child-1 [ready] — Alpha"
