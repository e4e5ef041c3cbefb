"""Lineage for listings: who a record says its parent is, and the children only a catalog names.

Theory of operation. A child is found by what its own line 1 says (docs/design.md, "Listing"): a
valid header, or — for a damaged log whose line 1 is still a JSON object — its unvalidated
`claimed` origin and parent. Such a lax candidate always lists as a diagnostic (its record is
damaged), in (claimed `created_at` if an int else -1, id) order. A child whose line 1 says
nothing at all (a log that is missing, empty, not a regular file or not JSON) would vanish, so
the parent's `subagent_catalog` projection names it too: every catalogued id without a usable
record becomes an `Absent` node, placed by the catalog's `child_created_at`. Its reason: a
record that exists but says nothing, names no subagent origin, or names another parent, no
parent or itself (issue 28: a catalogued child is never hidden) is `corrupt`; no record at all
is decided by a fresh stat (none → `unavailable`; a record with nothing usable, or naming
another parent → `corrupt`; a record that now names this parent → it was published after the
corpus was taken: omitted, like a live child in its creation window). A session is never its
own child (a header naming itself as its parent places it under nobody). Also here: sibling order, the candidates of a parent, the
pre-order walk below a root, and the catalog a parent's checkpoint row holds. Pure functions;
the listing does the IO.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

import attrs
from subagents.storage import Lifecycle, LogInfo, SessionHeader, StoredCheckpoint

from ..query import SessionRecord
from .units import CATALOG_UNIT, catalog_children

__all__ = [
    "NO_CHILDREN",
    "Absent",
    "CatalogEntry",
    "absent_children",
    "absent_reason",
    "catalog_entries",
    "catalog_owners",
    "children_of",
    "is_subagent",
    "lineage",
    "may_name_children",
    "names_absent",
    "order_key",
    "same_lifecycle",
    "StoredCatalog",
    "stored_catalog",
    "walk_descendants",
]

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
    owner: str  # the session whose catalog names it


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


def absent_children(owner_id: str, entries: list[CatalogEntry], records: Mapping[str, SessionRecord]) -> list[Absent]:
    """The catalogued children of `owner_id` that no record lists as its subagent child: a
    record naming a subagent origin and this parent is a candidate already; one naming another
    parent, no parent or itself would be hidden here, so it is placed (a diagnostic: its line 1
    and the catalog disagree). Under a root a node is listed once (`walk_descendants`)."""
    out = []
    for entry in entries:
        if entry.id == owner_id:
            continue  # a catalog naming its own session: not a child
        record = records.get(entry.id)
        if record is not None:
            said = lineage(record)
            if said is not None and said[0] == "subagent" and said[1] == owner_id:
                continue
        out.append(Absent(entry.id, entry.created_at, record, owner_id))
    return out


def absent_reason(now: LogInfo | None | Exception, owner_id: str) -> Reason | None:
    """The row of an absent child of `owner_id` not in the corpus, from a fresh `stat` (None:
    omitted)."""
    if now is None or isinstance(now, Exception):
        return "unavailable"  # gone, or it cannot be opened
    if now.header is None and now.claimed is None:
        return "corrupt"
    said = now.header or now.claimed
    assert said is not None
    if said.origin == "subagent" and said.parent_session == owner_id:
        return None  # published after the corpus was taken: the next listing shows it
    return "corrupt"


def same_lifecycle(stored: Lifecycle, header: SessionHeader, inherited_event_count: int) -> bool:
    """`stored == Lifecycle.of(header, inherited_event_count)`, without building the latter."""
    return (
        stored.format == header.format
        and stored.created_at == header.created_at
        and stored.cwd == header.cwd
        and stored.is_seeded == header.is_seeded
        and stored.inherited_event_count == inherited_event_count
    )


class StoredCatalog(NamedTuple):
    """The catalog an owner's checkpoint rows hold, and whether they cover its log whole."""

    entries: list[CatalogEntry]
    whole: bool
    inferred: bool = False  # no catalog row beside the others: empty, unless the index lost it


def stored_catalog(
    owner: SessionRecord, rows: Sequence[StoredCheckpoint], versions: Mapping[str, int]
) -> StoredCatalog | None:
    """The catalog an owner's checkpoint rows hold, or None when they cannot answer for it: no
    full set of rows of this lifecycle (of every unit in `versions`, key → state version) at one
    seq behind the corpus's view of the log — the index is missing, damaged or rebuilt, or the
    log changed in place — or a catalog row that holds no catalog. Every checkpoint holds a row
    of every healthy cell at one seq, and the query leaves out the catalog rows that name nobody:
    the other rows of the newest seq without a catalog row beside them are an empty catalog (a
    damaged index that kept only some of them answers nothing). A header that does not parse,
    or a log without events, names nobody."""
    header = owner.header
    if header is None or owner.event_count == 0:
        return StoredCatalog([], True)
    if owner.event_count is None:
        return None
    at: dict[str, StoredCheckpoint] = {}
    for row in rows:
        if (
            versions.get(row.key) == row.ver
            and row.seq < owner.event_count
            and same_lifecycle(row.lifecycle, header, owner.inherited_event_count)
        ):
            at[row.key] = row
    newest = max((row.seq for row in at.values()), default=-1)
    if newest < 0 or any(row.seq != newest for row in at.values()):
        return None
    catalog = at.get(CATALOG_UNIT.key)
    if len(at) < len(versions) - (catalog is None):
        return None  # not a full set: a unit's row is gone
    whole = newest == owner.event_count - 1
    if catalog is None:
        return StoredCatalog([], whole, inferred=True)
    if not may_name_children(catalog):
        return StoredCatalog([], whole)  # the usual row of a child with no children: not decoded
    state = catalog.value()
    if type(state) is not dict or type(state.get("children")) is not dict:
        return None  # a row that holds no catalog (UNREADABLE: a damaged index): the log answers
    return StoredCatalog(state_entries(state), whole)


NO_CHILDREN = b'"children":{}'  # how msgspec encodes the empty catalog (every stored one holds it)
_NO_CHILDREN_TEXT = NO_CHILDREN.decode()


def may_name_children(row: StoredCheckpoint) -> bool:
    """False for a stored catalog that is certainly empty (told from its JSON, not decoded)."""
    raw = row.val_json
    if isinstance(raw, bytes):
        return NO_CHILDREN not in raw
    return _NO_CHILDREN_TEXT not in raw


def catalog_owners(stored: Mapping[str, Sequence[StoredCheckpoint]]) -> set[str]:
    """The sessions among `stored` whose catalog row may name a child (most name none: a listing
    then checks only these)."""
    key = CATALOG_UNIT.key
    return {sid for sid, rows in stored.items() for row in rows if row.key == key and may_name_children(row)}


def names_absent(owner_id: str, catalog: object, records: Mapping[str, SessionRecord]) -> bool:
    """Whether a catalog (a view, or the entries of a stored row) names a child that only the
    catalog places: then its owner has children even if no record says so."""
    if not catalog:
        return False
    entries = catalog if isinstance(catalog, list) else catalog_entries(catalog)
    return bool(absent_children(owner_id, entries, records))


def is_subagent(record: SessionRecord) -> bool:
    """Whether the record says it is a subagent (its header, or its damaged line 1's claim)."""
    said = lineage(record)
    return said is not None and said[0] == "subagent"


def children_of(corpus: list[SessionRecord], parent_id: str) -> list[SessionRecord]:
    """The candidates of `parent_id` (docs/design.md, "Listing"), in sibling order."""
    out = []
    for r in corpus:
        if r.id == parent_id:
            continue  # a header naming itself as its parent: never its own child
        header = r.header
        if header is not None:
            if header.origin == "subagent" and header.parent_session == parent_id:
                out.append(r)
        elif r.claimed is not None and r.claimed.origin == "subagent" and r.claimed.parent_session == parent_id:
            out.append(r)  # a damaged header that still names the parent: a diagnostic
    out.sort(key=order_key)
    return out


Node = SessionRecord | Absent


def walk_descendants(
    corpus: list[SessionRecord], root_id: str, catalogued: Mapping[str, Sequence[Absent]] | None = None
) -> list[tuple[Node, str, int]]:
    """Pre-order over every corpus edge below `root_id` — and the edges to the `catalogued`
    children no record places — as (node, its parent, depth). Iterative, siblings in
    (`created_at`, id) order, never revisiting the root or a node."""
    children: dict[str, list[Node]] = {}
    for record in corpus:
        said = lineage(record)
        if said is not None and said[1] is not None and said[1] != record.id:
            children.setdefault(said[1], []).append(record)
    for parent_id, absent in (catalogued or {}).items():
        children.setdefault(parent_id, []).extend(absent)
    for siblings in children.values():
        siblings.sort(key=order_key)
    out: list[tuple[Node, str, int]] = []
    seen = {root_id}
    stack: list[tuple[Node, str, int]] = [(c, root_id, 1) for c in reversed(children.get(root_id, []))]
    while stack:
        node, parent, depth = stack.pop()
        if node.id in seen:
            continue
        seen.add(node.id)
        out.append((node, parent, depth))
        stack.extend((c, node.id, depth + 1) for c in reversed(children.get(node.id, [])))
    return out
