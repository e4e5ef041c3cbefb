"""Agent types: the file format, where they are found (the project's wins), bad files reported and
left out, and a type chosen by the model: its system prompt and tool filter in the child's model
requests, kept on a cold resume after the file is gone."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from subagents.runtime import CountingIds, ScenarioClock, ScriptedModel, load_script, open_runtime
from subagents.runtime.delegation.agent_types import agent_type_dirs, load_agent_types, parse_agent_type
from subagents.runtime.models.base import Model, ModelRequest, SessionBinding
from subagents.storage import FileLogStore
from wrapped_models import WrappedModel

REVIEWER = """---
name: reviewer
description: Reviews code
  for bugs
tools: [read_file, grep]
---
You review code. Be terse.
"""


def test_a_type_file_parses_to_its_child_options() -> None:
    kind = parse_agent_type(REVIEWER)
    assert (kind.name, kind.description, kind.prompt, kind.tools, kind.model) == (
        "reviewer",
        "Reviews code for bugs",
        "You review code. Be terse.",
        ("read_file", "grep"),
        None,
    )
    options = kind.options()
    assert options.persona == "You review code. Be terse."
    assert options.agent_type == "reviewer"  # the child's header `agent_preset` (listings show it)
    assert options.tool_filter is not None and options.tool_filter.allow == ("read_file", "grep")
    assert not options.selects_model
    typed = parse_agent_type(
        '---\nname: fast\ndescription: "quick: answers"\nmodel: openai:gpt-x\ntools: a, b\n---\nGo.'
    )
    assert (typed.description, typed.tools) == ("quick: answers", ("a", "b"))
    assert (typed.options().agent_provider, typed.options().agent_model) == ("openai", "gpt-x")
    assert kind.options().on_interrupted_turn is None  # the runtime's policy
    closing = parse_agent_type("---\nname: c\ndescription: d\non_interrupted_turn: close\n---\nGo.")
    assert closing.options().on_interrupted_turn == "close"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("name: x\n", "must start with a front matter block"),
        ("---\nname: x\ndescription: d\n", "no closing ---"),
        ("---\nname: x\n---\nbody", "needs description"),
        ("---\ndescription: d\n---\nbody", "needs name"),
        ("---\nname: x\ndescription: d\ncolour: red\n---\nbody", "line 4: expected one of"),
        ("---\nname: x\nname: y\ndescription: d\n---\nbody", "name is given twice"),
        ("---\nname: ../x\ndescription: d\n---\nbody", "must be letters, digits"),
        ("---\nname: x\ndescription: d\nmodel: gpt\n---\nbody", "must look like deepseek:MODEL"),
        ("---\nname: x\ndescription: d\n---\n  \n", "body (the system prompt) is empty"),
        ("---\nname: x\ndescription: d\ntools: [a b]\n---\nbody", "is not a tool name"),
        ("---\nname: x\ndescription: d\non_interrupted_turn: retry\n---\nbody", "must be continue or close"),
    ],
)
def test_a_bad_type_file_says_why(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        parse_agent_type(text)


def test_types_are_found_in_both_folders_the_project_wins_and_bad_files_are_reported(tmp_path: Path) -> None:
    user, project = tmp_path / "user", tmp_path / "project"
    dirs = agent_type_dirs(str(project), str(user))
    for folder in dirs:
        Path(folder).mkdir(parents=True)
    Path(dirs[0], "reviewer.md").write_text(REVIEWER.replace("Be terse.", "From the user."))
    Path(dirs[0], "writer.md").write_text("---\nname: writer\ndescription: Writes\n---\nWrite.")
    Path(dirs[1], "reviewer.md").write_text(REVIEWER)
    Path(dirs[1], "broken.md").write_text("no front matter")
    Path(dirs[1], "other.md").write_text(REVIEWER)  # its name is not its file's
    Path(dirs[1], "binary.md").write_bytes(b"---\xff")
    Path(dirs[1], "notes.txt").write_text("ignored")
    types, problems = load_agent_types(dirs)
    assert sorted(types) == ["reviewer", "writer"]
    assert types["reviewer"].prompt == "You review code. Be terse."  # the project's
    assert sorted((Path(p.path).name, p.reason) for p in problems) == [
        ("binary.md", "not UTF-8 text"),
        ("broken.md", "it must start with a front matter block (a line ---)"),
        ("other.md", "its name 'reviewer' differs from the file name"),
    ]


class Recording(WrappedModel):
    """The scripted model, keeping each session's system texts and offered tool names."""

    def __init__(self, script: dict[str, Any]) -> None:
        self.inner = ScriptedModel(load_script(json.dumps(script)))
        self.seen: dict[str, list[tuple[list[str], list[str]]]] = {}

    def answer(self, session: SessionBinding, inner: Model, request: ModelRequest) -> AsyncIterator[Any]:
        systems = [
            block["text"]
            for m in request.messages
            if m["role"] == "system"
            for block in m["content"]
            if "text" in block
        ]
        self.seen.setdefault(session.session_id, []).append((systems, [t.name for t in request.tools]))
        return inner.stream(request)


async def test_a_chosen_type_shapes_the_child_and_survives_a_cold_resume_without_its_file(tmp_path: Path) -> None:
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "reviewer.md").write_text(REVIEWER)
    types, problems = load_agent_types([str(tmp_path / "agents")])
    assert not problems
    first = Recording(
        {
            "agents": [
                {
                    "session": "p",
                    "responses": [
                        {
                            "tool_calls": [
                                {
                                    "name": "subagent",
                                    "arguments": {"description": "R", "prompt": "review", "agent_type": "reviewer"},
                                }
                            ]
                        },
                        {"wait_for": {"settled": "R"}, "text": "started"},
                        {"text": "noted"},
                    ],
                },
                {"label": "R", "responses": [{"wait_for": {"waiting": "p"}, "text": "looks fine"}]},
            ]
        }
    )
    (tmp_path / "ws").mkdir()
    options = {"clock": ScenarioClock(), "id_factory": CountingIds("child"), "compression": "none"}
    options |= {"workspace": tmp_path / "ws"}
    with trio.fail_after(30):
        async with open_runtime(tmp_path / "root", model=first, agent_types=types, **options) as rt:
            parent = await rt.agents.create(session_id="p")
            await parent.send("go")
            await rt.subagents.wait_tree_idle(parent)
    (parent_systems, parent_tools) = first.seen["p"][0]
    assert parent_systems == [] and "run_command" in parent_tools and "subagent" in parent_tools
    ((child_systems, child_tools),) = first.seen["child-1"]
    assert child_systems == ["You review code. Be terse."]
    assert child_tools == ["read_file", "grep"]  # the type's filter over every tool
    store = FileLogStore(str(tmp_path / "root"), compression="none")
    try:
        info = store.stat("child-1")
    finally:
        store.close_store()
    assert info is not None and info.header is not None and info.header.agent_preset == "reviewer"

    (tmp_path / "agents" / "reviewer.md").unlink()  # the type is gone; the descriptor keeps it
    second = Recording(
        {
            "agents": [
                {
                    "session": "p",
                    "responses": [
                        {
                            "tool_calls": [
                                {"name": "send_message", "arguments": {"agent_id": "child-1", "message": "again"}}
                            ]
                        },
                        {"text": "sent"},
                        {"text": "noted"},
                    ],
                },
                {"label": "R", "responses": [{"text": "still fine"}]},
            ]
        }
    )
    with trio.fail_after(30):
        async with open_runtime(tmp_path / "root", model=second, **options) as rt:
            parent = await rt.agents.resume("p")
            await parent.send("again")
            await rt.subagents.wait_tree_idle(parent)
    ((child_systems, child_tools),) = second.seen["child-1"]
    assert child_tools == ["read_file", "grep"]  # the options came back from the descriptor
    assert child_systems == ["You review code. Be terse."]  # once: the resumed surface has it already


async def test_the_subagent_tool_offers_agent_type_only_when_there_are_types(tmp_path: Path) -> None:
    from subagents.runtime.delegation.tools import subagent_tools

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "reviewer.md").write_text(REVIEWER)
    types, _ = load_agent_types([str(tmp_path / "a")])
    plain = subagent_tools(None)[0]  # type: ignore[arg-type]  # only the schema is read
    typed = subagent_tools(None, types)[0]  # type: ignore[arg-type]  # only the schema is read
    assert "agent_type" not in plain.parameters["properties"]
    choice = typed.parameters["properties"]["agent_type"]
    assert choice["enum"] == ["reviewer"]
    assert "reviewer: Reviews code for bugs" in choice["description"]
