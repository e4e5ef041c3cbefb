"""The key of a child's run (docs/format.md, `subagent/settled`'s `run_key`): which run of a
child a settlement settles, so the parent records one settlement per run, whichever host
finishes it (issue 27, "settled once")."""

from __future__ import annotations

from collections.abc import Sequence

from subagents.storage import Event

__all__ = ["run_key_of"]


def run_key_of(child_id: str, events: Sequence[Event]) -> str | None:
    """`<child_id>@<seq of the child's last turn/end>` over the child's events, or None when
    no turn of it has ended (nothing to settle by key)."""
    for event in reversed(events):
        if event.type == "turn/end":
            return f"{child_id}@{event.seq}"
    return None
