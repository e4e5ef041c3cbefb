"""Settled once (issue 27; docs/format.md, `subagent/settled`'s `run_key`): a parent records at
most one `subagent/settled` per run of a child, whichever host settles it.

A settlement carries the key of the run it settles (`run_key.py`: the child's id and the seq of
its last `turn/end`). Two settlements of one run happen when two hosts both believe they finished
it — a host that lost its lease for a moment settles a child that another host then claims,
resumes and, with nothing left to do, settles again — and each is posted with its own delivery
id, so the mailbox's "recorded once" cannot tell them apart; the run key can. The parent's
recorder (`Settlement`, locally and for `settled` deliveries) drops a settlement whose key its
log records already: no second record, no second notice; its envelope is acked all the same.

`recorded_run_keys` is the projection (a plain fold, like `recorded_delivery_ids`);
`SettledKeys` keeps it per open parent session, loaded from the events the resume read and
claimed before each record (released if it fails), so checking costs no log read.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import msgspec
from subagents.actors import SessionRef
from subagents.storage import Event

from ..agent.loop import Agent

__all__ = ["SettledKeys", "agent_run_key", "recorded_run_keys"]


def recorded_run_keys(events: Sequence[Event]) -> set[str]:
    """The `run_key`s of the `subagent/settled` records among `events`."""
    keys: set[str] = set()
    for event in events:
        if event.type == "subagent/settled":
            try:
                value = _RUN_KEY.decode(event.data).run_key
            except msgspec.DecodeError:
                continue  # the log was checked when read: no such payload reaches here
            if value is not None:
                keys.add(value)
    return keys


def agent_run_key(agent: Agent) -> str | None:
    """The key of the run a live child agent settles: `run_key_of(child_id, its events)`
    without reading them (its last `turn/end` is the one before `closed_prefix`)."""
    if agent.closed_prefix <= 0:
        return None
    return f"{agent.session_id}@{agent.closed_prefix - 1}"


class SettledKeys:
    """The run keys each open parent session records, keyed by its `SessionRef` (a session
    opened again, by this host or after another's, starts from its log anew)."""

    def __init__(self) -> None:
        self._keys: weakref.WeakKeyDictionary[SessionRef, set[str]] = weakref.WeakKeyDictionary()

    def load(self, ref: SessionRef, events: Sequence[Event]) -> None:
        """The session was opened with these events (a resume)."""
        self._keys[ref] = recorded_run_keys(events)

    def claim(self, ref: SessionRef, run_key: str | None) -> bool:
        """Reserve the key for a settlement about to be appended to the session: False when it
        records (or is recording) one of this run already. Claimed before the append, so two
        settlements of one run arriving together cannot both pass; `release` it if the append
        fails. No key: always True (nothing to tell apart)."""
        if run_key is None:
            return True
        keys = self._keys.setdefault(ref, set())
        if run_key in keys:
            return False
        keys.add(run_key)
        return True

    def release(self, ref: SessionRef, run_key: str | None) -> None:
        """The append of a claimed settlement failed: its key is not recorded."""
        if run_key is not None:
            self._keys.get(ref, set()).discard(run_key)


class _RunKeyOnly(msgspec.Struct):
    run_key: str | None = None


_RUN_KEY = msgspec.json.Decoder(_RunKeyOnly)
