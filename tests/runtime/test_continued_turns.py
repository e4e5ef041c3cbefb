"""Continued turns through the agent (issue 27 items 1-2; docs/format.md, "Continued turns"): a
log a crash left with an open turn, written by hand, resumed by a runtime over real files. Each
branch of the planner is driven through the agent: the lost model call issued again, an
idempotent started call run again, a non-idempotent one in doubt, an unstarted one run, a second
continuation counting attempt 3, a continued turn cancelled, and the `close` policy."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio
from log_lines import header_line, json_line, new_log_file, read_all
from subagents.runtime import (
    Agent,
    AgentConfig,
    CountingIds,
    FunctionTool,
    Runtime,
    ScenarioClock,
    ScriptedModel,
    SessionUsage,
    Tokens,
    ToolContext,
    load_script,
    open_runtime,
    usage_lines,
    usage_of,
)
from subagents.storage import TOOL_OUTCOME_UNKNOWN_TEXT, Event, FileLogStore, plan_continuation
from wrapped_models import WrappedModel

Json = dict[str, Any]
T0 = 1_700_000_000_001
GUARD = 10


def scripted(*responses: Json) -> ScriptedModel:
    return ScriptedModel(load_script(json.dumps({"agents": [{"responses": list(responses)}]})))


class Counting(WrappedModel):
    """A model wrapper that keeps the messages of every request."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.requests: list[list[Json]] = []
        self.called = trio.Event()

    def answer(self, session: Any, inner: Any, request: Any) -> AsyncIterator[Any]:
        self.requests.append(list(request.messages))
        self.called.set()
        return inner.stream(request)


@asynccontextmanager
async def runtime(root: Any, model: Any, tools: Sequence[FunctionTool] = (), **config: Any) -> AsyncIterator[Runtime]:
    async with open_runtime(
        root,
        model=model,
        clock=ScenarioClock(),
        id_factory=CountingIds("s"),
        compression="none",
        agent_config=AgentConfig(**config),
        tools=lambda: list(tools),
    ) as rt:
        yield rt


class Cut:
    """A log a crash cut, by hand: seqs are positions."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def add(self, type_: str, data: Json, **envelope: Any) -> Cut:
        seq = len(self.lines)
        self.lines.append(json_line(seq, type_, data, time=T0 + seq, **envelope))
        return self

    def start(self, step: int = 1) -> Cut:
        self.add("turn/start", {"turn": 1, "trigger": {"kind": "message"}})
        self.add("step/start", {"turn": 1, "step": step})
        message = {
            "id": "msg-1",
            "role": "user",
            "content": [{"type": "text", "text": "go"}],
            "source": {"kind": "user"},
        }
        return self.add("user/message", {"turn": 1, "step": step, "message": message}, surface_op="append")

    def reply(self, *calls: tuple[str, str]) -> Cut:
        content = [{"type": "tool-call", "id": cid, "name": name, "arguments": "{}"} for cid, name in calls]
        message = {"id": "msg-2", "role": "assistant", "content": content, "source": {"kind": "model"}}
        data = {"turn": 1, "step": 1, "finish": "tool-calls", "message": message}
        return self.add("assistant/message", data, surface_op="append")

    def call(self, call_id: str, name: str) -> Cut:
        return self.add("tool/call", {"turn": 1, "step": 1, "call_id": call_id, "name": name, "arguments": "{}"})

    def write(self, root: Any) -> None:
        new_log_file(root, "s-1", "none").write_bytes(
            header_line("s-1", created_at=1_700_000_000_000) + b"".join(self.lines)
        )


def read(root: Any) -> list[Event]:
    return read_all(FileLogStore(str(root), compression="none", use_index=False), "s-1")


def data(event: Event) -> Json:
    return msgspec.json.decode(event.data)


def after(events: list[Event], n: int) -> list[tuple[str, Json]]:
    return [(e.type, data(e)) for e in events[n:]]


def counted_tool(name: str, runs: list[str], *, idempotent: bool) -> FunctionTool:
    async def fn(args: Json, ctx: ToolContext) -> str:
        runs.append(ctx.call_id)
        return f"{name} ran"

    return FunctionTool(name=name, description=name, fn=fn, idempotent=idempotent)


def result_of(event: Event) -> tuple[str, str, Any, Any]:
    d = data(event)
    block = d["message"]["content"][0]
    return (block["call_id"], block["content"][0]["text"], d.get("error"), d.get("in_doubt"))


async def test_a_lost_model_call_is_issued_again_in_the_same_turn_and_step(tmp_path) -> None:
    Cut().start().write(tmp_path)
    model = Counting(scripted({"text": "ANSWER"}))
    async with runtime(tmp_path, model) as rt:
        with trio.fail_after(GUARD):
            agent = await rt.agents.resume("s-1")
            assert agent.status == "running"  # from the start: nobody takes it for idle
            result = await agent.wait_idle()
        assert agent.resumed_interrupted is False
    assert result is not None and (result.turn, result.reason, result.text) == (1, {"kind": "completed"}, "ANSWER")
    assert [[m["role"] for m in r] for r in model.requests] == [["user"]]
    events = read(tmp_path)
    tail = after(events, 3)
    assert [t for t, _ in tail] == ["turn/continue", "assistant/message", "step/end", "turn/end"]
    assert tail[0][1] == {"turn": 1, "step": 1, "attempt": 2, "lost_model_call": True}
    assert (tail[1][1]["turn"], tail[1][1]["step"], tail[1][1]["attempt"]) == (1, 1, 2)
    assert tail[3][1] == {"turn": 1, "reason": {"kind": "completed"}}
    assert [t for t, _ in after(events, 0)].count("turn/start") == 1
    # The lost call's usage is unknown, not zero: counted apart, and said so.
    per_turn, total = usage_of(events)
    assert per_turn[1] == Tokens(calls=1, reported=0, unknown_calls=1)
    assert total.to_json()["unknown_calls"] == 1
    shown = usage_lines(SessionUsage(session_id="s-1", turns=tuple(per_turn.items()), total=total))
    assert shown == [
        "turn 1: not reported (1 model call) +1 call unknown",
        "session s-1: not reported (1 model call) +1 call unknown",
    ]
    more = Tokens(input_tokens=5, output_tokens=2, calls=2, reported=2, unknown_calls=2)
    assert usage_lines(SessionUsage(session_id="x", turns=(), total=more)) == [
        "session x: 5 in, 2 out tokens (2 model calls) +2 calls unknown"
    ]


async def test_a_started_idempotent_call_runs_again_and_the_turn_goes_on(tmp_path) -> None:
    Cut().start().reply(("call_1_1", "look")).call("call_1_1", "look").write(tmp_path)
    runs: list[str] = []
    model = Counting(scripted({"text": "DONE"}))
    async with runtime(tmp_path, model, [counted_tool("look", runs, idempotent=True)]) as rt:
        with trio.fail_after(GUARD):
            agent = await rt.agents.resume("s-1")
            result = await agent.wait_idle()
    assert result is not None and (result.turn, result.reason, result.text) == (1, {"kind": "completed"}, "DONE")
    assert runs == ["call_1_1"]
    tail = after(read(tmp_path), 5)
    assert [t for t, _ in tail] == [
        "turn/continue",
        "tool/call",
        "tool/result",
        "step/end",
        "step/start",
        "assistant/message",
        "step/end",
        "turn/end",
    ]
    assert tail[0][1] == {"turn": 1, "step": 1, "attempt": 2, "lost_model_call": False}
    assert tail[1][1]["call_id"] == "call_1_1"
    assert "in_doubt" not in tail[2][1] and "error" not in tail[2][1]
    assert tail[4][1] == {"turn": 1, "step": 2}
    assert "attempt" not in tail[5][1]  # a new call of a new step, not one issued again
    # The model's next request sees the re-run's result as the call's answer.
    assert [m["role"] for m in model.requests[0]] == ["user", "assistant", "user"]


async def test_a_started_call_of_a_tool_not_idempotent_is_in_doubt_and_not_run(tmp_path) -> None:
    cut = Cut().start().reply(("call_1_1", "shell"), ("call_1_2", "look"))
    cut.call("call_1_1", "shell").write(tmp_path)
    runs: list[str] = []
    tools = [counted_tool("shell", runs, idempotent=False), counted_tool("look", runs, idempotent=True)]
    model = Counting(scripted({"text": "OK"}))
    async with runtime(tmp_path, model, tools) as rt:
        with trio.fail_after(GUARD):
            agent = await rt.agents.resume("s-1")
            await agent.wait_idle()
    assert runs == ["call_1_2"]  # the unstarted call runs; the started shell call does not
    events = read(tmp_path)
    results = [e for e in events if e.type == "tool/result"]
    assert [result_of(e) for e in results] == [
        (
            "call_1_1",
            TOOL_OUTCOME_UNKNOWN_TEXT,
            {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"},
            True,
        ),
        ("call_1_2", "look ran", None, None),
    ]
    assert results[0].source_event_seqs == [4]  # its `tool/call`
    assert data(events[-1]) == {"turn": 1, "reason": {"kind": "completed"}}
    # Both results precede the next step's model call.
    assert [m["role"] for m in model.requests[0]] == ["user", "assistant", "user", "user"]


async def test_a_second_continuation_counts_attempt_three(tmp_path) -> None:
    cut = Cut().start().add("turn/continue", {"turn": 1, "step": 1, "attempt": 2, "lost_model_call": True})
    cut.write(tmp_path)
    async with runtime(tmp_path, scripted({"text": "THIRD"})) as rt:
        with trio.fail_after(GUARD):
            agent = await rt.agents.resume("s-1")
            await agent.wait_idle()
    tail = after(read(tmp_path), 4)
    assert tail[0] == ("turn/continue", {"turn": 1, "step": 1, "attempt": 3, "lost_model_call": True})
    assert tail[1][0] == "assistant/message" and tail[1][1]["attempt"] == 3


async def test_a_continued_turn_is_cancellable(tmp_path) -> None:
    Cut().start().write(tmp_path)
    model = Counting(scripted({"hang": True}))
    async with runtime(tmp_path, model) as rt:
        with trio.fail_after(GUARD):
            agent = await rt.agents.resume("s-1")
            await model.called.wait()
            assert agent.cancel("user")
            result = await agent.wait_idle()
    assert result is not None and result.reason == {"kind": "aborted", "cause": "user"}
    assert after(read(tmp_path), 3)[-2:] == [
        ("step/end", {"turn": 1, "step": 1}),
        ("turn/end", {"turn": 1, "reason": {"kind": "aborted", "cause": "user"}}),
    ]


async def test_a_continued_turn_at_its_step_limit_ends_blocked_after_the_open_steps_calls(tmp_path) -> None:
    Cut().start().reply(("call_1_1", "look")).write(tmp_path)
    runs: list[str] = []
    async with runtime(tmp_path, scripted(), [counted_tool("look", runs, idempotent=True)], max_steps=1) as rt:
        with trio.fail_after(GUARD):
            agent = await rt.agents.resume("s-1")
            result = await agent.wait_idle()
    assert runs == ["call_1_1"]
    assert result is not None and result.reason["kind"] == "blocked"


async def test_the_close_policy_closes_the_turn_as_before(tmp_path) -> None:
    Cut().start().write(tmp_path)
    model = Counting(scripted({"text": "NEW"}))
    async with runtime(tmp_path, model, on_interrupted_turn="close") as rt:
        with trio.fail_after(GUARD):
            agent = await rt.agents.resume("s-1")
            assert agent.status == "idle" and agent.resumed_interrupted is True
            await agent.send("again")
            result = await agent.wait_idle()
    assert result is not None and result.turn == 2
    tail = after(read(tmp_path), 3)
    assert tail[:2] == [
        ("step/end", {"turn": 1, "step": 1}),
        ("turn/end", {"turn": 1, "reason": {"kind": "interrupted"}}),
    ]
    assert "turn/continue" not in [t for t, _ in tail]


async def test_a_stopped_session_s_open_turn_is_closed_not_continued(tmp_path) -> None:
    # Its stop recorded the marker, then the process died before the turn closed: stopped means
    # stopped, so the resume closes the turn whatever the policy says.
    Cut().start().add("session/stopped", {"by": "operator", "tree": False}).write(tmp_path)
    model = Counting(scripted({"text": "NEW"}))
    async with runtime(tmp_path, model) as rt:
        with trio.fail_after(GUARD):
            agent = await rt.agents.resume("s-1")
            assert agent.status == "idle" and agent.resumed_interrupted is True
    tail = after(read(tmp_path), 4)
    assert [t for t, _ in tail] == ["step/end", "turn/end"]
    assert tail[-1][1]["reason"] == {"kind": "interrupted"}
    assert model.requests == []


async def test_a_turn_continued_after_its_reply_leaves_no_continuation_for_the_next_resume(tmp_path) -> None:
    Cut().start().write(tmp_path)
    async with runtime(tmp_path, scripted({"text": "ONE"})) as rt:
        with trio.fail_after(GUARD):
            await (await rt.agents.resume("s-1")).wait_idle()
    settled = read(tmp_path)
    async with runtime(tmp_path, scripted({"text": "TWO"})) as rt:
        with trio.fail_after(GUARD):
            agent = await rt.agents.resume("s-1")
            assert agent.status == "idle"
    assert read(tmp_path) == settled  # nothing more is appended


# --- a `subagent` call cut after it started: reconciled from the parent's catalog ------------


def _subagent_cut(root: Any, catalog: Json | None, *, background: bool = True) -> None:
    arguments = json.dumps({"description": "helper", "prompt": "help", "run_in_background": background})
    cut = Cut().start()
    content = [{"type": "tool-call", "id": "call_1_1", "name": "subagent", "arguments": arguments}]
    message = {"id": "msg-2", "role": "assistant", "content": content, "source": {"kind": "model"}}
    cut.add(
        "assistant/message", {"turn": 1, "step": 1, "finish": "tool-calls", "message": message}, surface_op="append"
    )
    cut.add("tool/call", {"turn": 1, "step": 1, "call_id": "call_1_1", "name": "subagent", "arguments": arguments})
    if catalog is not None:
        cut.add("subagent/catalog", {"version": 1, "child_created_at": T0, **catalog})
    cut.write(root)


async def _resume_parent(root: Any, child_responses: Sequence[Json] = ()) -> tuple[Any, list[Event]]:
    script = {
        "agents": [
            {"session": "s-1", "responses": [{"text": "PARENT DONE"}, {"text": "NOTICED"}]},
            {"label": "helper", "responses": list(child_responses)},
        ]
    }
    async with runtime(root, ScriptedModel(load_script(json.dumps(script)))) as rt:
        with trio.fail_after(GUARD):
            agent = await rt.agents.resume("s-1")
            result = await rt.subagents.wait_tree_idle(agent)
    return result, read(root)


def _subagent_result(events: list[Event]) -> tuple[str, Any, Any]:
    (result,) = [e for e in events if e.type == "tool/result"]
    call_id, text, error, in_doubt = result_of(result)
    assert call_id == "call_1_1"
    return text, error, in_doubt


async def test_a_cut_subagent_call_whose_continuable_child_is_catalogued_is_not_started_again(tmp_path) -> None:
    _subagent_cut(tmp_path, {"child_id": "kid-1", "mode": "continuable", "call_id": "call_1_1"})
    result, events = await _resume_parent(tmp_path)
    assert result is not None and result.text == "PARENT DONE"
    assert _subagent_result(events) == ("started subagent kid-1", None, None)
    assert len([e for e in events if e.type == "subagent/catalog"]) == 1
    assert [e for e in events if e.type == "tool/call"][1:] == []  # not run again


async def test_a_cut_subagent_call_with_no_catalog_never_reached_its_child_and_runs(tmp_path) -> None:
    _subagent_cut(tmp_path, None)
    result, events = await _resume_parent(tmp_path, [{"text": "CHILD DONE"}])
    assert result is not None
    (catalog,) = [data(e) for e in events if e.type == "subagent/catalog"]
    assert catalog["call_id"] == "call_1_1"
    text, error, in_doubt = _subagent_result(events)
    assert text == f"started subagent {catalog['child_id']}" and (error, in_doubt) == (None, None)


async def test_a_cut_subagent_call_in_a_log_without_call_ids_is_in_doubt(tmp_path) -> None:
    _subagent_cut(tmp_path, {"child_id": "kid-1", "mode": "continuable"})
    _, events = await _resume_parent(tmp_path)
    assert _subagent_result(events) == (
        TOOL_OUTCOME_UNKNOWN_TEXT,
        {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"},
        True,
    )


async def test_a_cut_one_shot_subagent_call_is_in_doubt_naming_its_child(tmp_path) -> None:
    _subagent_cut(tmp_path, {"child_id": "kid-1", "mode": "one-shot", "call_id": "call_1_1"}, background=False)
    _, events = await _resume_parent(tmp_path)
    text, error, in_doubt = _subagent_result(events)
    assert "kid-1" in text and "outcome is unknown" in text
    assert (error["code"], in_doubt) == ("TOOL_OUTCOME_UNKNOWN", True)


async def test_runtime_resume_may_choose_the_policy_for_this_resume(tmp_path) -> None:
    """What a host that asked the person calls: the runtime's policy is continue, this resume closes."""
    Cut().start().write(tmp_path)
    async with runtime(tmp_path, scripted()) as rt:
        with trio.fail_after(GUARD):
            found = await rt.open_turn("s-1")
            assert found is not None and found.marker() == {"turn": 1, "step": 1, "attempt": 2, "lost_model_call": True}
            agent = await rt.resume("s-1", on_interrupted_turn="close")
            assert agent.status == "idle" and agent.resumed_interrupted
    assert data(read(tmp_path)[-1]) == {"turn": 1, "reason": {"kind": "interrupted"}}


async def test_steering_joins_a_continued_turn_at_its_next_step(tmp_path) -> None:
    Cut().start().reply(("call_1_1", "look")).call("call_1_1", "look").write(tmp_path)
    started, gate = trio.Event(), trio.Event()

    async def held(args: Json, ctx: ToolContext) -> str:
        started.set()
        await gate.wait()
        return "looked"

    look = FunctionTool(name="look", description="look", fn=held, idempotent=True)
    model = Counting(scripted({"text": "STEERED"}))
    async with runtime(tmp_path, model, [look]) as rt:
        with trio.fail_after(GUARD):
            agent = await rt.agents.resume("s-1")
            await started.wait()  # the continued step's call runs again
            await agent.send("also this", "steer")
            gate.set()
            result = await agent.wait_idle()
    assert result is not None and (result.turn, result.text) == (1, "STEERED")
    steered = [(t, d) for t, d in after(read(tmp_path), 5) if t == "user/message"]
    assert [(d["turn"], d["step"], d["message"]["content"][0]["text"]) for _, d in steered] == [(1, 2, "also this")]
    assert model.requests[0][-1]["content"] == [{"type": "text", "text": "also this"}]


async def test_a_continued_turn_cancelled_as_soon_as_it_is_resumed_closes_its_open_step(tmp_path) -> None:
    """Whether or not its driver has reached the model call yet, the cancel is not lost (the
    continued turn's abort exists with the agent) and the open step is closed."""
    Cut().start().write(tmp_path)
    async with runtime(tmp_path, scripted({"hang": True})) as rt:
        with trio.fail_after(GUARD):
            agent = await rt.agents.resume("s-1")
            assert agent.cancel("user")
            result = await agent.wait_idle()
    assert result is not None and result.reason == {"kind": "aborted", "cause": "user"}
    assert after(read(tmp_path), 4) == [
        ("step/end", {"turn": 1, "step": 1}),
        ("turn/end", {"turn": 1, "reason": {"kind": "aborted", "cause": "user"}}),
    ]


async def test_a_cancel_before_the_continued_turns_driver_runs_closes_the_open_step_unasked(tmp_path) -> None:
    """The branch a race may or may not reach above, forced: the agent is cancelled before its
    driver starts; its model is never asked."""
    Cut().start().write(tmp_path)
    model = Counting(scripted({"text": "NEVER"}))
    async with runtime(tmp_path, model) as rt:
        with trio.fail_after(GUARD):
            ref, events = await rt.sessions.open_with_events("s-1")
            plan = plan_continuation(events, session_id="s-1")
            agent = Agent(
                ref, model=model, tools=rt.agents.tools("s-1"), clock=ScenarioClock(), events=events, continuation=plan
            )
            assert agent.status == "running" and agent.cancel("user")
            async with trio.open_nursery() as nursery:
                await nursery.start(agent.run)
                result = await agent.wait_idle()
                await agent.stop()
            await rt.sessions.release("s-1")
    assert result is not None and result.reason == {"kind": "aborted", "cause": "user"}
    assert model.requests == []
    assert after(read(tmp_path), 3) == [
        ("step/end", {"turn": 1, "step": 1}),
        ("turn/end", {"turn": 1, "reason": {"kind": "aborted", "cause": "user"}}),
    ]
