"""The tracing seam the agent loop calls (README "Traces (OpenTelemetry)").

Theory of operation. Tracing is one narrow protocol, `Telemetry`, with two implementations: none
at all (`trace_of(None, ...)` gives `NO_TRACE`, whose every method does nothing, so a run with
tracing off imports no OpenTelemetry module and pays a few empty calls per step) and the
OpenTelemetry one (gen_ai.py; the tests use it with the SDK's in-memory exporter). An agent holds
one `SessionTrace`; a turn is a `TurnTrace` (the `invoke_agent` span), a model call a `ChatTrace`
(`chat {model}`), a tool call a `ToolTrace` (`execute_tool {name}`).

A session's spans belong to one trace for its whole life, across restarts and hosts, through
its *anchor*: the span context every `invoke_agent` span of the session is a child of, kept in
its own log as an ignorable `telemetry/trace {version: 1, traceparent}` event (W3C trace
context). A child's anchor is its parent's `execute_tool subagent` span, written in the append
that publishes the child; a session with no anchor (a root, or a session from before tracing was
on) makes its first traced turn's span its anchor and records it with that turn. The last
well-formed record of the session's own suffix holds (a fork inherits its parent's records,
which are not its own); one that fails to parse is ignored, never an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import msgspec
from subagents.storage import Event, SessionHeader

__all__ = [
    "NO_CHAT",
    "NO_TOOL",
    "NO_TRACE",
    "NO_TURN",
    "ROOT_AGENT_NAME",
    "TRACE_TYPE",
    "ChatTrace",
    "SessionTrace",
    "Telemetry",
    "ToolTrace",
    "TurnTrace",
    "agent_name",
    "recorded_traceparent",
    "trace_of",
    "trace_record",
]

TRACE_TYPE = "telemetry/trace"
ROOT_AGENT_NAME = "root"  # `gen_ai.agent.name` of a root session with no preset (`agent_name`)

Json = dict[str, Any]


class ChatTrace(Protocol):
    """One model call (`chat {model}`)."""

    def end(
        self,
        *,
        text: str,
        calls: Sequence[tuple[str, str, str]],  # (call id, tool name, arguments)
        finish: str | None,
        usage: Mapping[str, int] | None,
        error: str | None,
        interrupted: bool,
    ) -> None: ...

    def fail(self, exc: BaseException) -> None: ...


class ToolTrace(Protocol):
    """One tool call (`execute_tool {name}`), from its dispatch to its recorded result."""

    def end(self, *, content: Sequence[Json], is_error: bool, error: Mapping[str, str] | None) -> None: ...


class TurnTrace(Protocol):
    """One turn (`invoke_agent`)."""

    def chat(self, messages: Sequence[Json]) -> ChatTrace: ...

    def tool(self, call_id: str, name: str, arguments: str) -> ToolTrace: ...

    def end(self, reason: Mapping[str, Any]) -> None: ...

    def fail(self, exc: BaseException) -> None: ...


class SessionTrace(Protocol):
    """One agent's tracing; `provider` and `model` name the model it calls."""

    def turn(self, turn: int, *, provider: str, model: str, continued: bool) -> TurnTrace: ...

    def anchor_record(self) -> Json | None:
        """The `telemetry/trace` payload to write with the turn just started (once: when this
        turn became the session's anchor), else None."""
        ...

    def child_record(self, call_id: str | None) -> Json | None:
        """The `telemetry/trace` payload of a child started by the tool call `call_id` (its
        `execute_tool` span is the child's anchor), or None."""
        ...


class Telemetry(Protocol):
    """Tracing on: a `SessionTrace` per agent, and the end of it all."""

    def session(self, *, session_id: str, label: str | None, anchor: str | None) -> SessionTrace:
        """`anchor`: the traceparent the session's log recorded, if any."""
        ...

    def shutdown(self) -> None:
        """Export what is left and stop (blocking: run it in a thread)."""
        ...


class _NoChat:
    def end(self, **_: object) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        pass


class _NoTool:
    def end(self, **_: object) -> None:
        pass


class _NoTurn:
    def chat(self, messages: Sequence[Json]) -> ChatTrace:
        return NO_CHAT

    def tool(self, call_id: str, name: str, arguments: str) -> ToolTrace:
        return NO_TOOL

    def end(self, reason: Mapping[str, Any]) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        pass


class _NoTrace:
    def turn(self, turn: int, *, provider: str, model: str, continued: bool) -> TurnTrace:
        return NO_TURN

    def anchor_record(self) -> Json | None:
        return None

    def child_record(self, call_id: str | None) -> Json | None:
        return None


# Stateless, so one of each serves every agent.
NO_CHAT: ChatTrace = _NoChat()
NO_TOOL: ToolTrace = _NoTool()
NO_TURN: TurnTrace = _NoTurn()
NO_TRACE: SessionTrace = _NoTrace()


def trace_of(
    telemetry: Telemetry | None,
    *,
    session_id: str,
    label: str | None,
    events: Sequence[Event],
    inherited_event_count: int,
    header: SessionHeader | None = None,
) -> SessionTrace:
    """An agent's tracing: `NO_TRACE` when tracing is off (its log is not even looked at).
    With the session's `header`, a root is named (`agent_name`)."""
    if telemetry is None:
        return NO_TRACE
    return telemetry.session(
        session_id=session_id,
        label=label if header is None else agent_name(label, header),
        anchor=recorded_traceparent(events, inherited_event_count),
    )


def agent_name(label: str | None, header: SessionHeader) -> str | None:
    """The `gen_ai.agent.name` of a session's spans: a child's label (an unlabeled child has
    none); a root's label, else its header's `agent_preset`, else `root`. The conventions ask for
    the name "when available" and name the span `invoke_agent {gen_ai.agent.name}`; a root has no
    agent type (types select children) and no label, yet it is the one agent every tree starts
    from — named, its turns can be found by name in a trace backend (`gen_ai.agent.id` tells one
    root from another) and are never mistaken for an unlabeled child's."""
    if label is not None or header.origin is not None:
        return label
    return header.agent_preset or ROOT_AGENT_NAME


def trace_record(traceparent: str) -> Json:
    """The `telemetry/trace` payload."""
    return {"version": 1, "traceparent": traceparent}


def recorded_traceparent(events: Sequence[Event], inherited_event_count: int = 0) -> str | None:
    """The traceparent of the last well-formed `telemetry/trace` of the events' own suffix."""
    for event in reversed(events):
        if event.seq < inherited_event_count:
            break
        if event.type != TRACE_TYPE:
            continue
        try:
            data = msgspec.json.decode(event.data)
        except msgspec.DecodeError:
            continue
        if isinstance(data, dict) and data.get("version") == 1 and isinstance(data.get("traceparent"), str):
            return data["traceparent"]
    return None
