"""Listing children (docs/design.md, "Listing"): `list_children(parent_id, abort)` and
`list_descendants`.

Theory of operation. The corpus is `list_sessions()` (a live header wins). Candidates are the
records with `origin == "subagent"` naming the parent, in (`created_at`, id) order; a damaged one
whose line 1 still names the parent — as a valid header, or only as a JSON object (its
`claimed` lineage) — becomes its diagnostic. Children whose line 1 says nothing (log missing,
empty, not a file, not JSON), or names another parent, no parent or itself, come from the
parent's `subagent_catalog` projection and become `corrupt`/`unavailable` diagnostics in
(`child_created_at`, id) order (see `lineage`). The parent's catalog climbs the same ladder as an
identity (issue 28, "nothing hidden"): its live cell; else its checkpoint rows, when a full set
of its lifecycle covers its log whole (or lags a log another process writes now: `lineage.
stored_catalog`); else one observation of its log, written back like a child's (below a root, a
node observed for its catalog lists from that observation: one read) — so a missing, damaged or rebuilt index, or a parent
edited in place, never hides a catalogued child. Each candidate's identity climbs a
ladder: live candidates are all asked at once for `snapshot(["subagent"])` (no log read; one that
stopped meanwhile is treated as cold); cold candidates try the checkpoint rows of the index (one
query for all; rows answer for the log revision they cover whole, or — lagging — for a log
another process writes now), and only then one observation each through the cold reader (at
most four reads in flight), `OBSERVERS` observations under way at a time, all in one read group
so that their reads share thread hops (listing_observe; the rows, and what a listing keeps
between listings: listing_rows). The caller's abort becomes cancellation once, at the edge of
the call (`cancelled_when`): one watcher cancels everything under way when it is set; below the
edge (the rungs, lineage, the query) Trio cancellation alone. With `require_parent`, a parent
the corpus has no record of is `ListingParentNotFound`. An identity counts only from the child's own suffix (`seq >= inherited_event_count`). Rows come
in four states: a child row, an omitted live child without an identity yet, and
diagnostics `corrupt` / `unsupported` / `unavailable`. Typed query errors become rows; anything
else fails the listing. An abort at any point ends it with `CANCELLED` and no rows.
Observations feed the checkpoint rung: a listing that ends with its rows writes the checkpoint
rows its observations proved (children that became child rows only: never a diagnostic, never
a log another process writes) in one index write after the rows are built, outside its abort;
the next listing answers those children from the rung. The index is a cache, so a read-only
command may write it; a store this process may not write is still listed (the write is
skipped, quietly). Listing never writes a log or an actor.

A child row's flags (`stopped`, `in_doubt`: issue 27) come with its identity from the same rung:
the live ask, the `subagent_flags` checkpoint row beside the identity row (the rung answers only
when both do: a log checkpointed before the unit existed is observed), or the observation.

Liveness (issue 29 item 4) costs no read either: `last_event` is the record's `last_time` (its last
event's `time` field, as every store lists it) — or, for a child resident here with an open turn, the time its
live `subagent_timing` cell holds for that turn's last event (the runtime clock's); whether the last turn is open comes from the same rung (the live
`subagent_timing` cell, its checkpoint row — trusted only when it covers the log whole, or is a
running writer's —, or the observation's in-memory closers); the runner is this process, or
another one (named by one `holders` probe after the rows are built, only when some child runs
elsewhere). A turn open that nobody runs is `orphaned`; a running one whose last event is older
than `stall_after` by `now_ms` is `stalled` (one clock reading per listing, at its end).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

import attrs
from subagents.actors import (
    Abort,
    ActorStopped,
    SessionRef,
    SessionStore,
    cancelled_when,
    snapshot_all,
)
from subagents.storage import LogInfo, ObservedCheckpoint, ProjectionRegistry, StoredCheckpoint

from ..foundation.errors import (
    ListingParentNotFound,
    ProjectionsUnavailable,
    QueryUnavailable,
    SessionStoreUnavailable,
    SubagentCancelled,
)
from ..foundation.json_values import JsonObject, JsonValue
from ..query import SessionQuery, SessionRecord
from .lineage import (
    NO_CHILDREN,
    Absent,
    CatalogEntry,
    absent_children,
    absent_reason,
    catalog_entries,
    catalog_owners,
    is_subagent,
    names_absent,
    order_key,
    stored_catalog,
    walk_descendants,
)
from .listing_observe import observe_catalogs, observe_rows
from .listing_rows import (
    ELSEWHERE,
    HERE,
    ChildRow,
    CorpusShape,
    DiagnosticRow,
    Row,
    RowCache,
    flags_view,
    open_turn_time,
    own_identity,
    stored_flags,
    stored_identities,
    stored_turns,
    with_stall,
)
from .listing_stall import STALL_AFTER
from .units import CATALOG_UNIT, FLAGS_UNIT, IDENTITY_UNIT, TIMING_UNIT

__all__ = ["ChildRow", "DiagnosticRow", "ListingService", "walk_descendants"]

_IDENTITY = [IDENTITY_UNIT.key]
_CATALOG = [CATALOG_UNIT.key]
# A live child's identity, whether it has children, and its flags (stopped, in doubt).
# ... and whether its turn is open (liveness: issue 29 item 4).
_LIVE = [IDENTITY_UNIT.key, CATALOG_UNIT.key, FLAGS_UNIT.key, TIMING_UNIT.key]
# The checkpoint rows a listing reads (in one query).
_ROW_KEYS = (IDENTITY_UNIT.key, CATALOG_UNIT.key, FLAGS_UNIT.key, TIMING_UNIT.key)
_EMPTY_CATALOG = {CATALOG_UNIT.key: NO_CHILDREN}  # ... but not the catalog rows that name nobody
_VERSIONS = {unit.key: unit.state_version for unit in (IDENTITY_UNIT, CATALOG_UNIT, FLAGS_UNIT)}
OBSERVERS = 32  # cold observations under way at once (their reads: at most the cold reader's 4)
_CANCELLED = "subagent listing was cancelled"


class ListingService:
    """Constructible with any collaborator missing, so the service checks are testable."""

    def __init__(
        self,
        *,
        registry: ProjectionRegistry | None,
        sessions: SessionStore | None,
        query: SessionQuery | None,
        now_ms: Callable[[], int] | None = None,
        stall_after: float = STALL_AFTER,
    ) -> None:
        """`now_ms` (default the wall clock) and `stall_after` (seconds) decide which running
        children are `stalled`."""
        self.registry = registry
        self.sessions = sessions
        self.query = query  # all it reads of the store, it reads through the query
        self.observers = OBSERVERS
        self.now_ms = now_ms if now_ms is not None else _wall_ms
        self.stall_after_ms = round(stall_after * 1000)
        self._rows_made = RowCache()
        self._shape = CorpusShape()

    async def list_children(
        self, parent_id: str, abort: Abort | None = None, *, require_parent: bool = False
    ) -> list[Row]:
        """The rows of `parent_id`'s direct subagent children (README, "Listings"), in
        (`created_at`, id) order, with those only the parent's catalog names. Raises
        `SubagentError` (a missing service, `CANCELLED`; `ListingParentNotFound` with
        `require_parent` when the corpus has no record of `parent_id` — else the children that
        name it are listed all the same) or `SessionQueryError` (an unreadable root)."""
        body = partial(self._children, required=True) if require_parent else self._children
        return await self._edge(abort, body, parent_id)

    async def list_descendants(
        self, root_id: str, abort: Abort | None = None, *, require_parent: bool = False
    ) -> list[Row]:
        """The rows of every subagent below `root_id` in pre-order, each with `parent_id` and
        `depth`; raises as `list_children`."""
        body = partial(self._descendants, required=True) if require_parent else self._descendants
        return await self._edge(abort, body, root_id)

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
        return self._stalls(await self._runners(rows))

    async def _runners(self, rows: list[Row]) -> list[Row]:
        """`rows` with the children another process runs named by who runs them (`pid N`,
        `host H`): one more lock or lease probe, only when some child runs elsewhere."""
        elsewhere = [row.id for row in rows if isinstance(row, ChildRow) and row.runner == ELSEWHERE]
        if not elsewhere or self.query is None:
            return rows
        named = await self.query.holders(elsewhere)
        if not named:
            return rows
        return [
            attrs.evolve(row, runner=named[row.id])
            if isinstance(row, ChildRow) and row.runner == ELSEWHERE and row.id in named
            else row
            for row in rows
        ]

    def _stalls(self, rows: list[Row]) -> list[Row]:
        """`rows` with the running children whose open turn made no durable progress for
        `stall_after` marked `stalled` (one clock reading per listing, taken only when some
        child runs a turn)."""
        if not any(isinstance(row, ChildRow) and row.runner is not None and row.turn_open for row in rows):
            return rows
        now, after = self.now_ms(), self.stall_after_ms
        return [with_stall(row, now, after) if isinstance(row, ChildRow) else row for row in rows]

    async def _children(self, parent_id: str, proved: list[ObservedCheckpoint], *, required: bool = False) -> list[Row]:
        corpus = await self._corpus()
        shape = self._shape.of(corpus)
        candidates = shape.children_of(parent_id)
        parent = shape.records.get(parent_id)
        if parent is None and required:
            raise ListingParentNotFound(f'session "{parent_id}" not found')
        owners = [parent] if parent is not None else []
        catalogs, stored = await self._catalogs(owners, candidates, proved, shape, {})
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

    async def _descendants(
        self, root_id: str, proved: list[ObservedCheckpoint], *, required: bool = False
    ) -> list[Row]:
        corpus = await self._corpus()
        shape = self._shape.of(corpus)
        records = shape.records
        if root_id not in records and required:
            raise ListingParentNotFound(f'session "{root_id}" not found')
        # Catalogs can add children the corpus cannot place (and those may have children of their
        # own): walk, read the catalogs of the nodes not asked yet, walk again while that adds any.
        absent: dict[str, list[Absent]] = {}
        asked: set[str] = set()
        stored: dict[str, list[StoredCheckpoint]] = {}
        made: dict[str, Row] = {}  # the rows of nodes observed for their catalogs: not read again
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
            catalogs, more = await self._catalogs(owners, wanted, proved, shape, made)
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
        rows = iter(await self._rows(shape, candidates, stored, proved, made))
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
        self,
        owners: list[SessionRecord],
        candidates: list[SessionRecord],
        proved: list[ObservedCheckpoint],
        shape: CorpusShape,
        made: dict[str, Row],
    ) -> tuple[dict[str, list[CatalogEntry]], dict[str, list[StoredCheckpoint]]]:
        """The catalog entries of `owners` — a live owner's cell (no log read), else its
        checkpoint rows, else one observation of its log (its rows join `proved`, the row it
        would list as `made`) — and, from the same index hop, the stored checkpoint rows of
        the candidates that are cold now (for their identity rung)."""
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
        # An empty catalog told only by its row's absence (the query leaves such rows out) while
        # a record names the owner as its parent: its row is read after all (a damaged index may
        # have lost it, and every child is catalogued before its log exists).
        doubted = [
            owner.id
            for owner in cold
            if owner.id in shape.parents
            and (found := stored_catalog(owner, stored.get(owner.id, ()), _VERSIONS))
            and found.inferred
        ]
        rows_of = stored
        if doubted and self.query is not None:
            catalog_rows = await self.query.checkpoint_rows(doubted, _CATALOG)
            rows_of = {**stored, **{sid: [*stored.get(sid, ()), *catalog_rows.get(sid, ())] for sid in doubted}}
        lagging: list[tuple[SessionRecord, list[CatalogEntry]]] = []
        unanswered: list[SessionRecord] = []
        for owner in cold:
            found = stored_catalog(owner, rows_of.get(owner.id, ()), _VERSIONS)
            if found is not None and found.inferred and owner.id in doubted:
                found = None  # no catalog row at all beside the others: the log answers
            if found is None:
                if owner.persisted and owner.damage is None:
                    unanswered.append(owner)
                else:
                    entries[owner.id] = []  # nothing on disk to read it from (or a damaged log)
            elif found.whole:
                entries[owner.id] = found.entries
            else:
                lagging.append((owner, found.entries))
        if lagging:
            # Rows that lag the log answer only for a log another process writes now (its
            # writer checkpoints as it goes); else the events after them may name a child.
            held = await self._held_elsewhere([owner.id for owner, _ in lagging])
            for owner, found_entries in lagging:
                if owner.id in held:
                    entries[owner.id] = found_entries
                else:
                    unanswered.append(owner)
        if unanswered:
            assert self.query is not None
            observed, rows = await observe_catalogs(
                self.query, unanswered, shape=shape, rows=self._rows_made, proved=proved, observers=self.observers
            )
            made.update(rows)
            for owner in unanswered:
                entries[owner.id] = observed.get(owner.id, [])
        return entries, stored

    async def _stored_rows(self, ids: Sequence[str]) -> dict[str, list[StoredCheckpoint]]:
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
                reason = absent_reason(info, absent[i].owner)
                if reason is not None:
                    out[i] = DiagnosticRow(id=absent[i].id, reason=reason)
        return out

    async def _stat_all(self, ids: list[str]) -> list[LogInfo | None | Exception]:
        if self.query is None:
            return [None] * len(ids)
        return await self.query.stat_many(ids)

    async def _rows(
        self,
        shape: CorpusShape,
        candidates: list[SessionRecord],
        stored: dict[str, list[StoredCheckpoint]],
        proved: list[ObservedCheckpoint],
        made: dict[str, Row] | None = None,
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
        answers = await self._live_answers(refs, _LIVE)
        child = self._rows_made.child
        again: list[int] = []
        for i, answer in zip(live_at, answers, strict=True):
            record = candidates[i]
            if isinstance(answer, ActorStopped):
                cold.append(i)  # it stopped meanwhile: read what it left
            elif isinstance(answer, Exception):
                # Its identity alone may still be readable (a broken catalog or flags cell): a
                # row without flags then, never none.
                again.append(i)
            else:
                identity = own_identity(answer.get(IDENTITY_UNIT.key), record.inherited_event_count)
                if identity is not None:
                    has = record.id in parents or names_absent(record.id, answer.get(CATALOG_UNIT.key), records)
                    flags = flags_view(answer.get(FLAGS_UNIT.key))
                    # Resident here: its cell has the exact time of its open turn's last event
                    # (the runtime clock's, as `stall_after` is counted), else the listed last event's time.
                    through = open_turn_time(answer.get(TIMING_UNIT.key))
                    results[i] = child(
                        record, identity, has, HERE, flags=flags, turn_open=through is not None, last_event=through
                    )
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
                    identity = own_identity(answer.get(IDENTITY_UNIT.key), record.inherited_event_count)
                    if identity is not None:
                        results[i] = child(record, identity, record.id in parents, HERE)
        cold.sort()
        await self._cold_rows(candidates, cold, shape, results, stored, proved, made)
        return results

    async def _live_answers(self, refs: list[SessionRef], keys: list[str]) -> list[dict[str, JsonValue] | Exception]:
        """All live asks for `keys` at once (a cancelled listing stops waiting: an actor stuck
        in storage must not hold it)."""
        if not refs:
            return []
        return await snapshot_all(refs, keys)

    async def _cold_rows(
        self,
        candidates: list[SessionRecord],
        cold: list[int],
        shape: CorpusShape,
        results: list[Row | None],
        stored: dict[str, list[StoredCheckpoint]],
        proved: list[ObservedCheckpoint],
        made: dict[str, Row] | None,
    ) -> None:
        parents, records = shape.parents, shape.records
        pending = []
        for i in cold:
            record = candidates[i]
            if record.damage is not None:
                results[i] = DiagnosticRow(id=record.id, reason=record.damage)
            else:
                pending.append(i)
        answering = [candidates[i] for i in pending]
        checkpoints = await self._checkpoint_identities(answering, stored)  # (adds the rows it read to `stored`)
        flagged = stored_flags([r for r in answering if r.id in checkpoints], stored) if checkpoints else {}
        naming = catalog_owners(stored) if checkpoints else set()
        turns: dict[str, tuple[bool, int]] = (
            stored_turns([r for r in answering if r.id in checkpoints], stored) if checkpoints else {}
        )
        # Those another process holds the lock of are running there (observed ones learn it
        # from their observation's stat hop).
        held = await self._held_elsewhere([candidates[i].id for i in pending if candidates[i].id in checkpoints])
        observe = []
        for i in pending:
            record = candidates[i]
            identity, whole = checkpoints.get(record.id, (None, False))
            flags, flags_seq = flagged.get(record.id, (None, -1))
            timing = turns.get(record.id)
            # Rows answer for the log revision they cover whole; rows that lag it answer only
            # for a log another process writes now (its writer checkpoints it as it goes). The
            # identity, the flags and the timing (whether a turn is open: `orphaned`) all: a log
            # checkpointed before a unit existed, or whose row a damaged index lost, has no such
            # row, and is observed (until its next writer checkpoints it: the index keeps a
            # writer's rows over an observation's of the same seq) — one answer, index or not.
            if (
                identity is not None
                and flags is not None
                and timing is not None
                and ((whole and flags_seq == _last_seq(record)) or record.id in held)
            ):
                has = record.id in parents or (
                    record.id in naming and names_absent(record.id, _stored_entries(record, stored[record.id]), records)
                )
                # A turn open in rows that lag the log may have ended since: only a writer's
                # (held) rows answer then — and they only make a running child `stalled` or not.
                turn_open, turn_seq = timing
                held_there = record.id in held
                turn_open = turn_open and (held_there or turn_seq == _last_seq(record))
                runner = ELSEWHERE if held_there else None
                results[i] = self._rows_made.child(record, identity, has, runner, flags=flags, turn_open=turn_open)
            else:
                observe.append(i)
        if not observe:
            return
        assert self.query is not None
        await observe_rows(
            self.query,
            candidates,
            observe,
            shape=shape,
            rows=self._rows_made,
            results=results,
            proved=proved,
            observers=self.observers,
            made=made,
        )

    async def _checkpoint_identities(
        self, records: Sequence[SessionRecord], stored: dict[str, list[StoredCheckpoint]] | None = None
    ) -> dict[str, tuple[JsonObject, bool]]:
        """Identities the index's checkpoint rows prove, for all cold candidates: the rows read
        with the catalogs, and the rest (those that stopped meanwhile) in one more query, added
        to `stored` (their flags rows are read from there). With each, whether its row covers
        the log whole (`seq` is its last event's)."""
        if self.query is None or not records:
            return {}
        rows = stored if stored is not None else {}
        unread = [r.id for r in records if r.id not in rows]
        if unread:
            rows.update(await self._stored_rows(unread))
        return stored_identities(records, rows)


def _stored_entries(record: SessionRecord, rows: Sequence[StoredCheckpoint]) -> list[CatalogEntry]:
    """The catalog a child's rows hold (its identity rows answered: they cover its log)."""
    found = stored_catalog(record, rows, _VERSIONS)
    return found.entries if found is not None else []


def _last_seq(record: SessionRecord) -> int:
    """The seq of the record's last event (-1 for none: no row covers it)."""
    return -1 if record.event_count is None else record.event_count - 1


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _check(abort: Abort | None) -> None:
    if abort is not None and abort.is_set():
        raise SubagentCancelled(_CANCELLED)
