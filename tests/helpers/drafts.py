"""Event drafts that tests append through a session actor: notes, turn starts, descriptors."""

from __future__ import annotations

from typing import Any

from descriptors import descriptor
from subagents.actors import EventDraft


def note(time: int | None = None, **data: Any) -> EventDraft:
    """An ignorable event of a type outside the vocabulary: any object data is fine."""
    return EventDraft(type="test/note", data=data, ignorable=True, time=time)


def turn_start(turn: int, time: int | None = None) -> EventDraft:
    """A `turn/start` of turn `turn`."""
    return EventDraft(type="turn/start", data={"turn": turn}, time=time)


def descriptor_draft(label: str | None, time: int | None = None, **changes: str) -> EventDraft:
    """A `subagent/descriptor` labelled `label` (`changes` go to `descriptors.descriptor`)."""
    return EventDraft(type="subagent/descriptor", data=descriptor(label, **changes), time=time)
