"""A local Anthropic Messages API server for tests that run the hosts (`run`, `chat`, `acp`) as
subprocesses with `--model anthropic:...` and `--base-url`, or the transport in-process.

Theory of operation. `AnthropicServer` is a real socket server (stdlib `ThreadingHTTPServer` on
127.0.0.1, a thread per connection), so it serves a subprocess whatever the test runs on. It is
scripted per request: each `POST /v1/messages` takes the first queued `Reply` whose `when`
matches the request body and streams it; a request nothing matches is answered 400 and recorded
in `unmatched`. Every request is recorded (`requests`). A request the API would refuse is
answered 400 with the API's error body and recorded in `refused` (`request_problem`): a body
that is not a valid `MessageCreateParamsStreaming` of the official SDK (checked strictly, extra
keys included), no `x-api-key` or `anthropic-version` header, roles that do not alternate or do
not start with user, a `tool_result` answering no `tool_use` of the message before it or not
placed first, a `tool_use` left unanswered, more than four `cache_control` breakpoints, and —
with thinking on — a tool-use turn whose assistant message does not start with the thinking
block this server streamed (its signature is checked). `leftovers()` gathers what a test expects
to be empty.

A `Reply` streams the API's event sequence, as the API frames it (`event:` and `data:` lines):
`message_start` (with the input and cache usage), per content block `content_block_start`,
its deltas (`text_delta`, `input_json_delta` in fragments, `thinking_delta` then
`signature_delta`) and `content_block_stop`, a `ping`, `message_delta` (stop reason, output
usage) and `message_stop`. Fault modes: an HTTP error with the API's JSON error body and
`retry-after` (`Reply.error`), an `error` event after some events (`error_after`), a connection
cut (`cut_after`), a stream held open until the client goes away (`hold_after`; `holding` is set
once it holds).
"""

from __future__ import annotations

import collections.abc
import json
import socket
import threading
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler
from typing import Any

import attrs
import typing_extensions
from fake_server import FakeServer
from http_request import Seen

__all__ = ["AnthropicServer", "Block", "Reply", "request_problem", "sdk_problem"]

Json = dict[str, Any]
Match = Callable[[Json], bool]


def sdk_problem(body: Json) -> str | None:
    """What the official SDK's request type (`MessageCreateParamsStreaming`, a TypedDict) finds
    wrong with `body`, strictly: a value of the wrong type, a required key missing, or a key the
    type does not have. (pydantic's validation of these TypedDicts reads `Iterable` fields lazily
    and drops unknown keys, so the types are walked here.)"""
    from anthropic.types.message_create_params import MessageCreateParamsStreaming

    return _check(body, MessageCreateParamsStreaming, "body")


def _check(value: Any, tp: Any, where: str) -> str | None:
    origin, args = typing_extensions.get_origin(tp), typing_extensions.get_args(tp)
    if tp is object or tp is Any:
        return None
    if origin is typing.Literal:
        return None if value in args else f"{where}: {value!r} is not one of {args}"
    if origin in (typing.Union, types.UnionType):
        problems = [p for p in (_check(value, a, where) for a in args) if p is not None]
        if len(problems) < len(args):
            return None
        tagged = [a for a in args if typing_extensions.is_typeddict(a) and isinstance(value, dict)]
        for a in tagged:  # the member the block's `type` names, for a clear message
            hint = typing_extensions.get_type_hints(a).get("type")
            if hint is not None and value.get("type") in typing_extensions.get_args(hint):
                return _check(value, a, where)
        return max(problems, key=lambda p: len(p.partition(":")[0]))  # the one that got deepest
    if typing_extensions.is_typeddict(tp):
        if not isinstance(value, dict):
            return f"{where}: expected an object ({tp.__name__})"
        hints = typing_extensions.get_type_hints(tp)
        unknown = set(value) - set(hints)
        if unknown:
            return f"{where}: keys {sorted(unknown)} are not in {tp.__name__}"
        missing = set(tp.__required_keys__) - set(value)
        if missing:
            return f"{where}: {tp.__name__} needs {sorted(missing)}"
        for key, item in value.items():
            problem = _check(item, hints[key], f"{where}.{key}")
            if problem is not None:
                return problem
        return None
    if origin in (list, collections.abc.Iterable, collections.abc.Sequence, typing.Iterable):
        if not isinstance(value, list):
            return f"{where}: expected a list"
        for i, item in enumerate(value):
            problem = _check(item, args[0], f"{where}[{i}]")
            if problem is not None:
                return problem
        return None
    if origin in (dict, collections.abc.Mapping):
        return None if isinstance(value, dict) else f"{where}: expected an object"
    if tp is bool:
        return None if isinstance(value, bool) else f"{where}: expected a bool"
    if tp is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else f"{where}: expected an int"
    if tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else f"{where}: expected a number"
    if tp is str:
        return None if isinstance(value, str) else f"{where}: expected a string"
    if tp is type(None):
        return None if value is None else f"{where}: expected null"
    if isinstance(tp, type):
        return None if isinstance(value, tp) else f"{where}: expected {tp.__name__}"
    return f"{where}: the checker does not know the type {tp!r}"


def request_problem(body: Json, headers: dict[str, str], signatures: set[str]) -> str | None:
    """What the Messages API would refuse in a request (its 400 message), or None."""
    if not headers.get("x-api-key"):
        return "x-api-key header is required"
    if not headers.get("anthropic-version"):
        return "anthropic-version header is required"
    problem = sdk_problem(body)
    if problem is not None:
        return problem
    messages: list[Json] = body["messages"]
    breakpoints = sum(_marks(body.get("system", []))) + sum(_marks(body.get("tools", [])))
    if not messages or messages[0]["role"] != "user":
        return "messages: the first message must use the user role"
    thinking = body.get("thinking", {}).get("type") == "enabled"
    open_calls: list[str] = []
    for i, message in enumerate(messages):
        content = message["content"]
        if i and messages[i - 1]["role"] == message["role"]:
            return f"messages.{i}: roles must alternate between user and assistant"
        if isinstance(content, str) or not content:
            return f"messages.{i}: content must be a non-empty list of blocks"
        breakpoints += sum(_marks(content))
        kinds = [b["type"] for b in content]
        if message["role"] == "user":
            results = [b["tool_use_id"] for b in content if b["type"] == "tool_result"]
            if results and kinds[: len(results)] != ["tool_result"] * len(results):
                return f"messages.{i}: tool_result blocks must come first in the content"
            for call_id in results:
                if call_id not in open_calls:
                    return f"messages.{i}: unexpected tool_use_id found in tool_result blocks: {call_id}"
                open_calls.remove(call_id)
            if open_calls:
                return f"messages.{i}: tool_use ids were found without tool_result blocks: {', '.join(open_calls)}"
        else:
            if open_calls:
                return f"messages.{i}: tool_use ids were found without tool_result blocks: {', '.join(open_calls)}"
            open_calls = [b["id"] for b in content if b["type"] == "tool_use"]
            for b in content:
                if b["type"] == "text" and not b["text"]:
                    return f"messages.{i}: text content blocks must be non-empty"
                if b["type"] == "thinking" and b["signature"] not in signatures:
                    return f"messages.{i}: Invalid `signature` in `thinking` block"
            last_tool_turn = open_calls and i == len(messages) - 2
            if thinking and last_tool_turn and kinds[0] not in ("thinking", "redacted_thinking"):
                return (
                    f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found"
                    f" `{kinds[0]}`. When `thinking` is enabled, a final `assistant` message must start with a"
                    " thinking block"
                )
    if open_calls:
        return f"tool_use ids were found without tool_result blocks immediately after: {', '.join(open_calls)}"
    if breakpoints > 4:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {breakpoints}."
    return None


def _marks(blocks: Any) -> Iterable[int]:
    if isinstance(blocks, list):
        for block in blocks:
            yield 1 if isinstance(block, dict) and "cache_control" in block else 0


@attrs.frozen
class Block:
    """One content block of a reply: `text` (in `pieces`), `tool_use` (`name`, `input`, `id`, its
    JSON in `fragments`), `thinking` (`text`, `signature`) or `redacted_thinking` (`data`)."""

    type: str
    pieces: tuple[str, ...] = ()
    name: str = ""
    input: Json = attrs.field(factory=dict)
    id: str = ""
    fragments: int = 3
    signature: str = ""
    data: str = ""

    @classmethod
    def text(cls, *pieces: str) -> Block:
        return cls("text", pieces=pieces)

    @classmethod
    def tool_use(cls, name: str, input: Json, *, id: str = "toolu_0", fragments: int = 3) -> Block:
        return cls("tool_use", name=name, input=input, id=id, fragments=fragments)

    @classmethod
    def thinking(cls, *pieces: str, signature: str = "sig-0") -> Block:
        return cls("thinking", pieces=pieces, signature=signature)

    @classmethod
    def redacted(cls, data: str) -> Block:
        return cls("redacted_thinking", data=data)

    def events(self, index: int) -> list[tuple[str, Json]]:
        def delta(d: Json) -> tuple[str, Json]:
            return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})

        out: list[tuple[str, Json]] = []
        if self.type == "text":
            start: Json = {"type": "text", "text": ""}
            out = [delta({"type": "text_delta", "text": p}) for p in self.pieces]
        elif self.type == "tool_use":
            start = {"type": "tool_use", "id": self.id, "name": self.name, "input": {}}
            raw = json.dumps(self.input) if self.input else ""
            size = max(1, -(-len(raw) // self.fragments))
            out = [delta({"type": "input_json_delta", "partial_json": ""})]  # as the API opens one
            out += [
                delta({"type": "input_json_delta", "partial_json": raw[i : i + size]}) for i in range(0, len(raw), size)
            ]
        elif self.type == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            out = [delta({"type": "thinking_delta", "thinking": p}) for p in self.pieces]
            out.append(delta({"type": "signature_delta", "signature": self.signature}))
        else:
            start = {"type": "redacted_thinking", "data": self.data}
        head = ("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})
        return [head, *out, ("content_block_stop", {"type": "content_block_stop", "index": index})]


@attrs.frozen(kw_only=True)
class Reply:
    """One scripted answer: `blocks` streamed in order, then `stop_reason` and `usage`
    (`(input, output, cache_read, cache_write)`); or an HTTP error.

    `when` picks the requests it may answer: a predicate over the body, or a string the last
    message's text must contain (None: any request)."""

    blocks: tuple[Block, ...] = ()
    stop_reason: str = "end_turn"
    usage: tuple[int, int, int, int] = (10, 5, 0, 0)
    status: int = 200
    error_body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    when: Match | str | None = None
    cut_after: int | None = None  # send this many events, then drop the connection
    error_after: int | None = None  # send this many events, then an `error` event
    hold_after: int | None = None  # send this many events, then hold until the client leaves
    error_kind: str = "overloaded_error"
    taken: threading.Event | None = None

    @classmethod
    def text(cls, *pieces: str, **options: Any) -> Reply:
        return cls(blocks=(Block.text(*pieces),), **options)

    @classmethod
    def tool_uses(cls, *blocks: Block, text: str | None = None, **options: Any) -> Reply:
        head = (Block.text(text),) if text else ()
        return cls(blocks=(*head, *blocks), stop_reason="tool_use", **options)

    @classmethod
    def error(
        cls, status: int, message: str, *, kind: str = "invalid_request_error", retry_after: str | None = None
    ) -> Reply:
        body = json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
        headers = () if retry_after is None else (("retry-after", retry_after),)
        return cls(status=status, error_body=body, headers=headers)

    def matches(self, body: Json) -> bool:
        if self.when is None:
            return True
        if isinstance(self.when, str):
            return self.when in last_text(body)
        return self.when(body)

    def events(self, model: str) -> list[tuple[str, Json]]:
        """The (event name, data) pairs of this reply, in the API's order."""
        tokens_in, tokens_out, cache_read, cache_write = self.usage
        usage = {
            "input_tokens": tokens_in,
            "output_tokens": 1,
            "cache_read_input_tokens": cache_read,
            "cache_creation_input_tokens": cache_write,
        }
        message = {
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        events: list[tuple[str, Json]] = [("message_start", {"type": "message_start", "message": message})]
        for index, block in enumerate(self.blocks):
            events += block.events(index)
            if index == 0:
                events.append(("ping", {"type": "ping"}))
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self.stop_reason, "stop_sequence": None},
                    "usage": {"output_tokens": tokens_out},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    def signatures(self) -> set[str]:
        return {b.signature for b in self.blocks if b.type == "thinking"}


def last_text(body: Json) -> str:
    """The text of the last message of a request body (its text and tool-result blocks)."""
    content = body["messages"][-1]["content"]
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if block["type"] == "text":
            parts.append(block["text"])
        elif block["type"] == "tool_result":
            parts += [b["text"] for b in block.get("content", []) if b["type"] == "text"]
    return "\n".join(parts)


class AnthropicServer(FakeServer[Reply]):
    """The server; use as a context manager, then point the client at `server.base_url`."""

    def __init__(self, replies: Iterable[Reply] = ()) -> None:
        super().__init__(replies, _handler, "anthropic-server")
        self.signatures: set[str] = set()  # of the thinking blocks streamed so far

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _take(self, seen: Seen, body: Json | None) -> tuple[Reply | None, str | None]:
        with self._lock:
            self.requests.append(seen)
            if body is None:
                problem: str | None = "There was an error parsing the body of your request as JSON"
            else:
                problem = request_problem(body, seen.headers, self.signatures)
            if problem is not None:
                self.refused.append((seen, problem))
                return None, problem
            assert body is not None
            for i, reply in enumerate(self._replies):
                if reply.matches(body):
                    if reply.taken is not None:
                        reply.taken.set()
                    self.signatures |= reply.signatures()
                    return self._replies.pop(i), None
            self.unmatched.append(seen)
            return None, "the test server has no reply for this request"


def _handler(server: AnthropicServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            seen = Seen("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, raw)
            if self.path != "/v1/messages":
                self._json(
                    404, {"type": "error", "error": {"type": "not_found_error", "message": f"no route {self.path}"}}
                )
                return
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            reply, problem = server._take(seen, body if isinstance(body, dict) else None)
            if reply is None:
                self._json(400, {"type": "error", "error": {"type": "invalid_request_error", "message": problem}})
                return
            if reply.status != 200:
                self._head(
                    reply.status, "application/json", [*reply.headers, ("Content-Length", str(len(reply.error_body)))]
                )
                self.wfile.write(reply.error_body)
                return
            self._stream(reply, reply.events(str(body["model"]) if isinstance(body, dict) else ""))

        def _json(self, status: int, obj: Json) -> None:
            data = json.dumps(obj).encode()
            self._head(status, "application/json", [("Content-Length", str(len(data)))])
            self.wfile.write(data)

        def _head(self, status: int, content_type: str, headers: Sequence[tuple[str, str]]) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

        def _stream(self, reply: Reply, events: list[tuple[str, Json]]) -> None:
            self._head(200, "text/event-stream; charset=utf-8", [("Transfer-Encoding", "chunked")])
            for n in range(len(events) + 1):
                if n == reply.cut_after:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if n == reply.hold_after:
                    self._hold()
                    return
                if n == reply.error_after:
                    error = {"type": "error", "error": {"type": reply.error_kind, "message": "Overloaded"}}
                    self._chunk(b"event: error\ndata: " + json.dumps(error).encode() + b"\n\n")
                    self._chunk(b"")
                    return
                if n < len(events):
                    name, data = events[n]
                    self._chunk(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
            self._chunk(b"")

        def _hold(self) -> None:
            self.close_connection = True
            server._hold(self.connection, True)
            server.holding.set()
            try:
                while self.connection.recv(1):
                    pass
            except OSError:
                pass
            finally:
                server._hold(self.connection, False)

    return Handler
