"""Lineage for listings: who a record says its parent is, and the children only a catalog names.

Theory of operation. A child is found by what its own line 1 says (SPEC 5.4 step 3): a valid
header, or — for a damaged log whose line 1 is still a JSON object — its unvalidated `claimed`
origin and parent. Such a lax candidate always lists as a diagnostic (its record is damaged), in
(claimed `created_at` if an int else -1, id) order. A child whose line 1 says nothing at all (a
log that is missing, empty, not a regular file or not JSON) would vanish, so the parent's
`subagent_catalog` projection names it too: every catalogued id without a usable record becomes
an `Absent` node, placed by the catalog's `child_created_at`. Its reason: a record that exists
but says nothing (or names no subagent origin) is `corrupt`; no record at all is decided by a
fresh stat (none → `unavailable`; a record with nothing usable → `corrupt`; a record that now
names a parent → it was published after the corpus was taken: omitted, like a live child in its
creation window). Pure functions; the listing does the IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NamedTuple

import attrs

from subagents.runtime.query import SessionRecord
from subagents.storage import LogInfo

from .units import catalog_children

__all__ = ["Absent", "CatalogEntry", "absent_children", "absent_reason", "catalog_entries", "lineage", "order_key"]

Reason = Literal["corrupt", "unsupported", "unavailable"]


class CatalogEntry(NamedTuple):
    """One child as the parent's catalog names it."""

    id: str
    created_at: int
    mode: str
    label: str | None


@attrs.frozen
class Absent:
    """A catalogued child that the corpus does not list as anyone's child."""

    id: str
    created_at: int
    record: SessionRecord | None  # the record that says nothing usable, or None: not in the corpus


def catalog_entries(children: object) -> list[CatalogEntry]:
    """The entries of a catalog view (or the `children` of a checkpointed state), in
    (`created_at`, id) order; anything not shaped as the unit makes it is skipped."""
    if type(children) is not dict:
        return []
    out = []
    for cid, entry in children.items():
        if type(cid) is not str or type(entry) is not dict:
            continue
        created, mode, label = entry.get("created_at"), entry.get("mode"), entry.get("label")
        if type(created) is not int or type(mode) is not str or not (label is None or type(label) is str):
            continue
        out.append(CatalogEntry(cid, created, mode, label))
    out.sort(key=lambda e: (e.created_at, e.id))
    return out


def state_entries(state: object) -> list[CatalogEntry]:
    """`catalog_entries` of a stored checkpoint state."""
    return catalog_entries(catalog_children(state))


def lineage(record: SessionRecord) -> tuple[str | None, str | None] | None:
    """(origin, parent_session) as the record's header — or its damaged line 1's claim — says;
    None when line 1 says nothing."""
    header = record.header
    if header is not None:
        return header.origin, header.parent_session
    claimed = record.claimed
    if claimed is not None:
        return claimed.origin, claimed.parent_session
    return None


def order_key(node: SessionRecord | Absent) -> tuple[int, str]:
    """Sibling order: (`created_at`, id); a lax candidate's claimed `created_at` (-1 if none),
    an absent one's catalogued `child_created_at`."""
    if isinstance(node, Absent):
        return (node.created_at, node.id)
    header = node.header
    if header is not None:
        return (header.created_at, node.id)
    claimed = node.claimed
    created = claimed.created_at if claimed is not None and claimed.created_at is not None else -1
    return (created, node.id)


def absent_children(
    owner_id: str, entries: list[CatalogEntry], records: Mapping[str, SessionRecord]
) -> list[Absent]:
    """The catalogued children of `owner_id` that no record lists as a subagent child: a record
    naming a subagent origin lists under the parent it names (here, or elsewhere), never twice."""
    out = []
    for entry in entries:
        if entry.id == owner_id:
            continue  # a catalog naming its own session: not a child
        record = records.get(entry.id)
        if record is not None:
            said = lineage(record)
            if said is not None and said[0] == "subagent":
                continue
        out.append(Absent(entry.id, entry.created_at, record))
    return out


def absent_reason(now: LogInfo | None | Exception) -> Reason | None:
    """The row of an absent child not in the corpus, from a fresh `stat` (None: omitted)."""
    if now is None or isinstance(now, Exception):
        return "unavailable"  # gone, or it cannot be opened
    if now.header is None and now.claimed is None:
        return "corrupt"
    said = now.header or now.claimed
    assert said is not None
    if said.origin == "subagent":
        return None  # published after the corpus was taken: the next listing shows it
    return "corrupt"
