"""The model seam (docs/design.md, "The agent loop and models"): one method,
`stream(request)`, yielding chunks.

A transport turns a `ModelRequest` (the session's surface messages and its tool specs) into an
async iterator of chunks: text deltas, tool-call deltas (reassembled by index), usage and one
final `Finish`. Failures are raised as `ModelError` with a stable code; the agent loop records
them (`turn/end {kind: "error"}`), it never retries — retrying is the transport's business.
The loop consumes a stream inside `contextlib.aclosing` and may cancel it at any chunk.

Messages are the logged message values of docs/format.md, "The vocabulary (complete for format
1)" (`{id, role, content: [blocks], source}`), so a transport sees exactly what the log holds, in
surface order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal, Protocol

import attrs

from subagents.runtime.clock import Clock
from subagents.runtime.errors import ModelError  # the seam's error (runtime/errors.py)

__all__ = [
    "Chunk",
    "Finish",
    "Model",
    "ModelError",
    "ModelRequest",
    "ModelWaits",
    "TextDelta",
    "ToolCallDelta",
    "ToolSpec",
    "Usage",
]

Message = Mapping[str, Any]


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
    input_tokens: int
    output_tokens: int


@attrs.frozen
class Finish:
    reason: Literal["stop", "tool-calls", "max-tokens"]


Chunk = TextDelta | ToolCallDelta | Usage | Finish


@attrs.frozen
class ToolSpec:
    """What the model is told about one tool: its name, description and JSON-schema parameters."""

    name: str
    description: str
    parameters: Mapping[str, Any]


class ModelWaits(Protocol):
    """Hooks a scripted response can hold on (`wait_for`), provided by the runtime."""

    async def steered(self) -> None:
        """Return once this session's inbox has received a message (now or earlier in the turn)."""
        ...

    async def settled(self, child: str, count: int = 1) -> None:
        """Return once `count` `subagent/settled` records of the child named by label or id are
        durable in this session's log (those an earlier process recorded count too)."""
        ...


@attrs.frozen(kw_only=True)
class ModelRequest:
    session_id: str
    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    # Identity of the calling session, used by the scripted model to bind script entries.
    label: str | None = None
    created_at: int = 0
    # Number of `assistant/message` events already in the session's log (call-id numbering).
    assistant_count: int = 0
    clock: Clock
    waits: ModelWaits | None = None
    # "compaction": summarize `messages` (the scripted model answers from its `summaries`).
    purpose: Literal["turn", "compaction"] = "turn"


class Model(Protocol):
    def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]: ...
