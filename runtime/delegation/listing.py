"""Listing children (docs/design.md, "Listing"): `list_children(parent_id, abort)` and
`list_descendants`.

Theory of operation. The corpus is `list_sessions()` (a live header wins). Candidates are the
records with `origin == "subagent"` naming the parent, in (`created_at`, id) order; a damaged one
whose line 1 still names the parent — as a valid header, or only as a JSON object (its
`claimed` lineage) — becomes its diagnostic. Children whose line 1 says nothing (log missing,
empty, not a file, not JSON) come from the parent's `subagent_catalog` projection — its live cell
or its checkpoint row, never its log — and become diagnostics in (`child_created_at`, id) order
(see `lineage`). Each candidate's identity climbs a
ladder: live candidates are all asked at once for `snapshot(["subagent"])` (no log read; one that
stopped meanwhile is treated as cold); cold candidates try the checkpoint rows of the index (one
query for all; rows answer for the log revision they cover whole, or — lagging — for a log
another process writes now), and only then one observation each through the cold reader (at
most four reads in flight), `OBSERVERS` observations under way at a time, all in one read group
so that their reads share thread hops. The caller's abort becomes cancellation once, at the edge of the call
(`cancelled_when`): one watcher cancels everything under way when it is set. An
identity counts only from the child's own suffix (`seq >= inherited_event_count`). Rows come
in four states: a child row, an omitted live child without an identity yet, and
diagnostics `corrupt` / `unsupported` / `unavailable`. Typed query errors become rows; anything
else fails the listing. An abort at any point ends it with `CANCELLED` and no rows.
Observations feed the checkpoint rung: a listing that ends with its rows writes the checkpoint
rows its observations proved (children that became child rows only: never a diagnostic, never
a log another process writes) in one index write after the rows are built, outside its abort;
the next listing answers those children from the rung. The index is a cache, so a read-only
command may write it; a store this process may not write is still listed (the write is
skipped, quietly). Listing never writes a log or an actor.
"""

from __future__ import annotations

import operator
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

import attrs
import trio
from subagents.actors import (
    Abort,
    ActorStopped,
    ReadGroup,
    SessionRef,
    SessionStore,
    cancelled_when,
    raise_bare_cancelled,
    snapshot_all,
)
from subagents.storage import LogInfo, ObservedCheckpoint, ProjectionRegistry, StoredCheckpoint

from ..foundation.errors import (
    ProjectionsUnavailable,
    QueryUnavailable,
    SessionQueryError,
    SessionStoreUnavailable,
    SubagentCancelled,
)
from ..query import SessionQuery, SessionRecord, headers_differ
from .lineage import (
    NO_CHILDREN,
    Absent,
    CatalogEntry,
    absent_children,
    absent_reason,
    catalog_entries,
    catalog_owners,
    children_of,
    is_subagent,
    lineage,
    names_absent,
    order_key,
    same_lifecycle,
    stored_catalog,
    walk_descendants,
)
from .units import CATALOG_UNIT, IDENTITY_UNIT

__all__ = ["ChildRow", "DiagnosticRow", "ListingService", "walk_descendants"]

Reason = Literal["corrupt", "unsupported", "unavailable"]


@attrs.frozen(kw_only=True)
class ChildRow:
    id: str
    activity: Literal["running", "inactive"]
    has_children: bool
    mode: Literal["one-shot", "continuable"]
    label: str | None = None
    parent_id: str | None = None  # descendants only
    depth: int | None = None  # descendants only

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "child",
            "id": self.id,
            "activity": self.activity,
            "has_children": self.has_children,
            "mode": self.mode,
        }
        if self.label is not None:
            out["label"] = self.label
        if self.parent_id is not None:
            out |= {"parent_id": self.parent_id, "depth": self.depth}
        return out


@attrs.frozen(kw_only=True)
class DiagnosticRow:
    id: str
    reason: Reason
    parent_id: str | None = None
    depth: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "diagnostic", "id": self.id, "reason": self.reason}
        if self.parent_id is not None:
            out |= {"parent_id": self.parent_id, "depth": self.depth}
        return out


Row = ChildRow | DiagnosticRow
_IDENTITY = [IDENTITY_UNIT.key]
_CATALOG = [CATALOG_UNIT.key]
_BOTH = [IDENTITY_UNIT.key, CATALOG_UNIT.key]  # a live child's identity and whether it has children
_ROW_KEYS = (IDENTITY_UNIT.key, CATALOG_UNIT.key)  # the checkpoint rows a listing reads
_EMPTY_CATALOG = {CATALOG_UNIT.key: NO_CHILDREN}  # ... but not the catalog rows that name nobody
OBSERVERS = 32  # cold observations under way at once (their reads: at most the cold reader's 4)
_CANCELLED = "subagent listing was cancelled"


def _own(identity: object, inherited_event_count: int) -> dict[str, Any] | None:
    if isinstance(identity, dict) and type(identity.get("seq")) is int and identity["seq"] >= inherited_event_count:
        return identity
    return None


_ROW_CACHE = 8192  # rows kept for reuse at most (a row is ~200 bytes)


class _Rows:
    """Child rows are values: the same child in the same state is the same row, reused from the
    last listings instead of built again (a listing of a thousand live children then allocates
    a thousand fewer objects, and the cyclic GC runs that much less often during it)."""

    def __init__(self) -> None:
        self._made: dict[tuple[str, bool, bool, object, object], ChildRow] = {}

    def child(self, record: SessionRecord, identity: dict[str, Any], has_children: bool, live: bool) -> ChildRow:
        mode, label = identity["mode"], identity.get("label")
        if type(mode) is not str or (label is not None and type(label) is not str):
            # Not what a descriptor holds (a tampered checkpoint row): built, never kept.
            return ChildRow(
                id=record.id,
                activity="running" if live else "inactive",
                has_children=has_children,
                mode=mode,
                label=label,
            )
        key = (record.id, live, has_children, mode, label)
        row = self._made.get(key)
        if row is None:
            if len(self._made) >= _ROW_CACHE:
                self._made.clear()
            row = self._made[key] = ChildRow(
                id=record.id,
                activity="running" if live else "inactive",
                has_children=has_children,
                mode=mode,
                label=label,
            )
        return row


class _Shape:
    """What the listing derives from a corpus (who has children, the candidates per parent),
    kept while the session query hands back the very same records (a warm corpus)."""

    _PARENTS_KEPT = 64

    def __init__(self) -> None:
        self._corpus: list[SessionRecord] = []
        self.parents: frozenset[str | None] = frozenset()
        self._children: dict[str, list[SessionRecord]] = {}
        self._records: dict[str, SessionRecord] | None = None

    def of(self, corpus: list[SessionRecord]) -> _Shape:
        if len(corpus) != len(self._corpus) or not all(map(operator.is_, corpus, self._corpus)):
            self._corpus = corpus
            # A damaged child whose line 1 names its parent lists (as a diagnostic): its parent has children.
            self.parents = frozenset(
                said[1] for said in map(lineage, corpus) if said is not None and said[0] == "subagent"
            )
            self._children = {}
            self._records = None
        return self

    @property
    def records(self) -> dict[str, SessionRecord]:
        """The corpus by id."""
        if self._records is None:
            self._records = {record.id: record for record in self._corpus}
        return self._records

    def children_of(self, parent_id: str) -> list[SessionRecord]:
        """The candidates of `parent_id`, in order (kept: not to be changed)."""
        children = self._children.get(parent_id)
        if children is None:
            if len(self._children) >= self._PARENTS_KEPT:
                self._children.clear()
            children = self._children[parent_id] = children_of(self._corpus, parent_id)
        return children


class ListingService:
    """Constructible with any collaborator missing, so the service checks are testable."""

    def __init__(
        self,
        *,
        registry: ProjectionRegistry | None,
        sessions: SessionStore | None,
        query: SessionQuery | None,
    ) -> None:
        self.registry = registry
        self.sessions = sessions
        self.query = query  # all it reads of the store, it reads through the query
        self.observers = OBSERVERS
        self._rows_made = _Rows()
        self._shape = _Shape()

    async def list_children(self, parent_id: str, abort: Abort | None = None) -> list[Row]:
        """The rows of `parent_id`'s direct subagent children (README, "Listings"), in
        (`created_at`, id) order, with those only the parent's catalog names. Raises
        `SubagentError` (a missing service, `CANCELLED`) or `SessionQueryError` (an unreadable
        root)."""
        return await self._edge(abort, self._children, parent_id)

    async def list_descendants(self, root_id: str, abort: Abort | None = None) -> list[Row]:
        """The rows of every subagent below `root_id` in pre-order, each with `parent_id` and
        `depth`; raises as `list_children`."""
        return await self._edge(abort, self._descendants, root_id)

    async def _edge(
        self,
        abort: Abort | None,
        listing: Callable[[str, list[ObservedCheckpoint]], Awaitable[list[Row]]],
        node: str,
    ) -> list[Row]:
        """Where the caller's abort becomes cancellation, once (`cancelled_when`): below it
        the listing is cancelled the Trio way. An abort set at any point — before the call,
        while it runs, or as it ends — ends it with `CANCELLED` and no rows, whatever was under
        way (a read failing as it was cancelled included); an enclosing cancellation passes
        as the bare `trio.Cancelled` its scope expects. Only a listing that ended with its
        rows writes back what its observations proved, in one write, outside the abort."""
        _check(abort)
        rows: list[Row] | None = None
        proved: list[ObservedCheckpoint] = []
        try:
            async with cancelled_when(abort):
                rows = await listing(node, proved)
        except Exception:  # an abort set meanwhile is the answer (CANCELLED), not the error it caused
            _check(abort)
            raise
        _check(abort)
        assert rows is not None  # only an abort cancels the body quietly
        if proved and self.query is not None:
            await self.query.write_observed(proved)  # the index is a cache: never an error
        return rows

    async def _children(self, parent_id: str, proved: list[ObservedCheckpoint]) -> list[Row]:
        corpus = await self._corpus()
        shape = self._shape.of(corpus)
        candidates = shape.children_of(parent_id)
        parent = shape.records.get(parent_id)
        catalogs, stored = await self._catalogs([parent] if parent is not None else [], candidates)
        entries = catalogs.get(parent_id)
        absent = absent_children(parent_id, entries, shape.records) if entries else []
        rows = await self._rows(shape, candidates, stored, proved)
        if not absent:
            return [row for row in rows if row is not None]
        extra = await self._absent_rows(absent)
        placed = sorted(
            [(order_key(node), row) for node, row in zip(candidates, rows, strict=True)]
            + [(order_key(node), row) for node, row in zip(absent, extra, strict=True)],
            key=operator.itemgetter(0),
        )
        return [row for _, row in placed if row is not None]

    async def _descendants(self, root_id: str, proved: list[ObservedCheckpoint]) -> list[Row]:
        corpus = await self._corpus()
        shape = self._shape.of(corpus)
        records = shape.records
        # Catalogs can add children the corpus cannot place (and those may have children of their
        # own): walk, read the catalogs of the nodes not asked yet, walk again while that adds any.
        absent: dict[str, list[Absent]] = {}
        asked: set[str] = set()
        stored: dict[str, list[StoredCheckpoint]] = {}
        while True:
            placed = walk_descendants(corpus, root_id, absent)
            owners = [
                node
                for node in ([records[root_id]] if root_id in records else []) + [n for n, _, _ in placed]
                if isinstance(node, SessionRecord) and node.header is not None and node.id not in asked
            ]
            if not owners:
                break
            asked.update(owner.id for owner in owners)
            wanted = [n for n, _, _ in placed if isinstance(n, SessionRecord) and is_subagent(n) and n.id not in stored]
            catalogs, more = await self._catalogs(owners, wanted)
            stored.update(more)
            grew = False
            for owner_id, entries in catalogs.items():
                found = absent_children(owner_id, entries, records) if entries else []
                if found:
                    absent[owner_id] = found
                    grew = True
            if not grew:
                break
        nodes = [node for node, _, _ in placed if isinstance(node, Absent) or is_subagent(node)]
        candidates = [node for node in nodes if isinstance(node, SessionRecord)]
        rows = iter(await self._rows(shape, candidates, stored, proved))
        lost = [node for node in nodes if isinstance(node, Absent)]
        extra = iter(await self._absent_rows(lost) if lost else [])
        where = {node.id: (parent, depth) for node, parent, depth in placed}
        out = []
        for node in nodes:
            row = next(extra) if isinstance(node, Absent) else next(rows)
            if row is not None:
                parent, depth = where[node.id]
                out.append(attrs.evolve(row, parent_id=parent, depth=depth))
        return out

    # --- the steps ---

    async def _corpus(self) -> list[SessionRecord]:
        if self.registry is None:
            raise ProjectionsUnavailable("projection registry is unavailable")
        if self.sessions is None:
            raise SessionStoreUnavailable("session store is unavailable")
        if self.query is None:
            raise QueryUnavailable("session query is unavailable")
        return await self.query.list_sessions()

    async def _catalogs(
        self, owners: list[SessionRecord], candidates: list[SessionRecord]
    ) -> tuple[dict[str, list[CatalogEntry]], dict[str, list[StoredCheckpoint]]]:
        """The catalog entries of `owners` — a live owner's cell (no log read), else its
        checkpoint row — and, from the same index hop, the stored checkpoint rows of the
        candidates that are cold now (for their identity rung)."""
        assert self.sessions is not None
        sessions = self.sessions
        refs: list[SessionRef] = []
        live: list[SessionRecord] = []
        cold: list[SessionRecord] = []
        for owner in owners:
            ref = sessions.get(owner.id) if owner.live else None
            if ref is not None:
                refs.append(ref)
                live.append(owner)
            else:
                cold.append(owner)
        entries: dict[str, list[CatalogEntry]] = {}
        if refs:
            for owner, answer in zip(live, await self._live_answers(refs, _CATALOG), strict=True):
                if isinstance(answer, ActorStopped):
                    cold.append(owner)  # it stopped meanwhile: its checkpoint row
                elif not isinstance(answer, Exception):
                    entries[owner.id] = catalog_entries(answer.get(CATALOG_UNIT.key))
                # else a broken catalog cell (a unit bug): it names nobody
        ids = [c.id for c in candidates if c.damage is None and not (c.live and sessions.get(c.id) is not None)]
        ids += [owner.id for owner in cold if owner.persisted]
        stored = await self._stored_rows(ids)
        for owner in cold:
            entries[owner.id] = stored_catalog(owner, stored.get(owner.id, ()))
        return entries, stored

    async def _stored_rows(self, ids: list[str]) -> dict[str, list[StoredCheckpoint]]:
        """The checkpoint rows of `ids` in one query and one index hop; every id asked is a key
        of the answer (no rows: the index is a cache, any failure is a miss)."""
        if self.query is None or not ids:
            return {sid: [] for sid in ids}
        return await self.query.checkpoint_rows(ids, _ROW_KEYS, _EMPTY_CATALOG)

    async def _held_elsewhere(self, ids: list[str]) -> set[str]:
        """The ids another process holds the lock of (one thread hop; advice, never an error)."""
        if self.query is None or not ids:
            return set()
        return await self.query.held_elsewhere(ids)

    async def _absent_rows(self, absent: list[Absent]) -> list[Row | None]:
        """The rows of catalogued children the corpus does not list, aligned to `absent`; those
        with no record at all are stat'ed afresh, in one thread hop."""
        out: list[Row | None] = [None] * len(absent)
        missing = []
        for i, node in enumerate(absent):
            if node.record is not None:
                out[i] = DiagnosticRow(id=node.id, reason="corrupt")  # line 1 says nothing usable
            else:
                missing.append(i)
        if missing:
            now = await self._stat_all([absent[i].id for i in missing])
            for i, info in zip(missing, now, strict=True):
                reason = absent_reason(info)
                if reason is not None:
                    out[i] = DiagnosticRow(id=absent[i].id, reason=reason)
        return out

    async def _stat_all(self, ids: list[str]) -> list[LogInfo | None | Exception]:
        if self.query is None:
            return [None] * len(ids)
        return await self.query.stat_many(ids)

    async def _rows(
        self,
        shape: _Shape,
        candidates: list[SessionRecord],
        stored: dict[str, list[StoredCheckpoint]],
        proved: list[ObservedCheckpoint],
    ) -> list[Row | None]:
        """Rows aligned to `candidates` (None: omitted); `stored`: checkpoint rows already read;
        `proved` collects the rows observations proved, to be written back.
        A child has children when a subagent record names it as its parent, or its own catalog
        names a child that only the catalog places."""
        parents, records = shape.parents, shape.records
        results: list[Row | None] = [None] * len(candidates)
        cold: list[int] = []
        live_at: list[int] = []
        refs: list[SessionRef] = []
        assert self.sessions is not None
        for i, record in enumerate(candidates):
            ref = self.sessions.get(record.id) if record.live else None
            if ref is not None:
                live_at.append(i)
                refs.append(ref)
            else:
                cold.append(i)
        answers = await self._live_answers(refs, _BOTH)
        child = self._rows_made.child
        again: list[int] = []
        for i, answer in zip(live_at, answers, strict=True):
            record = candidates[i]
            if isinstance(answer, ActorStopped):
                cold.append(i)  # it stopped meanwhile: read what it left
            elif isinstance(answer, Exception):
                again.append(i)  # its identity alone may still be readable (a broken catalog cell)
            else:
                identity = _own(answer.get(IDENTITY_UNIT.key), record.inherited_event_count)
                if identity is not None:
                    has = record.id in parents or names_absent(record.id, answer.get(CATALOG_UNIT.key), records)
                    results[i] = child(record, identity, has, live=True)
                # else: omitted — a live child in its creation window
        if again:
            ref_at = dict(zip(live_at, refs, strict=True))
            retried = await self._live_answers([ref_at[i] for i in again], _IDENTITY)
            for i, answer in zip(again, retried, strict=True):
                record = candidates[i]
                if isinstance(answer, ActorStopped):
                    cold.append(i)
                elif isinstance(answer, Exception):
                    results[i] = DiagnosticRow(id=record.id, reason="corrupt")
                else:
                    identity = _own(answer.get(IDENTITY_UNIT.key), record.inherited_event_count)
                    if identity is not None:
                        results[i] = child(record, identity, record.id in parents, live=True)
        cold.sort()
        await self._cold_rows(candidates, cold, shape, results, stored, proved)
        return results

    async def _live_answers(self, refs: list[SessionRef], keys: list[str]) -> list[Any]:
        """All live asks for `keys` at once (a cancelled listing stops waiting: an actor stuck
        in storage must not hold it)."""
        if not refs:
            return []
        return await snapshot_all(refs, keys)

    async def _cold_rows(
        self,
        candidates: list[SessionRecord],
        cold: list[int],
        shape: _Shape,
        results: list[Row | None],
        stored: dict[str, list[StoredCheckpoint]],
        proved: list[ObservedCheckpoint],
    ) -> None:
        parents, records = shape.parents, shape.records
        pending = []
        for i in cold:
            record = candidates[i]
            if record.damage is not None:
                results[i] = DiagnosticRow(id=record.id, reason=record.damage)
            else:
                pending.append(i)
        checkpoints = await self._checkpoint_identities([candidates[i] for i in pending], stored)
        naming = catalog_owners(stored) if checkpoints else set()
        # Those another process holds the lock of are running there (observed ones learn it
        # from their observation's stat hop).
        held = await self._held_elsewhere([candidates[i].id for i in pending if candidates[i].id in checkpoints])
        observe = []
        for i in pending:
            identity, whole = checkpoints.get(candidates[i].id, (None, False))
            # Rows answer for the log revision they cover whole; rows that lag it answer only
            # for a log another process writes now (its writer checkpoints it as it goes).
            if identity is not None and (whole or candidates[i].id in held):
                record = candidates[i]
                has = record.id in parents or (
                    record.id in naming and names_absent(record.id, stored_catalog(record, stored[record.id]), records)
                )
                results[i] = self._rows_made.child(record, identity, has, live=record.id in held)
            else:
                observe.append(i)
        if not observe:
            return
        assert self.query is not None
        query = self.query
        failures: list[BaseException] = []
        # Every observation of this listing reads in one group: their reads share thread hops.
        group = ReadGroup()

        async def observe_one(i: int) -> None:
            record = candidates[i]
            try:
                async with query.observe_session(record.id, group=group) as seen:
                    if record.header is not None and headers_differ(record.header, seen.header):
                        results[i] = DiagnosticRow(id=record.id, reason="corrupt")  # lifecycle witness
                        return
                    identity = _own(seen.projections.get(IDENTITY_UNIT.key), seen.inherited_event_count)
                    catalog = seen.projections.get(CATALOG_UNIT.key)
                    elsewhere = seen.held
                    observed = seen.observed
            except SessionQueryError as exc:
                if exc.diagnostic is None:
                    failures.append(exc)
                    return
                results[i] = DiagnosticRow(id=record.id, reason=exc.diagnostic)
                return
            except Exception as exc:  # a bug must not hide as a row: it fails the listing
                failures.append(exc)
                return
            if identity is None:
                results[i] = DiagnosticRow(id=record.id, reason="corrupt")  # no own identity
            else:
                has = record.id in parents or names_absent(record.id, catalog, records)
                results[i] = self._rows_made.child(record, identity, has, live=elsewhere)
                if observed is not None and not elsewhere:
                    proved.append(observed)  # a child row: what its observation proved is kept

        try:
            # A bounded number of observers take the candidates in turn: the listing's memory is
            # bounded by the observations under way, not by the children, and enough stay under
            # way for the cold reader to fill its thread hops.
            queue = iter(observe)

            async def observer() -> None:
                for i in queue:
                    await observe_one(i)

            async with trio.open_nursery() as observations:
                for _ in range(min(len(observe), self.observers)):
                    observations.start_soon(observer)
        except BaseExceptionGroup as group_error:  # only Cancelled can arrive grouped here: passed on bare
            raise_bare_cancelled(group_error)  # everything else is kept as a value by observe_one
        if failures:
            raise failures[0]

    async def _checkpoint_identities(
        self, records: Sequence[SessionRecord], stored: dict[str, list[StoredCheckpoint]] | None = None
    ) -> dict[str, tuple[dict[str, Any], bool]]:
        """Identities the index's checkpoint rows prove, for all cold candidates: the rows read
        with the catalogs, and the rest (those that stopped meanwhile) in one more query. With
        each, whether its row covers the log whole (`seq` is its last event's)."""
        if self.query is None or not records:
            return {}
        rows = stored or {}
        unread = [r.id for r in records if r.id not in rows]
        if unread:
            rows = {**rows, **await self._stored_rows(unread)}
        out = {}
        key, version = IDENTITY_UNIT.key, IDENTITY_UNIT.state_version
        for record in records:
            header = record.header
            if header is None or record.event_count is None:
                continue
            for row in rows.get(record.id, ()):
                if row.key != key or row.ver != version or row.seq >= record.event_count:
                    continue
                if same_lifecycle(row.lifecycle, header, record.inherited_event_count):
                    val = row.value()  # decoded only now (UNREADABLE, an object: no identity)
                    identity = _own(val.get("identity") if type(val) is dict else None, record.inherited_event_count)
                    if identity is not None:
                        out[record.id] = (identity, row.seq == record.event_count - 1)
        return out


def _check(abort: Abort | None) -> None:
    if abort is not None and abort.is_set():
        raise SubagentCancelled(_CANCELLED)
