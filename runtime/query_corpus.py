"""The corpus's records (docs/design.md, "Session query"): one `SessionRecord` per session the
store lists or the session store holds live, newest first.

A live header wins over the persisted one; a persisted header that differs from it in a
witnessed field marks the record `conflict` instead of failing. Records are values, reused while
the store info and live ref they were made from are the same objects (the store's warm index
hands back the same infos), so a warm corpus costs a few lookups per session. Pure: the session
query does the IO.
"""

from __future__ import annotations

import operator
from typing import Literal

import attrs
from subagents.actors import SessionRef
from subagents.storage import HeaderClaim, LogInfo, Revision, SessionHeader, SessionId

__all__ = ["Corpus", "SessionRecord", "headers_differ"]


@attrs.frozen(kw_only=True)
class SessionRecord:
    id: SessionId
    header: SessionHeader | None  # None only for a damaged log whose line 1 does not parse
    live: bool
    persisted: bool
    damage: Literal["corrupt", "unsupported"] | None
    inherited_event_count: int
    revision: Revision | None  # None for live-only records
    event_count: int | None
    conflict: bool = False
    # A damaged persisted record whose line 1 is a JSON object but no valid header: what it says
    # of its lineage, unvalidated (listings make it a diagnostic of the parent it names).
    claimed: HeaderClaim | None = None
    # Another writer (another process) holds its lock: it is live elsewhere. Filled only where a
    # caller asks (`list_sessions(probe_locks=True)`); never set on a record live here.
    held: bool = False
    # The `time` of its last durable event (`LogInfo.last_time`; 0 when unknown or live-only).
    last_time: int = 0


_WITNESSED = (
    "format",
    "id",
    "created_at",
    "cwd",
    "parent_session",
    "is_seeded",
    "delegation_depth",
    "origin",
    "agent_preset",
)


def headers_differ(a: SessionHeader, b: SessionHeader) -> bool:
    # Equal headers (the usual case) are equal in every witnessed field: one comparison.
    return a != b and any(getattr(a, name) != getattr(b, name) for name in _WITNESSED)


class Corpus:
    """The records of the last corpus made, kept for reuse (see the module docstring)."""

    def __init__(self) -> None:
        # For each id, the store info and live ref its record was made from.
        self._records: dict[SessionId, tuple[LogInfo | None, SessionRef | None, SessionRecord]] = {}
        self._order: list[SessionRecord] | None = None
        self._last_infos: list[LogInfo] = []  # what the last corpus was made from
        self._last_refs: list[SessionRef] = []

    def recorded(self, session_id: str) -> SessionRecord | None:
        """The record of `session_id` in the last corpus made (None: not in it)."""
        known = self._records.get(SessionId(session_id))
        return None if known is None else known[2]

    def records(self, infos: list[LogInfo], refs: list[SessionRef]) -> list[SessionRecord]:
        """The corpus of `infos` (the store's listing) and `refs` (the live sessions), newest
        first; a live header wins over the persisted one."""
        # Records are values: one made from the very same store info and live ref as last time
        # is reused, and when every record is, so is last time's order (a warm corpus of a
        # thousand sessions then costs a few dict lookups per session, not new records).
        if (
            self._order is not None
            and len(infos) == len(self._last_infos)
            and len(refs) == len(self._last_refs)
            and all(map(operator.is_, infos, self._last_infos))
            and all(map(operator.is_, refs, self._last_refs))
        ):
            return list(self._order)  # the very same infos and live actors: the same records
        self._last_infos, self._last_refs = infos, refs
        made = self._records
        kept: dict[SessionId, tuple[LogInfo | None, SessionRef | None, SessionRecord]] = {}
        live = {ref.session_id: ref for ref in refs}
        same = True
        for info in infos:
            sid = info.id
            ref = live.get(sid)
            known = made.get(sid)
            if known is not None and known[0] is info and known[1] is ref:
                kept[sid] = known
                continue
            same = False
            stored = _persisted(info)
            kept[sid] = (info, ref, stored if ref is None else _live(ref, stored))
        for sid, ref in live.items():
            if sid in kept:
                continue  # persisted too: done above
            known = made.get(sid)
            if known is not None and known[0] is None and known[1] is ref:
                kept[sid] = known
                continue
            same = False
            kept[sid] = (None, ref, _live(ref, None))
        self._records = kept
        if same and len(kept) == len(made) and self._order is not None:
            return list(self._order)
        order = sorted((entry[2] for entry in kept.values()), key=_newest_first)
        self._order = order
        return list(order)


def _live(ref: SessionRef, stored: SessionRecord | None) -> SessionRecord:
    """A live session's record: its live header wins over the persisted one (docs/design.md,
    "Session query")."""
    return SessionRecord(
        id=ref.session_id,
        header=ref.header,
        live=True,
        persisted=stored is not None,
        damage=stored.damage if stored is not None else None,
        inherited_event_count=ref.inherited_event_count,
        revision=stored.revision if stored is not None else None,
        event_count=stored.event_count if stored is not None else None,
        last_time=stored.last_time if stored is not None else 0,
        conflict=stored is not None and (stored.header is None or headers_differ(stored.header, ref.header)),
    )


def _persisted(info: LogInfo) -> SessionRecord:
    return SessionRecord(
        id=info.id,
        header=info.header,
        live=False,
        persisted=True,
        damage=info.damage,
        inherited_event_count=info.inherited_event_count,
        revision=info.revision,
        event_count=info.event_count,
        claimed=info.claimed,
        last_time=info.last_time,
    )


def _newest_first(record: SessionRecord) -> tuple[int, str]:
    created = record.header.created_at if record.header is not None else -1
    return (-created, record.id)
