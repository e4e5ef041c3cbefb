"""The OpenAI-compatible transport against a real HTTP server on 127.0.0.1.

The server is a small Trio TCP server speaking just enough HTTP/1.1: it records each request and
answers from a script (status, headers, body pieces, how the body is framed, whether it is cut
off or held open). Backoff sleeps on a `ScenarioClock`, so retries never wait for real; the only
real-time bound is a hang guard around waits for the server's side of a disconnect.
"""

from __future__ import annotations

import json
import logging
import random
import socket
from collections.abc import Awaitable, Callable, Sequence
from contextlib import aclosing
from functools import partial
from typing import Any, Literal

import attrs
import httpx
import pytest
import trio
import trio.testing
from http_request import Seen, read_request
from subagents.runtime.foundation.clock import ScenarioClock
from subagents.runtime.foundation.errors import ModelError
from subagents.runtime.models.base import Chunk, Finish, ModelRequest, TextDelta, ToolCallDelta, ToolSpec, Usage
from subagents.runtime.models.openai import OpenAIChatModel
from subagents.runtime.models.openai_wire import openai_messages
from subagents.runtime.models.sse import SSEDecoder, SSEError, SSEEvent

# A body generator left suspended for the garbage collector (a response not closed properly)
# shows up as a ResourceWarning from Trio: make it fail the test.
pytestmark = pytest.mark.filterwarnings("error")

KEY = "sk-SENTINEL-7f3a9c1e5b2d4f60"
MODEL = "test-model"
HANG_GUARD = 5.0  # real seconds; only ever reached if something hangs


# -- the scripted server -----------------------------------------------------------------------


@attrs.frozen
class Reply:
    status: int = 200
    headers: Sequence[tuple[str, str]] = (("Content-Type", "text/event-stream"),)
    parts: Sequence[bytes] = ()
    # chunked: each part one chunk; length: Content-Length; close: the body ends at EOF.
    framing: Literal["chunked", "length", "close"] = "chunked"
    complete: bool = True  # False: close the connection without finishing the chunked body
    hold: bool = False  # after the parts (body unfinished), keep the connection open until the client leaves


class ScriptedServer:
    """Answers the n-th request with the n-th reply (the last one repeats)."""

    def __init__(self, replies: Sequence[Reply]) -> None:
        self.replies = list(replies)
        self.requests: list[Seen] = []
        self.port = 0
        self.sent_parts = trio.Event()
        self.disconnected = trio.Event()

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            seen = await read_request(stream)
            if seen is None:
                return
            self.requests.append(seen)
            reply = self.replies[min(len(self.requests), len(self.replies)) - 1]
            await self._answer(stream, reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.disconnected.set()
        finally:
            await stream.aclose()

    async def _answer(self, stream: trio.SocketStream, reply: Reply) -> None:
        head = [f"HTTP/1.1 {reply.status} Scripted", "Connection: close"]
        head += [f"{k}: {v}" for k, v in reply.headers]
        if reply.framing == "chunked":
            head.append("Transfer-Encoding: chunked")
        elif reply.framing == "length":
            head.append(f"Content-Length: {sum(len(p) for p in reply.parts)}")
        await stream.send_all(("\r\n".join(head) + "\r\n\r\n").encode())
        for part in reply.parts:
            if reply.framing == "chunked":
                part = b"%x\r\n%s\r\n" % (len(part), part)
            await stream.send_all(part)
        if reply.framing == "chunked" and reply.complete and not reply.hold:
            await stream.send_all(b"0\r\n\r\n")
        self.sent_parts.set()
        if reply.hold:
            while await stream.receive_some(65536):
                pass
            self.disconnected.set()


Serve = Callable[..., Awaitable[ScriptedServer]]


@pytest.fixture
def serve(nursery: trio.Nursery) -> Serve:
    async def start(*replies: Reply) -> ScriptedServer:
        server = ScriptedServer(replies)
        listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
        server.port = listeners[0].socket.getsockname()[1]
        return server

    return start


# -- helpers -----------------------------------------------------------------------------------


def sse(*objs: Any, done: bool = True) -> list[bytes]:
    parts = [b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs]
    return parts + [b"data: [DONE]\n\n"] if done else parts


def delta(
    content: str | None = None, *, tool_calls: list[Any] | None = None, finish: str | None = None
) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if content is not None:
        d["content"] = content
    if tool_calls is not None:
        d["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [{"index": 0, "delta": d, "finish_reason": finish}],
        "usage": None,
    }


def usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}


def call(index: int, *, id: str | None = None, name: str | None = None, args: str | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"index": index, "function": {}}
    if id is not None:
        c["id"] = id
        c["type"] = "function"
    if name is not None:
        c["function"]["name"] = name
    if args is not None:
        c["function"]["arguments"] = args
    return c


TEXT_STREAM = sse(delta(""), delta("Hel"), delta("lo"), delta(finish="stop"), usage(12, 3))
TEXT_CHUNKS = [TextDelta("Hel"), TextDelta("lo"), Usage(12, 3), Finish("stop")]


def model_for(server: ScriptedServer | int, **kw: Any) -> OpenAIChatModel:
    port = server if isinstance(server, int) else server.port
    kw.setdefault("api_key", KEY)
    kw.setdefault("rng", random.Random(7))
    kw.setdefault("clock", ScenarioClock())  # backoff never sleeps for real
    return OpenAIChatModel(MODEL, base_url=f"http://127.0.0.1:{port}/v1/", **kw)


def make_request(messages: Sequence[dict[str, Any]] | None = None, tools: Sequence[ToolSpec] = ()) -> ModelRequest:
    if messages is None:
        messages = [msg("u1", "user", [text("hi")])]
    return ModelRequest(messages=messages, tools=tools)


def msg(id: str, role: str, content: list[dict[str, Any]], kind: str = "prompt") -> dict[str, Any]:
    return {"id": id, "role": role, "content": content, "source": {"kind": kind}}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


async def collect(model: OpenAIChatModel, request: ModelRequest, into: list[Chunk] | None = None) -> list[Chunk]:
    got: list[Chunk] = [] if into is None else into
    async with aclosing(model.stream(request)) as stream:
        async for chunk in stream:
            got.append(chunk)
    return got


async def failure(model: OpenAIChatModel, request: ModelRequest, into: list[Chunk] | None = None) -> ModelError:
    with pytest.raises(ModelError) as info:
        await collect(model, request, into)
    assert "\n" not in str(info.value)
    return info.value


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- streaming -----------------------------------------------------------------------------------


async def test_text_streams_with_usage_and_one_finish(serve: Serve) -> None:
    # A keep-alive comment, and one event split across two network pieces.
    first, *rest = TEXT_STREAM
    server = await serve(Reply(parts=[b": keep-alive\n\n", first[:9], first[9:], *rest]))
    assert await collect(model_for(server), make_request()) == TEXT_CHUNKS
    [seen] = server.requests
    assert (seen.method, seen.target) == ("POST", "/v1/chat/completions")
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["accept"] == "text/event-stream"


async def test_no_key_sends_no_authorization(serve: Serve) -> None:
    server = await serve(Reply(parts=TEXT_STREAM, framing="length"))
    assert await collect(model_for(server, api_key=None), make_request()) == TEXT_CHUNKS
    assert "authorization" not in server.requests[0].headers


async def test_tool_calls_arrive_as_deltas_by_index(serve: Serve) -> None:
    stream = sse(
        delta(tool_calls=[call(0, id="call_a", name="read_file", args="")]),
        delta(tool_calls=[call(0, args='{"pa')]),
        delta(tool_calls=[call(1, id="call_b", name="list_agents")]),
        delta(tool_calls=[call(0, args='th": "a.txt"}')]),
        delta(tool_calls=[call(1, args='{"depth"')]),
        delta(tool_calls=[call(1, args=": 2}")]),
        delta(finish="tool_calls"),
        usage(40, 21),
    )
    server = await serve(Reply(parts=stream))
    got = await collect(model_for(server), make_request())
    assert got == [
        ToolCallDelta(0, "call_a", "read_file", ""),
        ToolCallDelta(0, arguments='{"pa'),
        ToolCallDelta(1, "call_b", "list_agents", ""),
        ToolCallDelta(0, arguments='th": "a.txt"}'),
        ToolCallDelta(1, arguments='{"depth"'),
        ToolCallDelta(1, arguments=": 2}"),
        Usage(40, 21),
        Finish("tool-calls"),
    ]
    calls: dict[int, dict[str, str]] = {}
    for c in got:
        if isinstance(c, ToolCallDelta):
            entry = calls.setdefault(c.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] = c.id or entry["id"]
            entry["name"] = c.name or entry["name"]
            entry["arguments"] += c.arguments
    assert [(c["id"], c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("call_a", "read_file", {"path": "a.txt"}),
        ("call_b", "list_agents", {"depth": 2}),
    ]


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([delta("x"), delta(finish="length")], Finish("max-tokens")),
        # Providers that say `stop` after tool calls: the stream did call tools.
        ([delta(tool_calls=[call(0, id="c", name="t", args="{}")]), delta(finish="stop")], Finish("tool-calls")),
        ([delta("x"), delta(finish="eos")], Finish("stop")),
    ],
    ids=["length", "stop-after-tool-calls", "unknown-reason"],
)
async def test_finish_reasons(serve: Serve, events: list[Any], expected: Finish) -> None:
    server = await serve(Reply(parts=sse(*events)))
    assert (await collect(model_for(server), make_request()))[-1] == expected


async def test_a_clean_end_after_finish_without_done_is_accepted(serve: Serve) -> None:
    server = await serve(Reply(parts=sse(delta("ok"), delta(finish="stop"), usage(1, 1), done=False)))
    assert await collect(model_for(server), make_request()) == [TextDelta("ok"), Usage(1, 1), Finish("stop")]


async def test_request_body_shape(serve: Serve) -> None:
    tool_result = {
        "type": "tool-result",
        "call_id": "call_a",
        "content": [text("line 1"), text("line 2")],
        "is_error": False,
    }
    failed = {"type": "tool-result", "call_id": "call_b", "content": [text("Error: no such agent")], "is_error": True}
    messages = [
        msg("m1", "system", [text("You are terse."), text("Be kind.")], "system"),
        msg("m2", "user", [text("read a.txt")]),
        msg(
            "m3",
            "assistant",
            [
                text("Reading."),
                {"type": "tool-call", "id": "call_a", "name": "read_file", "arguments": '{"path": "a.txt"}'},
                {"type": "tool-call", "id": "call_b", "name": "list_agents", "arguments": "{}"},
            ],
            "model",
        ),
        msg("m4", "user", [tool_result], "tool"),
        msg("m5", "user", [failed], "tool"),
        msg("m6", "assistant", [{"type": "tool-call", "id": "call_c", "name": "noop", "arguments": ""}], "model"),
        msg("m7", "user", [{**tool_result, "call_id": "call_c", "content": []}, text("and now?")], "tool"),
        msg("m8", "assistant", [text("Done.")], "model"),
    ]
    tools = [
        ToolSpec("read_file", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}}),
        ToolSpec("list_agents", "List children.", {"type": "object", "properties": {}}),
    ]
    server = await serve(Reply(parts=TEXT_STREAM), Reply(parts=TEXT_STREAM))
    model = model_for(server)
    await collect(model, make_request(messages, tools))
    assert server.requests[0].json() == {
        "model": MODEL,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "You are terse.\nBe kind."},
            {"role": "user", "content": "read a.txt"},
            {
                "role": "assistant",
                "content": "Reading.",
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
                    },
                    {"id": "call_b", "type": "function", "function": {"name": "list_agents", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "line 1\nline 2"},
            {"role": "tool", "tool_call_id": "call_b", "content": "Error: no such agent"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_c", "type": "function", "function": {"name": "noop", "arguments": ""}}],
            },
            {"role": "tool", "tool_call_id": "call_c", "content": ""},
            {"role": "user", "content": "and now?"},
            {"role": "assistant", "content": "Done."},
        ],
        "tools": [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in tools
        ],
    }
    await collect(model, make_request(messages[:2]))
    assert "tools" not in server.requests[1].json()
    assert server.requests[1].json()["messages"] == openai_messages(messages[:2])


# -- retries -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "value", "slept_ms"),
    [("Retry-After", "3", 3000), ("retry-after-ms", "250", 250), ("Retry-After", "3600", 10_000)],
    ids=["seconds", "milliseconds", "capped"],
)
async def test_429_then_success_honours_retry_after(serve: Serve, header: str, value: str, slept_ms: int) -> None:
    busy = Reply(
        429,
        [("Content-Type", "application/json"), (header, value)],
        [b'{"error": {"message": "Rate limit reached"}}'],
    )
    server = await serve(busy, Reply(parts=TEXT_STREAM))
    clock = ScenarioClock()
    assert await collect(model_for(server, retry_after_max=10.0, clock=clock), make_request()) == TEXT_CHUNKS
    assert len(server.requests) == 2
    assert server.requests[0].body == server.requests[1].body
    assert clock.slept_ms == slept_ms


async def test_a_5xx_storm_gives_up_naming_the_attempts(serve: Serve) -> None:
    server = await serve(Reply(503, [("Content-Type", "text/plain")], [b"upstream   overloaded\n"]))
    clock = ScenarioClock()
    error = await failure(model_for(server, max_retries=3, clock=clock), make_request())
    assert error.code == "MODEL_UNAVAILABLE"
    assert len(server.requests) == 4
    assert "after 4 attempts" in error.message
    assert "HTTP 503: upstream overloaded" in error.message
    assert MODEL in error.message and f"127.0.0.1:{server.port}/v1/chat/completions" in error.message
    # Exponential backoff with jitter: retry n waits within [b/2, b], b = 0.5 * 2**(n-1).
    assert 1750 <= clock.slept_ms <= 3500


async def test_backoff_is_capped_and_jittered(serve: Serve) -> None:
    server = await serve(Reply(500))
    clocks = []
    for seed in (1, 2):
        clock = ScenarioClock()
        model = model_for(
            server, max_retries=6, backoff_base=1.0, backoff_max=2.0, rng=random.Random(seed), clock=clock
        )
        assert (await failure(model, make_request())).code == "MODEL_UNAVAILABLE"
        clocks.append(clock.slept_ms)
    # Waits of b = 1, 2, 2, 2, 2, 2 seconds, each jittered to [b/2, b].
    assert all(5500 <= ms <= 11_000 for ms in clocks)
    assert clocks[0] != clocks[1]


async def test_connection_refused_is_retried_then_unavailable() -> None:
    clock = ScenarioClock()
    error = await failure(model_for(closed_port(), max_retries=2, clock=clock), make_request())
    assert error.code == "MODEL_UNAVAILABLE"
    assert "after 3 attempts" in error.message and "ConnectError" in error.message
    assert clock.slept_ms > 0


@pytest.mark.parametrize(
    "reply",
    [
        Reply(parts=[*sse(delta("Hel"), done=False), b'data: {"choices": [{"delta": {"con'], complete=False),
        Reply(parts=sse(delta("Hel"), done=False), framing="close"),
    ],
    ids=["connection-dropped", "clean-eof-before-finish"],
)
async def test_a_cut_stream_is_interrupted_and_not_retried(serve: Serve, reply: Reply) -> None:
    server = await serve(reply, Reply(parts=TEXT_STREAM))
    clock = ScenarioClock()
    got: list[Chunk] = []
    error = await failure(model_for(server, clock=clock), make_request(), got)
    assert error.code == "MODEL_STREAM_INTERRUPTED"
    assert got == [TextDelta("Hel")]
    assert len(server.requests) == 1
    assert clock.slept_ms == 0


# -- errors that are not retried ----------------------------------------------------------------


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_failures(serve: Serve, status: int) -> None:
    body = b'{"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}'
    server = await serve(Reply(status, [("Content-Type", "application/json")], [body]))
    error = await failure(model_for(server), make_request())
    assert (error.code, error.status) == ("MODEL_AUTH", status)
    assert f"authentication failed ({status})" in error.message
    assert "Incorrect API key provided" in error.message
    assert len(server.requests) == 1


async def test_not_found_names_the_url_and_model(serve: Serve) -> None:
    server = await serve(Reply(404, [("Content-Type", "text/html")], [b"<html><body>Not Found</body></html>"]))
    error = await failure(model_for(server), make_request())
    assert (error.code, error.status) == ("MODEL_NOT_FOUND", 404)
    assert f"http://127.0.0.1:{server.port}/v1/chat/completions" in error.message
    assert repr(MODEL) in error.message
    assert len(server.requests) == 1


async def test_other_4xx_is_an_http_error_with_an_excerpt(serve: Serve) -> None:
    body = json.dumps({"error": {"message": "Invalid 'messages': " + "x" * 5000}}).encode()
    server = await serve(Reply(400, [("Content-Type", "application/json")], [body]))
    error = await failure(model_for(server), make_request())
    assert (error.code, error.status) == ("MODEL_HTTP_ERROR", 400)
    assert "HTTP 400: Invalid 'messages': xxx" in error.message
    assert len(error.message) < 400
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "reply",
    [
        Reply(headers=[("Content-Type", "application/json")], parts=[b'{"choices": []}'], framing="length"),
        Reply(parts=[b"<html>\n<body>Bad Gateway</body>\n"], framing="length"),
        Reply(headers=[], parts=[b"hello"], framing="length"),
    ],
    ids=["json-body", "html-labelled-sse", "no-content-type"],
)
async def test_a_body_that_is_not_an_event_stream(serve: Serve, reply: Reply) -> None:
    server = await serve(reply)
    error = await failure(model_for(server), make_request())
    assert error.code == "MODEL_BAD_RESPONSE"
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("parts", "words"),
    [
        ([b'data: {"choices": [{"delta": {"content": "a"}\n\n'], "not JSON"),
        ([b"data: [1, 2]\n\n"], "not a JSON object"),
        (sse(delta("a")), "[DONE] arrived without a finish_reason"),
        (sse({"error": {"message": "overloaded mid-stream"}}), "overloaded mid-stream"),
        (sse({"choices": [{"delta": {"tool_calls": [{"index": "0"}]}}]}), "index"),
    ],
    ids=["bad-json", "not-an-object", "done-without-finish", "error-event", "bad-tool-index"],
)
async def test_malformed_streams(serve: Serve, parts: list[bytes], words: str) -> None:
    server = await serve(Reply(parts=parts))
    error = await failure(model_for(server), make_request())
    assert error.code == "MODEL_BAD_STREAM"
    assert words in error.message
    assert len(server.requests) == 1


async def test_content_filter_is_an_error(serve: Serve) -> None:
    server = await serve(Reply(parts=sse(delta("a"), delta(finish="content_filter"))))
    assert (await failure(model_for(server), make_request())).code == "MODEL_CONTENT_FILTERED"


# -- cancellation --------------------------------------------------------------------------------


@pytest.mark.parametrize("injected", [False, True], ids=["own-client", "injected-client"])
async def test_cancelling_mid_stream_closes_the_response(serve: Serve, injected: bool) -> None:
    server = await serve(Reply(parts=sse(delta("Hel"), done=False), hold=True))
    got: list[Chunk] = []
    cancelled = []
    first = trio.Event()
    client = httpx.AsyncClient() if injected else None

    async def consume() -> None:
        try:
            async with aclosing(model_for(server, client=client).stream(make_request())) as stream:
                async for chunk in stream:
                    got.append(chunk)
                    first.set()
        except trio.Cancelled:
            cancelled.append(True)
            raise

    with trio.fail_after(HANG_GUARD):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await first.wait()
            await trio.testing.wait_all_tasks_blocked()  # the consumer waits for more body
            nursery.cancel_scope.cancel()
        await server.disconnected.wait()
    assert nursery.cancel_scope.cancelled_caught
    assert cancelled == [True]
    assert got == [TextDelta("Hel")]
    if client is not None:
        assert not client.is_closed  # the caller's client is the caller's to close
        await client.aclose()


async def test_an_injected_client_is_reused_and_left_open(serve: Serve) -> None:
    server = await serve(Reply(parts=TEXT_STREAM))
    async with httpx.AsyncClient() as client:
        model = model_for(server, client=client)
        for _ in range(2):
            assert await collect(model, make_request()) == TEXT_CHUNKS
        assert not client.is_closed
    assert len(server.requests) == 2


@pytest.mark.parametrize("injected", [False, True], ids=["own-client", "injected-client"])
async def test_closing_the_stream_early_closes_the_response(serve: Serve, injected: bool) -> None:
    server = await serve(Reply(parts=sse(delta("Hel"), done=False), hold=True))
    async with httpx.AsyncClient() as client:
        model = model_for(server, client=client if injected else None)
        with trio.fail_after(HANG_GUARD):
            async with aclosing(model.stream(make_request())) as stream:
                async for chunk in stream:
                    assert chunk == TextDelta("Hel")
                    break
            await server.disconnected.wait()


async def test_cancellation_during_backoff_propagates(serve: Serve) -> None:
    server = await serve(Reply(503))
    scope = trio.CancelScope()

    class CancellingClock(ScenarioClock):
        async def sleep(self, seconds: float) -> None:
            scope.cancel()
            await super().sleep(seconds)

    clock = CancellingClock()
    with scope:
        await collect(model_for(server, clock=clock), make_request())
    assert scope.cancelled_caught
    assert len(server.requests) == 1
    assert clock.slept_ms > 0


# -- the key never leaks ---------------------------------------------------------------------


async def test_the_api_key_never_appears_in_logs_errors_or_reprs(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpcore", "subagents"):
        caplog.set_level(logging.DEBUG, logger=name)
    echo = json.dumps({"error": {"message": f"bad key {KEY}"}}).encode()
    server = await serve(
        Reply(parts=TEXT_STREAM),
        Reply(401, [("Content-Type", "application/json")], [echo]),
        Reply(500, [("Content-Type", "text/plain")], [f"oops {KEY}".encode()]),
    )
    model = model_for(server, max_retries=1)
    assert await collect(model, make_request()) == TEXT_CHUNKS
    errors = [await failure(model, make_request()), await failure(model, make_request())]
    errors.append(await failure(model_for(closed_port(), max_retries=1), make_request()))
    # Positive controls: the key was really sent, and the loggers really logged.
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    loggers = {r.name.split(".")[0] for r in caplog.records}
    assert {"httpx", "httpcore", "subagents"} <= loggers
    assert "[redacted]" in errors[0].message and "[redacted]" in errors[1].message

    for record in caplog.records:
        assert KEY not in record.getMessage()
        assert KEY not in repr(record.args)
        assert KEY not in (record.exc_text or "")
    assert KEY not in caplog.text
    for error in errors:
        assert KEY not in str(error) and KEY not in repr(error)
        assert KEY not in repr(error.__cause__) and KEY not in repr(error.__context__)
    assert KEY not in repr(model) and KEY not in str(model)
    with pytest.raises(ValueError) as info:
        OpenAIChatModel(MODEL, base_url="http://127.0.0.1:1", api_key=KEY + "\n")
    assert KEY not in str(info.value)


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="http"):
        OpenAIChatModel(MODEL, base_url="ftp://example.com", api_key=None)
    with pytest.raises(ValueError, match="model"):
        OpenAIChatModel("", base_url="http://example.com", api_key=None)
    with pytest.raises(ValueError, match=">= 0"):
        OpenAIChatModel(MODEL, base_url="http://example.com", api_key=None, max_retries=-1)
    model = OpenAIChatModel(MODEL, base_url="https://api.example.com/v1///", api_key=None)
    assert model.url == "https://api.example.com/v1/chat/completions"


# -- the SSE decoder (sans-IO) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pieces", "events"),
    [
        ([b"data: a\n\n"], [SSEEvent("a")]),
        ([b"data: a\r\n\r\n", b"data:b\r\r"], [SSEEvent("a"), SSEEvent("b")]),
        ([b"data: a\r", b"\n\r", b"\n"], [SSEEvent("a")]),  # CRLFs split across pieces
        ([b"\xef\xbb\xbfdata: a\n\n"], [SSEEvent("a")]),  # BOM
        ([b": keep-alive\n\n", b"\n\n"], []),  # comments and blank lines dispatch nothing
        ([b"data: a\ndata:  b\ndata\n\n"], [SSEEvent("a\n b\n")]),  # multi-line data, one space dropped
        ([b"event: error\nid: 7\nretry: 10\nx-custom: 1\ndata: oops\n\n"], [SSEEvent("oops", "error")]),
        ([b"data: [DONE]"], [SSEEvent("[DONE]")]),  # unterminated final event, flushed at close
        ([b"da", b"ta: h\xc3", b"\xa9\n", b"\n"], [SSEEvent("h\u00e9")]),  # UTF-8 split across pieces
    ],
)
def test_sse_decoder(pieces: list[bytes], events: list[SSEEvent]) -> None:
    decoder = SSEDecoder()
    got = [e for p in pieces for e in decoder.feed(p)]
    assert got + decoder.close() == events


@pytest.mark.parametrize(
    "body",
    [b'{"error": "nope"}\n', b"<html>\n", b"Bad Gateway\n", b"data: \xff\n", b"x" * 100],
)
def test_sse_decoder_rejects_what_is_not_an_event_stream(body: bytes) -> None:
    decoder = SSEDecoder(max_line=64)
    with pytest.raises(SSEError):
        decoder.feed(body)
        decoder.close()
