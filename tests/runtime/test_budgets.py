"""Budgets (issue 16 item 6; SPEC §8, runtime/foundation/budgets.py): `max_turns`, `max_tokens` and a
deadline per agent; a child inherits its parent's remainder, clamped, lowered by the `subagent`
call; running out ends the turn with `turn/end {reason: {kind: "budget", message}}`, the child
settles and the parent's notice names the budget; cold resume recounts what was spent.

The scripted model gives usage per response; deadlines run on the ScenarioClock (`delay_ms`
advances it) or, mid-call, under `autojump_clock` with the in-memory store. Real files otherwise,
synchronised on the runtime's own waits, never on time."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from clocks import T
from events import turn_start_event
from log_lines import header, persist_log, read_all
from subagents.runtime import Agent, Budget, ChildOptions, ScenarioClock, open_runtime
from subagents.runtime.delegation.descriptor import (
    MalformedDescriptor,
    SubagentDescriptor,
    parse_descriptor,
    snapshot_descriptor,
)
from subagents.runtime.foundation.budgets import Spent, parse_budget, remainder, reply_tokens
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel
from subagents.runtime.tools.base import FunctionTool
from subagents.storage import Event, FileLogStore, LogStore, make_event
from subagents.storage.testing import MemoryLogStore

Json = dict[str, Any]


def _model(agents: list[Json]) -> ScriptedModel:
    return ScriptedModel(load_script(json.dumps({"agents": agents})))


def _call(name: str, **arguments: Any) -> Json:
    return {"name": name, "arguments": arguments}


def _delegate(label: str, prompt: str = "go", **arguments: Any) -> Json:
    return _call("subagent", description=label, prompt=prompt, **arguments)


@asynccontextmanager
async def _runtime(
    root: Path, model: ScriptedModel, *, store: LogStore | None = None, **kwargs: Any
) -> AsyncIterator[Any]:
    async with open_runtime(
        root,
        model=model,
        clock=ScenarioClock(),
        id_factory=CountingIds("c"),
        compression="none",
        log_store=store,
        **kwargs,
    ) as rt:
        yield rt


def _events(root: Path, sid: str, store: LogStore | None = None) -> list[tuple[str, Json]]:
    own = store is None
    store = store if store is not None else FileLogStore(str(root), compression="none")
    try:
        events: list[Event] = read_all(store, sid)
    finally:
        if own:
            store.close_store()
    return [(e.type, msgspec.json.decode(e.data)) for e in events]


def _of(events: list[tuple[str, Json]], type_: str) -> list[Json]:
    return [data for t, data in events if t == type_]


def _reasons(events: list[tuple[str, Json]]) -> list[Json]:
    return [data["reason"] for data in _of(events, "turn/end")]


def _notices(events: list[tuple[str, Json]]) -> list[list[str]]:
    return [
        [block["text"] for block in data["message"]["content"]]
        for data in _of(events, "user/message")
        if data["message"]["source"]["kind"] == "subagent-settled"
    ]


def _budget_of(root: Path, sid: str, store: LogStore | None = None) -> Json | None:
    (descriptor,) = _of(_events(root, sid, store), "subagent/descriptor")
    return descriptor.get("budget")


def _texts(data: Json) -> list[str]:
    return [b["text"] for b in data["message"]["content"] if b["type"] == "text"]


async def _started(rt: Any, prompt: str = "start it") -> tuple[Agent, str]:
    """The root `parent`, given `prompt`, once its family is idle; its first child's id."""
    parent = await rt.agents.create(session_id="parent")
    await parent.send(prompt)
    await rt.subagents.wait_tree_idle(parent)
    return parent, "c-1"


# --- each budget running out ---------------------------------------------------------------------


async def test_a_child_out_of_turns_stops_before_its_model_call_and_the_notice_says_so(tmp_path: Path) -> None:
    model = _model(
        [
            {
                "session": "parent",
                "responses": [
                    {"tool_calls": [_delegate("worker", max_turns=1)]},
                    {"text": "started"},
                    {"text": "noted 1"},
                    {"text": "noted 2"},
                ],
            },
            # One answer only: a second model call would fail the turn (script exhausted).
            {"label": "worker", "responses": [{"text": "first answer"}]},
        ]
    )
    async with _runtime(tmp_path, model) as rt:
        parent, child = await _started(rt)
        await rt.subagents.send_message(parent, child, "one more thing")
        await rt.subagents.wait_tree_idle(parent)
    assert _budget_of(tmp_path, child) == {"max_turns": 1}
    events = _events(tmp_path, child)
    assert _reasons(events) == [{"kind": "completed"}, {"kind": "budget", "message": "max_turns 1 reached"}]
    assert len(_of(events, "assistant/message")) == 1  # no model call in the second turn
    # The message that started the second turn is kept, in a step without a model call.
    assert _texts(_of(events, "user/message")[-1]) == ["Agent parent sent a message: ", "one more thing"]
    parent_events = _events(tmp_path, "parent")
    last_end = max(seq for seq, (t, _d) in enumerate(events) if t == "turn/end")
    assert _of(parent_events, "subagent/settled")[-1] == {
        "child_id": child,
        "reason_kind": "budget",
        "reason_message": "max_turns 1 reached",
        "run_key": f"{child}@{last_end}",  # its run, by its last turn/end (issue 27)
    }
    assert _notices(parent_events)[-1] == [
        f"Background subagent {child} ran out of its budget before it finished (max_turns 1 reached).",
        "It left no closing message.",
    ]


async def test_a_child_out_of_tokens_stops_before_its_next_call(tmp_path: Path) -> None:
    model = _model(
        [
            {
                "session": "parent",
                "responses": [
                    {"tool_calls": [_delegate("worker", max_tokens=100)]},
                    {"text": "started"},
                    {"text": "noted"},
                ],
            },
            {
                "label": "worker",
                "responses": [
                    {
                        "text": "looking around",
                        "tool_calls": [_call("list_agents")],
                        "usage": {"input_tokens": 80, "output_tokens": 30},
                    },
                    {"text": "never asked for"},
                ],
            },
        ]
    )
    async with _runtime(tmp_path, model) as rt:
        _parent, child = await _started(rt)
    events = _events(tmp_path, child)
    assert _reasons(events) == [{"kind": "budget", "message": "max_tokens 100 reached: 110 used (10 over)"}]
    assert len(_of(events, "assistant/message")) == 1
    assert len(_of(events, "tool/result")) == 1  # the reply's tools ran: the reply was within budget
    assert _notices(_events(tmp_path, "parent")) == [
        [
            f"Background subagent {child} ran out of its budget before it finished (max_tokens 100 reached: 110 used (10 over)).",
            "Its closing message:",
            "looking around",
        ]
    ]


async def test_a_child_past_its_deadline_on_the_runtime_clock_stops(tmp_path: Path) -> None:
    """The scenario clock drives the deadline: the child's first reply is scripted to take
    500 s of it (`delay_ms`), past the 60 s the call allowed; no real time passes."""
    model = _model(
        [
            {
                "session": "parent",
                "responses": [
                    {"tool_calls": [_delegate("worker", deadline_seconds=60)]},
                    {"text": "started"},
                    {"text": "noted"},
                ],
            },
            {
                "label": "worker",
                "responses": [
                    {"delay_ms": 500_000, "text": "slow", "tool_calls": [_call("list_agents")]},
                    {"text": "never asked for"},
                ],
            },
        ]
    )
    async with _runtime(tmp_path, model) as rt:
        _parent, child = await _started(rt)
    budget = _budget_of(tmp_path, child)
    assert budget is not None and set(budget) == {"deadline"}
    header_time = _child_created_at(tmp_path, child)
    assert 60_000 <= budget["deadline"] - header_time <= 61_000  # 60 s from when the call made it
    events = _events(tmp_path, child)
    assert _reasons(events) == [{"kind": "budget", "message": "deadline reached"}]
    assert len(_of(events, "assistant/message")) == 1
    assert _notices(_events(tmp_path, "parent"))[0][0] == (
        f"Background subagent {child} ran out of its budget before it finished (deadline reached)."
    )


def _child_created_at(root: Path, sid: str) -> int:
    store = FileLogStore(str(root), compression="none")
    try:
        return store.stat(sid).header.created_at  # type: ignore[union-attr]  # a published log has a header
    finally:
        store.close_store()


def _hanging_script(child_responses: list[Json]) -> ScriptedModel:
    return _model(
        [
            {
                "session": "parent",
                "responses": [
                    {"tool_calls": [_delegate("worker", deadline_seconds=5)]},
                    {"text": "started"},
                    {"text": "noted"},
                ],
            },
            {"label": "worker", "responses": child_responses},
        ]
    )


async def test_a_deadline_cuts_a_model_call_that_outlives_it(tmp_path: Path, autojump_clock: Any) -> None:
    """Mid-call the deadline is a cancel scope: the call is cut as a cancel cuts it, and the
    turn ends with the budget reason, not `aborted`."""
    store = MemoryLogStore()
    async with _runtime(tmp_path, _hanging_script([{"hang": True}]), store=store) as rt:
        _parent, child = await _started(rt)
    events = _events(tmp_path, child, store)
    assert _reasons(events) == [{"kind": "budget", "message": "deadline reached"}]
    assert _of(events, "assistant/message") == []  # nothing was streamed before the cut
    assert _notices(_events(tmp_path, "parent", store))[0][0] == (
        f"Background subagent {child} ran out of its budget before it finished (deadline reached)."
    )


async def test_a_deadline_stops_a_tool_that_outlives_it_two_phase(tmp_path: Path, autojump_clock: Any) -> None:
    async def forever(_args: Json, _ctx: Any) -> str:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    store = MemoryLogStore()
    model = _hanging_script([{"text": "working", "tool_calls": [_call("slow")]}, {"text": "never asked for"}])
    tools = [FunctionTool(name="slow", description="takes forever", fn=forever)]
    async with _runtime(tmp_path, model, store=store, tools=lambda: tools) as rt:
        _parent, child = await _started(rt)
    events = _events(tmp_path, child, store)
    assert _reasons(events) == [{"kind": "budget", "message": "deadline reached"}]
    (result,) = _of(events, "tool/result")
    assert result["error"] == {"name": "ToolCancelledError", "code": "CANCELLED"}
    assert len(_of(events, "assistant/message")) == 1


# --- inheritance and clamping --------------------------------------------------------------------


def _level(label: str, usage: tuple[int, int], *delegation: Json) -> Json:
    """A scripted agent that delegates (when given a call), then answers, then notes a notice."""
    first: Json = {"usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}
    if delegation:
        first["tool_calls"] = list(delegation)
    else:
        first["text"] = f"{label} done"
    return {"label": label, "responses": [first, {"text": f"{label} started"}, {"text": f"{label} noted"}]}


async def test_budgets_are_inherited_and_clamped_down_three_levels(tmp_path: Path) -> None:
    model = _model(
        [
            {
                "session": "parent",
                "responses": [
                    {
                        # Asks for more tokens than the root has left: clamped.
                        "tool_calls": [_delegate("L1", max_tokens=5000)],
                        "usage": {"input_tokens": 100, "output_tokens": 10},
                    },
                    {"text": "root started"},
                    {"text": "root noted"},
                ],
            },
            _level("L1", (50, 5), _delegate("L2", max_turns=4)),  # lowers the turns
            _level("L2", (20, 2), _delegate("L3", deadline_seconds=10)),  # lowers the deadline
            _level("L3", (1, 1)),
        ]
    )
    root_budget = Budget(max_turns=10, max_tokens=1000, seconds=600)
    async with _runtime(tmp_path, model, budget=root_budget, max_depth=3) as rt:
        parent, _ = await _started(rt)
        assert parent.budget is not None and parent.budget.seconds is None
        deadline = parent.budget.deadline  # the root's 600 s, resolved when it started
        assert deadline is not None
        ids = {label: _child_with_label(rt, label) for label in ("L1", "L2", "L3")}
    # The root was in its first of 10 turns and had spent 110: turns are shared down the tree
    # too, so a child gets the turns its ancestors have left (the current one is spent).
    assert _budget_of(tmp_path, ids["L1"]) == {"max_turns": 9, "max_tokens": 890, "deadline": deadline}
    assert _budget_of(tmp_path, ids["L2"]) == {"max_turns": 4, "max_tokens": 835, "deadline": deadline}
    l3 = _budget_of(tmp_path, ids["L3"])
    assert l3 is not None and (l3["max_turns"], l3["max_tokens"]) == (3, 813)
    assert l3["deadline"] < deadline
    assert 10_000 <= l3["deadline"] - _child_created_at(tmp_path, ids["L3"]) <= 11_000
    for sid in ids.values():  # every level finished within its budget
        assert all(r == {"kind": "completed"} for r in _reasons(_events(tmp_path, sid))), sid


def _child_with_label(rt: Any, label: str) -> str:
    for sid in ("c-1", "c-2", "c-3"):
        events = _events(Path(rt.root), sid)
        if _of(events, "subagent/descriptor")[0]["label"] == label:
            return sid
    raise AssertionError(label)


async def test_a_child_of_a_parent_out_of_tokens_gets_none(tmp_path: Path) -> None:
    """The remainder is what is left when the child is made: a parent that has spent its
    tokens gives a child a zero budget, whatever the call asks — it stops before any call."""
    model = _model(
        [
            {
                "session": "parent",
                "responses": [
                    {
                        "tool_calls": [_delegate("worker", max_tokens=500)],
                        "usage": {"input_tokens": 60, "output_tokens": 40},
                    },
                    {"text": "never asked for"},
                ],
            },
            {"label": "worker", "responses": [{"text": "never asked for"}]},
        ]
    )
    async with _runtime(tmp_path, model, budget=Budget(max_tokens=100)) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("go")
        await rt.subagents.wait_tree_idle(parent)
    assert _budget_of(tmp_path, "c-1") == {"max_tokens": 0}
    assert _reasons(_events(tmp_path, "c-1")) == [{"kind": "budget", "message": "max_tokens 0 reached: 0 used"}]
    parent_events = _events(tmp_path, "parent")
    assert _reasons(parent_events)[0] == {"kind": "budget", "message": "max_tokens 100 reached: 100 used"}


async def test_a_fork_counts_only_its_own_tokens_not_its_inherited_prefix(tmp_path: Path) -> None:
    model = _model(
        [
            {
                "session": "parent",
                "responses": [
                    {"text": "hello", "usage": {"input_tokens": 100, "output_tokens": 10}},
                    {"tool_calls": [_call("subagent_fork", description="twin", prompt="go", max_tokens=600)]},
                    {"text": "started"},
                    {"text": "noted"},
                ],
            },
            {
                "label": "twin",
                "responses": [
                    {"tool_calls": [_call("list_agents")], "usage": {"input_tokens": 200, "output_tokens": 50}},
                    {"text": "twin done"},
                ],
            },
        ]
    )
    async with _runtime(tmp_path, model, budget=Budget(max_tokens=1000)) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("first")
        await parent.wait_idle()
        await parent.send("fork now")
        await rt.subagents.wait_tree_idle(parent)
    events = _events(tmp_path, "c-1")
    assert any(t == "session/end-seed" for t, _ in events)  # it inherited the first turn (110 tokens)
    assert _budget_of(tmp_path, "c-1") == {"max_tokens": 600}
    # 250 of its own and the second call's estimated ~270: within 600; with the inherited 110
    # counted it would have been refused.
    assert _reasons(events)[-1] == {"kind": "completed"}
    assert _texts(_of(events, "assistant/message")[-1]) == ["twin done"]


# --- cold resume -------------------------------------------------------------------------------


def _worker_script(parent_notes: int, child: list[Json]) -> ScriptedModel:
    return _model(
        [
            {"session": "parent", "responses": [{"text": f"noted {i}"} for i in range(1, parent_notes + 1)]},
            {"label": "worker", "responses": child},
        ]
    )


async def _message(rt: Any, parent: Agent, child: str, text: str) -> None:
    await rt.subagents.send_message(parent, child, text)
    await rt.subagents.wait_tree_idle(parent)


async def test_cold_resume_keeps_the_budget_and_recounts_the_turns_spent(tmp_path: Path) -> None:
    """A child that used 2 of its 3 turns before a restart gets exactly 1 more after it."""
    first = _worker_script(2, [{"text": "answer 1"}, {"text": "answer 2"}])
    async with _runtime(tmp_path, first) as rt:
        parent = await rt.agents.create(session_id="parent")
        child = await rt.subagents.start_continuable(
            parent, "spawn", "worker", "go", options=ChildOptions(budget=Budget(max_turns=3))
        )
        await rt.subagents.wait_tree_idle(parent)
        await _message(rt, parent, child, "again")
    assert _reasons(_events(tmp_path, child)) == [{"kind": "completed"}] * 2
    # A new process: a fresh script (positions start over) with one answer for the child.
    second = _worker_script(2, [{"text": "answer 3"}, {"text": "never asked for"}])
    async with _runtime(tmp_path, second) as rt:
        parent = await rt.agents.resume("parent")
        await _message(rt, parent, child, "a third time")
        await _message(rt, parent, child, "a fourth time")
    events = _events(tmp_path, child)
    assert _reasons(events) == [{"kind": "completed"}] * 3 + [{"kind": "budget", "message": "max_turns 3 reached"}]
    assert [_texts(a) for a in _of(events, "assistant/message")] == [["answer 1"], ["answer 2"], ["answer 3"]]
    assert _budget_of(tmp_path, child) == {"max_turns": 3}
    assert _notices(_events(tmp_path, "parent"))[-1][0] == (
        f"Background subagent {child} ran out of its budget before it finished (max_turns 3 reached)."
    )


async def test_cold_resume_recounts_the_tokens_spent_from_the_log(tmp_path: Path) -> None:
    usage = {"input_tokens": 300, "output_tokens": 100}
    first = _worker_script(1, [{"text": "answer 1", "usage": usage}])
    async with _runtime(tmp_path, first) as rt:
        parent = await rt.agents.create(session_id="parent")
        child = await rt.subagents.start_continuable(
            parent, "spawn", "worker", "go", options=ChildOptions(budget=Budget(max_tokens=800))
        )
        await rt.subagents.wait_tree_idle(parent)
    second = _worker_script(
        2, [{"text": "answer 2", "usage": {"input_tokens": 300, "output_tokens": 150}}, {"text": "never asked for"}]
    )
    async with _runtime(tmp_path, second) as rt:
        parent = await rt.agents.resume("parent")
        await _message(rt, parent, child, "again")  # 400 of 800 spent, this call ~200: made
        await _message(rt, parent, child, "and again")  # 850 spent: none (the overshoot reported)
    assert _reasons(_events(tmp_path, child)) == [
        {"kind": "completed"},
        {"kind": "completed"},
        {"kind": "budget", "message": "max_tokens 800 reached: 850 used (50 over)"},
    ]


async def test_a_redelivered_budget_notice_still_names_the_budget(tmp_path: Path) -> None:
    """The settled record carries the reason message, so a notice delivered again after a
    restart says the same; and a turn/end reason kind this reader does not know is read (as an
    error), not refused as corrupt."""
    model = _model([{"session": "parent", "responses": [{"text": "noted"}]}])
    store = FileLogStore(str(tmp_path), compression="none")
    try:
        persist_log(
            store,
            header("parent"),
            [
                turn_start_event(0, T + 1),
                _event(1, "turn/end", {"turn": 1, "reason": {"kind": "finished-by-a-newer-writer"}}),
                _event(
                    2,
                    "subagent/settled",
                    {"child_id": "c-9", "reason_kind": "budget", "reason_message": "deadline reached"},
                ),
            ],
        )
    finally:
        store.close_store()
    async with _runtime(tmp_path, model) as rt:
        parent = await rt.agents.resume("parent")
        await parent.wait_idle()
    assert _notices(_events(tmp_path, "parent")) == [
        [
            "Background subagent c-9 ran out of its budget before it finished (deadline reached).",
            "It left no closing message.",
        ]
    ]


def _event(seq: int, type_: str, data: Json) -> Event:
    return make_event(seq, type_, T + seq + 1, data)


# --- the root's budget and one-shot children -------------------------------------------------------


async def test_the_root_budget_from_open_runtime_limits_the_root(tmp_path: Path) -> None:
    model = _model([{"session": "parent", "responses": [{"text": "one"}, {"text": "never asked for"}]}])
    async with _runtime(tmp_path, model, budget=Budget(max_turns=1)) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("first")
        first = await parent.wait_idle()
        await parent.send("second")
        second = await parent.wait_idle()
    assert first is not None and first.reason == {"kind": "completed"}
    assert second is not None and second.reason == {"kind": "budget", "message": "max_turns 1 reached"}


async def test_a_one_shot_child_out_of_budget_fails_its_call_naming_the_budget(tmp_path: Path) -> None:
    model = _model(
        [
            {
                "session": "parent",
                "responses": [
                    {"tool_calls": [_delegate("helper", run_in_background=False, max_tokens=60)]},
                    {"text": "saw it"},
                ],
            },
            {
                "label": "helper",
                "responses": [
                    {
                        "text": "partial",
                        "tool_calls": [_call("list_agents")],
                        "usage": {"input_tokens": 60, "output_tokens": 10},
                    },
                    {"text": "never asked for"},
                ],
            },
        ]
    )
    async with _runtime(tmp_path, model) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("go")
        await parent.wait_idle()
    (result,) = _of(_events(tmp_path, "parent"), "tool/result")
    (block,) = result["message"]["content"]
    assert block["is_error"] and block["content"][0]["text"] == (
        "Error: subagent run ran out of its budget before finishing\n"
        "Diagnostic: max_tokens 60 reached: 70 used (10 over)\n"
        "Partial output before the run ended:\npartial"
    )
    assert _budget_of(tmp_path, "c-1") is None  # a one-shot descriptor records no extras


# --- the values ----------------------------------------------------------------------------------


def test_clamping_remainders_and_resolution() -> None:
    parent = Budget(max_turns=4, max_tokens=1000, deadline=50_000)
    left = remainder(parent, Spent(turns=2, tokens=300), in_turn=True)
    assert left == Budget(max_turns=3, max_tokens=700, deadline=50_000)  # the current turn is left
    assert remainder(parent, Spent(turns=2, tokens=1200), in_turn=False) == Budget(
        max_turns=2, max_tokens=0, deadline=50_000
    )
    assert remainder(None, Spent(), in_turn=True) is None
    asked = Budget(max_turns=10, seconds=30).resolved(now_ms=40_000)
    assert asked == Budget(max_turns=10, deadline=70_000)
    assert asked.clamped(left) == Budget(max_turns=3, max_tokens=700, deadline=50_000)
    assert Budget(seconds=1).resolved(now_ms=0).clamped(left).deadline == 1000
    assert Budget().unlimited and not Budget(max_tokens=0).unlimited
    for bad in ({"max_turns": -1}, {"max_tokens": True}, {"deadline": 1.5}, {"seconds": 0}, {"seconds": float("inf")}):
        with pytest.raises(ValueError):
            Budget(**bad)


def test_the_descriptor_records_a_budget_strictly() -> None:
    descriptor = SubagentDescriptor(
        mode="continuable", provider="spawn", label="w", budget=Budget(max_turns=3, deadline=99)
    )
    payload = snapshot_descriptor(descriptor)
    assert payload["budget"] == {"max_turns": 3, "deadline": 99}
    assert parse_descriptor(payload) == descriptor
    for bad in ({}, {"max_turns": "3"}, {"max_turns": -1}, {"seconds": 3}, [3], {"max_tokens": 2.0}):
        with pytest.raises(MalformedDescriptor):
            parse_descriptor({**payload, "budget": bad})
    assert isinstance(parse_budget({"max_tokens": 5}), Budget)
    with pytest.raises(MalformedDescriptor):  # one-shot descriptors carry no extras
        parse_descriptor({"version": 2, "mode": "one-shot", "provider": "spawn", "budget": {"max_turns": 1}})
    with pytest.raises(ValueError):  # a recorded budget is resolved
        SubagentDescriptor(mode="continuable", provider="spawn", label="w", budget=Budget(seconds=5))


def test_a_token_budget_counts_cache_reads_and_writes_as_the_running_agent_does() -> None:
    usage = {"input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 900, "cache_write_tokens": 40}
    message = {"id": "m", "role": "assistant", "content": [], "source": {"kind": "model"}}
    data = {"turn": 1, "step": 1, "message": message, "finish": "stop", "usage": usage}
    assert reply_tokens(make_event(0, "assistant/message", 1, data, surface_op="append")) == 955
    plain = {**data, "usage": {"input_tokens": 10, "output_tokens": 5}}
    assert reply_tokens(make_event(0, "assistant/message", 1, plain, surface_op="append")) == 15
