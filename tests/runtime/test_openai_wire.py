"""The OpenAI wire format without IO: body bytes to chunks (or faults) and messages to the chat
format, as tables. No server, no trio: `StreamParser` is fed bytes and answers synchronously."""

from __future__ import annotations

import json
from typing import Any

import pytest
from subagents.runtime.models.base import Chunk, Finish, TextDelta, ToolCallDelta, Usage
from subagents.runtime.models.openai_wire import StreamFault, StreamParser, openai_messages


def data(obj: Any) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def delta(finish: str | None = None, **fields: Any) -> bytes:
    return data({"choices": [{"index": 0, "delta": fields, "finish_reason": finish}]})


DONE = b"data: [DONE]\n\n"


def parse(pieces: list[bytes]) -> tuple[list[Chunk], bool]:
    """Every chunk the pieces make, then `end()`'s; and whether the parser was done before the end."""
    parser = StreamParser()
    chunks: list[Chunk] = []
    for piece in pieces:
        chunks += parser.feed(piece)
    done = parser.done
    chunks += parser.end()
    return chunks, done


STREAMS = [
    pytest.param(
        [delta(content="Hel"), delta(content="lo"), delta("stop"), DONE],
        [TextDelta("Hel"), TextDelta("lo"), Finish("stop")],
        True,
        id="text",
    ),
    pytest.param(
        [(delta(content="ab") + delta("stop") + DONE)[i : i + 3] for i in range(0, 200, 3)],
        [TextDelta("ab"), Finish("stop")],
        True,
        id="split-every-3-bytes",
    ),
    pytest.param(
        [
            delta(tool_calls=[{"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}]),
            delta(tool_calls=[{"index": 0, "function": {"arguments": '{"a":'}}]),
            delta(tool_calls=[{"index": 0, "function": {"arguments": "1}"}}]),
            delta("tool_calls"),
            DONE,
        ],
        [
            ToolCallDelta(0, id="c1", name="f"),
            ToolCallDelta(0, arguments='{"a":'),
            ToolCallDelta(0, arguments="1}"),
            Finish("tool-calls"),
        ],
        True,
        id="tool-call-deltas-by-index",
    ),
    pytest.param(
        [delta(tool_calls=[{"index": 1, "id": "c2", "function": {"name": "g"}}]), delta("stop"), DONE],
        [ToolCallDelta(1, id="c2", name="g"), Finish("tool-calls")],
        True,
        id="stop-with-tool-calls",
    ),
    pytest.param(
        [
            delta("length"),
            data({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}),
            data({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 6}}),
            DONE,
        ],
        [Usage(5, 6), Finish("max-tokens")],
        True,
        id="last-usage-wins",
    ),
    pytest.param(
        [
            delta("stop"),
            data(
                {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 50,
                        "completion_tokens": 4,
                        "prompt_tokens_details": {"cached_tokens": 32},
                    },
                }
            ),
            DONE,
        ],
        [Usage(18, 4, cache_read_tokens=32), Finish("stop")],
        True,
        id="openai-cached-prompt-apart",
    ),
    pytest.param(
        [
            delta("stop"),
            data(
                {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 10,
                        "completion_tokens": 40,
                        "completion_tokens_details": {"reasoning_tokens": 99},
                    },
                }
            ),
            data(
                {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 10,
                        "completion_tokens": 40,
                        "completion_tokens_details": {"reasoning_tokens": 32},
                    },
                }
            ),
            DONE,
        ],
        [Usage(10, 40, reasoning_tokens=32), Finish("stop")],
        True,
        id="openai-reasoning-kept-as-a-part-of-the-completion",
    ),
    pytest.param(
        [
            delta("stop"),
            data(
                {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 10,
                        "completion_tokens": 40,
                        "completion_tokens_details": {"reasoning_tokens": 99},
                    },
                }
            ),
            DONE,
        ],
        [Usage(10, 40, reasoning_tokens=40), Finish("stop")],
        True,
        id="openai-reasoning-never-past-the-completion",
    ),
    pytest.param(
        [
            data(
                {
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 40, "completion_tokens": 2, "prompt_cache_hit_tokens": 64},
                }
            ),
            DONE,
        ],
        [Usage(0, 2, cache_read_tokens=40), Finish("stop")],
        True,
        id="deepseek-cache-hits-apart-and-never-past-the-prompt",
    ),
    pytest.param([delta("mystery"), DONE], [Finish("stop")], True, id="unknown-reason"),
    pytest.param(
        [delta(content="x", reasoning_content="ignored"), delta("stop")],
        [TextDelta("x"), Finish("stop")],
        False,
        id="clean-end-without-done",
    ),
    pytest.param(
        [b": keep-alive\n\n", delta("stop"), DONE, delta(content="after")],
        [Finish("stop")],
        True,
        id="comments-and-input-after-done",
    ),
]


@pytest.mark.parametrize(("pieces", "expected", "done_before_end"), STREAMS)
def test_streams_become_chunks(pieces: list[bytes], expected: list[Chunk], done_before_end: bool) -> None:
    assert parse(pieces) == (expected, done_before_end)


FAULTS = [
    pytest.param([b'{"error": "nope"}\n'], "MODEL_BAD_RESPONSE", "not an event stream", id="not-sse"),
    pytest.param([b"data: {oops\n\n"], "MODEL_BAD_STREAM", "event 1 is not JSON", id="not-json"),
    pytest.param([b"data: [1]\n\n"], "MODEL_BAD_STREAM", "not a JSON object", id="not-an-object"),
    pytest.param([data({"error": {"message": "overloaded"}})], "MODEL_BAD_STREAM", "overloaded", id="error-object"),
    pytest.param([b"event: error\ndata: boom\n\n"], "MODEL_BAD_STREAM", "boom", id="error-event"),
    pytest.param([DONE], "MODEL_BAD_STREAM", "[DONE] arrived without a finish_reason", id="done-without-finish"),
    pytest.param([delta(content=5)], "MODEL_BAD_STREAM", "delta.content is not a string", id="content-type"),
    pytest.param([delta(tool_calls=[{"index": -1}])], "MODEL_BAD_STREAM", "non-negative integer", id="bad-index"),
    pytest.param(
        [data({"choices": [], "usage": {"prompt_tokens": "3"}})],
        "MODEL_BAD_STREAM",
        "usage token counts are not integers",
        id="usage-type",
    ),
    pytest.param([delta("content_filter")], "MODEL_CONTENT_FILTERED", "content filter", id="content-filter"),
    pytest.param([delta(content="cut")], "MODEL_STREAM_INTERRUPTED", "after 1 events without [DONE]", id="cut"),
]


@pytest.mark.parametrize(("pieces", "code", "words"), FAULTS)
def test_faults_carry_their_code(pieces: list[bytes], code: str, words: str) -> None:
    with pytest.raises(StreamFault) as caught:
        parse(pieces)
    assert caught.value.error.code == code
    assert words in caught.value.message


def test_quoted_provider_text_is_redacted_before_it_is_cut() -> None:
    parser = StreamParser(lambda text: text.replace("SECRET", "[redacted]"))
    with pytest.raises(StreamFault) as caught:
        parser.feed(b"event: error\ndata: " + b"x" * 195 + b"SECRET\n\n")
    assert "SECRET" not in caught.value.message and "SEC" not in caught.value.message


MESSAGES = [
    pytest.param(
        [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        [{"role": "user", "content": "a\nb"}],
        id="text-joined",
    ),
    pytest.param(
        [{"role": "assistant", "content": [{"type": "tool-call", "id": "c1", "name": "f", "arguments": "{}"}]}],
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            }
        ],
        id="assistant-tool-call",
    ),
    pytest.param(
        [
            {
                "role": "user",
                "content": [
                    {"type": "tool-result", "call_id": "c1", "content": [{"type": "text", "text": "r"}]},
                    {"type": "text", "text": "then"},
                ],
            }
        ],
        [{"role": "tool", "tool_call_id": "c1", "content": "r"}, {"role": "user", "content": "then"}],
        id="tool-result-before-text",
    ),
]


@pytest.mark.parametrize(("messages", "expected"), MESSAGES)
def test_messages_convert_to_the_chat_format(messages: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert openai_messages(messages) == expected
