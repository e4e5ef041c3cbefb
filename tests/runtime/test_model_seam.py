"""The model seam is clean (issue 14 item 4): a `ModelRequest` carries what a model needs —
messages, tools, purpose — and nothing about the calling session; a model that answers per
session (the scripted model) gets the session, the runtime clock and the waits through
`bind(SessionBinding)`, once per agent; a transport without `bind` never sees any of it.
Real files under `tmp_path`, a `ScenarioClock`, no sleeps."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import attrs
from scripted_calls import req, text_of
from subagents.runtime import (
    Chunk,
    CountingIds,
    Finish,
    FunctionTool,
    Model,
    ModelRequest,
    OpenAIChatModel,
    RealClock,
    ScenarioClock,
    ScriptedModel,
    SessionBinding,
    SessionModel,
    TextDelta,
    ToolCallDelta,
    load_script,
    open_runtime,
)


def test_a_request_holds_messages_tools_and_purpose_only() -> None:
    assert [f.name for f in attrs.fields(ModelRequest)] == ["messages", "tools", "purpose"]


class Transport:
    """A custom transport written against the public seam: `stream` and nothing else."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        self.requests.append(request)
        return self._play(len(self.requests))

    async def _play(self, n: int) -> AsyncIterator[Chunk]:
        yield TextDelta(f"reply {n}")
        yield Finish("stop")


async def _echo(arguments: Any, _ctx: Any) -> str:
    return "echoed"


ECHO = FunctionTool(name="echo", description="Echo.", fn=_echo)


def _runtime(root: Any, model: Any, clock: ScenarioClock | None = None) -> Any:
    return open_runtime(
        root,
        model=model,
        clock=clock or ScenarioClock(),
        id_factory=CountingIds("s"),
        compression="none",
        tools=lambda: [ECHO],
    )


async def test_a_custom_transport_gets_messages_tools_and_purpose(tmp_path) -> None:
    transport = Transport()
    assert not isinstance(transport, SessionModel)
    async with _runtime(tmp_path, transport) as rt:
        agent = await rt.agents.create(session_id="a")
        await agent.send("hello")
        result = await agent.wait_idle()
    assert result is not None and result.text == "reply 1"
    [request] = transport.requests
    assert set(attrs.asdict(request, recurse=False)) == {"messages", "tools", "purpose"}
    assert request.purpose == "turn"
    assert request.messages[-1]["content"] == [{"type": "text", "text": "hello"}]
    assert "echo" in [spec.name for spec in request.tools]


class Binding(Transport):
    """A custom `SessionModel`: remembers every binding, answers through a plain transport."""

    def __init__(self) -> None:
        super().__init__()
        self.bindings: list[SessionBinding] = []
        self.counts: list[int] = []  # the bound session's `assistant_count()` at each call

    def bind(self, session: SessionBinding) -> Model:
        self.bindings.append(session)
        return _Counting(self, session)


@attrs.frozen
class _Counting:
    model: Binding
    session: SessionBinding

    def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        self.model.counts.append(self.session.assistant_count())
        return self.model.stream(request)


async def test_a_session_model_is_bound_once_per_agent_with_its_session(tmp_path) -> None:
    model = Binding()
    clock = ScenarioClock()
    async with _runtime(tmp_path, model, clock) as rt:
        a = await rt.agents.create(session_id="a")
        b = await rt.agents.create(session_id="b")
        for text in ("one", "two"):
            await a.send(text)
            await a.wait_idle()
        await b.send("three")
        await b.wait_idle()
        created = {"a": a.session.header.created_at, "b": b.session.header.created_at}
    assert [(s.session_id, s.label, s.created_at) for s in model.bindings] == [
        ("a", None, created["a"]),
        ("b", None, created["b"]),
    ]
    assert all(s.clock is clock and s.waits is not None for s in model.bindings)
    # Read at each call: the session's assistant messages so far.
    assert model.counts == [0, 1, 0]


SCRIPT = {
    "agents": [
        {"responses": [{"text": "a1"}, {"text": "a2"}, {"text": "a3"}]},
        {"responses": [{"text": "b1"}, {"text": "b2"}]},
    ]
}


def _binding(session_id: str, **fields: Any) -> SessionBinding:
    return SessionBinding(session_id=session_id, clock=ScenarioClock(), **fields)


async def _text(bound: Model) -> str:
    chunks = [c async for c in bound.stream(ModelRequest(messages=()))]
    return "".join(c.text for c in chunks if isinstance(c, TextDelta))


async def test_the_scripted_model_bound_to_two_sessions_keeps_their_entries_apart() -> None:
    model = ScriptedModel(load_script(json.dumps(SCRIPT)))
    a, b = model.bind(_binding("a")), model.bind(_binding("b"))
    assert [await _text(a), await _text(b), await _text(a), await _text(b)] == ["a1", "b1", "a2", "b2"]
    # A second binding of the same session (a resumed agent) continues its entry.
    assert await _text(model.bind(_binding("a"))) == "a3"
    assert model.statistics().bindings == ("a", "b")


async def test_two_sessions_of_one_runtime_keep_their_script_entries(tmp_path) -> None:
    model = ScriptedModel(load_script(json.dumps(SCRIPT)))
    texts = []
    async with _runtime(tmp_path, model) as rt:
        a = await rt.agents.create(session_id="a")
        b = await rt.agents.create(session_id="b")
        for agent, prompt in ((a, "x"), (b, "y"), (a, "z"), (b, "w")):
            await agent.send(prompt)
            result = await agent.wait_idle()
            assert result is not None
            texts.append(result.text)
    assert texts == ["a1", "b1", "a2", "b2"]


async def test_scripted_call_ids_number_from_the_count_at_each_call() -> None:
    call = {"name": "echo", "arguments": {}}
    model = ScriptedModel(load_script(json.dumps({"agents": [{"responses": [{"tool_calls": [call]}] * 2}]})))
    count = [0]
    bound = model.bind(_binding("a", assistant_count=lambda: count[0]))
    ids = []
    for n in (0, 4):
        count[0] = n
        chunks = [c async for c in bound.stream(ModelRequest(messages=()))]
        ids += [c.id for c in chunks if isinstance(c, ToolCallDelta) and c.id is not None]
    assert ids == ["call_1_1", "call_5_1"]


async def test_the_scripted_model_answers_only_through_a_binding() -> None:
    model = ScriptedModel(load_script(json.dumps(SCRIPT)))
    assert isinstance(model, SessionModel)
    assert not hasattr(model, "stream")
    assert await text_of(model, req("solo", label="worker", created_at=3)) == "a1"


async def test_the_openai_transport_is_no_session_model_and_sleeps_on_its_own_clock(tmp_path) -> None:
    model = OpenAIChatModel("m", base_url="http://127.0.0.1:9", api_key=None)
    assert not isinstance(model, SessionModel)
    assert isinstance(model.clock, RealClock)
    clock = ScenarioClock()
    # Built from a spec by `open_runtime`, it backs off on the runtime's clock.
    async with open_runtime(tmp_path, model="openai:m", api_key="k", base_url="http://127.0.0.1:9", clock=clock) as rt:
        built = rt.agents.model
        assert isinstance(built, OpenAIChatModel)
        assert built.clock is clock
