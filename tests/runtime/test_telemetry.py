"""Traces in the OpenTelemetry GenAI conventions (issue 29 item 5; README "Traces
(OpenTelemetry)"), with the SDK's in-memory exporter and the scripted model: span names,
attributes, parents, no content unless asked, errors as span status, the trace anchor kept in the
log (and absent when tracing is off), and a session resumed in a new runtime going on in the same
trace."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from scripts import BACKGROUND_CHILD
from subagents.runtime import (
    Chunk,
    CountingIds,
    Finish,
    FunctionTool,
    Model,
    ModelRequest,
    OtelTelemetry,
    ScenarioClock,
    ScriptedModel,
    SessionBinding,
    Usage,
    load_script,
    open_runtime,
)
from subagents.storage import FileLogStore
from wrapped_models import WrappedModel


def _telemetry(*, capture_content: bool = False) -> tuple[OtelTelemetry, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OtelTelemetry(provider, capture_content=capture_content), exporter


def _model(script: dict[str, Any]) -> ScriptedModel:
    return ScriptedModel(load_script(json.dumps(script)))


async def _run_background_child(root: Path, telemetry: OtelTelemetry | None) -> None:
    async with open_runtime(
        root,
        model=_model(BACKGROUND_CHILD),
        clock=ScenarioClock(),
        id_factory=CountingIds("child"),
        telemetry=telemetry,
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("Delegate the thing.")
        await rt.subagents.wait_tree_idle(parent)


def _records(root: Path, session_id: str) -> list[dict[str, Any]]:
    """The `telemetry/trace` events of a session's log, as written."""
    store = FileLogStore(str(root))
    try:
        handle = store.open_read(session_id)
        try:
            events = store.read(handle)
        finally:
            store.close(handle)
    finally:
        store.close_store()
    return [
        {"seq": e.seq, "ignorable": e.ignorable, **msgspec.json.decode(e.data)}
        for e in events
        if e.type == "telemetry/trace"
    ]


def _by_name(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def _one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = _by_name(spans, name)
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def _traceparent(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


async def test_a_tree_is_one_trace_of_gen_ai_spans(tmp_path: Path) -> None:
    telemetry, exporter = _telemetry()
    await _run_background_child(tmp_path, telemetry)
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == [
        "chat ScriptedModel",
        "chat ScriptedModel",
        "chat ScriptedModel",
        "chat ScriptedModel",
        "execute_tool list_agents",
        "execute_tool subagent",
        "invoke_agent helper",
        "invoke_agent root",
    ]
    turn = _one(spans, "invoke_agent root")
    child_turn = _one(spans, "invoke_agent helper")
    spawn = _one(spans, "execute_tool subagent")
    assert turn.parent is None and turn.kind is SpanKind.INTERNAL
    assert dict(turn.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": "subagents",
        "gen_ai.request.model": "ScriptedModel",
        "gen_ai.agent.id": "parent",
        "gen_ai.agent.name": "root",  # a root has no label: named for what it is
        "gen_ai.conversation.id": "parent",
        "subagents.turn": 1,
        "subagents.turn.end_reason": "completed",
        "gen_ai.usage.input_tokens": 60,
        "gen_ai.usage.output_tokens": 6,
    }
    assert dict(child_turn.attributes or {})["gen_ai.agent.id"] == "child-1"
    assert dict(child_turn.attributes or {})["gen_ai.agent.name"] == "helper"
    # The child's turn is a child of the parent's `subagent` call: one trace for the tree.
    assert child_turn.parent is not None and child_turn.parent.span_id == spawn.context.span_id
    assert {s.context.trace_id for s in spans} == {turn.context.trace_id}
    assert dict(spawn.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "subagent",
        "gen_ai.tool.call.id": "call_1_1",
        "gen_ai.tool.type": "function",
    }
    assert spawn.parent is not None and spawn.parent.span_id == turn.context.span_id
    chats = [s for s in _by_name(spans, "chat ScriptedModel") if s.parent and s.parent.span_id == turn.context.span_id]
    assert [dict(s.attributes or {}).get("gen_ai.usage.input_tokens") for s in chats] == [10, 20, 30]
    assert [tuple(dict(s.attributes or {})["gen_ai.response.finish_reasons"]) for s in chats] == [
        ("tool_call",),
        ("tool_call",),
        ("stop",),
    ]
    assert all(s.kind is SpanKind.CLIENT and s.status.status_code is StatusCode.UNSET for s in chats)
    # No prompt, output, argument or result text unless asked for.
    shown = json.dumps([dict(s.attributes or {}) for s in spans])
    for text in ("Delegate the thing", "do the thing", "CHILD_OK", "NOTED", "STARTED"):
        assert text not in shown
    assert "gen_ai.input.messages" not in shown and "gen_ai.tool.call.result" not in shown
    # Each log keeps its anchor: the root its first turn's span, the child its parent's call.
    assert _records(tmp_path, "parent") == [
        {"seq": 1, "ignorable": True, "version": 1, "traceparent": _traceparent(turn)}
    ]
    assert [r["traceparent"] for r in _records(tmp_path, "child-1")] == [_traceparent(spawn)]


async def test_content_goes_into_spans_only_with_capture_content(tmp_path: Path) -> None:
    telemetry, exporter = _telemetry(capture_content=True)
    await _run_background_child(tmp_path, telemetry)
    spans = exporter.get_finished_spans()
    first_chat = min(_by_name(spans, "chat ScriptedModel"), key=lambda s: s.start_time or 0)
    inputs = json.loads(str(dict(first_chat.attributes or {})["gen_ai.input.messages"]))
    assert inputs == [{"role": "user", "parts": [{"type": "text", "content": "Delegate the thing."}]}]
    outputs = json.loads(str(dict(first_chat.attributes or {})["gen_ai.output.messages"]))
    assert outputs[0]["finish_reason"] == "tool_call"
    assert outputs[0]["parts"][0]["name"] == "subagent"
    spawn = dict(_one(spans, "execute_tool subagent").attributes or {})
    assert json.loads(str(spawn["gen_ai.tool.call.arguments"])) == {"description": "helper", "prompt": "do the thing"}
    assert "child-1" in str(spawn["gen_ai.tool.call.result"])


async def test_no_trace_record_is_written_when_tracing_is_off(tmp_path: Path) -> None:
    await _run_background_child(tmp_path, None)
    assert _records(tmp_path, "parent") == [] and _records(tmp_path, "child-1") == []


async def test_errors_set_the_span_status(tmp_path: Path) -> None:
    telemetry, exporter = _telemetry()
    script = {
        "agents": [
            {
                "responses": [
                    {"tool_calls": [{"name": "no_such_tool", "arguments": {}}]},
                    {"error": {"status": 500, "message": "upstream down"}},
                ]
            }
        ]
    }
    async with open_runtime(tmp_path, model=_model(script), clock=ScenarioClock(), telemetry=telemetry) as rt:
        agent = await rt.agents.create(session_id="s")
        await agent.send("hi")
        result = await agent.wait_idle()
    assert result is not None and result.reason["kind"] == "error"
    spans = exporter.get_finished_spans()
    tool = _one(spans, "execute_tool no_such_tool")
    assert tool.status.status_code is StatusCode.ERROR
    assert dict(tool.attributes or {})["error.type"] == "ToolNotFoundError"
    failed_chat = _by_name(spans, "chat ScriptedModel")[-1]
    assert failed_chat.status.status_code is StatusCode.ERROR
    assert dict(failed_chat.attributes or {})["error.type"] == "model_error"
    turn = _one(spans, "invoke_agent root")
    assert turn.status.status_code is StatusCode.ERROR
    assert dict(turn.attributes or {})["subagents.turn.end_reason"] == "error"


async def test_a_session_resumed_in_a_new_runtime_goes_on_in_the_same_trace(tmp_path: Path) -> None:
    await _restarted(tmp_path, None)
    assert len(_records(tmp_path, "s")) == 1  # the anchor is recorded once


@pytest.mark.pg
async def test_a_session_taken_over_by_another_host_goes_on_in_the_same_trace(tmp_path: Path, pg_url: str) -> None:
    """Two runtimes on one PostgreSQL store, one after the other: two hosts, the second taking
    the session over from the log the first wrote."""
    from pg_server import reset_tables

    reset_tables(pg_url)
    await _restarted(tmp_path, pg_url)


async def _restarted(tmp_path: Path, store: str | None) -> None:
    """A turn of session `s` in one runtime, a second turn in another on the same store: the
    second's span is a child of the first's, in its trace."""
    first, exported = _telemetry()
    script = {"agents": [{"session": "s", "responses": [{"text": "one"}, {"text": "two"}]}]}
    async with open_runtime(tmp_path, model=_model(script), clock=ScenarioClock(), telemetry=first, store=store) as rt:
        agent = await rt.agents.create(session_id="s")
        await agent.send("first")
        await agent.wait_idle()
    (turn1,) = _by_name(exported.get_finished_spans(), "invoke_agent root")
    # A new runtime on the same store (a restart, or another host): a cold resume from the log.
    second, exported_again = _telemetry()
    script = {"agents": [{"session": "s", "responses": [{"text": "two"}]}]}
    async with open_runtime(tmp_path, model=_model(script), clock=ScenarioClock(), telemetry=second, store=store) as rt:
        agent = await rt.agents.resume("s")
        await agent.send("second")
        await agent.wait_idle()
    (turn2,) = _by_name(exported_again.get_finished_spans(), "invoke_agent root")
    assert turn2.context.trace_id == turn1.context.trace_id
    assert turn2.parent is not None and turn2.parent.span_id == turn1.context.span_id
    assert dict(turn2.attributes or {})["subagents.turn"] == 2


async def test_a_damaged_trace_record_is_ignored(tmp_path: Path) -> None:
    """A `telemetry/trace` that is not W3C trace context starts a new trace, recorded anew."""
    from subagents.actors import EventDraft

    telemetry, exporter = _telemetry()
    script = {"agents": [{"session": "s", "responses": [{"text": "ok"}]}]}
    async with open_runtime(tmp_path, model=_model(script), clock=ScenarioClock(), telemetry=telemetry) as rt:
        agent = await rt.agents.create(session_id="s")
        bad = {"version": 1, "traceparent": "00-zz-not-a-trace"}
        await agent.session.append([EventDraft(type="telemetry/trace", data=bad, ignorable=True)])
        await rt.agents.stop("s")
        agent = await rt.agents.resume("s")
        await agent.send("hi")
        await agent.wait_idle()
    (turn,) = _by_name(exporter.get_finished_spans(), "invoke_agent root")
    assert turn.parent is None
    assert [r["traceparent"] for r in _records(tmp_path, "s")] == ["00-zz-not-a-trace", _traceparent(turn)]


@pytest.mark.parametrize("capture", [False, True])
async def test_a_stopped_turn_ends_its_span(tmp_path: Path, capture: bool) -> None:
    """A turn cut by a cancel still ends its spans (none left open to leak)."""
    telemetry, exporter = _telemetry(capture_content=capture)
    script = {"agents": [{"session": "s", "responses": [{"text": "never", "wait_for": {"steered": True}}]}]}
    async with open_runtime(tmp_path, model=_model(script), clock=ScenarioClock(), telemetry=telemetry) as rt:
        agent = await rt.agents.create(session_id="s")
        await agent.send("hi")
        while not (agent.status == "running" and agent.quiet):  # until its model call is in flight
            await trio.testing.wait_all_tasks_blocked()
        assert agent.cancel("user")
        result = await agent.wait_idle()
    assert result is not None and result.reason["kind"] == "aborted"
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["chat ScriptedModel", "invoke_agent root"]
    chat = _one(exporter.get_finished_spans(), "chat ScriptedModel")
    assert dict(chat.attributes or {})["subagents.interrupted"] is True


async def test_a_child_resumed_in_a_new_runtime_goes_on_under_its_parents_call(tmp_path: Path) -> None:
    first, exported = _telemetry()
    await _run_background_child(tmp_path, first)
    spawn = _one(exported.get_finished_spans(), "execute_tool subagent")
    second, exported_again = _telemetry()
    script = {"agents": [{"session": "child-1", "responses": [{"text": "MORE"}]}]}
    async with open_runtime(tmp_path, model=_model(script), clock=ScenarioClock(), telemetry=second) as rt:
        child = await rt.agents.resume("child-1", label="helper")  # as the service resumes a child
        await child.send("one more thing")
        await child.wait_idle()
    turn = _one(exported_again.get_finished_spans(), "invoke_agent helper")
    assert turn.context.trace_id == spawn.context.trace_id
    assert turn.parent is not None and turn.parent.span_id == spawn.context.span_id
    assert dict(turn.attributes or {})["subagents.turn"] == 2


async def test_an_agent_stopped_mid_tool_call_ends_every_span(tmp_path: Path) -> None:
    """An agent stopped while a tool runs (its task is cancelled, as when its process shuts
    down): the tool's span and the turn's end with the cancellation as their error."""
    telemetry, exporter = _telemetry()
    started = trio.Event()

    async def hang(args: dict[str, Any], ctx: object) -> str:
        started.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    tool = FunctionTool(name="hang", description="never returns", parameters={"type": "object"}, fn=hang)
    script = {"agents": [{"session": "s", "responses": [{"tool_calls": [{"name": "hang", "arguments": {}}]}]}]}
    async with open_runtime(
        tmp_path, model=_model(script), clock=ScenarioClock(), telemetry=telemetry, tools=lambda: [tool]
    ) as rt:
        agent = await rt.agents.create(session_id="s")
        await agent.send("hi")
        await started.wait()
        await agent.stop()
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == ["chat ScriptedModel", "execute_tool hang", "invoke_agent root"]
    for name in ("execute_tool hang", "invoke_agent root"):
        span = _one(spans, name)
        assert span.status.status_code is StatusCode.ERROR
        assert dict(span.attributes or {})["error.type"] == "Cancelled"


@pytest.mark.parametrize(
    ("label", "origin", "preset", "name"),
    [
        (None, None, None, "root"),  # a root: named for what it is
        (None, None, "reviewer", "reviewer"),  # ... or for its preset, when its header has one
        ("chat", None, None, "chat"),  # a root an embedder labelled
        ("helper", "subagent", None, "helper"),  # a child: its label
        (None, "subagent", None, None),  # an unlabeled child: no name (nothing to tell)
    ],
)
def test_the_agent_name_of_roots_and_children(
    label: str | None, origin: str | None, preset: str | None, name: str | None
) -> None:
    from subagents.runtime.telemetry.seam import agent_name
    from subagents.storage import SessionHeader

    header = SessionHeader(
        id="s",
        created_at=1,
        parent_session="p" if origin else None,
        origin=origin,
        delegation_depth=1 if origin else 0,
        agent_preset=preset,
    )
    assert agent_name(label, header) == name


class _SummaryUsage(WrappedModel):
    """The scripted model, with the usage a provider reports for a compaction summary call."""

    def __init__(self, inner: ScriptedModel) -> None:
        self.inner = inner

    async def answer(self, session: SessionBinding, inner: Model, request: ModelRequest) -> AsyncIterator[Chunk]:
        async for chunk in inner.stream(request):
            if request.purpose == "compaction" and isinstance(chunk, Finish):
                yield Usage(input_tokens=700, output_tokens=40)
            yield chunk


async def test_the_compaction_summary_has_its_own_chat_span_with_its_usage(tmp_path: Path) -> None:
    """Compaction's summary call is a `chat` span of its turn, with the tokens it used — counted
    in its turn's sums like any model call — and, without content capture, no summary text."""
    from subagents.runtime import AgentConfig, CompactionPolicy

    telemetry, exporter = _telemetry()
    script = {
        "agents": [
            {
                "responses": [
                    {
                        "text": "Step one.",
                        "tool_calls": [{"name": "echo", "arguments": {}}],
                        "usage": {"input_tokens": 10, "output_tokens": 1},
                    },
                    {
                        "text": "Step two.",
                        "tool_calls": [{"name": "echo", "arguments": {}}],
                        "usage": {"input_tokens": 20, "output_tokens": 2},
                    },
                    {"text": "Done.", "usage": {"input_tokens": 30, "output_tokens": 3}},
                ]
            }
        ],
        "summaries": ["They echoed."],
    }

    async def echoed(args: dict[str, Any], ctx: object) -> str:
        return "echoed"

    echo = FunctionTool(name="echo", description="Echo.", parameters={"type": "object"}, fn=echoed)
    config = AgentConfig(compaction=CompactionPolicy(max_chars=10, keep_recent=2))
    async with open_runtime(
        tmp_path,
        model=_SummaryUsage(_model(script)),
        clock=ScenarioClock(),
        telemetry=telemetry,
        agent_config=config,
        tools=lambda: [echo],
    ) as rt:
        agent = await rt.agents.create(session_id="a")
        await agent.send("Go.")
        assert (await agent.wait_idle()).reason == {"kind": "completed"}
    spans = exporter.get_finished_spans()
    turn = _one(spans, "invoke_agent root")
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert all(s.parent is not None and s.parent.span_id == turn.context.span_id for s in chats)
    usage = [
        (dict(s.attributes or {})["gen_ai.usage.input_tokens"], dict(s.attributes or {})["gen_ai.usage.output_tokens"])
        for s in chats
    ]
    assert sorted(usage) == [(10, 1), (20, 2), (30, 3), (700, 40)]
    (summary,) = [s for s in chats if dict(s.attributes or {})["gen_ai.usage.input_tokens"] == 700]
    assert dict(summary.attributes or {})["gen_ai.response.finish_reasons"] == ("stop",)
    assert summary.kind is SpanKind.CLIENT and summary.status.status_code is StatusCode.UNSET
    assert "They echoed" not in json.dumps([dict(s.attributes or {}) for s in spans], default=list)
    turn_attributes = dict(turn.attributes or {})
    assert (turn_attributes["gen_ai.usage.input_tokens"], turn_attributes["gen_ai.usage.output_tokens"]) == (760, 46)
