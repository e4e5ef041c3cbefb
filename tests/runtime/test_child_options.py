"""Descriptor extras (SPEC 3.6): a continuable child's model route, persona and tool filter are
recorded in its descriptor, applied when it starts and re-applied on every cold resume; a
one-shot child uses them without recording them. Real files, ScenarioClock, no sleeps."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from log_lines import read_all
from subagents.runtime.agent.loop import AgentConfig
from subagents.runtime.app import open_runtime
from subagents.runtime.delegation.descriptor import ToolFilter, parse_descriptor
from subagents.runtime.delegation.options import ChildOptions, filtered_tools
from subagents.runtime.foundation.clock import ScenarioClock
from subagents.runtime.foundation.errors import AgentError, SubagentError
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.models.base import Chunk, Model, ModelRequest, SessionBinding
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel
from subagents.runtime.tools.base import FunctionTool, ToolSet
from subagents.storage import FileLogStore, decode_payload
from wrapped_models import WrappedModel

PERSONA = "You are a careful reviewer."
OPTIONS = ChildOptions(
    agent_provider="scripted",
    agent_model="reviewer",
    persona=PERSONA,
    tool_filter=ToolFilter(deny=["subagent", "subagent_fork"]),
)


class Recording(WrappedModel):
    """A model that answers from a script and remembers every request, per session."""

    def __init__(self, script: ScriptedModel, name: str) -> None:
        self.inner = self.script = script
        self.name = name
        self.requests: list[tuple[str, ModelRequest]] = []

    def answer(self, session: SessionBinding, inner: Model, request: ModelRequest) -> AsyncIterator[Chunk]:
        self.requests.append((session.session_id, request))
        return inner.stream(request)

    def of(self, session_id: str) -> list[ModelRequest]:
        return [r for sid, r in self.requests if sid == session_id]


def _script(*child_texts: str) -> ScriptedModel:
    return ScriptedModel(
        load_script(
            json.dumps(
                {
                    "agents": [
                        {"label": "reviewer-child", "responses": [{"text": t} for t in child_texts]},
                    ]
                }
            )
        )
    )


class Models:
    """The runtime's model and the factory of child models, both recording."""

    def __init__(self, *child_texts: str) -> None:
        script = _script(*child_texts)
        self.default = Recording(script, "default")
        self.child = Recording(script, "child")
        self.asked: list[ChildOptions] = []

    def child_model(self, options: ChildOptions) -> Recording:
        self.asked.append(options)
        return self.child


def _tool_names(request: ModelRequest) -> list[str]:
    return [spec.name for spec in request.tools]


def _system_texts(request: ModelRequest) -> list[str]:
    return [block["text"] for m in request.messages if m["role"] == "system" for block in m["content"]]


def _descriptor(root: Path, child_id: str) -> Any:
    store = FileLogStore(str(root), compression="none")
    try:
        events = read_all(store, child_id)
    finally:
        store.close_store()
    (event,) = [e for e in events if e.type == "subagent/descriptor"]
    return decode_payload(event, session_id=child_id)


def _runtime(root: Path, models: Models, **kwargs: Any) -> Any:
    return open_runtime(
        root,
        model=models.default,
        child_model=models.child_model,
        clock=ScenarioClock(),
        id_factory=CountingIds("c"),
        compression="none",
        **kwargs,
    )


async def test_a_continuable_child_records_its_options_and_gets_them_back_on_cold_resume(tmp_path: Path) -> None:
    models = Models("first answer", "second answer")
    deployment = AgentConfig(system_prompt="You are the deployment's agent.")  # the persona shadows it
    async with _runtime(tmp_path, models, agent_config=deployment) as rt:
        parent = await rt.agents.create(session_id="parent")
        child_id = await rt.subagents.start_continuable(parent, "spawn", "reviewer-child", "review it", options=OPTIONS)
        await rt.subagents.wait_tree_idle(parent)
        parent_tools = [spec.name for spec in rt.agents.tools().specs()]  # what every agent gets
    assert models.asked == [OPTIONS]
    payload = _descriptor(tmp_path, child_id)
    assert payload == {
        "version": 2,
        "mode": "continuable",
        "provider": "spawn",
        "label": "reviewer-child",
        "agent_provider": "scripted",
        "agent_model": "reviewer",
        "persona": PERSONA,
        "tool_filter": {"deny": ["subagent", "subagent_fork"]},
    }
    assert parse_descriptor(payload) is not None
    (first,) = models.child.of(child_id)
    assert models.default.of(child_id) == []  # the child used the model its options selected
    assert _system_texts(first) == [PERSONA]
    assert "subagent" in parent_tools and "subagent" not in _tool_names(first)
    assert set(_tool_names(first)) == set(parent_tools) - {"subagent", "subagent_fork"}

    fresh = Models("unused", "second answer")
    fresh.child.script = models.child.script  # the same script position: its second answer
    async with _runtime(tmp_path, fresh, agent_config=deployment) as rt:
        parent = await rt.agents.resume("parent")
        await rt.subagents.send_message(parent, child_id, "once more")
        await rt.subagents.wait_tree_idle(parent)
    assert fresh.asked == [OPTIONS]  # re-applied from the descriptor on the cold resume
    (again,) = fresh.child.of(child_id)
    assert _system_texts(again) == [PERSONA]
    assert set(_tool_names(again)) == set(parent_tools) - {"subagent", "subagent_fork"}


def _user_texts(request: ModelRequest) -> list[str]:
    return [block["text"] for m in request.messages if m["role"] == "user" for block in m["content"]]


@pytest.mark.parametrize("deny", [[], ["send_message"]])
async def test_the_return_guidance_names_only_tools_the_child_has(tmp_path: Path, deny: list[str]) -> None:
    models = Models("done")
    options = ChildOptions(persona=PERSONA, tool_filter=ToolFilter(deny=deny)) if deny else ChildOptions()
    async with _runtime(tmp_path, models) as rt:
        parent = await rt.agents.create(session_id="parent")
        child_id = await rt.subagents.start_continuable(parent, "spawn", "reviewer-child", "go", options=options)
        await rt.subagents.wait_tree_idle(parent)
    (first,) = models.default.of(child_id)
    prompt, guidance = _user_texts(first)
    assert prompt == "go"
    assert guidance.startswith('Your parent agent id is "parent".')
    if deny:
        assert "send_message" not in _tool_names(first)
        assert "send_message" not in guidance and "your closing message is what your parent is given" in guidance
    else:
        assert "send_message" in _tool_names(first)
        assert 'send_message({ agent_id: "parent"' in guidance


async def test_options_that_select_a_model_need_a_factory(tmp_path: Path) -> None:
    models = Models("first answer")
    async with open_runtime(
        tmp_path, model=models.default, clock=ScenarioClock(), id_factory=CountingIds("c"), compression="none"
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        for start in (
            lambda: rt.subagents.start_continuable(parent, "spawn", "reviewer-child", "go", options=OPTIONS),
            lambda: rt.subagents.start(parent, "spawn", "go", label="x", options=OPTIONS),
        ):
            with pytest.raises(SubagentError) as exc:
                await start()
            assert exc.value.code == "SUBAGENT_UNSUPPORTED_CAPABILITY"
        assert sorted(p.name for p in (tmp_path / "sessions").iterdir()) == ["parent"]  # no child was made
        # Persona and tool filter alone need no factory.
        child_id = await rt.subagents.start_continuable(
            parent, "spawn", "reviewer-child", "go", options=ChildOptions(persona=PERSONA)
        )
        await rt.subagents.wait_tree_idle(parent)
        assert _system_texts(models.default.of(child_id)[0]) == [PERSONA]


async def test_a_child_whose_model_cannot_be_rebuilt_is_not_resumable(tmp_path: Path) -> None:
    models = Models("first answer")
    async with _runtime(tmp_path, models) as rt:
        parent = await rt.agents.create(session_id="parent")
        child_id = await rt.subagents.start_continuable(parent, "spawn", "reviewer-child", "go", options=OPTIONS)
        await rt.subagents.wait_tree_idle(parent)
    async with open_runtime(tmp_path, model=Models("x").default, clock=ScenarioClock(), compression="none") as rt:
        parent = await rt.agents.resume("parent")
        with pytest.raises(SubagentError) as exc:
            await rt.subagents.send_message(parent, child_id, "again")
        assert (exc.value.code, exc.value.message) == (
            "SUBAGENT_NOT_RESUMABLE",
            f'subagent "{child_id}" is unavailable',
        )
        assert rt.subagents.manager.get(child_id) is None


async def test_a_one_shot_child_uses_its_options_without_recording_them(tmp_path: Path) -> None:
    models = Models("the result")
    async with _runtime(tmp_path, models) as rt:
        parent = await rt.agents.create(session_id="parent")
        result = await rt.subagents.start(parent, "spawn", "go", label="reviewer-child", options=OPTIONS)
        assert result.text == "the result"
    (child_id,) = {sid for sid, _ in models.child.requests}
    assert _system_texts(models.child.of(child_id)[0]) == [PERSONA]
    assert "subagent" not in _tool_names(models.child.of(child_id)[0])
    assert _descriptor(tmp_path, child_id) == {
        "version": 2,
        "mode": "one-shot",
        "provider": "spawn",
        "label": "reviewer-child",
    }


def test_tool_filters_allow_then_deny_in_registration_order() -> None:
    async def noop(_args: Any, _ctx: Any) -> str:
        return "ok"

    tools = ToolSet(FunctionTool(name=n, description=n, fn=noop) for n in ("a", "b", "c", "d"))
    names = lambda ts: [spec.name for spec in ts.specs()]  # noqa: E731
    assert names(filtered_tools(tools, None)) == ["a", "b", "c", "d"]
    assert names(filtered_tools(tools, ToolFilter(allow=["d", "b", "zz"]))) == ["b", "d"]
    assert names(filtered_tools(tools, ToolFilter(deny=["a"]))) == ["b", "c", "d"]
    assert names(filtered_tools(tools, ToolFilter(allow=["a", "b"], deny=["a"]))) == ["b"]
    assert names(filtered_tools(tools, ToolFilter(allow=[]))) == []
    with pytest.raises(TypeError):
        ChildOptions(persona=3)  # type: ignore[arg-type]  # the wrong type under test
    with pytest.raises(TypeError):
        ChildOptions(tool_filter={"deny": ["a"]})  # type: ignore[arg-type]  # the wrong type under test


async def test_every_resume_path_gets_the_options_back(tmp_path: Path) -> None:
    """Not only a parent's message: resuming the child by id (as `subagents run --session`,
    scenarios and the demo do) applies its recorded options too; one that cannot be applied
    leaves the session released."""
    models = Models("first answer", "second answer")
    deployment = AgentConfig(system_prompt="You are the deployment's agent.")
    async with _runtime(tmp_path, models, agent_config=deployment) as rt:
        parent = await rt.agents.create(session_id="parent")
        child_id = await rt.subagents.start_continuable(parent, "spawn", "reviewer-child", "go", options=OPTIONS)
        await rt.subagents.wait_tree_idle(parent)
        parent_tools = {spec.name for spec in rt.agents.tools().specs()}
    fresh = Models("unused")
    fresh.child.script = models.child.script
    async with _runtime(tmp_path, fresh, agent_config=deployment) as rt:
        child = await rt.agents.resume(child_id)
        await child.send("directly")
        await child.wait_idle()
    assert fresh.asked == [OPTIONS]
    (again,) = fresh.child.of(child_id)
    assert _system_texts(again) == [PERSONA]  # no deployment prompt appended on resume
    assert {spec.name for spec in again.tools} == parent_tools - {"subagent", "subagent_fork"}
    async with open_runtime(tmp_path, model=Models("x").default, clock=ScenarioClock(), compression="none") as rt:
        with pytest.raises(AgentError) as exc:
            await rt.agents.resume(child_id)
        assert exc.value.code == "SUBAGENT_OPTIONS_NOT_REAPPLIED" and exc.value.record()["code"] == "NOT_RESUMABLE"
        assert rt.sessions.get(child_id) is None  # released again, lock and all
