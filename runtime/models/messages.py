"""Message values and the surface: what the model sees of a session
(docs/format.md, "The vocabulary (complete for format 1)"; docs/design.md, "The agent loop and
models").

Messages are plain JSON values, exactly as logged: `{id, role, content: [blocks], source}`.
The *surface* is the sequence of surface events after applying their `surface_op`s — `append`
adds a node, `replace {start_seq, end_seq}` swaps the nodes of that seq range for one node (a
compaction summary). Pure and synchronous: rebuilt from a log on resume, then kept up to date
by the loop as it appends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs
import msgspec
from subagents.storage import SURFACE_TYPES, UNSET, Event, ReplaceOp, decode_payload

from ..foundation.json_values import JsonObject as Json
from ..foundation.json_values import JsonValue

__all__ = [
    "Surface",
    "SurfaceNode",
    "message",
    "message_text",
    "text_blocks",
    "tool_result_message",
]


def text_blocks(*texts: str) -> list[Json]:
    return [{"type": "text", "text": t} for t in texts]


def message(
    msg_id: str, role: str, content: Sequence[Mapping[str, JsonValue]], source: Mapping[str, JsonValue]
) -> Json:
    return {"id": msg_id, "role": role, "content": [dict(b) for b in content], "source": dict(source)}


def tool_result_message(
    msg_id: str, call_id: str, content: Sequence[Mapping[str, JsonValue]], *, is_error: bool
) -> Json:
    block = {"type": "tool-result", "call_id": call_id, "content": [dict(b) for b in content], "is_error": is_error}
    return message(msg_id, "user", [block], {"kind": "tool", "call_id": call_id})


def message_text(msg: Mapping[str, JsonValue], *, sep: str = "\n") -> str:
    """The text blocks of a message joined with `sep` (tool-result contents included)."""
    return sep.join(_texts(msg.get("content", ())))


def _texts(blocks: Iterable[Mapping[str, JsonValue]]) -> Iterable[str]:
    for block in blocks:
        if block.get("type") == "text":
            yield block["text"]
        elif block.get("type") == "tool-result":
            yield from _texts(block.get("content", ()))


@attrs.frozen
class SurfaceNode:
    seq: int
    type: str
    message: Json
    # The first event seq the node stands for: its own seq, or for a compaction summary the
    # start of the range it replaced. Strictly increasing along the surface (a summary's own
    # seq is not: it is newer than the nodes after it).
    first_seq: int = attrs.field(default=attrs.Factory(lambda node: node.seq, takes_self=True))


class Surface:
    """The surface nodes of one session, in order."""

    def __init__(self) -> None:
        self.nodes: list[SurfaceNode] = []

    @classmethod
    def from_events(cls, events: Iterable[Event], *, session_id: str = "") -> Surface:
        surface = cls()
        for event in events:
            # An ignorable event of a later format may carry a surface_op: readers skip it.
            if event.surface_op is not UNSET and event.type in SURFACE_TYPES:
                surface.apply(event, session_id=session_id)
        return surface

    def apply(self, event: Event, *, session_id: str = "") -> None:
        payload = decode_payload(event, session_id=session_id)
        self.add(event.seq, event.type, _to_json(payload.message), event.surface_op)

    def add(self, seq: int, type: str, msg: Json, op: object = "append") -> None:
        if not isinstance(op, ReplaceOp):
            self.nodes.append(SurfaceNode(seq, type, msg))
            return
        # The span runs from the first node at or after `start_seq` to the node whose own seq is
        # `end_seq` (a summary may end a span although its seq is newer than what follows it).
        nodes = self.nodes
        lo = next((i for i, n in enumerate(nodes) if n.first_seq >= op.start_seq), len(nodes))
        hi = next((i for i, n in enumerate(nodes) if n.seq == op.end_seq), None)
        if hi is None:
            hi = max((i for i, n in enumerate(nodes) if n.first_seq <= op.end_seq), default=lo - 1)
        self.nodes = [*nodes[:lo], SurfaceNode(seq, type, msg, op.start_seq), *nodes[max(hi, lo - 1) + 1 :]]

    def messages(self) -> list[Json]:
        return [n.message for n in self.nodes]

    def last_system_text(self) -> str | None:
        for node in reversed(self.nodes):
            if node.type == "system/message":
                return message_text(node.message)
        return None

    def size(self) -> int:
        """A cheap measure of the history's weight: characters of text, arguments and ids."""
        total = 0
        for node in self.nodes:
            for block in node.message["content"]:
                total += _block_size(block)
        return total


def _block_size(block: Mapping[str, JsonValue]) -> int:
    kind = block.get("type")
    if kind == "text":
        return len(block["text"])
    if kind == "tool-call":
        return len(block["arguments"]) + len(block["name"])
    if kind == "tool-result":
        return sum(_block_size(b) for b in block["content"])
    return 0


def _to_json(value: object) -> JsonValue:
    return msgspec.to_builtins(value)
