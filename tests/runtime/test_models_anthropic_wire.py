"""The Anthropic wire format, sans-IO (runtime/models/anthropic_wire.py): request bodies built from
logged messages (checked against the official SDK's request types and the API's own rules, as the
fake server checks them), and streamed bodies read into chunks, as tables.

The event sequences come from the fake server's `Reply.events`, which the first test validates
against the SDK's stream event models, so the parser is tested on what the API sends."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fake_anthropic import Block, Reply, request_problem, sdk_problem
from subagents.runtime.foundation.errors import (
    ModelBadResponse,
    ModelBadStream,
    ModelContentFiltered,
    ModelError,
    ModelSpecError,
    ModelStreamInterrupted,
    ModelUnavailable,
)
from subagents.runtime.models.anthropic_wire import AnthropicOptions, StreamParser, anthropic_body
from subagents.runtime.models.base import (
    Chunk,
    Finish,
    ModelRequest,
    TextDelta,
    Thinking,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from subagents.runtime.models.openai_wire import StreamFault
from subagents.runtime.models.specs import anthropic_options, build_model, parse_model_spec, record_of

HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
EPHEMERAL = {"type": "ephemeral"}


def msg(role: str, *blocks: dict[str, Any], kind: str = "user") -> dict[str, Any]:
    return {"id": "m", "role": role, "content": list(blocks), "source": {"kind": kind}}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def call(call_id: str, name: str = "echo", arguments: str = '{"text": "x"}') -> dict[str, Any]:
    return {"type": "tool-call", "id": call_id, "name": name, "arguments": arguments}


def result(call_id: str, t: str, *, is_error: bool = False) -> dict[str, Any]:
    block = {"type": "tool-result", "call_id": call_id, "content": [text(t)], "is_error": is_error}
    return {"id": "r", "role": "user", "content": [block], "source": {"kind": "tool", "call_id": call_id}}


THINK = {"type": "thinking", "thinking": "hm", "signature": "sig-1"}
REDACTED = {"type": "redacted-thinking", "data": "opaque=="}
TOOLS = [ToolSpec(name="echo", description="Echo.", parameters={"type": "object"})]

SYSTEM = msg("system", text("Be brief."))
HISTORY = [
    SYSTEM,
    msg("user", text("first")),
    msg("assistant", THINK, REDACTED, text("calling"), call("c1"), call("c2", arguments=""), kind="model"),
    result("c1", "one"),
    result("c2", "two", is_error=True),
    msg("user", text("steered")),
]


def body(messages: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    return anthropic_body("claude-x", ModelRequest(messages=messages, tools=TOOLS), AnthropicOptions(**options))


def test_a_tool_use_turn_maps_to_blocks_merged_results_and_four_cache_marks() -> None:
    sent = body(HISTORY, thinking_budget=1024)
    assert sent["system"] == [{"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL}]
    assert sent["tools"] == [
        {"name": "echo", "description": "Echo.", "input_schema": {"type": "object"}, "cache_control": EPHEMERAL}
    ]
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert sent["stream"] is True and sent["max_tokens"] == 8192
    assert sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "first", "cache_control": EPHEMERAL}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "sig-1"},
                {"type": "redacted_thinking", "data": "opaque=="},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "c1", "name": "echo", "input": {"text": "x"}},
                {"type": "tool_use", "id": "c2", "name": "echo", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": [text("one")]},
                {"type": "tool_result", "tool_use_id": "c2", "content": [text("two")], "is_error": True},
                {"type": "text", "text": "steered", "cache_control": EPHEMERAL},
            ],
        },
    ]
    assert sdk_problem(sent) is None
    assert request_problem(sent, HEADERS, {"sig-1"}) is None


def test_without_thinking_the_thinking_blocks_stay_home_and_caching_can_be_off() -> None:
    sent = body(HISTORY, cache=False)
    assert "thinking" not in sent
    assistant = sent["messages"][1]["content"]
    assert [b["type"] for b in assistant] == ["text", "tool_use", "tool_use"]
    assert "cache_control" not in json.dumps(sent)
    assert sdk_problem(sent) is None and request_problem(sent, HEADERS, set()) is None


@pytest.mark.parametrize(
    "messages",
    [
        [msg("user", text("only"))],
        [msg("user", text("a")), msg("assistant", text("b"), kind="model"), msg("user", text("c"))],
        [msg("user", text("")), msg("user", text("x"))],  # empty text dropped, users merged
        [SYSTEM, SYSTEM, msg("user", text("two systems"))],
        HISTORY + [msg("assistant", text("done"), kind="model"), msg("user", text("more"))],
        [msg("user", text("a")), msg("assistant", call("c9", arguments="not json"), kind="model"), result("c9", "bad")],
    ],
)
@pytest.mark.parametrize("thinking", [None, 2048])
def test_every_body_passes_the_sdks_types_and_the_apis_rules(
    messages: list[dict[str, Any]], thinking: int | None
) -> None:
    sent = body(messages, thinking_budget=thinking)
    assert sdk_problem(sent) is None
    assert request_problem(sent, HEADERS, {"sig-1"}) is None
    marks = json.dumps(sent).count('"cache_control"')
    assert 1 <= marks <= 4
    # Thinking goes with every call but one continuing a tool-use turn that did not think.
    unthought = messages[-1]["source"]["kind"] == "tool" and messages[-2]["content"][0]["type"] == "tool-call"
    assert ("thinking" in sent) == (thinking is not None and not unthought)


def test_a_compaction_call_asks_for_the_summary_last_and_does_not_think() -> None:
    history = [*HISTORY, msg("assistant", THINK, text("done"), kind="model")]
    request = ModelRequest(messages=history, purpose="compaction")
    sent = anthropic_body("claude-x", request, AnthropicOptions(thinking_budget=1024))
    assert "thinking" not in sent and "tools" not in sent
    last = sent["messages"][-1]
    assert last["role"] == "user" and last["content"][-1]["text"].startswith("Summarize the conversation above")
    assert all(b["type"] != "thinking" for m in sent["messages"] for b in m["content"])
    assert sdk_problem(sent) is None and request_problem(sent, HEADERS, set()) is None


def test_the_checker_refuses_what_the_api_refuses() -> None:
    good = body(HISTORY, thinking_budget=1024)
    assert sdk_problem({**good, "temperature": "hot"}) is not None
    assert sdk_problem({**good, "bogus": 1}) is not None
    bad_block = json.loads(json.dumps(good))
    bad_block["messages"][0]["content"][0]["type"] = "tool-result"
    assert sdk_problem(bad_block) is not None
    assert request_problem(good, {}, {"sig-1"}) == "x-api-key header is required"
    assert "signature" in (request_problem(good, HEADERS, set()) or "")
    no_thinking = json.loads(json.dumps(good))
    no_thinking["messages"][1]["content"] = no_thinking["messages"][1]["content"][2:]
    assert "must start with a thinking block" in (request_problem(no_thinking, HEADERS, set()) or "")
    split = json.loads(json.dumps(good))
    split["messages"][2]["content"].reverse()
    assert "come first" in (request_problem(split, HEADERS, {"sig-1"}) or "")


# -- the stream ----------------------------------------------------------------------------------


def frame(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


def read(data: bytes, piece: int = 7) -> list[Chunk]:
    parser = StreamParser()
    chunks: list[Chunk] = []
    for i in range(0, len(data), piece):  # pieces that cut lines and events anywhere
        chunks += parser.feed(data[i : i + piece])
    chunks += parser.end()
    assert parser.done
    return chunks


FULL = Reply(
    blocks=(
        Block.thinking("let ", "me see", signature="sig-9"),
        Block.redacted("cipher"),
        Block.text("Hi ", "there"),
        Block.tool_use("echo", {"text": "a longer argument"}, id="toolu_1", fragments=4),
        Block.tool_use("list_agents", {}, id="toolu_2"),
    ),
    stop_reason="tool_use",
    usage=(11, 42, 300, 25),
)


def test_the_fakes_events_are_the_sdks_stream_events() -> None:
    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter

    adapter = TypeAdapter(RawMessageStreamEvent)
    names = []
    for name, data in FULL.events("claude-x"):
        if name != "ping":
            assert adapter.validate_python(data).type == name
        names.append(name)
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert {"content_block_start", "content_block_delta", "content_block_stop", "ping"} <= set(names)


def test_a_full_reply_reads_as_thinking_text_two_calls_usage_and_finish() -> None:
    chunks = read(frame(FULL.events("claude-x")))
    assert chunks[0] == Thinking(text="let me see", signature="sig-9")  # whole, at its block's stop
    assert [c for c in chunks if isinstance(c, Thinking)] == [
        Thinking(text="let me see", signature="sig-9"),
        Thinking(redacted="cipher"),
    ]
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "Hi there"
    calls: dict[int, list[ToolCallDelta]] = {}
    for c in chunks:
        if isinstance(c, ToolCallDelta):
            calls.setdefault(c.index, []).append(c)
    assert [(v[0].id, v[0].name) for v in calls.values()] == [("toolu_1", "echo"), ("toolu_2", "list_agents")]
    assert [json.loads("".join(p.arguments for p in v)) for v in calls.values()] == [{"text": "a longer argument"}, {}]
    assert chunks[-2:] == [Usage(11, 42, cache_read_tokens=300, cache_write_tokens=25), Finish("tool-calls")]


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("tool_use", "tool-calls"),
        ("max_tokens", "max-tokens"),
        ("model_context_window_exceeded", "max-tokens"),
        ("something_new", "stop"),
    ],
)
def test_stop_reasons(stop: str, finish: str) -> None:
    chunks = read(frame(Reply.text("x", stop_reason=stop).events("m")))
    assert chunks[-1] == Finish(finish)


def fault(data: bytes) -> StreamFault:
    with pytest.raises(StreamFault) as caught:
        read(data)
    return caught.value


EVENTS = Reply.text("partial").events("m")


@pytest.mark.parametrize(
    ("data", "error", "says"),
    [
        (frame([*Reply.text("x", stop_reason="refusal").events("m")]), ModelContentFiltered, "refusal"),
        (frame([*Reply.text("x", stop_reason="pause_turn").events("m")]), ModelBadStream, "pause_turn"),
        (
            frame(
                [
                    *EVENTS[:3],
                    ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
                ]
            ),
            ModelUnavailable,
            "overloaded_error: Overloaded",
        ),
        (
            frame(
                [*EVENTS[:3], ("error", {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}})]
            ),
            ModelBadStream,
            "invalid_request_error: no",
        ),
        (frame(EVENTS[:4]), ModelStreamInterrupted, "without message_stop"),
        (b"event: message_start\ndata: {not json\n\n", ModelBadStream, "not JSON"),
        (b"data: [1, 2]\n\n", ModelBadStream, "not a JSON object"),
        (frame(EVENTS[1:]), ModelBadStream, "before message_start"),
        (
            frame([EVENTS[0], ("content_block_delta", {"type": "content_block_delta", "index": 3, "delta": {}})]),
            ModelBadStream,
            "never started",
        ),
        (
            frame(
                [
                    EVENTS[0],
                    EVENTS[1],
                    (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 5}},
                    ),
                ]
            ),
            ModelBadStream,
            "not a string",
        ),
        (
            frame(
                [
                    EVENTS[0],
                    (
                        "message_delta",
                        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": -1}},
                    ),
                ]
            ),
            ModelBadStream,
            "non-negative",
        ),
        (b"<html>Bad Gateway</html>\n", ModelBadResponse, "not an event stream"),
    ],
)
def test_faults(data: bytes, error: type[ModelError], says: str) -> None:
    found = fault(data)
    assert found.error is error
    assert says in found.message and "\n" not in found.message


def test_a_body_that_ends_after_a_stop_reason_without_message_stop_is_accepted() -> None:
    chunks = read(frame(EVENTS[:-1]))
    assert chunks[-1] == Finish("stop") and "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "partial"


def test_unknown_events_blocks_and_deltas_are_skipped() -> None:
    extra = [
        (
            "content_block_start",
            {"type": "content_block_start", "index": 5, "content_block": {"type": "server_tool_use"}},
        ),
        ("content_block_delta", {"type": "content_block_delta", "index": 5, "delta": {"type": "citations_delta"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 5}),
        ("future_event", {"type": "future_event"}),
    ]
    chunks = read(frame([EVENTS[0], *extra, *EVENTS[1:]]))
    assert chunks == [TextDelta("partial"), Usage(10, 5), Finish("stop")]


def test_the_key_is_redacted_from_a_reported_error() -> None:
    key = "sk-ant-SECRET-0123456789"
    data = frame([EVENTS[0], ("error", {"type": "error", "error": {"type": "api_error", "message": f"bad {key}"}})])
    parser = StreamParser(lambda t: t.replace(key, "[redacted]"))
    with pytest.raises(StreamFault) as caught:
        parser.feed(data)
    assert key not in caught.value.message and "[redacted]" in caught.value.message


# -- the spec ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "model", "options"),
    [
        ("claude-x", "claude-x", AnthropicOptions()),
        ("claude-x,thinking=2048", "claude-x", AnthropicOptions(thinking_budget=2048)),
        # A budget past the default max_tokens leaves the default's room for the answer after it.
        ("claude-x,thinking=10000", "claude-x", AnthropicOptions(thinking_budget=10000, max_tokens=18192)),
        ("claude-x,thinking=1024,max_tokens=4096", "claude-x", AnthropicOptions(thinking_budget=1024, max_tokens=4096)),
        ("claude-x,cache=off", "claude-x", AnthropicOptions(cache=False)),
    ],
)
def test_anthropic_options(name: str, model: str, options: AnthropicOptions) -> None:
    assert anthropic_options(name) == (model, options)


@pytest.mark.parametrize(
    "spec",
    [
        "anthropic:claude-x,thinking",
        "anthropic:claude-x,thinking=lots",
        "anthropic:claude-x,thinking=0",
        "anthropic:claude-x,temperature=1",
        "anthropic:claude-x,cache=maybe",
        "anthropic:claude-x,cache=on,cache=off",
        "anthropic:,thinking=1024",
    ],
)
def test_bad_anthropic_specs_are_one_line_errors(spec: str) -> None:
    with pytest.raises(ModelSpecError) as caught:
        parse_model_spec(spec, env={"ANTHROPIC_API_KEY": "k"})
    assert "\n" not in str(caught.value)


def test_the_spec_reads_the_key_and_base_url_from_the_environment_and_records_no_key() -> None:
    env = {"ANTHROPIC_API_KEY": "sk-ant-env", "ANTHROPIC_BASE_URL": "http://proxy.test:8080"}
    spec = parse_model_spec("anthropic:claude-x,thinking=2048", env=env)
    assert (spec.base_url, spec.api_key) == ("http://proxy.test:8080", "sk-ant-env")
    assert parse_model_spec("anthropic:claude-x", env=env, base_url="http://flag.test").base_url == "http://flag.test"
    assert (
        parse_model_spec("anthropic:claude-x", env={"ANTHROPIC_API_KEY": "k"}).base_url == "https://api.anthropic.com"
    )
    model = build_model(spec)
    record = record_of(model)
    assert record is not None
    assert record.data() == {"model": "anthropic:claude-x,thinking=2048", "base_url": "http://proxy.test:8080"}
    assert "sk-ant-env" not in repr(model)
    assert model.url == "http://proxy.test:8080/v1/messages"
    with pytest.raises(ModelSpecError, match="ANTHROPIC_API_KEY is not set"):
        parse_model_spec("anthropic:claude-x", env={"OTHER": "x"})
    with pytest.raises(ModelSpecError, match="thinking budget"):
        build_model(parse_model_spec("anthropic:claude-x,thinking=4096,max_tokens=4096", env=env))
