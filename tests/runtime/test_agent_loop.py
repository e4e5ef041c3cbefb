"""The agent loop end to end (SPEC 3.2, 3.4, 5.2, 5.6): turns, steps, tools, the inbox,
cancellation, failures, resume and compaction — over real files, with the scripted model.

Every test runs `open_runtime` on `tmp_path` with plain logs, a `ScenarioClock` (its `sleep`
only yields, so a tool-abort grace or a `delay_ms` costs no real time) and counting ids, then
reads the log back from disk and compares events. Ordering never depends on timing: tests hold
the model with `wait_for: {"steered": true}` / `hang: true` or a hand-made model, hold tools on
`trio.Event`s, and learn that a model call started from a recording wrapper.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio
import trio.testing
from log_lines import header_line, json_line, new_log_file, read_all
from subagents.actors import EventDraft
from subagents.runtime.agent.compaction import CompactionPolicy
from subagents.runtime.agent.loop import Agent, AgentConfig
from subagents.runtime.app import Runtime, open_runtime
from subagents.runtime.foundation.clock import ScenarioClock
from subagents.runtime.foundation.errors import ToolFailure
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.models.base import Chunk, Finish, Model, ModelRequest, SessionBinding, TextDelta
from subagents.runtime.models.messages import Surface
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel
from subagents.runtime.tools.base import FunctionTool, ToolContext
from subagents.storage import UNSET, Event, FileLogStore, ReplaceOp, SessionNotFound
from subagents.storage.closers import TOOL_NOT_STARTED_TEXT, TOOL_OUTCOME_UNKNOWN_TEXT
from wrapped_models import WrappedModel

Json = dict[str, Any]

# --- helpers ----------------------------------------------------------------------------------


def scripted(*responses: Json, summaries: Sequence[str] | None = None) -> ScriptedModel:
    """A scripted model with one unnamed entry holding `responses`."""
    document: Json = {"agents": [{"responses": list(responses)}]}
    if summaries is not None:
        document["summaries"] = list(summaries)
    return ScriptedModel(load_script(json.dumps(document)))


class Recording(WrappedModel):
    """A `Model` wrapper that keeps every request and lets a test wait for the n-th call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.requests: list[ModelRequest] = []
        self._lot = trio.lowlevel.ParkingLot()

    def answer(self, session: SessionBinding, inner: Model, request: ModelRequest) -> AsyncIterator[Chunk]:
        self.requests.append(request)
        self._lot.unpark_all()
        return inner.stream(request)

    async def wait_calls(self, n: int) -> None:
        while len(self.requests) < n:
            await self._lot.park()

    def turn_requests(self) -> list[ModelRequest]:
        return [r for r in self.requests if r.purpose == "turn"]


class PartialThenHang:
    """A model that streams exactly `pieces`, says so, then hangs until cancelled."""

    def __init__(self, *pieces: str) -> None:
        self.pieces = pieces
        self.streamed = trio.Event()

    def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        return self._play()

    async def _play(self) -> AsyncIterator[Chunk]:
        for piece in self.pieces:
            yield TextDelta(piece)
        # Resumed only when the consumer asks for the next chunk: every piece was taken.
        self.streamed.set()
        await trio.sleep_forever()


@asynccontextmanager
async def runtime(
    root: Any,
    model: Any,
    *,
    config: AgentConfig | None = None,
    tools: Sequence[FunctionTool] = (),
    clock: ScenarioClock | None = None,
) -> AsyncIterator[Runtime]:
    async with open_runtime(
        root,
        model=model,
        clock=clock if clock is not None else ScenarioClock(),
        id_factory=CountingIds("s"),
        compression="none",
        agent_config=config if config is not None else AgentConfig(),
        tools=lambda: list(tools),
    ) as rt:
        yield rt


def read_log(root: Any, session_id: str) -> list[Event]:
    """The session's events, read from disk by a store of our own."""
    return read_all(FileLogStore(str(root), compression="none", use_index=False), session_id)


def data(event: Event) -> Json:
    return msgspec.json.decode(event.data)


def types(events: Sequence[Event]) -> list[str]:
    return [e.type for e in events]


def text(msg: Json) -> str:
    """The text of a message: its text blocks, and those inside tool-result blocks."""
    out: list[str] = []
    for block in msg["content"]:
        if block["type"] == "text":
            out.append(block["text"])
        elif block["type"] == "tool-result":
            out.extend(b["text"] for b in block["content"] if b["type"] == "text")
    return "".join(out)


def brief(events: Sequence[Event]) -> list[tuple[Any, ...]]:
    """A readable digest of a log: type, turn/step, and what matters for each type."""
    rows: list[tuple[Any, ...]] = []
    for e in events:
        d = data(e)
        where = (d.get("turn"), d.get("step"))
        if e.type in ("user/message", "system/message"):
            rows.append((e.type, *where, text(d["message"])))
        elif e.type == "assistant/message":
            calls = [b["id"] for b in d["message"]["content"] if b["type"] == "tool-call"]
            rows.append((e.type, *where, text(d["message"]), d["finish"], calls))
        elif e.type == "tool/call":
            rows.append((e.type, *where, d["call_id"], d["name"]))
        elif e.type == "tool/result":
            rows.append((e.type, *where, d["message"]["source"]["call_id"], text(d["message"]), d.get("error")))
        elif e.type == "turn/start":
            rows.append((e.type, d["turn"]))
        elif e.type == "turn/end":
            rows.append((e.type, d["turn"], d["reason"]))
        elif e.type in ("step/start", "step/end"):
            rows.append((e.type, *where))
        else:
            rows.append((e.type, d))
    return rows


def assert_every_call_answered(events: Sequence[Event]) -> None:
    """Every `tool/call` of a closed turn has exactly one `tool/result`, before its `turn/end`;
    the only result without a `tool/call` is a closer for a call that never started."""
    open_calls: dict[str, int] = {}
    for e in events:
        d = data(e)
        if e.type == "tool/call":
            assert d["call_id"] not in open_calls, f"call {d['call_id']} recorded twice"
            open_calls[d["call_id"]] = e.seq
        elif e.type == "tool/result":
            call_id = d["message"]["source"]["call_id"]
            if d.get("error", {}).get("code") == "TOOL_NOT_STARTED":
                assert call_id not in open_calls, f"{call_id} started but its closer says it did not"
                continue
            assert call_id in open_calls, f"result for {call_id} without a tool/call"
            del open_calls[call_id]
        elif e.type == "turn/end":
            assert not open_calls, f"turn {d['turn']} closed with unanswered calls {sorted(open_calls)}"


def tool(name: str, fn: Callable[[Json, ToolContext], Any], *, parallel_safe: bool = True) -> FunctionTool:
    return FunctionTool(name=name, description=f"the {name} tool", fn=fn, parallel_safe=parallel_safe)


async def _echo(args: Json, ctx: ToolContext) -> str:
    return f"echo {json.dumps(args, sort_keys=True)}"


ECHO = tool("echo", _echo)


async def run_turns(rt: Runtime, *messages: str) -> tuple[Agent, Any]:
    agent = await rt.agents.create()
    for m in messages:
        await agent.send(m)
    return agent, await agent.wait_idle()


# --- steps and tools --------------------------------------------------------------------------


async def test_multi_step_tool_use_writes_each_step_and_feeds_results_back(tmp_path) -> None:
    model = Recording(
        scripted(
            {"text": "Let me look.", "tool_calls": [{"name": "echo", "arguments": {"path": "a.txt"}}]},
            {"tool_calls": [{"name": "echo", "arguments": {"path": "b.txt"}}]},
            {"text": "Both files read."},
        )
    )
    async with runtime(tmp_path, model, tools=[ECHO]) as rt:
        agent, result = await run_turns(rt, "read a and b")
    events = read_log(tmp_path, agent.session_id)
    assert brief(events) == [
        ("turn/start", 1),
        ("step/start", 1, 1),
        ("user/message", 1, 1, "read a and b"),
        ("assistant/message", 1, 1, "Let me look.", "tool-calls", ["call_1_1"]),
        ("tool/call", 1, 1, "call_1_1", "echo"),
        ("tool/result", 1, 1, "call_1_1", 'echo {"path": "a.txt"}', None),
        ("step/end", 1, 1),
        ("step/start", 1, 2),
        ("assistant/message", 1, 2, "", "tool-calls", ["call_2_1"]),
        ("tool/call", 1, 2, "call_2_1", "echo"),
        ("tool/result", 1, 2, "call_2_1", 'echo {"path": "b.txt"}', None),
        ("step/end", 1, 2),
        ("step/start", 1, 3),
        ("assistant/message", 1, 3, "Both files read.", "stop", []),
        ("step/end", 1, 3),
        ("turn/end", 1, {"kind": "completed"}),
    ]
    assert [e.seq for e in events] == list(range(len(events)))
    call = data(events[4])
    assert call == {"turn": 1, "step": 1, "call_id": "call_1_1", "name": "echo", "arguments": '{"path":"a.txt"}'}
    assert data(events[1]) == {"turn": 1, "step": 1}
    assert data(events[0]) == {"turn": 1, "trigger": {"kind": "message"}}
    result_event = events[5]
    assert result_event.surface_op == "append"
    assert data(result_event)["message"]["role"] == "user"
    assert data(result_event)["message"]["source"] == {"kind": "tool", "call_id": "call_1_1"}
    assert data(result_event)["message"]["content"][0]["is_error"] is False
    assert result.turn == 1 and result.reason == {"kind": "completed"} and result.text == "Both files read."
    # Each request sees the whole surface so far: the third one ends with the second result.
    third = model.turn_requests()[2].messages
    assert [m["role"] for m in third] == ["user", "assistant", "user", "assistant", "user"]
    assert text(third[-1]) == 'echo {"path": "b.txt"}'


async def test_parallel_tools_finishing_in_reverse_keep_model_order(tmp_path) -> None:
    names = ["a", "b", "c"]
    started = {k: trio.Event() for k in names}
    release = {k: trio.Event() for k in names}
    finished: list[str] = []
    finished_event = {k: trio.Event() for k in names}

    async def wait(args: Json, ctx: ToolContext) -> str:
        k = args["k"]
        started[k].set()
        await release[k].wait()
        finished.append(k)
        finished_event[k].set()
        return f"done {k}"

    model = scripted(
        {"tool_calls": [{"name": "wait", "arguments": {"k": k}} for k in names]},
        {"text": "all done"},
    )
    async with runtime(tmp_path, model, tools=[tool("wait", wait)]) as rt:
        agent = await rt.agents.create()
        await agent.send("go")
        for k in names:  # all three run at once: none finishes before every one started
            await started[k].wait()
        for k in reversed(names):
            release[k].set()
            await finished_event[k].wait()
        result = await agent.wait_idle()
    assert finished == ["c", "b", "a"]
    assert result.reason == {"kind": "completed"}
    rows = [r for r in brief(read_log(tmp_path, agent.session_id)) if r[0] in ("tool/call", "tool/result")]
    assert rows == [
        ("tool/call", 1, 1, "call_1_1", "wait"),
        ("tool/call", 1, 1, "call_1_2", "wait"),
        ("tool/call", 1, 1, "call_1_3", "wait"),
        ("tool/result", 1, 1, "call_1_1", "done a", None),
        ("tool/result", 1, 1, "call_1_2", "done b", None),
        ("tool/result", 1, 1, "call_1_3", "done c", None),
    ]


async def test_tool_failures_become_error_results_and_the_turn_goes_on(tmp_path) -> None:
    async def fail(args: Json, ctx: ToolContext) -> str:
        raise ToolFailure("the disk is full", code="DISK_FULL")

    async def crash(args: Json, ctx: ToolContext) -> str:
        raise RuntimeError("boom")

    model = scripted(
        {
            "tool_calls": [
                {"name": "fail", "arguments": {}},
                {"name": "echo", "arguments": '{"path": '},
                {"name": "nope", "arguments": {}},
                {"name": "echo", "arguments": "[1, 2]"},
                {"name": "crash", "arguments": {}},
            ]
        },
        {"text": "I see the errors."},
    )
    async with runtime(tmp_path, model, tools=[ECHO, tool("fail", fail), tool("crash", crash)]) as rt:
        agent, result = await run_turns(rt, "try things")
    events = read_log(tmp_path, agent.session_id)
    calls = [data(e) for e in events if e.type == "tool/call"]
    assert [c["arguments"] for c in calls] == ["{}", '{"path": ', "{}", "[1, 2]", "{}"]  # raw, verbatim
    results = [data(e) for e in events if e.type == "tool/result"]
    assert [r["error"] for r in results] == [
        {"name": "ToolFailure", "code": "DISK_FULL"},
        {"name": "ToolArgumentsError", "code": "INVALID_ARGUMENTS"},
        {"name": "ToolNotFoundError", "code": "UNKNOWN_TOOL"},
        {"name": "ToolArgumentsError", "code": "INVALID_ARGUMENTS"},
        {"name": "RuntimeError", "code": "TOOL_FAILED"},
    ]
    texts = [text(r["message"]) for r in results]
    assert texts[0] == "Error: the disk is full"
    assert texts[1].startswith('Error: invalid arguments for tool "echo": malformed JSON')
    assert texts[2] == 'Error: unknown tool "nope"'
    assert texts[3] == 'Error: invalid arguments for tool "echo": expected a JSON object, got array'
    assert texts[4] == "Error: boom"
    assert all(r["message"]["content"][0]["is_error"] is True for r in results)
    assert result.reason == {"kind": "completed"} and result.text == "I see the errors."
    assert_every_call_answered(events)


# --- the inbox --------------------------------------------------------------------------------


async def test_steer_mid_turn_joins_the_next_step_of_the_same_turn(tmp_path) -> None:
    model = Recording(
        scripted(
            {"wait_for": {"steered": True}, "text": "Working on it."},
            {"text": "Switched to tests."},
        )
    )
    async with runtime(tmp_path, model) as rt:
        agent = await rt.agents.create()
        await agent.send("write the code")
        await model.wait_calls(1)
        assert agent.status == "running"
        await agent.send("write the tests first", "steer")
        result = await agent.wait_idle()
    assert brief(read_log(tmp_path, agent.session_id)) == [
        ("turn/start", 1),
        ("step/start", 1, 1),
        ("user/message", 1, 1, "write the code"),
        ("assistant/message", 1, 1, "Working on it.", "stop", []),
        ("step/end", 1, 1),
        ("step/start", 1, 2),
        ("user/message", 1, 2, "write the tests first"),
        ("assistant/message", 1, 2, "Switched to tests.", "stop", []),
        ("step/end", 1, 2),
        ("turn/end", 1, {"kind": "completed"}),
    ]
    assert result.turn == 1 and result.text == "Switched to tests."
    assert text(model.turn_requests()[1].messages[-1]) == "write the tests first"


async def test_steer_to_an_idle_agent_starts_a_turn(tmp_path) -> None:
    async with runtime(tmp_path, scripted({"text": "On it."})) as rt:
        agent = await rt.agents.create()
        await agent.send("hello", "steer")
        result = await agent.wait_idle()
    assert result is not None and result.turn == 1 and result.reason == {"kind": "completed"}
    assert ("user/message", 1, 1, "hello") in brief(read_log(tmp_path, agent.session_id))


async def test_two_follow_ups_run_as_two_turns(tmp_path) -> None:
    async with runtime(tmp_path, scripted({"text": "first reply"}, {"text": "second reply"})) as rt:
        agent, result = await run_turns(rt, "one", "two")
    assert brief(read_log(tmp_path, agent.session_id)) == [
        ("turn/start", 1),
        ("step/start", 1, 1),
        ("user/message", 1, 1, "one"),
        ("assistant/message", 1, 1, "first reply", "stop", []),
        ("step/end", 1, 1),
        ("turn/end", 1, {"kind": "completed"}),
        ("turn/start", 2),
        ("step/start", 2, 1),
        ("user/message", 2, 1, "two"),
        ("assistant/message", 2, 1, "second reply", "stop", []),
        ("step/end", 2, 1),
        ("turn/end", 2, {"kind": "completed"}),
    ]
    assert result.turn == 2 and result.text == "second reply"


async def test_follow_up_sent_mid_turn_waits_for_the_next_turn(tmp_path) -> None:
    model = Recording(scripted({"wait_for": {"steered": True}, "text": "r1"}, {"text": "r2"}))
    async with runtime(tmp_path, model) as rt:
        agent = await rt.agents.create()
        await agent.send("go")
        await model.wait_calls(1)
        await agent.send("later")  # releases the held response, but must not extend turn 1
        result = await agent.wait_idle()
    assert brief(read_log(tmp_path, agent.session_id)) == [
        ("turn/start", 1),
        ("step/start", 1, 1),
        ("user/message", 1, 1, "go"),
        ("assistant/message", 1, 1, "r1", "stop", []),
        ("step/end", 1, 1),
        ("turn/end", 1, {"kind": "completed"}),
        ("turn/start", 2),
        ("step/start", 2, 1),
        ("user/message", 2, 1, "later"),
        ("assistant/message", 2, 1, "r2", "stop", []),
        ("step/end", 2, 1),
        ("turn/end", 2, {"kind": "completed"}),
    ]
    assert result.turn == 2


async def test_inject_does_not_wake_an_idle_agent_but_joins_the_next_step(tmp_path) -> None:
    model = Recording(scripted({"text": "noted"}))
    async with runtime(tmp_path, model) as rt:
        agent = await rt.agents.create()
        await agent.send("context: the repo uses trio", "inject")
        await trio.testing.wait_all_tasks_blocked()
        assert agent.status == "idle"
        assert await agent.wait_idle() is None  # nothing would start a turn
        assert model.requests == []
        try:
            read_log(tmp_path, agent.session_id)
        except SessionNotFound:
            pass  # nothing was ever written: the session is not even published
        else:
            raise AssertionError("an injection alone wrote to the log")
        await agent.send("go")
        result = await agent.wait_idle()
    assert brief(read_log(tmp_path, agent.session_id)) == [
        ("turn/start", 1),
        ("step/start", 1, 1),
        ("user/message", 1, 1, "context: the repo uses trio"),
        ("user/message", 1, 1, "go"),
        ("assistant/message", 1, 1, "noted", "stop", []),
        ("step/end", 1, 1),
        ("turn/end", 1, {"kind": "completed"}),
    ]
    assert result.turn == 1


async def test_inject_mid_turn_joins_the_next_step_and_does_not_extend_a_finished_turn(tmp_path) -> None:
    model = Recording(
        scripted(
            {"wait_for": {"steered": True}, "tool_calls": [{"name": "echo", "arguments": {}}]},
            {"text": "step two"},
            {"wait_for": {"steered": True}, "text": "turn two"},
            {"text": "turn three"},
        )
    )
    async with runtime(tmp_path, model, tools=[ECHO]) as rt:
        agent = await rt.agents.create()
        await agent.send("go")
        await model.wait_calls(1)
        await agent.send("fyi one", "inject")  # step 2 exists (tool call): it joins it
        await agent.wait_idle()
        await agent.send("again")
        await model.wait_calls(3)
        await agent.send("fyi two", "inject")  # the turn ends without tools: waits, wakes nothing
        first = await agent.wait_idle()
        assert first.turn == 2
        await agent.send("third")
        result = await agent.wait_idle()
    rows = [
        r
        for r in brief(read_log(tmp_path, agent.session_id))
        if r[0] in ("turn/start", "step/start", "user/message", "turn/end")
    ]
    assert rows == [
        ("turn/start", 1),
        ("step/start", 1, 1),
        ("user/message", 1, 1, "go"),
        ("step/start", 1, 2),
        ("user/message", 1, 2, "fyi one"),
        ("turn/end", 1, {"kind": "completed"}),
        ("turn/start", 2),
        ("step/start", 2, 1),
        ("user/message", 2, 1, "again"),
        ("turn/end", 2, {"kind": "completed"}),
        ("turn/start", 3),
        ("step/start", 3, 1),
        ("user/message", 3, 1, "fyi two"),
        ("user/message", 3, 1, "third"),
        ("turn/end", 3, {"kind": "completed"}),
    ]
    assert result.turn == 3


# --- waiting on the agent ---------------------------------------------------------------------


class Gated:
    """A model whose n-th call answers "reply n" once `release(n)` was called."""

    def __init__(self) -> None:
        self.gates: list[trio.Event] = []
        self.calls = 0
        self._lot = trio.lowlevel.ParkingLot()

    def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        self.calls += 1
        self._lot.unpark_all()
        return self._play(self.calls)

    def _gate(self, n: int) -> trio.Event:
        while len(self.gates) < n:
            self.gates.append(trio.Event())
        return self.gates[n - 1]

    def release(self, n: int) -> None:
        self._gate(n).set()

    async def wait_calls(self, n: int) -> None:
        while self.calls < n:
            await self._lot.park()

    async def _play(self, n: int) -> AsyncIterator[Chunk]:
        await self._gate(n).wait()
        yield TextDelta(f"reply {n}")
        yield Finish("stop")


async def test_waits_look_again_when_the_next_turn_starts_before_the_waiter_runs(tmp_path) -> None:
    # A turn that ends with a follow-up queued is followed by the next at once, before a task
    # woken by the first turn's end runs: `wait_turn_closed` and `wait_idle` must wait on for
    # the second turn (a wait that trusted the wake-up would return while a turn runs).
    model = Gated()
    async with runtime(tmp_path, model) as rt:
        agent = await rt.agents.create()
        await agent.send("one")
        await model.wait_calls(1)
        await agent.send("two")  # a follow-up: the next turn
        returned: list[str] = []

        async def wait(name: str, fn: Callable[[], Any]) -> None:
            await fn()
            returned.append(name)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait, "closed", agent.wait_turn_closed)
            nursery.start_soon(wait, "idle", agent.wait_idle)
            await trio.testing.wait_all_tasks_blocked()
            model.release(1)
            await model.wait_calls(2)  # the second turn waits on its model
            await trio.testing.wait_all_tasks_blocked()
            assert agent.status == "running" and agent.quiet
            assert returned == []
            model.release(2)
        assert sorted(returned) == ["closed", "idle"]
        assert agent.status == "idle" and agent.last_result is not None
        assert agent.last_result.text == "reply 2"


# --- cancellation -----------------------------------------------------------------------------


async def test_cancel_during_a_hanging_model_call_without_text_writes_no_assistant_message(tmp_path) -> None:
    clock = ScenarioClock()
    model = Recording(scripted({"delay_ms": 5000, "hang": True}, {"text": "back again"}))
    async with runtime(tmp_path, model, clock=clock) as rt:
        agent = await rt.agents.create()
        await agent.send("think hard")
        await model.wait_calls(1)
        assert agent.cancel("user") is True
        result = await agent.wait_idle()
        assert agent.cancel("user") is False  # no turn is running
        assert clock.slept_ms == 5000  # the delay ran on the runtime clock, not for real
        await agent.send("hello?")
        second = await agent.wait_idle()
    assert result.reason == {"kind": "aborted", "cause": "user"}
    assert brief(read_log(tmp_path, agent.session_id)) == [
        ("turn/start", 1),
        ("step/start", 1, 1),
        ("user/message", 1, 1, "think hard"),
        ("step/end", 1, 1),
        ("turn/end", 1, {"kind": "aborted", "cause": "user"}),
        ("turn/start", 2),
        ("step/start", 2, 1),
        ("user/message", 2, 1, "hello?"),
        ("assistant/message", 2, 1, "back again", "stop", []),
        ("step/end", 2, 1),
        ("turn/end", 2, {"kind": "completed"}),
    ]
    assert second.reason == {"kind": "completed"}


async def test_cancel_mid_stream_keeps_exactly_the_text_streamed_so_far(tmp_path) -> None:
    model = PartialThenHang("Hello, ", "wor")
    async with runtime(tmp_path, model) as rt:
        agent = await rt.agents.create()
        await agent.send("greet")
        await model.streamed.wait()
        assert agent.cancel("parent") is True
        result = await agent.wait_idle()
    events = read_log(tmp_path, agent.session_id)
    assert types(events) == ["turn/start", "step/start", "user/message", "assistant/message", "step/end", "turn/end"]
    assistant = data(events[3])
    assert assistant["message"]["content"] == [{"type": "text", "text": "Hello, wor"}]
    assert assistant["finish"] == "aborted" and assistant["interrupted"] is True
    assert data(events[5]) == {"turn": 1, "reason": {"kind": "aborted", "cause": "parent"}}
    assert result.reason == {"kind": "aborted", "cause": "parent"}


async def test_cancel_during_a_tool_that_ignores_abort_cancels_it_after_the_grace(tmp_path) -> None:
    clock = ScenarioClock()
    started = trio.Event()
    cancelled = trio.Event()

    async def stubborn(args: Json, ctx: ToolContext) -> str:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()
        return "never"

    model = scripted({"text": "Running it.", "tool_calls": [{"name": "stubborn", "arguments": {}}]})
    config = AgentConfig(tool_abort_grace=7.5)
    async with runtime(tmp_path, model, config=config, clock=clock, tools=[tool("stubborn", stubborn)]) as rt:
        agent = await rt.agents.create()
        await agent.send("go")
        await started.wait()
        assert clock.slept_ms == 0
        agent.cancel("user")
        result = await agent.wait_idle()
    assert cancelled.is_set()
    assert clock.slept_ms == 7500  # cut only after the grace, measured on the runtime clock
    events = read_log(tmp_path, agent.session_id)
    assert brief(events)[3:] == [
        ("assistant/message", 1, 1, "Running it.", "tool-calls", ["call_1_1"]),
        ("tool/call", 1, 1, "call_1_1", "stubborn"),
        (
            "tool/result",
            1,
            1,
            "call_1_1",
            "Error: tool call was cancelled",
            {"name": "ToolCancelledError", "code": "CANCELLED"},
        ),
        ("step/end", 1, 1),
        ("turn/end", 1, {"kind": "aborted", "cause": "user"}),
    ]
    assert result.reason == {"kind": "aborted", "cause": "user"}
    assert_every_call_answered(events)


async def test_cancel_records_a_polite_tool_and_closes_undispatched_calls_behind_an_exclusive_one(tmp_path) -> None:
    started = trio.Event()
    exclusive_ran = False

    async def polite(args: Json, ctx: ToolContext) -> str:
        started.set()
        await ctx.abort.wait()
        return "Error: subagent listing was cancelled"

    async def exclusive(args: Json, ctx: ToolContext) -> str:
        nonlocal exclusive_ran
        exclusive_ran = True
        return "ran"

    tools = [tool("polite", polite), tool("exclusive", exclusive, parallel_safe=False), ECHO]
    model = scripted(
        {
            "tool_calls": [
                {"name": "polite", "arguments": {}},
                {"name": "exclusive", "arguments": {}},
                {"name": "echo", "arguments": {}},
            ]
        }
    )
    async with runtime(tmp_path, model, tools=tools) as rt:
        agent = await rt.agents.create()
        await agent.send("go")
        await started.wait()
        agent.cancel("user")
        result = await agent.wait_idle()
    assert not exclusive_ran
    events = read_log(tmp_path, agent.session_id)
    not_dispatched = {"name": "ToolAbortedError", "code": "ABORTED_BEFORE_DISPATCH"}
    assert brief(events)[4:] == [
        ("tool/call", 1, 1, "call_1_1", "polite"),
        ("tool/result", 1, 1, "call_1_1", "Error: subagent listing was cancelled", None),
        ("tool/call", 1, 1, "call_1_2", "exclusive"),
        ("tool/result", 1, 1, "call_1_2", "Error: tool call aborted before dispatch", not_dispatched),
        ("tool/call", 1, 1, "call_1_3", "echo"),
        ("tool/result", 1, 1, "call_1_3", "Error: tool call aborted before dispatch", not_dispatched),
        ("step/end", 1, 1),
        ("turn/end", 1, {"kind": "aborted", "cause": "user"}),
    ]
    assert data(events[5])["message"]["content"][0]["is_error"] is False  # the tool's own return value
    assert result.reason == {"kind": "aborted", "cause": "user"}
    assert_every_call_answered(events)


async def test_cancel_records_a_polite_tool_result_even_when_it_waits_behind_a_stubborn_one(tmp_path) -> None:
    """Two parallel calls, [stubborn, polite]: polite returns at once when the turn is
    cancelled, stubborn is cut after the grace. SPEC 5.2: what a tool returns within the grace
    is recorded, and a closed turn has a result for every `tool/call`."""
    clock = ScenarioClock()
    started = {"stubborn": trio.Event(), "polite": trio.Event()}

    async def stubborn(args: Json, ctx: ToolContext) -> str:
        started["stubborn"].set()
        await trio.sleep_forever()
        return "never"

    async def polite(args: Json, ctx: ToolContext) -> str:
        started["polite"].set()
        await ctx.abort.wait()
        return "stopped cleanly"

    model = scripted({"tool_calls": [{"name": "stubborn", "arguments": {}}, {"name": "polite", "arguments": {}}]})
    tools = [tool("stubborn", stubborn), tool("polite", polite)]
    async with runtime(tmp_path, model, clock=clock, tools=tools) as rt:
        agent = await rt.agents.create()
        await agent.send("go")
        await started["stubborn"].wait()
        await started["polite"].wait()
        agent.cancel("user")
        result = await agent.wait_idle()
    events = read_log(tmp_path, agent.session_id)
    assert result.reason == {"kind": "aborted", "cause": "user"}
    assert [r for r in brief(events) if r[0] == "tool/result"] == [
        (
            "tool/result",
            1,
            1,
            "call_1_1",
            "Error: tool call was cancelled",
            {"name": "ToolCancelledError", "code": "CANCELLED"},
        ),
        ("tool/result", 1, 1, "call_1_2", "stopped cleanly", None),
    ]
    assert_every_call_answered(events)


# --- model failures ---------------------------------------------------------------------------


async def test_model_error_ends_the_turn_with_its_message_and_the_agent_goes_on(tmp_path) -> None:
    model = scripted({"error": {"status": 503, "message": "upstream overloaded"}}, {"text": "fine now"})
    async with runtime(tmp_path, model) as rt:
        agent = await rt.agents.create()
        await agent.send("hi")
        first = await agent.wait_idle()
        await agent.send("again")
        second = await agent.wait_idle()
    assert first.reason == {"kind": "error", "message": "upstream overloaded"}
    assert brief(read_log(tmp_path, agent.session_id))[:5] == [
        ("turn/start", 1),
        ("step/start", 1, 1),
        ("user/message", 1, 1, "hi"),
        ("step/end", 1, 1),
        ("turn/end", 1, {"kind": "error", "message": "upstream overloaded"}),
    ]
    assert second.reason == {"kind": "completed"} and second.text == "fine now"


async def test_running_out_of_responses_fails_the_turn_naming_session_and_call(tmp_path) -> None:
    async with runtime(tmp_path, scripted({"text": "only one"})) as rt:
        agent, result = await run_turns(rt, "one", "two")
    message = 'script exhausted for session "s-1": call 2 but its entry $.agents[0] has 1 responses'
    assert result.turn == 2 and result.reason == {"kind": "error", "message": message}
    events = read_log(tmp_path, agent.session_id)
    assert data(events[-1]) == {"turn": 2, "reason": {"kind": "error", "message": message}}


# --- resume -----------------------------------------------------------------------------------

HEADER = header_line("s-1", created_at=1_700_000_000_000)
T0 = 1_700_000_000_001


def _line(seq: int, type: str, payload: Json, **envelope: Any) -> bytes:
    return json_line(seq, type, payload, time=T0 + seq, **envelope)


def cut_log(*, recorded: bool) -> list[bytes]:
    """Turn 1: the model asked for `write`; cut after its `tool/call` (recorded) or before it."""
    call = {"type": "tool-call", "id": "call_1_1", "name": "write", "arguments": '{"path":"x"}'}
    lines = [
        _line(0, "turn/start", {"turn": 1, "trigger": {"kind": "message"}}),
        _line(1, "step/start", {"turn": 1, "step": 1}),
        _line(
            2,
            "user/message",
            {
                "turn": 1,
                "step": 1,
                "message": {
                    "id": "msg-1",
                    "role": "user",
                    "content": [{"type": "text", "text": "write x"}],
                    "source": {"kind": "user"},
                },
            },
            surface_op="append",
        ),
        _line(
            3,
            "assistant/message",
            {
                "turn": 1,
                "step": 1,
                "finish": "tool-calls",
                "message": {"id": "msg-2", "role": "assistant", "content": [call], "source": {"kind": "model"}},
            },
            surface_op="append",
        ),
    ]
    if recorded:
        lines.append(
            _line(
                4,
                "tool/call",
                {"turn": 1, "step": 1, "call_id": "call_1_1", "name": "write", "arguments": '{"path":"x"}'},
            )
        )
    return lines


async def _resume_cut_log(tmp_path, *, recorded: bool) -> list[Event]:
    new_log_file(tmp_path, "s-1", "none").write_bytes(HEADER + b"".join(cut_log(recorded=recorded)))
    model = Recording(
        scripted(
            {"tool_calls": [{"name": "write", "arguments": {"path": "x"}}]},
            {"text": "written"},
        )
    )

    async def write(args: Json, ctx: ToolContext) -> str:
        return f"wrote {args['path']}"

    # The `close` policy: since issue 27 an open turn is continued by default (test_continued_turns.py).
    close = AgentConfig(on_interrupted_turn="close")
    async with runtime(tmp_path, model, tools=[tool("write", write)], config=close) as rt:
        agent = await rt.agents.resume("s-1")
        closed = read_log(tmp_path, "s-1")  # the closers are durable before anything else runs
        assert agent.status == "idle" and model.requests == []
        await agent.send("try again")
        result = await agent.wait_idle()
    assert result.turn == 2 and result.reason == {"kind": "completed"}
    # The resumed model sees the closer as the result of the interrupted call.
    first = model.turn_requests()[0].messages
    assert [m["role"] for m in first] == ["user", "assistant", "user", "user"]
    events = read_log(tmp_path, "s-1")
    assert events[: len(closed)] == closed
    assert_every_call_answered(events)
    return closed


async def test_resume_after_a_cut_following_tool_call_appends_outcome_unknown_closers(tmp_path) -> None:
    closed = await _resume_cut_log(tmp_path, recorded=True)
    assert types(closed) == [
        "turn/start",
        "step/start",
        "user/message",
        "assistant/message",
        "tool/call",
        "tool/result",
        "step/end",
        "turn/end",
    ]
    result, step_end, turn_end = closed[5:]
    assert [e.seq for e in closed[5:]] == [5, 6, 7]
    assert {e.time for e in closed[5:]} == {T0 + 4}  # the last event's time
    assert data(result) == {
        "turn": 1,
        "step": 1,
        "error": {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"},
        "message": {
            "id": "interrupted-tool-result-call_1_1-5",
            "role": "user",
            "source": {"kind": "tool", "call_id": "call_1_1"},
            "content": [
                {
                    "type": "tool-result",
                    "call_id": "call_1_1",
                    "content": [{"type": "text", "text": TOOL_OUTCOME_UNKNOWN_TEXT}],
                    "is_error": True,
                }
            ],
        },
    }
    assert result.surface_op == "append" and result.source_event_seqs == [4]
    assert data(step_end) == {"turn": 1, "step": 1}
    assert data(turn_end) == {"turn": 1, "reason": {"kind": "interrupted"}}


async def test_resume_after_a_cut_following_the_assistant_message_appends_not_started_closers(tmp_path) -> None:
    closed = await _resume_cut_log(tmp_path, recorded=False)
    assert types(closed) == [
        "turn/start",
        "step/start",
        "user/message",
        "assistant/message",
        "tool/result",
        "step/end",
        "turn/end",
    ]
    result, step_end, turn_end = closed[4:]
    assert [e.seq for e in closed[4:]] == [4, 5, 6]
    assert {e.time for e in closed[4:]} == {T0 + 3}
    payload = data(result)
    assert payload["error"] == {"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"}
    assert payload["message"]["id"] == "interrupted-tool-result-call_1_1-4"
    assert payload["message"]["content"] == [
        {
            "type": "tool-result",
            "call_id": "call_1_1",
            "is_error": True,
            "content": [{"type": "text", "text": TOOL_NOT_STARTED_TEXT}],
        }
    ]
    assert result.source_event_seqs is UNSET
    assert data(step_end) == {"turn": 1, "step": 1}
    assert data(turn_end) == {"turn": 1, "reason": {"kind": "interrupted"}}


async def test_resume_of_a_cut_log_numbers_new_calls_after_the_old_ones(tmp_path) -> None:
    await _resume_cut_log(tmp_path, recorded=True)
    events = read_log(tmp_path, "s-1")
    call_ids = [data(e)["call_id"] for e in events if e.type == "tool/call"]
    assert call_ids == ["call_1_1", "call_2_1"]
    assert [r for r in brief(events) if r[0] == "turn/start"] == [("turn/start", 1), ("turn/start", 2)]


async def test_call_ids_never_repeat_across_a_restart_with_a_fresh_script(tmp_path) -> None:
    responses = (
        {"tool_calls": [{"name": "echo", "arguments": {"n": 1}}, {"name": "echo", "arguments": {"n": 2}}]},
        {"text": "done"},
    )
    async with runtime(tmp_path, scripted(*responses), tools=[ECHO]) as rt:
        agent, _ = await run_turns(rt, "first")
    # A new process: a fresh model instance starts its entry at the first response again.
    async with runtime(tmp_path, scripted(*responses), tools=[ECHO]) as rt:
        agent = await rt.agents.resume(agent.session_id)
        await agent.send("second")
        result = await agent.wait_idle()
    assert result.turn == 2 and result.reason == {"kind": "completed"}
    events = read_log(tmp_path, agent.session_id)
    call_ids = [data(e)["call_id"] for e in events if e.type == "tool/call"]
    assert call_ids == ["call_1_1", "call_1_2", "call_3_1", "call_3_2"]
    assert len(set(call_ids)) == len(call_ids)
    message_ids = [data(e)["message"]["id"] for e in events if e.surface_op is not UNSET]
    assert len(set(message_ids)) == len(message_ids)


# --- the system prompt ------------------------------------------------------------------------


async def test_system_prompt_is_written_once_and_again_only_when_it_changes(tmp_path) -> None:
    tools = [ECHO]
    one_tool_turn = ({"tool_calls": [{"name": "echo", "arguments": {}}]}, {"text": "ok"})
    model = Recording(scripted(*one_tool_turn, {"text": "second turn"}))
    async with runtime(tmp_path, model, config=AgentConfig(system_prompt="You are terse."), tools=tools) as rt:
        agent, _ = await run_turns(rt, "one", "two")
    sid = agent.session_id
    assert [r for r in brief(read_log(tmp_path, sid)) if r[0] == "system/message"] == [
        ("system/message", 1, 1, "You are terse."),
    ]
    assert types(read_log(tmp_path, sid))[:4] == ["turn/start", "step/start", "system/message", "user/message"]
    assert all(r.messages[0]["role"] == "system" for r in model.turn_requests())

    # The same prompt after a restart: nothing new.
    async with runtime(
        tmp_path, scripted({"text": "three"}), config=AgentConfig(system_prompt="You are terse."), tools=tools
    ) as rt:
        agent = await rt.agents.resume(sid)
        await agent.send("three")
        await agent.wait_idle()
    # A changed prompt: written again at the first step of the next turn, and only there.
    model = Recording(scripted(*one_tool_turn))
    async with runtime(tmp_path, model, tools=tools) as rt:
        agent = await rt.agents.resume(sid, config=AgentConfig(system_prompt="You are verbose."))
        await agent.send("four")
        result = await agent.wait_idle()
    assert result.turn == 4
    events = read_log(tmp_path, sid)
    assert [r for r in brief(events) if r[0] == "system/message"] == [
        ("system/message", 1, 1, "You are terse."),
        ("system/message", 4, 1, "You are verbose."),
    ]
    # The model sees the current prompt (the surface keeps both; the last one is the new one).
    assert text([m for m in model.turn_requests()[0].messages if m["role"] == "system"][-1]) == "You are verbose."


# --- compaction -------------------------------------------------------------------------------

DESCRIPTOR = {"version": 2, "mode": "continuable", "provider": "fork", "label": "researcher"}


async def test_compaction_replaces_an_older_range_keeps_the_descriptor_and_the_next_request_sees_the_summary(
    tmp_path,
) -> None:
    model = Recording(
        scripted(
            {"text": "Step one.", "tool_calls": [{"name": "echo", "arguments": {"q": "alpha"}}]},
            {"text": "Step two.", "tool_calls": [{"name": "echo", "arguments": {"q": "beta"}}]},
            {"text": "All done."},
            summaries=["They searched alpha."],
        )
    )
    config = AgentConfig(compaction=CompactionPolicy(max_chars=10, keep_recent=2))
    async with runtime(tmp_path, model, config=config, tools=[ECHO]) as rt:
        agent = await rt.agents.create(first=[EventDraft(type="subagent/descriptor", data=DESCRIPTOR)])
        await agent.send("research the greek letters")
        result = await agent.wait_idle()
    assert result.reason == {"kind": "completed"} and result.text == "All done."
    events = read_log(tmp_path, agent.session_id)
    by_seq = {e.seq: e for e in events}
    assert events[0].type == "subagent/descriptor" and data(events[0]) == DESCRIPTOR
    assert sum(1 for e in events if e.type == "subagent/descriptor") == 1

    i = types(events).index("compaction/start")
    start, summary, replacement, end = events[i : i + 4]
    assert types([start, summary, replacement, end]) == [
        "compaction/start",
        "compaction/summary",
        "user/message",
        "compaction/end",
    ]
    assert data(start) == {"turn": 1}
    assert data(summary) == {"text": "They searched alpha."}
    # The range: the first user message, the first assistant message and its tool result.
    first_user = next(e for e in events if e.type == "user/message")
    first_result = next(e for e in events if e.type == "tool/result")
    assert replacement.surface_op == ReplaceOp(op="replace", start_seq=first_user.seq, end_seq=first_result.seq)
    first_assistant = next(e for e in events if e.type == "assistant/message")
    assert replacement.source_event_seqs == [first_user.seq, first_assistant.seq, first_result.seq]
    assert [by_seq[s].type for s in replacement.source_event_seqs] == [
        "user/message",
        "assistant/message",
        "tool/result",
    ]
    msg = data(replacement)["message"]
    assert msg["role"] == "user" and msg["source"] == {"kind": "compaction"}
    assert text(msg) == "<compacted-summary>They searched alpha.</compacted-summary>"
    assert data(end) == {"start_seq": first_user.seq, "end_seq": first_result.seq}
    assert 0 not in range(first_user.seq, first_result.seq + 1)  # the descriptor is not in the range
    assert events[i + 4].type == "step/start" and data(events[i + 4]) == {"turn": 1, "step": 3}

    # The summarizer saw the replaced messages; the next turn request sees the summary instead.
    compaction = [r for r in model.requests if r.purpose == "compaction"]
    assert len(compaction) == 1
    assert [text(m) for m in compaction[0].messages] == [
        "research the greek letters",
        "Step one.",
        'echo {"q": "alpha"}',
    ]
    after = model.turn_requests()[2].messages
    assert [text(m) for m in after] == [
        "<compacted-summary>They searched alpha.</compacted-summary>",
        "Step two.",
        'echo {"q": "beta"}',
    ]
    assert_every_call_answered(events)


async def test_compaction_goes_on_past_a_system_prompt_that_changed(tmp_path) -> None:
    """History under an old prompt, then a new prompt: once the old run is down to its summary,
    the history after the new system message is what gets compacted."""
    model = scripted(*[{"text": f"Answer {i}."} for i in range(5)], summaries=[f"Summary {i}." for i in range(5)])
    compact = CompactionPolicy(max_chars=10, keep_recent=2)
    async with runtime(tmp_path, model, config=AgentConfig(system_prompt="Prompt A.", compaction=compact)) as rt:
        agent = await rt.agents.create(session_id="a")
        await agent.send("question 0")
        await agent.wait_idle()
        await rt.agents.stop("a")
        agent = await rt.agents.resume("a", config=AgentConfig(system_prompt="Prompt B.", compaction=compact))
        for i in range(1, 4):
            await agent.send(f"question {i}")
            await agent.wait_idle()
    events = read_log(tmp_path, "a")
    prompt_b = next(e.seq for e in events if e.type == "system/message" and "Prompt B." in json.dumps(data(e)))
    ranges = [(data(e)["start_seq"], data(e)["end_seq"]) for e in events if e.type == "compaction/end"]
    assert any(start > prompt_b for start, _end in ranges), ranges  # compacted after the new prompt
    assert all(not start <= prompt_b <= end for start, end in ranges)  # a system message is never inside
    surface = Surface.from_events(events, session_id="a")
    assert [n.type for n in surface.nodes].count("system/message") == 2
    assert len(surface.nodes) <= 2 + 2 + 2 + 2  # prompts, a summary on each side, keep_recent
