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


def test_list_agents_render_says_stopped_and_in_doubt() -> None:
    """Issue 27: a stopped child that does not run is `stopped` (not ready or idle); a child
    whose last turn holds results in doubt says how many; a running one stays `running`."""

    def child(sid: str, **flags: Any) -> ChildRow:
        return ChildRow(id=sid, activity="inactive", has_children=False, mode="continuable", label=sid, **flags)

    rows = [
        child("a", stopped=True),
        child("b", stopped=True, in_doubt=1),
        child("c", in_doubt=3),
        child("d", stopped=True),
        child("e"),
    ]
    status = {"b": "idle", "d": "running"}.get
    assert render_agents(rows, False, lambda i: status(i) or "ready") == (
        "a [stopped] — a\nb [stopped] — b (1 in doubt)\nc [ready] — c (3 in doubt)\nd [running] — d\ne [ready] — e"
    )


def test_child_rows_have_the_flags_in_their_json_only_when_set() -> None:
    plain = ChildRow(id="a", activity="inactive", has_children=False, mode="continuable", label="x")
    assert list(plain.to_json()) == ["kind", "id", "activity", "has_children", "mode", "label"]  # SPEC 5.4's bytes
    flagged = ChildRow(
        id="a",
        activity="inactive",
        has_children=False,
        mode="continuable",
        label="x",
        parent_id="p",
        depth=1,
        stopped=True,
        in_doubt=2,
    )
    assert flagged.to_json() == plain.to_json() | {"parent_id": "p", "depth": 1, "stopped": True, "in_doubt": 2}


async def test_list_agents_tells_the_model_a_child_is_stopped_or_in_doubt(tmp_path: Any) -> None:
    """The model-facing `list_agents` on a parent whose children's logs say so (issue 27)."""
    import json

    import msgspec
    from descriptors import descriptor
    from events import turn_end_event, turn_start_event
    from flag_events import call_event, result_event, stopped_event
    from log_lines import header, persist_log
    from subagents.runtime.app import open_runtime
    from subagents.runtime.foundation.clock import ScenarioClock
    from subagents.runtime.testing.script_format import load_script
    from subagents.runtime.testing.scripted_model import ScriptedModel
    from subagents.storage import FileLogStore, make_event

    store = FileLogStore(str(tmp_path), compression="none")
    start = [make_event(0, "subagent/descriptor", 1, descriptor("stopped one")), turn_start_event(1, 2)]
    persist_log(store, header("c1", 10, origin="subagent", parent_session="p"), [*start, stopped_event(2)])
    doubt = [call_event(2, "a"), result_event(3, "a"), turn_end_event(4, 5)]
    start[0] = make_event(0, "subagent/descriptor", 1, descriptor("doubtful one"))
    persist_log(store, header("c2", 11, origin="subagent", parent_session="p"), [*start, *doubt])
    script = {
        "agents": [
            {
                "session": "p",
                "responses": [{"tool_calls": [{"name": "list_agents", "arguments": {}}]}, {"text": "done"}],
            }
        ]
    }
    async with open_runtime(
        tmp_path, model=ScriptedModel(load_script(json.dumps(script))), clock=ScenarioClock(), log_store=store
    ) as rt:
        parent = await rt.agents.create(session_id="p")
        await parent.send("list them")
        await parent.wait_idle()
        handle = store.open_read("p")
        events = list(store.read(handle))
        store.close(handle)
    (result,) = [msgspec.json.decode(e.data) for e in events if e.type == "tool/result"]
    text = result["message"]["content"][0]["content"][0]["text"]
    assert text == "c1 [stopped] — stopped one\nc2 [ready] — doubtful one (1 in doubt)"
    store.close_store()


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
