"""A local OpenAI-compatible chat-completions server for tests that run the hosts (`run`, `chat`,
`acp`) as subprocesses with `--model openai:...` or `deepseek:...` and `--base-url`.

Theory of operation. `OpenAIServer` is a real socket server (stdlib `ThreadingHTTPServer` on
127.0.0.1, a thread per connection), so it serves a subprocess whatever the test runs on: plain
sync code, Trio or asyncio. It is scripted per request: each `POST .../chat/completions` takes the
first queued `Reply` whose `when` matches the request (in the order they were added) and answers
with it; a request nothing matches is answered 400 (which the client does not retry) and recorded
in `unmatched`. Every request is recorded (`requests`: method, path, headers, body) so a test can
assert the messages and tools the runtime sent. A request OpenAI would refuse (`request_problem`:
unknown roles, missing content, malformed `tool_calls`, a `tool` message answering no call, a
call left unanswered) is answered 400 with OpenAI's message and recorded in `refused`, so a
runtime that sends a broken history fails the test. `leftovers()` gathers what a test expects
to be empty: unused replies, unmatched and refused requests, the server's own errors.

A `Reply` is written the way OpenAI streams: `text/event-stream` over chunked transfer encoding,
each `data:` event its own chunk on the wire (`chat.completion.chunk` objects: the first delta
carries `role`, text comes in `delta.content` pieces, a tool call as `delta.tool_calls` with its
index, id and name first and its arguments in fragments), a `finish_reason`, then — only when the
request asked for `stream_options.include_usage` — a final chunk with empty `choices` and the
`usage`, then `data: [DONE]`. Fault modes: an HTTP error status with an OpenAI-style JSON error
body (`Reply.error`), a connection cut after some events (`cut_after`), a chunk that is not JSON
(`malformed_after`), and a stream held open after some events until the client goes away
(`hold_after`; `holding` is set once it holds). A reply can wait for another to be taken
(`gate`, `taken`), to order concurrent agents' requests without sleeping.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler
from typing import Any

import attrs
from fake_server import FakeServer
from http_request import Seen

__all__ = ["OpenAIServer", "Reply", "last_message", "request_problem", "tool_messages"]

Json = dict[str, Any]
Match = Callable[[Json], bool]
GATE_GUARD = 60.0  # real seconds: only reached if the request a gate waits for never comes


def last_message(body: Json) -> Json:
    """The last chat message of a request body."""
    messages: list[Json] = body["messages"]
    return messages[-1]


def tool_messages(body: Json) -> list[Json]:
    """The `role: tool` messages of a request body (tool results going back to the model)."""
    return [m for m in body["messages"] if m["role"] == "tool"]


def _content_has(text: str) -> Match:
    def match(body: Json) -> bool:
        content = last_message(body).get("content")
        return isinstance(content, str) and text in content

    return match


_ROLES = {"system", "developer", "user", "assistant", "tool"}
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}\Z")


def request_problem(body: Json) -> str | None:
    """What OpenAI would refuse in a chat-completions request body (its 400 message), or None.

    The checks are the structural ones OpenAI enforces: a known role per message, content where
    it is required, well-formed `tool_calls`, every `tool` message answering a call of the
    assistant message before it, and every such call answered before anything else comes."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter"
    open_calls: list[str] = []  # calls of the last assistant message not answered yet
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in _ROLES:
            return f"Invalid value for 'messages[{i}].role'"
        content = message.get("content")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in open_calls:
                return (
                    f"Invalid parameter: messages with role 'tool' must be a response to a preceeding message"
                    f" with 'tool_calls' (messages[{i}], tool_call_id {call_id!r})"
                )
            open_calls.remove(call_id)
            if not isinstance(content, str):
                return f"Invalid type for 'messages[{i}].content'"
            continue
        if open_calls:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each"
                f" 'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(open_calls)}"
            )
        calls = message.get("tool_calls")
        if role == "assistant":
            if content is None and not calls:
                return f"Invalid value for 'messages[{i}].content': expected a string, got null"
            for j, call in enumerate(calls or []):
                function = call.get("function") if isinstance(call, dict) else None
                if (
                    not isinstance(call.get("id"), str)
                    or call.get("type") != "function"
                    or not isinstance(function, dict)
                    or not isinstance(function.get("name"), str)
                    or not isinstance(function.get("arguments"), str)
                ):
                    return f"Invalid value for 'messages[{i}].tool_calls[{j}]'"
                open_calls.append(call["id"])
        elif calls is not None:
            return f"Unrecognized parameter 'messages[{i}].tool_calls'"
        elif not isinstance(content, str):
            return f"Invalid type for 'messages[{i}].content': expected a string"
    if open_calls:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each"
            f" 'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(open_calls)}"
        )
    for k, tool in enumerate(body.get("tools") or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type") != "function" or not isinstance(function, dict):
            return f"Invalid value for 'tools[{k}]'"
        if not _TOOL_NAME.match(str(function.get("name"))):
            return f"Invalid 'tools[{k}].function.name': string does not match pattern"
        if not isinstance(function.get("parameters", {}), dict):
            return f"Invalid type for 'tools[{k}].function.parameters'"
    return None


@attrs.frozen(kw_only=True)
class Reply:
    """One scripted answer: `deltas` (each a `delta` object, sent as its own event), then a
    `finish_reason`, then the usage chunk (if asked for) and `[DONE]`; or an error status.

    `when` picks the requests it may answer: a predicate over the request body, or a string the
    last message's content must contain (None: any request)."""

    deltas: tuple[Json, ...] = ()
    finish: str | None = "stop"
    usage: tuple[int, int] | None = None  # (prompt_tokens, completion_tokens)
    status: int = 200
    error_body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    when: Match | str | None = None
    cut_after: int | None = None  # send this many events, then drop the connection
    malformed_after: int | None = None  # send this many events, then one whose data is not JSON
    hold_after: int | None = None  # send this many events, then hold until the client leaves
    usage_with_finish: bool = False  # DeepSeek's way: usage on the finish chunk, no usage chunk
    # Ordering across concurrent agents: `taken` is set when this reply is picked for a request;
    # a reply with a `gate` answers only once the gate is set (e.g. another reply's `taken`).
    taken: threading.Event | None = None
    gate: threading.Event | None = None

    @classmethod
    def text(cls, *pieces: str, usage: tuple[int, int] | None = None, **options: Any) -> Reply:
        """An answer whose text arrives in `pieces`, one event each."""
        return cls(deltas=tuple({"content": p} for p in pieces), usage=usage, **options)

    @classmethod
    def tool_call(cls, name: str, arguments: Json, *, call_id: str = "call_0", **options: Any) -> Reply:
        """One tool call (see `tool_calls`)."""
        return cls.tool_calls((name, arguments, call_id), **options)

    @classmethod
    def tool_calls(
        cls, *calls: tuple[str, Json, str], fragments: int = 3, usage: tuple[int, int] | None = None, **options: Any
    ) -> Reply:
        """Tool calls `(name, arguments, call_id)`, one after another as OpenAI streams parallel
        calls: each call's index, id and name in a first event, then its JSON arguments cut into
        `fragments` events; then `finish_reason: tool_calls`."""
        deltas: list[Json] = []
        for index, (name, arguments, call_id) in enumerate(calls):
            raw = json.dumps(arguments)
            size = -(-len(raw) // fragments)
            head = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
            rest = [{"index": index, "function": {"arguments": raw[i : i + size]}} for i in range(0, len(raw), size)]
            deltas += [{"tool_calls": [call]} for call in [head, *rest]]
        return cls(deltas=tuple(deltas), finish="tool_calls", usage=usage, **options)

    @classmethod
    def error(
        cls,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        retry_after_ms: int | None = None,
        **options: Any,
    ) -> Reply:
        """An HTTP error with OpenAI's JSON error body (`retry_after_ms` sets `retry-after-ms`,
        so a client's retry need not wait)."""
        body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode()
        headers = () if retry_after_ms is None else (("retry-after-ms", str(retry_after_ms)),)
        return cls(status=status, error_body=body, headers=headers, **options)

    def matches(self, body: Json) -> bool:
        if self.when is None:
            return True
        match = _content_has(self.when) if isinstance(self.when, str) else self.when
        return match(body)

    def events(self, model: str, include_usage: bool) -> list[bytes]:
        """The `data:` events of this reply, as OpenAI frames them."""

        def chunk(choices: list[Json], usage: Json | None = None) -> bytes:
            obj: Json = {
                "id": "chatcmpl-test",
                "object": "chat.completion.chunk",
                "created": 1789000000,
                "model": model,
                "system_fingerprint": "fp_test",
                "choices": choices,
            }
            if include_usage:
                obj["usage"] = usage  # null on every chunk but the last, as OpenAI sends it
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        def choice(delta: Json, finish: str | None = None) -> list[Json]:
            return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]

        deltas = list(self.deltas) or [{"content": ""}]
        events = [chunk(choice({"role": "assistant", **delta} if i == 0 else delta)) for i, delta in enumerate(deltas)]
        usage: Json | None = None
        if include_usage and self.usage is not None:
            prompt, completion = self.usage
            usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        if self.usage_with_finish:
            if usage is not None:  # DeepSeek adds its cache counts
                usage |= {"prompt_cache_hit_tokens": 0, "prompt_cache_miss_tokens": usage["prompt_tokens"]}
            events.append(chunk(choice({"content": ""}, self.finish), usage))
        else:
            events.append(chunk(choice({}, self.finish)))
            if usage is not None:
                events.append(chunk([], usage))
        events.append(b"data: [DONE]\n\n")
        return events


class OpenAIServer(FakeServer[Reply]):
    """The server (`with OpenAIServer([...]) as server:`), at `server.base_url`."""

    def __init__(self, replies: Iterable[Reply] = ()) -> None:
        super().__init__(replies, _handler, "openai-server")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- called from the handler threads -------------------------------------------------------

    def _refuse(self, seen: Seen, body: Json | None) -> str | None:
        problem = request_problem(body) if body is not None else "We could not parse the JSON body of your request."
        if problem is not None:
            with self._lock:
                self.requests.append(seen)
                self.refused.append((seen, problem))
        return problem

    def _take(self, seen: Seen, body: Json | None) -> Reply | None:
        with self._lock:
            self.requests.append(seen)
            for i, reply in enumerate(self._replies):
                if body is not None and reply.matches(body):
                    if reply.taken is not None:
                        reply.taken.set()
                    return self._replies.pop(i)
            self.unmatched.append(seen)
            return None


def _handler(server: OpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test reads `requests`; stderr stays quiet

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            seen = Seen("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, raw)
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            if not self.path.endswith("/chat/completions"):
                self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            body = body if isinstance(body, dict) else None
            problem = server._refuse(seen, body)
            if problem is not None:  # as OpenAI answers a request it will not take
                self._json(
                    400, {"error": {"message": problem, "type": "invalid_request_error", "param": None, "code": None}}
                )
                return
            reply = server._take(seen, body)
            if reply is None:
                self._json(400, {"error": {"message": "the test server has no reply for this request"}})
                return
            if reply.gate is not None and not reply.gate.wait(GATE_GUARD):
                server.failures.append(f"a gated reply waited {GATE_GUARD} s for its gate: {reply!r}")
            if reply.status != 200:
                self._send_head(
                    reply.status, "application/json", [*reply.headers, ("Content-Length", str(len(reply.error_body)))]
                )
                self.wfile.write(reply.error_body)
                return
            assert body is not None
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._stream(reply, reply.events(str(body.get("model")), include_usage))

        def _json(self, status: int, obj: Json) -> None:
            data = json.dumps(obj).encode()
            self._send_head(status, "application/json", [("Content-Length", str(len(data)))])
            self.wfile.write(data)

        def _send_head(self, status: int, content_type: str, headers: Sequence[tuple[str, str]]) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

        def _stream(self, reply: Reply, events: list[bytes]) -> None:
            self._send_head(200, "text/event-stream; charset=utf-8", [("Transfer-Encoding", "chunked")])
            for n in range(len(events) + 1):  # a fault may come after the last event too
                if n == reply.cut_after:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)  # mid-body: no terminating chunk
                    return
                if n == reply.malformed_after:
                    self._chunk(b'data: {"choices": [{"index": 0, "delta": {"content": "x"\n\n')
                if n == reply.hold_after:
                    self._wait_for_the_client_to_leave()
                    return
                if n < len(events):
                    self._chunk(events[n])
            self._chunk(b"")  # the terminating zero-length chunk

        def _wait_for_the_client_to_leave(self) -> None:
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
