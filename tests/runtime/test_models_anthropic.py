"""The Anthropic transport (runtime/models/anthropic.py) in-process: against the fake Messages API
server (a real socket: what the transport sends is checked as the API would), and against
`httpx.MockTransport` for the error paths, where the key is placed at every offset around an
excerpt's cut (as test_openai_secrets.py does for OpenAI): no error text, repr or log record
holds any 8-character run of it. Backoff sleeps on a `ScenarioClock`, never for real."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing
from typing import Any

import httpx
import pytest
from fake_anthropic import AnthropicServer, Block, Reply
from subagents.runtime.foundation.clock import ScenarioClock
from subagents.runtime.foundation.errors import ModelError
from subagents.runtime.models.anthropic import AnthropicModel
from subagents.runtime.models.anthropic_wire import AnthropicOptions
from subagents.runtime.models.base import Chunk, Finish, ModelRequest, TextDelta, Thinking, ToolSpec, Usage

KEY = "sk-ant-LEAK-Q7f3a9c1e5b2d4f60Zx8W9v"
GRAMS = {KEY[i : i + 8] for i in range(len(KEY) - 7)}
CUT = 200  # the excerpt length of provider text in an error message
PIECES = {"whole": KEY, "prefix8": KEY[:8], "prefix20": KEY[:20], "tail8": KEY[-8:], "middle": KEY[5:25]}

REQUEST = ModelRequest(
    messages=[
        {"id": "s", "role": "system", "content": [{"type": "text", "text": "Be brief."}], "source": {"kind": "user"}},
        {"id": "u", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}},
    ],
    tools=[ToolSpec(name="echo", description="Echo.", parameters={"type": "object"})],
)


def leaks(text: str | bytes) -> list[str]:
    raw = text.encode() if isinstance(text, str) else text
    return [g for g in GRAMS if g.encode() in raw]


async def collect(model: AnthropicModel, request: ModelRequest = REQUEST) -> list[Chunk]:
    async with aclosing(model.stream(request)) as chunks:
        return [chunk async for chunk in chunks]


async def failure(model: AnthropicModel) -> ModelError:
    with pytest.raises(ModelError) as info:
        await collect(model)
    return info.value


def on(server: AnthropicServer, **options: Any) -> AnthropicModel:
    options.setdefault("clock", ScenarioClock())
    return AnthropicModel("claude-x", base_url=server.base_url, api_key=KEY, **options)


async def test_a_thinking_reply_with_cache_usage_against_the_fake_server() -> None:
    reply = Reply(
        blocks=(Block.thinking("a", "b", signature="sig-x"), Block.text("Hel", "lo")),
        usage=(4, 9, 1200, 30),
    )
    with AnthropicServer([reply]) as server:
        chunks = await collect(on(server, options=AnthropicOptions(thinking_budget=1024)))
        assert server.leftovers() == {}
        [seen] = server.requests
    assert chunks == [
        Thinking(text="ab", signature="sig-x"),
        TextDelta("Hel"),
        TextDelta("lo"),
        Usage(4, 9, cache_read_tokens=1200, cache_write_tokens=30),
        Finish("stop"),
    ]
    assert seen.target == "/v1/messages"
    assert seen.headers["x-api-key"] == KEY and seen.headers["anthropic-version"] == "2023-06-01"
    assert seen.headers["accept"] == "text/event-stream" and "authorization" not in seen.headers
    assert seen.json()["system"] == [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]


@pytest.mark.parametrize("status", [529, 503, 429])
async def test_overloaded_and_rate_limits_are_retried_after_the_servers_retry_after(status: int) -> None:
    clock = ScenarioClock()
    busy = Reply.error(status, "Overloaded", kind="overloaded_error", retry_after="7")
    with AnthropicServer([busy, busy, Reply.text("ok")]) as server:
        chunks = await collect(on(server, clock=clock))
        assert len(server.requests) == 3 and server.leftovers() == {}
    assert chunks[0] == TextDelta("ok")
    assert clock.slept_ms == 14_000  # twice the 7 s the server asked for, on the runtime clock


async def test_overloaded_until_the_retries_run_out_is_one_line() -> None:
    busy = Reply.error(529, "Overloaded", kind="overloaded_error", retry_after="0")
    with AnthropicServer([busy] * 3) as server:
        error = await failure(on(server, max_retries=2))
    assert error.code == "MODEL_UNAVAILABLE"
    assert "unavailable after 3 attempts" in error.message and "HTTP 529: Overloaded" in error.message
    assert "\n" not in error.message


async def test_an_error_event_mid_stream_and_a_cut_are_model_errors() -> None:
    with AnthropicServer([Reply.text("a", "b", error_after=3), Reply.text("a", "b", cut_after=3)]) as server:
        overloaded = await failure(on(server))
        cut = await failure(on(server))
    assert overloaded.code == "MODEL_UNAVAILABLE" and "overloaded_error: Overloaded" in overloaded.message
    assert cut.code == "MODEL_STREAM_INTERRUPTED"


async def test_a_base_url_with_the_version_path_and_a_wrong_one() -> None:
    with AnthropicServer([Reply.text("ok")]) as server:
        model = AnthropicModel("claude-x", base_url=f"{server.base_url}/v1", api_key=KEY)
        assert model.url == f"{server.base_url}/v1/messages"
        assert (await collect(model))[0] == TextDelta("ok")
        wrong = await failure(AnthropicModel("claude-x", base_url=f"{server.base_url}/api", api_key=KEY))
    assert wrong.code == "MODEL_NOT_FOUND" and "check the base URL" in wrong.message


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"options": AnthropicOptions(thinking_budget=512)}, "at least 1024"),
        ({"options": AnthropicOptions(thinking_budget=9000, max_tokens=9000)}, "below max_tokens"),
        ({"options": AnthropicOptions(max_tokens=0)}, "at least 1"),
        ({"base_url": "ftp://x"}, "http(s)"),
        ({"api_key": "two words"}, "printable ASCII"),
    ],
)
def test_bad_settings_are_value_errors(options: dict[str, Any], says: str) -> None:
    arguments: dict[str, Any] = {"base_url": "https://api.anthropic.com", "api_key": KEY} | options
    with pytest.raises(ValueError, match=None) as caught:
        AnthropicModel("claude-x", **arguments)
    assert says in str(caught.value)
    assert not leaks(str(caught.value))


def test_the_repr_names_no_key() -> None:
    model = AnthropicModel("claude-x", api_key=KEY)
    assert repr(model) == "AnthropicModel(model='claude-x', url='https://api.anthropic.com/v1/messages', api_key=set)"


# -- the key never leaks ---------------------------------------------------------------------------


def cases() -> Iterator[tuple[str, int, str]]:
    """Provider text with a piece of the key at every offset from before the excerpt's cut to
    after it."""
    for name, piece in PIECES.items():
        for offset in range(max(0, CUT - len(piece) - 3), CUT + 3):
            yield name, offset, "p" * offset + piece + "q" * (CUT + 40)


Handler = Callable[[httpx.Request], httpx.Response]


def mocked(handler: Handler) -> AnthropicModel:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return AnthropicModel(
        "claude-x", base_url="http://provider.test", api_key=KEY, client=client, max_retries=1, clock=ScenarioClock()
    )


def assert_clean(error: ModelError, where: Any) -> None:
    for text in (str(error), repr(error), error.message, repr(error.args)):
        assert not leaks(text), (where, text)
    assert error.__cause__ is None and error.__context__ is None, where
    assert "\n" not in error.message


@pytest.mark.slow  # the key at every offset of every error: many runs
@pytest.mark.parametrize("status", [400, 401, 403, 404, 429, 529])
async def test_error_bodies_never_leak_at_any_offset(status: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    redacted = 0
    for name, offset, text in cases():
        body = json.dumps({"type": "error", "error": {"type": "some_error", "message": text}})
        error = await failure(
            mocked(lambda r, b=body: httpx.Response(status, headers={"content-type": "application/json"}, text=b))
        )
        assert_clean(error, (name, offset))
        if offset + len("[redacted]") < CUT:  # positive control: the marker fits in the excerpt
            assert "[redacted]" in error.message, (name, offset, error.message)
            redacted += 1
    assert redacted > 0
    assert not leaks(caplog.text)


@pytest.mark.slow  # the key at every offset of every stream error: many runs
@pytest.mark.parametrize("kind", ["error-event", "not-json"])
async def test_stream_errors_never_leak_at_any_offset(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    start = 'event: message_start\ndata: {"type": "message_start", "message": {"usage": {"input_tokens": 1}}}\n\n'
    for name, offset, text in cases():
        if kind == "error-event":
            error_data = json.dumps({"type": "error", "error": {"type": "overloaded_error", "message": text}})
            stream = f"{start}event: error\ndata: {error_data}\n\n"
        else:
            stream = f"{start}event: ping\ndata: {text}\n\n"
        error = await failure(
            mocked(lambda r, s=stream: httpx.Response(200, headers={"content-type": "text/event-stream"}, text=s))
        )
        assert error.code == ("MODEL_UNAVAILABLE" if kind == "error-event" else "MODEL_BAD_STREAM"), error
        assert_clean(error, (name, offset))
    assert not leaks(caplog.text)


async def test_transport_errors_never_leak(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for name, offset, text in list(cases())[::7]:

        def refuse(r: httpx.Request, text: str = text) -> httpx.Response:
            raise httpx.ConnectError(text, request=r)

        async def cut_body(text: str = text) -> AsyncIterator[bytes]:
            yield b'event: message_start\ndata: {"type": "message_start", "message": {}}\n\n'
            raise httpx.ReadError(text)

        def cut(r: httpx.Request, body: Any = cut_body) -> httpx.Response:
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

        for handler, code in ((refuse, "MODEL_UNAVAILABLE"), (cut, "MODEL_STREAM_INTERRUPTED")):
            error = await failure(mocked(handler))
            assert error.code == code, error
            assert_clean(error, (name, offset, code))
    assert not leaks(caplog.text)
