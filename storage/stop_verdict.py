"""The durable stopped marker as the log says it (issue 27 item 5; docs/format.md,
`session/stopped`): pure functions of the events, so the agent registry (which decides what a
resume does with an open turn) and the subagent service (runtime/delegation/stopping.py, which
stops trees) read one verdict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ._codec import Event

__all__ = ["EXPLICIT_SOURCES", "is_explicit_message", "stop_marker", "stopped"]

Json = dict[str, Any]

# The sources of a message that may start a stopped session again: a person's words, another
# agent's `send_message`. Notices (`subagent-settled`), compaction and tool results never do.
EXPLICIT_SOURCES = frozenset({"user", "agent-message"})


def is_explicit_message(event: Event) -> bool:
    """Whether `event` is a `user/message` a person or another agent sent (it clears the marker)."""
    if event.type != "user/message":
        return False
    data: Json = msgspec.json.decode(event.data)  # checked by every read of the log
    message: Json = data.get("message", {})
    source: object = message.get("source", {})
    return isinstance(source, dict) and source.get("kind") in EXPLICIT_SOURCES  # pyright: ignore[reportUnknownMemberType]  # a JSON object's values are untyped


def stop_marker(events: Sequence[Event]) -> Json | None:
    """The `session/stopped` marker in force: the last one, unless an explicit message came after
    it (None: the session is not stopped). Only the own suffix counts: a fork inherits its
    parent's history, not its parent's stop — so the caller passes `events[inherited:]` when the
    log has an inherited prefix (`stopped_own`)."""
    for event in reversed(events):
        if event.type == "session/stopped":
            data: Json = msgspec.json.decode(event.data)  # checked by every read of the log
            return data
        if is_explicit_message(event):
            return None
    return None


def stopped(events: Sequence[Event], inherited_event_count: int = 0) -> bool:
    """Whether the session is stopped: its last `session/stopped` comes after its last explicit
    message (only its own events, after `inherited_event_count`, count)."""
    return stop_marker(events[inherited_event_count:]) is not None
