"""The run key of a child's settlement (`subagent/settled` `run_key`, docs/format.md).

A child's run is named by its id and the seq of its last `turn/end`: two hosts that claim the same
work (a placement reclaimed while its first host still ran it, a sweep racing a takeover) read the
same log and so compute the same key, and the parent's recorder keeps only the first
`subagent/settled` with a given key. Both the settling side (the serving host) and the recording
side (the parent's mailbox owner) compute it here, so they cannot disagree on its form.
"""

from __future__ import annotations

from collections.abc import Sequence

from subagents.storage import Event

__all__ = ["run_key_of"]


def run_key_of(child_id: str, events: Sequence[Event]) -> str | None:
    """`<child_id>@<seq of the child's last turn/end>`; None when the child has no `turn/end`
    (it never finished a turn: nothing identifies a run to settle)."""
    for event in reversed(events):
        if event.type == "turn/end":
            return f"{child_id}@{event.seq}"
    return None
