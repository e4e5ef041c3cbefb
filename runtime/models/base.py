"""The model seam (docs/design.md, "The agent loop and models"): one method,
`stream(request)`, yielding chunks.

A transport turns a `ModelRequest` (the session's surface messages, its tool specs and what the
call is for) into an async iterator of chunks: text deltas, tool-call deltas (reassembled by
index), whole thinking blocks (kept in the reply's message for the provider that needs them
back), usage and one final `Finish`. Failures are raised as `ModelError` with a stable code; the
agent loop records them (`turn/end {kind: "error"}`), it never retries — retrying is the
transport's business. The loop consumes a stream inside `contextlib.aclosing` and may cancel it
at any chunk.

The request holds nothing about the calling session. A model that answers per session (the
scripted model binds script entries to sessions, numbers call ids, sleeps on the runtime clock
and paces its `wait_for` holds on what the session publishes, `SessionWaits`) is a
`SessionModel`: the agent calls its `bind(session)` once, when it starts, with a
`SessionBinding`, and streams from the `Model` that returns. A transport that needs none of this
(the OpenAI-compatible one) simply has no `bind`.

Messages are the logged message values of docs/format.md, "The vocabulary (complete for format
1)" (`{id, role, content: [blocks], source}`), so a transport sees exactly what the log holds, in
surface order.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Literal, Protocol, runtime_checkable

import attrs
from subagents.actors import DurableFeed
from subagents.storage import Event

from ..foundation.clock import Clock
from ..foundation.json_values import JsonValue

__all__ = [
    "AnyModel",
    "Chunk",
    "Finish",
    "InboxCounts",
    "Model",
    "ModelRequest",
    "PublishedInbox",
    "SessionBinding",
    "SessionModel",
    "SessionWaits",
    "TextDelta",
    "Thinking",
    "ToolCallDelta",
    "ToolSpec",
    "Usage",
    "bind_model",
]

Message = Mapping[str, JsonValue]


@attrs.frozen
class TextDelta:
    text: str


@attrs.frozen
class ToolCallDelta:
    """A piece of the `index`-th tool call: `id` and `name` arrive once (usually first),
    `arguments` is a fragment of the raw JSON string, concatenated in arrival order."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@attrs.frozen
class Usage:
    """The tokens one model call used. The four counts are disjoint: `input_tokens` are the
    prompt tokens neither read from nor written to the provider's prompt cache (a provider that
    reports no cache counts all its prompt here), `cache_read_tokens` those read from it,
    `cache_write_tokens` those written to it, `output_tokens` the reply (thinking included).
    `reasoning_tokens` is the part of `output_tokens` the provider reports as reasoning (OpenAI's
    `completion_tokens_details.reasoning_tokens`; 0: not reported), not another count."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    def record(self) -> dict[str, int]:
        """The `usage` of the call's `assistant/message` (cache counts only when there are any, so
        a provider without a cache writes what it always wrote)."""
        out = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        if self.cache_read_tokens:
            out["cache_read_tokens"] = self.cache_read_tokens
        if self.cache_write_tokens:
            out["cache_write_tokens"] = self.cache_write_tokens
        if self.reasoning_tokens:
            out["reasoning_tokens"] = self.reasoning_tokens
        return out

    def total(self) -> int:
        """Every token the call was charged for (a token budget counts these)."""
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens


@attrs.frozen
class Thinking:
    """A whole thinking block of the reply (a provider's reasoning, kept so it can be sent back
    as that provider requires): its text and the `signature` that vouches for it, or for a
    redacted block only its opaque `data`. Recorded in the reply's message, never shown as its
    text."""

    text: str = ""
    signature: str = ""
    redacted: str | None = None

    def block(self) -> dict[str, str]:
        """The logged content block (docs/format.md: `thinking` or `redacted-thinking`)."""
        if self.redacted is not None:
            return {"type": "redacted-thinking", "data": self.redacted}
        return {"type": "thinking", "thinking": self.text, "signature": self.signature}


@attrs.frozen
class Finish:
    reason: Literal["stop", "tool-calls", "max-tokens"]


Chunk = TextDelta | ToolCallDelta | Thinking | Usage | Finish


@attrs.frozen
class ToolSpec:
    """What the model is told about one tool: its name, description and JSON-schema parameters."""

    name: str
    description: str
    parameters: Mapping[str, JsonValue]


class InboxCounts(Protocol):
    """What an inbox's `statistics()` tells (runtime/agent/inbox.py, `InboxStatistics`)."""

    @property
    def received(self) -> int:
        """Deliveries accepted since the inbox was made."""
        ...

    @property
    def received_in_turn(self) -> int:
        """Deliveries accepted since the current (or last) turn claimed its input."""
        ...


class PublishedInbox(Protocol):
    """A session's inbox as it is published: its counts, and a wake on each change."""

    def statistics(self) -> InboxCounts: ...

    async def wait_changed(self) -> None:
        """Until the next delivery or claim (test the counts again, then wait on)."""
        ...


@attrs.frozen(kw_only=True)
class SessionWaits:
    """What a running session publishes that a model may pace itself on (the scripted model's
    `wait_for` holds are derived from it; nothing in it is for one model only).

    `inbox` is the session's inbox (its counts, with a change notification); `history` the
    events its log held when the agent started (`inherited_event_count` of them inherited by a
    fork); `feed` the session store's durable feed, which carries every event appended since
    (`None`: the runtime publishes none)."""

    inbox: PublishedInbox
    history: Sequence[Event] = ()
    inherited_event_count: int = 0
    feed: DurableFeed | None = None


@attrs.frozen(kw_only=True)
class ModelRequest:
    """One model call: what a transport needs and nothing about who calls.

    `messages` are the session's surface messages in order; `tools` the specs offered (none for
    a compaction call); `purpose` is `"turn"` (answer the conversation) or `"compaction"`
    (summarize `messages`; the scripted model answers from its `summaries`)."""

    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    purpose: Literal["turn", "compaction"] = "turn"


def _no_assistant_messages() -> int:
    return 0


@attrs.frozen(kw_only=True)
class SessionBinding:
    """What the runtime tells a `SessionModel` about the one session it answers.

    `session_id`, `label` and `created_at` identify the session (the scripted model binds its
    entries by them); `clock` is the runtime's clock (scripted delays sleep on it); `waits` is
    what the running session publishes for a model to pace itself on (`None`: nothing);
    `assistant_count()` is the number of `assistant/message` events in the session's log when it
    is called — read at each `stream` call, it numbers default call ids (`call_<n>_<i>`)."""

    session_id: str
    label: str | None = None
    created_at: int = 0
    clock: Clock
    waits: SessionWaits | None = None
    assistant_count: Callable[[], int] = _no_assistant_messages


class Model(Protocol):
    """A transport: streams the chunks answering one request. The stream is an async generator,
    so a caller that stops early closes it at once (`aclosing`), letting it release its
    connection or its script position."""

    def stream(self, request: ModelRequest) -> AsyncGenerator[Chunk]: ...


@runtime_checkable
class SessionModel(Protocol):
    """A model that answers per session: `bind` returns the `Model` one session streams from.
    The runtime accepts one wherever it accepts a `Model`, and binds it once per agent."""

    def bind(self, session: SessionBinding) -> Model: ...


# What the runtime accepts wherever it takes a model: a transport, or a model that binds per session.
AnyModel = Model | SessionModel


def bind_model(model: AnyModel, session: SessionBinding) -> Model:
    """The `Model` the session streams from: `model.bind(session)` for a `SessionModel`, else
    `model` itself (a transport never sees the binding)."""
    if isinstance(model, SessionModel):
        return model.bind(session)
    return model
