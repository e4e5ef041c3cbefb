"""The OpenAI chat-completions wire format, sans-IO (docs/design.md, "The agent loop and models"):
messages and tools to the request body's shape, and a streamed body's bytes to chunks.

Theory of operation. `StreamParser` is fed the body of a 2xx event stream piece by piece (over
`sse.SSEDecoder`) and turns `data:` events into chunks — text deltas, tool-call deltas by index,
then at `[DONE]` the last usage seen and exactly one `Finish`. It reads no socket, keeps no clock
and raises `StreamFault(error, message)`; the transport (`openai.py`) adds the model and URL and
raises that `ModelError`. Tool-call deltas are passed on by index, not joined: the
agent loop assembles calls from any model's chunks.

Finish reasons: `stop` → stop (tool-calls if the stream carried tool calls, for providers that
say `stop` there), `tool_calls`/`function_call` → tool-calls, `length` → max-tokens; an unknown
reason is read as tool-calls if tool calls were streamed, else stop; `content_filter` is a
`MODEL_CONTENT_FILTERED` fault. A body that ends cleanly after a `finish_reason` but without
`[DONE]` is accepted (some compatible servers omit it). Only the first choice is read; delta
fields other than `content` and `tool_calls` (DeepSeek's `reasoning_content`, `refusal`) are
ignored; when usage arrives more than once the last wins. Cached prompt tokens are counted apart
from the input (`_usage`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

import msgspec

from ..foundation.errors import (
    ModelBadResponse,
    ModelBadStream,
    ModelContentFiltered,
    ModelError,
    ModelStreamInterrupted,
)
from ..foundation.json_values import JsonObject as Json
from ..foundation.json_values import JsonValue
from .base import Chunk, Finish, TextDelta, ToolCallDelta, ToolSpec, Usage
from .sse import SSEDecoder, SSEError, SSEEvent

__all__ = [
    "EXCERPT",
    "EventStreamParser",
    "StreamFault",
    "StreamParser",
    "error_message",
    "one_line",
    "openai_messages",
    "openai_tools",
]

# Logged as the transport's logger: one name to turn on for everything the model client says.
logger = logging.getLogger("subagents.runtime.models.openai")


EXCERPT = 200  # characters of provider text quoted in an error
FinishReason = Literal["stop", "tool-calls", "max-tokens"]
_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "length": "max-tokens",
}


class StreamFault(Exception):
    """The stream cannot be read as chat-completion chunks; `error` is the `ModelError` the
    transport raises it as (the transport adds the model and URL to `message`)."""

    def __init__(self, error: type[ModelError], message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def _bad(message: str) -> StreamFault:
    return StreamFault(ModelBadStream, message)


class EventStreamParser:
    """An event-stream body in, chunks out: `feed(bytes)`, then `end()` at a clean end of body;
    both raise `StreamFault`. `events` counts the events read so far and `done` is set once the
    stream is complete (further input is ignored). A provider's parser maps one event
    (`_event`), says whether the stream told how it finished (`_finished`) and what a complete
    stream ends with (`END_TEXT`), and gives the closing chunks (`_closing`). Provider text
    quoted in a fault is passed through `redact` before it is cut to an excerpt."""

    END_TEXT = "its end"

    def __init__(self, redact: Callable[[str], str] = str) -> None:
        self._redact = redact
        self._sse = SSEDecoder(redact=redact)
        self.events = 0
        self.done = False

    def feed(self, data: bytes) -> list[Chunk]:
        """The chunks the events completed by `data` make, in order."""
        if self.done:
            return []
        try:
            events = self._sse.feed(data)
        except SSEError as exc:
            raise StreamFault(ModelBadResponse, f"the body is not an event stream: {exc}") from None
        return self._events(events)

    def end(self) -> list[Chunk]:
        """The body ended cleanly: the last chunks, or a fault if the stream is incomplete."""
        if self.done:
            return []
        try:
            chunks = self._events(self._sse.close())
        except SSEError as exc:
            raise StreamFault(ModelBadResponse, f"the body is not an event stream: {exc}") from None
        if self.done:
            return chunks
        if not self._finished():
            raise StreamFault(
                ModelStreamInterrupted, f"stream ended after {self.events} events without {self.END_TEXT}"
            )
        self.done = True
        return chunks + self._closing()

    def _events(self, events: Iterable[SSEEvent]) -> list[Chunk]:
        chunks: list[Chunk] = []
        for event in events:
            if self.done:
                break
            self.events += 1
            chunks.extend(self._event(event))
        return chunks

    def _event(self, event: SSEEvent) -> list[Chunk]:
        raise NotImplementedError

    def _finished(self) -> bool:
        raise NotImplementedError

    def _closing(self) -> list[Chunk]:
        raise NotImplementedError


class StreamParser(EventStreamParser):
    """Chat-completion chunks (`data:` events, then `[DONE]`) as the runtime's chunks."""

    END_TEXT = "[DONE] or a finish_reason"

    def __init__(self, redact: Callable[[str], str] = str) -> None:
        super().__init__(redact)
        self._finish: str | None = None
        self._usage: Usage | None = None
        self._saw_tool_calls = False

    def _finished(self) -> bool:
        return self._finish is not None

    def _event(self, event: SSEEvent) -> list[Chunk]:
        if event.event == "error":
            raise _bad(f"the provider reported an error: {self._quote(event.data)}")
        if event.data.strip() == "[DONE]":
            if self._finish is None:
                raise _bad("[DONE] arrived without a finish_reason")
            self.done = True
            return self._closing()
        try:
            obj = msgspec.json.decode(event.data)
        except msgspec.DecodeError:
            raise _bad(f"event {self.events} is not JSON: {self._quote(event.data)}") from None
        if not isinstance(obj, dict):
            raise _bad(f"event {self.events} is not a JSON object: {self._quote(event.data)}")
        if obj.get("error"):
            raise _bad(f"the provider reported an error: {self._quote(error_message(obj) or event.data)}")
        usage = obj.get("usage")
        if usage is not None:
            self._usage = _usage(usage, self.events)
        choices = obj.get("choices") or []
        if not isinstance(choices, list):
            raise _bad(f"event {self.events}: choices is not a list")
        if not choices:
            return []
        return self._choice(choices[0])

    def _choice(self, choice: JsonValue) -> list[Chunk]:
        n = self.events
        if not isinstance(choice, dict):
            raise _bad(f"event {n}: a choice is not an object")
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise _bad(f"event {n}: delta is not an object")
        chunks: list[Chunk] = []
        content = delta.get("content")
        if content is not None and not isinstance(content, str):
            raise _bad(f"event {n}: delta.content is not a string")
        if content:
            chunks.append(TextDelta(content))
        calls = delta.get("tool_calls") or []
        if not isinstance(calls, list):
            raise _bad(f"event {n}: delta.tool_calls is not a list")
        for position, call in enumerate(calls):
            piece = _tool_call_delta(call, position, n)
            if piece is not None:
                self._saw_tool_calls = True
                chunks.append(piece)
        reason = choice.get("finish_reason")
        if reason is not None:
            if not isinstance(reason, str):
                raise _bad(f"event {n}: finish_reason is not a string")
            if reason == "content_filter":
                raise StreamFault(ModelContentFiltered, "the provider's content filter stopped the output")
            if self._finish is None:
                self._finish = reason
        return chunks

    def _quote(self, text: str) -> str:
        return one_line(self._redact(text))

    def _closing(self) -> list[Chunk]:
        known = _FINISH.get(self._finish or "")
        if known is None:
            logger.debug("unknown finish_reason %s", self._quote(repr(self._finish)))
        reason: FinishReason
        if known is None or known == "stop":
            reason = "tool-calls" if self._saw_tool_calls else "stop"
        else:
            reason = known
        chunks: list[Chunk] = [] if self._usage is None else [self._usage]
        chunks.append(Finish(reason))
        return chunks


def _tool_call_delta(call: JsonValue, position: int, n: int) -> ToolCallDelta | None:
    if not isinstance(call, dict):
        raise _bad(f"event {n}: a tool call is not an object")
    index = call.get("index", position)
    call_id = call.get("id")
    function = call.get("function") or {}
    if not isinstance(function, dict):
        raise _bad(f"event {n}: tool_calls[].function is not an object")
    name = function.get("name")
    arguments = function.get("arguments") or ""
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise _bad(f"event {n}: tool_calls[].index is not a non-negative integer")
    if not isinstance(call_id, str | None) or not isinstance(name, str | None) or not isinstance(arguments, str):
        raise _bad(f"event {n}: tool_calls[] id, name and arguments must be strings")
    if not call_id and not name and not arguments:
        return None
    return ToolCallDelta(index=index, id=call_id or None, name=name or None, arguments=arguments)


def _usage(usage: JsonValue, n: int) -> Usage:
    """The usage record; prompt tokens the provider read from its cache (OpenAI's
    `prompt_tokens_details.cached_tokens`, DeepSeek's `prompt_cache_hit_tokens`), which its
    `prompt_tokens` includes, are counted apart as cache reads (the seam's counts are disjoint)."""
    if not isinstance(usage, dict):
        raise _bad(f"event {n}: usage is not an object")
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    details = usage.get("prompt_tokens_details")
    cached = usage.get("prompt_cache_hit_tokens")
    if cached is None and isinstance(details, dict):
        cached = details.get("cached_tokens")
    cached = cached or 0
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in (prompt, completion, cached)):
        raise _bad(f"event {n}: usage token counts are not integers")
    cached = min(max(cached, 0), max(prompt, 0))  # a count past the prompt is not believed
    # Reasoning models report the part of the completion spent reasoning (kept, not added).
    completion_details = usage.get("completion_tokens_details")
    reasoning = completion_details.get("reasoning_tokens") if isinstance(completion_details, dict) else None
    if not isinstance(reasoning, int) or isinstance(reasoning, bool):
        reasoning = 0
    reasoning = min(max(reasoning, 0), max(completion, 0))
    return Usage(
        input_tokens=prompt - cached, output_tokens=completion, cache_read_tokens=cached, reasoning_tokens=reasoning
    )


# -- conversion to the chat format ------------------------------------------------------


def openai_messages(messages: Iterable[Mapping[str, JsonValue]]) -> list[Json]:
    """Logged messages (`{id, role, content: [blocks], source}`) → chat-completions messages.

    System and user text become `{role, content}` (text blocks joined with newlines); an assistant
    message carries its text (or `null`) and its tool-call blocks as `tool_calls`; each tool-result
    block becomes its own `{role: "tool", tool_call_id, content}` message, placed before any text
    of the same message.
    """
    out: list[Json] = []
    for msg in messages:
        role = msg["role"]
        blocks: Sequence[Mapping[str, JsonValue]] = msg.get("content", ())
        text = _text(blocks)
        if role == "assistant":
            calls = [
                {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": b["arguments"]}}
                for b in blocks
                if b.get("type") == "tool-call"
            ]
            entry: Json = {"role": "assistant", "content": text if text or not calls else None}
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
            continue
        results = [b for b in blocks if b.get("type") == "tool-result"]
        for result in results:
            out.append({"role": "tool", "tool_call_id": result["call_id"], "content": _text(result.get("content", ()))})
        if not results or any(b.get("type") == "text" for b in blocks):
            out.append({"role": role, "content": text})
    return out


def openai_tools(tools: Iterable[ToolSpec]) -> list[Json]:
    """Tool specs → chat-completions `tools` entries (`type: function`)."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": dict(t.parameters)},
        }
        for t in tools
    ]


def _text(blocks: Iterable[Mapping[str, JsonValue]]) -> str:
    return "\n".join(b["text"] for b in blocks if b.get("type") == "text")


# -- provider text -------------------------------------------------------------------------------


def error_message(obj: JsonValue) -> str | None:
    """The human part of a provider's JSON error body, if it has a recognizable one."""
    if not isinstance(obj, dict):
        return None
    error = obj.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    for value in (error, obj.get("message"), obj.get("detail")):
        if isinstance(value, str):
            return value
    return None


def one_line(text: str, limit: int = EXCERPT) -> str:
    """`text` on one line (runs of whitespace made one space), cut to `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
