"""Anthropic's Messages API wire format, sans-IO: the logged messages and tool specs to a request
body, and a streamed body's bytes to chunks (docs/design.md, "The agent loop and models").

Theory of operation — the request. `anthropic_body` maps the surface: system messages become the
top-level `system` blocks; user text stays text; a `tool-result` becomes a `tool_result` block
(placed before the text of its message, as the API wants them first); an assistant message keeps
its blocks in order — `thinking` (with its signature) and `redacted_thinking` (opaque) only when
thinking is on, text, and `tool_use` with its arguments parsed back to an object. Consecutive
messages of one role are merged into one (the API wants roles to alternate, so the results of
parallel tool calls travel in one user message). Empty text is dropped (the API refuses it). A
call that continues a tool-use turn whose assistant message holds no thinking goes without
thinking (the API refuses thinking there: a history from a model that did not think).

A compaction call (`purpose: "compaction"`) goes without thinking and ends with a user message
asking for the summary (`SUMMARIZE`).

Prompt caching, on unless `cache=False`: `cache_control: {"type": "ephemeral"}` on the last tool
definition, the last system block, the last block of the final message (so this call writes the
whole prefix) and the last block of the user message before the final one (the previous call's
final message: what it wrote is read back even when more than the API's 20-block lookback came
since). That is at most four breakpoints, the API's limit.

Theory of operation — the stream. `StreamParser` is fed the body of a 2xx event stream piece by
piece (over `sse.SSEDecoder`): `message_start` (usage so far), `content_block_start`/`_delta`/
`_stop` per block index, `message_delta` (the `stop_reason` and cumulative usage), `message_stop`,
`ping`, and `error`. Text deltas are passed on as they come; a `tool_use` block becomes tool-call
deltas under its block index (its id and name first, then each `input_json_delta` fragment; `{}`
when no fragment came); a `thinking` block is gathered (text and signature) and passed on whole
at its stop, as is a `redacted_thinking` block. At `message_stop`: usage, then one `Finish`.
Unknown event, block and delta types are skipped (the API may add them).

Stop reasons: `end_turn`, `stop_sequence` → stop; `tool_use` → tool-calls; `max_tokens` and
`model_context_window_exceeded` → max-tokens; `refusal` is a `MODEL_CONTENT_FILTERED` fault;
`pause_turn` (only server tools pause, and none is offered) is a `MODEL_BAD_STREAM` fault; an
unknown reason is tool-calls if tool calls were streamed, else stop. An `error` event is a
`MODEL_UNAVAILABLE` fault when the API says it is overloaded or failing (`overloaded_error`,
`api_error`), else `MODEL_BAD_STREAM`; a body that ends before `message_stop` is accepted only
after a `stop_reason`, else it is `MODEL_STREAM_INTERRUPTED`.

Usage: Anthropic's `input_tokens` excludes cache reads and writes, which it counts in
`cache_read_input_tokens` and `cache_creation_input_tokens`: the runtime's `Usage` keeps these as
they are (its four counts are disjoint).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs
import msgspec

from ..foundation.errors import (
    ModelBadStream,
    ModelContentFiltered,
    ModelUnavailable,
)
from ..foundation.json_values import JsonObject as Json
from ..foundation.json_values import JsonValue
from .base import Chunk, Finish, ModelRequest, TextDelta, Thinking, ToolCallDelta, ToolSpec, Usage
from .openai_wire import EventStreamParser, StreamFault, one_line
from .sse import SSEEvent

__all__ = ["ANTHROPIC_VERSION", "AnthropicOptions", "StreamParser", "anthropic_body", "anthropic_messages"]

logger = logging.getLogger("subagents.runtime.models.anthropic")

ANTHROPIC_VERSION = "2023-06-01"
EPHEMERAL: Json = {"type": "ephemeral"}
FinishReason = Literal["stop", "tool-calls", "max-tokens"]
_FINISH: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool-calls",
    "max_tokens": "max-tokens",
    "model_context_window_exceeded": "max-tokens",
}
_UNAVAILABLE_ERRORS = frozenset({"overloaded_error", "api_error"})


@attrs.frozen(kw_only=True)
class AnthropicOptions:
    """What a call asks beyond the messages: `max_tokens` (the API requires it), extended thinking
    with `thinking_budget` tokens (None: off; the API wants it >= 1024 and below `max_tokens`),
    and prompt caching (`cache`)."""

    max_tokens: int = 8192
    thinking_budget: int | None = None
    cache: bool = True


# -- the request ---------------------------------------------------------------------------------


# A compaction call sends the range to summarize; the API wants a user message last (an
# assistant message last would be continued, not summarized), so it ends with this request.
SUMMARIZE = (
    "Summarize the conversation above for your own later use: the task, what was done and found, "
    "the decisions taken and what is still open. Reply with the summary only."
)


def anthropic_body(model: str, request: ModelRequest, options: AnthropicOptions) -> Json:
    """The streaming Messages API body for `request` (see the module docstring)."""
    compaction = request.purpose == "compaction"
    thinking = options.thinking_budget is not None and not compaction
    system = [
        {"type": "text", "text": text}
        for msg in request.messages
        if msg["role"] == "system"
        for text in [_text(msg.get("content", ()))]
        if text
    ]
    logged = list(request.messages)
    if compaction:
        logged.append({"role": "user", "content": [{"type": "text", "text": SUMMARIZE}]})
    messages = anthropic_messages(logged, thinking=thinking)
    tools = anthropic_tools(request.tools)
    if options.cache:
        _mark_cache(system, messages, tools)
    body: Json = {"model": model, "max_tokens": options.max_tokens, "messages": messages, "stream": True}
    if system:
        body["system"] = system
    if tools:
        body["tools"] = tools
    if thinking and not _unthought_tool_turn(messages):
        body["thinking"] = {"type": "enabled", "budget_tokens": options.thinking_budget}
    return body


def _unthought_tool_turn(messages: Sequence[Json]) -> bool:
    """Whether the request continues a tool-use turn whose assistant message holds no thinking
    (a history from a model that did not think, or from before thinking was turned on): with
    thinking on, the API refuses it, so that one call is sent without thinking."""
    if len(messages) < 2 or messages[-2]["role"] != "assistant":
        return False
    content: list[Json] = messages[-2]["content"]
    calls = any(b["type"] == "tool_use" for b in content)
    return calls and content[0]["type"] not in ("thinking", "redacted_thinking")


def anthropic_messages(messages: Iterable[Mapping[str, JsonValue]], *, thinking: bool = False) -> list[Json]:
    """Logged user and assistant messages → Messages API messages (system messages are left out:
    they go to `system`); `thinking`: send thinking blocks back."""
    out: list[Json] = []
    for msg in messages:
        role = msg["role"]
        if role == "system":
            continue
        blocks: Sequence[Mapping[str, JsonValue]] = msg.get("content", ())
        content = _assistant_blocks(blocks, thinking) if role == "assistant" else _user_blocks(blocks)
        if not content:
            continue
        if out and out[-1]["role"] == role:
            previous: list[Json] = out[-1]["content"]
            if role == "user":  # tool results first in a user message, as the API wants them
                merged = [*previous, *content]
                content = [b for b in merged if b["type"] == "tool_result"] + [
                    b for b in merged if b["type"] != "tool_result"
                ]
                out[-1]["content"] = content
            else:
                previous.extend(content)
            continue
        out.append({"role": role, "content": content})
    return out


def _user_blocks(blocks: Sequence[Mapping[str, JsonValue]]) -> list[Json]:
    results: list[Json] = []
    texts: list[Json] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text" and block["text"]:
            texts.append({"type": "text", "text": block["text"]})
        elif kind == "tool-result":
            result: Json = {"type": "tool_result", "tool_use_id": block["call_id"]}
            text = _text(block.get("content", ()))
            if text:
                result["content"] = [{"type": "text", "text": text}]
            if block.get("is_error"):
                result["is_error"] = True
            results.append(result)
    return results + texts


def _assistant_blocks(blocks: Sequence[Mapping[str, JsonValue]], thinking: bool) -> list[Json]:
    out: list[Json] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "thinking" and thinking:
            out.append({"type": "thinking", "thinking": block["thinking"], "signature": block["signature"]})
        elif kind == "redacted-thinking" and thinking:
            out.append({"type": "redacted_thinking", "data": block["data"]})
        elif kind == "text" and block["text"]:
            out.append({"type": "text", "text": block["text"]})
        elif kind == "tool-call":
            out.append({"type": "tool_use", "id": block["id"], "name": block["name"], "input": _input(block)})
    return out


def _input(block: Mapping[str, JsonValue]) -> Json:
    """A call's arguments as the object `tool_use.input` must be. Arguments that are not a JSON
    object (the model's own mistake, already answered with an error result) are sent as `{}`."""
    raw = block["arguments"]
    try:
        value = msgspec.json.decode(raw) if isinstance(raw, str) and raw else {}
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def anthropic_tools(tools: Iterable[ToolSpec]) -> list[Json]:
    """Tool specs → Messages API tool definitions."""
    return [{"name": t.name, "description": t.description, "input_schema": dict(t.parameters)} for t in tools]


def _mark_cache(system: list[Json], messages: list[Json], tools: list[Json]) -> None:
    """Put the (at most four) cache breakpoints on the stable prefix (module docstring)."""
    if tools:
        tools[-1] = {**tools[-1], "cache_control": EPHEMERAL}
    if system:
        system[-1] = {**system[-1], "cache_control": EPHEMERAL}
    marked = 0
    for msg in reversed(messages):
        if msg["role"] != "user":
            continue
        content: list[Json] = msg["content"]
        content[-1] = {**content[-1], "cache_control": EPHEMERAL}
        marked += 1
        if marked == 2:
            break


def _text(blocks: Iterable[Mapping[str, JsonValue]]) -> str:
    return "\n".join(str(b["text"]) for b in blocks if b.get("type") == "text")


# -- the stream ----------------------------------------------------------------------------------


def _bad(message: str) -> StreamFault:
    return StreamFault(ModelBadStream, message)


@attrs.define
class _Block:
    """A content block being streamed: its type, and what it gathers until its stop."""

    kind: str
    fragments: int = 0  # input_json_delta fragments seen (tool_use)
    thinking: list[str] = attrs.field(factory=list)
    signature: list[str] = attrs.field(factory=list)
    data: str = ""


class StreamParser(EventStreamParser):
    """Messages API events as the runtime's chunks (`EventStreamParser`): `done` is set at
    `message_stop`."""

    END_TEXT = "message_stop or a stop_reason"

    def __init__(self, redact: Callable[[str], str] = str) -> None:
        super().__init__(redact)
        self._started = False
        self._blocks: dict[int, _Block] = {}
        self._stop: str | None = None
        self._usage: dict[str, int] = {}
        self._saw_tool_calls = False

    def _finished(self) -> bool:
        return self._stop is not None

    def _event(self, event: SSEEvent) -> list[Chunk]:
        n = self.events
        try:
            obj = msgspec.json.decode(event.data)
        except msgspec.DecodeError:
            raise _bad(f"event {n} is not JSON: {self._quote(event.data)}") from None
        if not isinstance(obj, dict):
            raise _bad(f"event {n} is not a JSON object: {self._quote(event.data)}")
        kind = obj.get("type", event.event)
        if kind == "error" or event.event == "error":
            raise self._error(obj, event.data)
        if kind == "ping":
            return []
        if kind == "message_start":
            message = obj.get("message")
            if not isinstance(message, dict):
                raise _bad(f"event {n}: message_start without a message object")
            self._started = True
            self._read_usage(message.get("usage"))
            return []
        if not self._started:
            raise _bad(f"event {n} ({self._quote(str(kind))}) came before message_start")
        if kind == "content_block_start":
            return self._block_start(obj)
        if kind == "content_block_delta":
            return self._block_delta(obj)
        if kind == "content_block_stop":
            return self._block_stop(obj)
        if kind == "message_delta":
            delta = obj.get("delta")
            if not isinstance(delta, dict):
                raise _bad(f"event {n}: message_delta without a delta object")
            reason = delta.get("stop_reason")
            if reason is not None:
                if not isinstance(reason, str):
                    raise _bad(f"event {n}: stop_reason is not a string")
                self._stop_reason(reason)
            self._read_usage(obj.get("usage"))
            return []
        if kind == "message_stop":
            if self._stop is None:
                raise _bad(f"event {n}: message_stop without a stop_reason")
            self.done = True
            return self._closing()
        logger.debug("skipped an event of unknown type %s", self._quote(repr(kind)))
        return []

    def _index(self, obj: Mapping[str, Any]) -> int:
        index = obj.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise _bad(f"event {self.events}: {obj.get('type')} without a non-negative integer index")
        return index

    def _block_start(self, obj: Mapping[str, Any]) -> list[Chunk]:
        n, index = self.events, self._index(obj)
        block = obj.get("content_block")
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _bad(f"event {n}: content_block_start without a typed content_block")
        if index in self._blocks:
            raise _bad(f"event {n}: content block {index} started twice")
        kind = block["type"]
        self._blocks[index] = state = _Block(kind)
        if kind == "text":
            text = block.get("text", "")
            if not isinstance(text, str):
                raise _bad(f"event {n}: text block's text is not a string")
            return [TextDelta(text)] if text else []
        if kind == "tool_use":
            call_id, name = block.get("id"), block.get("name")
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
                raise _bad(f"event {n}: tool_use block without a string id and name")
            self._saw_tool_calls = True
            start: list[Chunk] = [ToolCallDelta(index=index, id=call_id, name=name)]
            given = block.get("input")
            if isinstance(given, dict) and given:  # not streamed in fragments: whole at the start
                state.fragments += 1
                start.append(ToolCallDelta(index=index, arguments=msgspec.json.encode(given).decode()))
            return start
        if kind == "thinking":
            state.thinking.append(_string(block.get("thinking", ""), n, "thinking"))
            state.signature.append(_string(block.get("signature", ""), n, "signature"))
        elif kind == "redacted_thinking":
            state.data = _string(block.get("data"), n, "redacted_thinking data")
        return []

    def _block_delta(self, obj: Mapping[str, Any]) -> list[Chunk]:
        n, index = self.events, self._index(obj)
        state = self._blocks.get(index)
        if state is None:
            raise _bad(f"event {n}: a delta for content block {index}, which never started")
        delta = obj.get("delta")
        if not isinstance(delta, dict):
            raise _bad(f"event {n}: content_block_delta without a delta object")
        kind = delta.get("type")
        if kind == "text_delta" and state.kind == "text":
            text = _string(delta.get("text"), n, "text_delta text")
            return [TextDelta(text)] if text else []
        if kind == "input_json_delta" and state.kind == "tool_use":
            partial = _string(delta.get("partial_json"), n, "input_json_delta partial_json")
            if not partial:
                return []
            state.fragments += 1
            return [ToolCallDelta(index=index, arguments=partial)]
        if kind == "thinking_delta" and state.kind == "thinking":
            state.thinking.append(_string(delta.get("thinking"), n, "thinking_delta thinking"))
            return []
        if kind == "signature_delta" and state.kind == "thinking":
            state.signature.append(_string(delta.get("signature"), n, "signature_delta signature"))
            return []
        if kind in ("text_delta", "input_json_delta", "thinking_delta", "signature_delta"):
            raise _bad(f"event {n}: a {kind} for a {state.kind} block")
        return []  # citations and deltas of later API versions: nothing to keep

    def _block_stop(self, obj: Mapping[str, Any]) -> list[Chunk]:
        n, index = self.events, self._index(obj)
        state = self._blocks.get(index)
        if state is None:
            raise _bad(f"event {n}: content block {index} stopped without starting")
        if state.kind == "tool_use" and state.fragments == 0:
            return [ToolCallDelta(index=index, arguments="{}")]  # a call without arguments
        if state.kind == "thinking":
            return [Thinking(text="".join(state.thinking), signature="".join(state.signature))]
        if state.kind == "redacted_thinking":
            return [Thinking(redacted=state.data)]
        return []

    def _stop_reason(self, reason: str) -> None:
        if reason == "refusal":
            raise StreamFault(ModelContentFiltered, "the model refused to answer (stop_reason: refusal)")
        if reason == "pause_turn":
            raise _bad("the model paused its turn (stop_reason: pause_turn), which only server tools do")
        self._stop = reason

    def _read_usage(self, usage: object) -> None:
        if usage is None:
            return
        if not isinstance(usage, dict):
            raise _bad(f"event {self.events}: usage is not an object")
        for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
            value = usage.get(key)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise _bad(f"event {self.events}: usage.{key} is not a non-negative integer")
            self._usage[key] = value  # message_delta's counts are cumulative: the last wins

    def _error(self, obj: Mapping[str, Any], raw: str) -> StreamFault:
        error = obj.get("error")
        kind = error.get("type") if isinstance(error, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        text = f"{kind}: {message}" if isinstance(kind, str) and isinstance(message, str) else raw
        fault = ModelUnavailable if kind in _UNAVAILABLE_ERRORS else ModelBadStream
        return StreamFault(fault, f"the provider reported an error: {self._quote(text)}")

    def _quote(self, text: str) -> str:
        return one_line(self._redact(text))

    def _closing(self) -> list[Chunk]:
        known = _FINISH.get(self._stop or "")
        if known is None:
            logger.debug("unknown stop_reason %s", self._quote(repr(self._stop)))
        reason: FinishReason
        if known is None:
            reason = "tool-calls" if self._saw_tool_calls else "stop"
        else:
            reason = known
        chunks: list[Chunk] = []
        if self._usage:
            u = self._usage
            chunks.append(
                Usage(
                    input_tokens=u.get("input_tokens", 0),
                    output_tokens=u.get("output_tokens", 0),
                    cache_read_tokens=u.get("cache_read_input_tokens", 0),
                    cache_write_tokens=u.get("cache_creation_input_tokens", 0),
                )
            )
        chunks.append(Finish(reason))
        return chunks


def _string(value: object, n: int, what: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"event {n}: {what} is not a string")
    return value
