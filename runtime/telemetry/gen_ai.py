"""The OpenTelemetry implementation of the tracing seam (seam.py), in the GenAI semantic
conventions: `invoke_agent {name}` per turn (INTERNAL: the agent runs in this process),
`chat {model}` per model call (CLIENT) and `execute_tool {name}` per tool call (INTERNAL), each
`chat` and `execute_tool` a child of its turn's span. Imported only when tracing is on (it
imports the `otel` extra).

Spans are started with an explicit parent context, never the ambient one: Trio tasks copy
context variables when they start, so a current span would leak into tasks that are not its
children (a child agent's task is started from its parent's tool call). Prompts, outputs, tool
arguments and results go into spans only with `capture_content` (the conventions' opt-in
attributes `gen_ai.input.messages`, `gen_ai.output.messages`, `gen_ai.tool.call.arguments`,
`gen_ai.tool.call.result`, as JSON strings).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    set_span_in_context,
)

from .seam import ChatTrace, Json, SessionTrace, ToolTrace, TurnTrace, trace_record

__all__ = ["OtelTelemetry", "format_traceparent", "parse_traceparent"]

# The model's finish as the conventions spell finish reasons.
_FINISH = {"stop": "stop", "tool-calls": "tool_call", "max-tokens": "length", "error": "error"}


class OtelTelemetry:
    """`Telemetry` over an SDK `TracerProvider` (owned: `shutdown` shuts it down)."""

    def __init__(self, provider: TracerProvider, *, capture_content: bool = False) -> None:
        self.provider = provider
        self.capture_content = capture_content
        self._tracer = provider.get_tracer("subagents")

    def session(self, *, session_id: str, label: str | None, anchor: str | None) -> SessionTrace:
        return _SessionTrace(self._tracer, self.capture_content, session_id, label, parse_traceparent(anchor))

    def shutdown(self) -> None:
        self.provider.shutdown()


def format_traceparent(context: SpanContext) -> str:
    """W3C trace context: `00-<trace id>-<span id>-<flags>`."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def parse_traceparent(value: str | None) -> SpanContext | None:
    """A recorded traceparent as a remote span context; None for anything that is not one."""
    if value is None:
        return None
    parts = value.split("-")
    if len(parts) != 4 or parts[0] != "00" or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if trace_id == 0 or span_id == 0:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))


def _under(parent: SpanContext | Span | None) -> otel_context.Context:
    """A context whose only span is `parent` (an empty one: a new trace)."""
    if parent is None:
        return otel_context.Context()
    span = parent if isinstance(parent, Span) else NonRecordingSpan(parent)
    return set_span_in_context(span, otel_context.Context())


def _error_name(exc: BaseException) -> str:
    """An exception's class name; a group's first leaf's (a nursery's cancellation is `Cancelled`)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return type(exc).__name__


def _error(span: Span, kind: str, description: str | None = None) -> None:
    span.set_attribute("error.type", kind)
    span.set_status(Status(StatusCode.ERROR, description))


class _SessionTrace:
    def __init__(
        self, tracer: Tracer, capture: bool, session_id: str, label: str | None, anchor: SpanContext | None
    ) -> None:
        self._tracer = tracer
        self._capture = capture
        self._session_id = session_id
        self._label = label
        self._anchor = anchor
        self._unrecorded: str | None = None
        self._tools: dict[str, Span] = {}  # call id → the span of a tool call still running

    def turn(self, turn: int, *, provider: str, model: str, continued: bool) -> TurnTrace:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "gen_ai.agent.id": self._session_id,
            "gen_ai.conversation.id": self._session_id,
            "subagents.turn": turn,
        }
        if self._label is not None:
            attributes["gen_ai.agent.name"] = self._label
        if continued:
            attributes["subagents.turn.continued"] = True
        name = f"invoke_agent {self._label}" if self._label else "invoke_agent"
        span = self._tracer.start_span(
            name, context=_under(self._anchor), kind=SpanKind.INTERNAL, attributes=attributes
        )
        if self._anchor is None:
            self._anchor = span.get_span_context()
            self._unrecorded = format_traceparent(self._anchor)
        return _TurnTrace(self, span, provider, model)

    def anchor_record(self) -> Json | None:
        unrecorded, self._unrecorded = self._unrecorded, None
        return None if unrecorded is None else trace_record(unrecorded)

    def child_record(self, call_id: str | None) -> Json | None:
        span = self._tools.get(call_id) if call_id is not None else None
        return None if span is None else trace_record(format_traceparent(span.get_span_context()))


class _TurnTrace:
    def __init__(self, session: _SessionTrace, span: Span, provider: str, model: str) -> None:
        self._session = session
        self._span = span
        self._provider = provider
        self._model = model
        self._tokens = [0, 0]  # input, output: the turn's sums
        self._open: dict[str, Span] = {}  # the turn's tool spans not ended yet

    def chat(self, messages: Sequence[Json]) -> ChatTrace:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self._provider,
            "gen_ai.request.model": self._model,
            "gen_ai.conversation.id": self._session._session_id,
        }
        if self._session._capture:
            attributes["gen_ai.input.messages"] = json.dumps([_message(m) for m in messages], ensure_ascii=False)
        span = self._session._tracer.start_span(
            f"chat {self._model}", context=_under(self._span), kind=SpanKind.CLIENT, attributes=attributes
        )
        return _ChatTrace(self, span)

    def tool(self, call_id: str, name: str, arguments: str) -> ToolTrace:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
        }
        if self._session._capture:
            attributes["gen_ai.tool.call.arguments"] = arguments
        span = self._session._tracer.start_span(
            f"execute_tool {name}", context=_under(self._span), kind=SpanKind.INTERNAL, attributes=attributes
        )
        self._session._tools[call_id] = self._open[call_id] = span
        return _ToolTrace(self, call_id, span)

    def _close_tools(self, kind: str) -> None:
        """Tool calls still open when their turn ends (its task was cancelled mid-call)."""
        for call_id, span in list(self._open.items()):
            _error(span, kind)
            span.end()
            self._forget(call_id, span)

    def _forget(self, call_id: str, span: Span) -> None:
        self._open.pop(call_id, None)
        if self._session._tools.get(call_id) is span:
            del self._session._tools[call_id]

    def end(self, reason: Mapping[str, Any]) -> None:
        kind = str(reason.get("kind"))
        self._close_tools(kind)
        self._span.set_attribute("subagents.turn.end_reason", kind)
        self._span.set_attribute("gen_ai.usage.input_tokens", self._tokens[0])
        self._span.set_attribute("gen_ai.usage.output_tokens", self._tokens[1])
        if kind in ("error", "interrupted"):
            message = reason.get("message")
            _error(self._span, kind, message if isinstance(message, str) else None)
        self._span.end()

    def fail(self, exc: BaseException) -> None:
        self._close_tools(_error_name(exc))
        _error(self._span, _error_name(exc))
        self._span.end()


class _ChatTrace:
    def __init__(self, turn: _TurnTrace, span: Span) -> None:
        self._turn = turn
        self._span = span

    def end(
        self,
        *,
        text: str,
        calls: Sequence[tuple[str, str, str]],
        finish: str | None,
        usage: Mapping[str, int] | None,
        error: str | None,
        interrupted: bool,
    ) -> None:
        span = self._span
        if usage is not None:
            inputs, outputs = int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
            span.set_attribute("gen_ai.usage.input_tokens", inputs)
            span.set_attribute("gen_ai.usage.output_tokens", outputs)
            self._turn._tokens[0] += inputs
            self._turn._tokens[1] += outputs
        reason = "error" if error is not None else _FINISH.get("tool-calls" if calls else (finish or "stop"), "stop")
        if not interrupted:
            span.set_attribute("gen_ai.response.finish_reasons", [reason])
        else:
            span.set_attribute("subagents.interrupted", True)
        if self._turn._session._capture and (text or calls):
            parts: list[Json] = [{"type": "text", "content": text}] if text else []
            parts += [{"type": "tool_call", "id": i, "name": n, "arguments": a} for i, n, a in calls]
            output = [{"role": "assistant", "parts": parts, "finish_reason": reason}]
            span.set_attribute("gen_ai.output.messages", json.dumps(output, ensure_ascii=False))
        if error is not None:
            _error(span, "model_error", error)
        span.end()

    def fail(self, exc: BaseException) -> None:
        _error(self._span, _error_name(exc))
        self._span.end()


class _ToolTrace:
    def __init__(self, turn: _TurnTrace, call_id: str, span: Span) -> None:
        self._turn = turn
        self._call_id = call_id
        self._span = span

    def end(self, *, content: Sequence[Json], is_error: bool, error: Mapping[str, str] | None) -> None:
        if self._turn._open.get(self._call_id) is not self._span:
            return  # ended with its turn already
        self._turn._forget(self._call_id, self._span)
        if self._turn._session._capture:
            self._span.set_attribute("gen_ai.tool.call.result", _text(content))
        if is_error:
            name = error.get("name") if error is not None else None
            code = error.get("code") if error is not None else None
            _error(self._span, name or "_OTHER", code)
        self._span.end()


def _text(blocks: Sequence[Json]) -> str:
    return "".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")


def _message(message: Json) -> Json:
    """A surface message in the conventions' shape: `{role, parts: [...]}`."""
    parts: list[Json] = []
    for block in message.get("content", ()):
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "content": block.get("text", "")})
        elif kind == "tool-call":
            parts.append(
                {
                    "type": "tool_call",
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "arguments": block.get("arguments"),
                }
            )
        elif kind == "tool-result":
            parts.append(
                {"type": "tool_call_response", "id": block.get("call_id"), "response": _text(block.get("content", ()))}
            )
    role = message.get("role", "user")
    if parts and all(p["type"] == "tool_call_response" for p in parts):
        role = "tool"
    return {"role": role, "parts": parts}
