"""Listing children (SPEC 5.4): `list_children(parent_id, abort)` and `list_descendants`.

Theory of operation. The corpus is `list_sessions()` (a live header wins). Candidates are the
records with `origin == "subagent"` naming the parent, in (`created_at`, id) order; a damaged one
whose header still names the parent becomes its diagnostic. Each candidate's identity climbs a
ladder: live candidates are all asked at once for `snapshot(["subagent"])` (no log read; one that
stopped meanwhile is treated as cold); cold candidates try the checkpoint rows of the index (one
query for all), and only then one observation each through the cold reader (at most four reads
in flight), `OBSERVERS` observations under way at a time, all under one abort so that their
reads share thread hops, with one watcher that cancels them all when the abort is set. An
identity counts only from the child's own suffix (`seq >= inherited_event_count`). Rows come
in four states: a child row, an omitted live child without an identity yet, and
diagnostics `corrupt` / `unsupported` / `unavailable`. Typed query errors become rows; anything
else fails the listing. An abort at any check point ends it with `CANCELLED` and no rows.
Listing never writes a log, a checkpoint or an actor.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Literal

import attrs
import trio

from subagents.actors import Abort, ActorStopped, SessionRef, SessionStore, raise_bare_cancelled, snapshot_all
from subagents.runtime.query import SessionQuery, SessionQueryError, SessionRecord, headers_differ
from subagents.storage import LogStore, SessionHeader
from subagents.storage.projection import Lifecycle, ProjectionRegistry

from .units import IDENTITY_UNIT

__all__ = ["ChildRow", "DiagnosticRow", "ListingService", "SubagentError"]

Reason = Literal["corrupt", "unsupported", "unavailable"]


class SubagentError(Exception):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


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
        out: dict[str, Any] = {"kind": "child", "id": self.id, "activity": self.activity,
                               "has_children": self.has_children, "mode": self.mode}
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
OBSERVERS = 32  # cold observations under way at once (their reads: at most the cold reader's 4)
_CANCELLED = "subagent listing was cancelled"
_QUERY_REASONS: dict[str, Reason | None] = {
    "SESSION_QUERY_CORRUPT_SESSION": "corrupt",
    "SESSION_QUERY_SOURCE_CONFLICT": "corrupt",
    "SESSION_QUERY_UNSUPPORTED_SESSION": "unsupported",
    "SESSION_QUERY_SESSION_NOT_FOUND": "unavailable",
    "SESSION_QUERY_PERSISTENCE_FAILED": "unavailable",
}


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
            return ChildRow(id=record.id, activity="running" if live else "inactive",
                            has_children=has_children, mode=mode, label=label)
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

    def of(self, corpus: list[SessionRecord]) -> _Shape:
        if len(corpus) != len(self._corpus) or not all(map(operator.is_, corpus, self._corpus)):
            self._corpus = corpus
            self.parents = frozenset(
                r.header.parent_session for r in corpus if r.header is not None and r.header.origin == "subagent"
            )
            self._children = {}
        return self

    def children_of(self, parent_id: str) -> list[SessionRecord]:
        """The candidates of `parent_id`, in order (kept: not to be changed)."""
        children = self._children.get(parent_id)
        if children is None:
            if len(self._children) >= self._PARENTS_KEPT:
                self._children.clear()
            children = self._children[parent_id] = _children_of(self._corpus, parent_id)
        return children


class ListingService:
    """Constructible with any collaborator missing, so the service checks are testable."""

    def __init__(
        self,
        *,
        registry: ProjectionRegistry | None,
        sessions: SessionStore | None,
        query: SessionQuery | None,
        log_store: LogStore | None = None,
    ) -> None:
        self.registry = registry
        self.sessions = sessions
        self.query = query
        self.log_store = log_store
        self.observers = OBSERVERS
        self._rows_made = _Rows()
        self._shape = _Shape()

    async def list_children(self, parent_id: str, abort: Abort | None = None) -> list[Row]:
        corpus = await self._corpus(abort)
        shape = self._shape.of(corpus)
        return await self._rows(shape.parents, shape.children_of(parent_id), abort)

    async def list_descendants(self, root_id: str, abort: Abort | None = None) -> list[Row]:
        corpus = await self._corpus(abort)
        placed = walk_descendants(corpus, root_id)
        parents = self._shape.of(corpus).parents
        rows = await self._rows(parents, [record for record, _, _ in placed if _is_subagent(record)], abort)
        where = {record.id: (parent, depth) for record, parent, depth in placed}
        return [attrs.evolve(row, parent_id=where[row.id][0], depth=where[row.id][1]) for row in rows]

    # --- the steps ---

    async def _corpus(self, abort: Abort | None) -> list[SessionRecord]:
        if self.registry is None:
            raise SubagentError("projection registry is unavailable", "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE")
        if self.sessions is None:
            raise SubagentError("session store is unavailable", "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE")
        _check(abort)
        if self.query is None:
            raise SubagentError("session query is unavailable", "SUBAGENT_CONTROL_QUERY_UNAVAILABLE")
        try:
            corpus = await self.query.list_sessions(abort)
        except SessionQueryError as exc:
            if exc.code == "SESSION_QUERY_ABORTED":
                raise SubagentError(_CANCELLED, "CANCELLED") from None
            raise
        _check(abort)
        return corpus

    async def _rows(self, parents: frozenset[str | None], candidates: list[SessionRecord], abort: Abort | None) -> list[Row]:
        """`parents`: the ids some subagent record of the corpus names as its parent."""
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
        answers = await self._live_answers(refs, abort)
        child = self._rows_made.child
        for i, answer in zip(live_at, answers, strict=True):
            record = candidates[i]
            if isinstance(answer, ActorStopped):
                cold.append(i)  # it stopped meanwhile: read what it left
            elif isinstance(answer, Exception):
                results[i] = DiagnosticRow(id=record.id, reason="corrupt")
            else:
                identity = _own(answer.get(IDENTITY_UNIT.key), record.inherited_event_count)
                if identity is not None:
                    results[i] = child(record, identity, record.id in parents, live=True)
                # else: omitted — a live child in its creation window
        cold.sort()
        await self._cold_rows(candidates, cold, parents, results, abort)
        _check(abort)
        return [row for row in results if row is not None]

    async def _live_answers(self, refs: list[SessionRef], abort: Abort | None) -> list[Any]:
        """All live asks at once; an abort ends the wait (an actor stuck in storage must not
        hold a cancelled listing)."""
        if not refs:
            return []
        if abort is None:
            return await snapshot_all(refs, [IDENTITY_UNIT.key])
        answers: list[Any] | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_on, abort, nursery.cancel_scope)
                answers = await snapshot_all(refs, [IDENTITY_UNIT.key])
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # only an enclosing cancel gets here: pass it on bare
            raise_bare_cancelled(group)
        if answers is None or abort.is_set():
            _check(abort)
        assert answers is not None
        return answers

    async def _cold_rows(
        self,
        candidates: list[SessionRecord],
        cold: list[int],
        parents: frozenset[str | None],
        results: list[Row | None],
        abort: Abort | None,
    ) -> None:
        pending = []
        for i in cold:
            record = candidates[i]
            if record.damage is not None:
                results[i] = DiagnosticRow(id=record.id, reason=record.damage)
            else:
                pending.append(i)
        held: set[str] = set()  # cold candidates another process holds the lock of: running there
        checkpoints = await self._checkpoint_identities([candidates[i] for i in pending], held)
        observe = []
        for i in pending:
            identity = checkpoints.get(candidates[i].id)
            if identity is not None:
                results[i] = self._rows_made.child(
                    candidates[i], identity, candidates[i].id in parents, live=candidates[i].id in held)
            else:
                observe.append(i)
        if not observe:
            return
        assert self.query is not None
        query = self.query
        failures: list[BaseException] = []
        # One Abort for every observation of this listing (a private one, never set, when the
        # caller gave none): the cold reader lets reads under the same Abort share thread hops.
        shared = abort if abort is not None else Abort()

        async def observe_one(i: int) -> None:
            record = candidates[i]
            try:
                async with query.observe_session(record.id, shared) as seen:
                    if record.header is not None and headers_differ(record.header, seen.header):
                        results[i] = DiagnosticRow(id=record.id, reason="corrupt")  # lifecycle witness
                        return
                    identity = _own(seen.projections.get(IDENTITY_UNIT.key), seen.inherited_event_count)
            except SessionQueryError as exc:
                reason = _QUERY_REASONS.get(exc.code)
                if exc.code == "SESSION_QUERY_ABORTED" or (abort is not None and abort.is_set()):
                    return  # the listing raises CANCELLED once everything has stopped
                if reason is None:
                    failures.append(exc)
                    return
                results[i] = DiagnosticRow(id=record.id, reason=reason)
                return
            except Exception as exc:  # a bug must not hide as a row: it fails the listing
                failures.append(exc)
                return
            if identity is None:
                results[i] = DiagnosticRow(id=record.id, reason="corrupt")  # no own identity
            else:
                results[i] = self._rows_made.child(record, identity, record.id in parents, live=record.id in held)

        _check(abort)
        try:
            async with trio.open_nursery() as nursery:
                if abort is not None:
                    # One watcher for every observation: an abort cancels them all at once
                    # (each also sees it at its own checks), and the listing raises CANCELLED.
                    nursery.start_soon(_cancel_on, abort, nursery.cancel_scope)
                # A bounded number of observers take the candidates in turn: the listing's
                # memory is bounded by the observations under way, not by the children, and
                # enough stay under way for the cold reader to fill its thread hops.
                queue = iter(observe)

                async def observer() -> None:
                    for i in queue:
                        await observe_one(i)

                async with trio.open_nursery() as observations:
                    for _ in range(min(len(observe), self.observers)):
                        observations.start_soon(observer)
                nursery.cancel_scope.cancel()  # every observation is done: stop the watcher
        except BaseExceptionGroup as group:
            raise_bare_cancelled(group)  # everything else is kept as a value by observe_one
        _check(abort)
        if failures:
            raise failures[0]

    async def _checkpoint_identities(
        self, records: Sequence[SessionRecord], held: set[str] | None = None
    ) -> dict[str, dict[str, Any]]:
        """Identities the index's checkpoint rows prove, for all cold candidates in one query;
        in the same thread hop, the ids of those another writer holds the lock of go into
        `held`."""
        if self.log_store is None or not records:
            return {}
        store, ids = self.log_store, [r.id for r in records]

        def rows_and_locks() -> tuple[dict[str, Any] | None, set[str]]:
            locked = store.held_elsewhere(ids)
            try:
                return store.read_checkpoint_rows(ids), locked
            except Exception:  # the index is a cache: any failure falls through to observation
                return None, locked

        try:
            # Through the index's one worker slot (SPEC 3.3), shared with the session query.
            limiter = self.query.index_limiter if self.query is not None else None
            rows, locked = await trio.to_thread.run_sync(rows_and_locks, limiter=limiter)
        except Exception:  # the index is a cache: any failure falls through to observation
            return {}
        if held is not None:
            held |= locked
        if not rows:
            return {}
        out = {}
        key, version = IDENTITY_UNIT.key, IDENTITY_UNIT.state_version
        for record in records:
            header = record.header
            if header is None or record.event_count is None:
                continue
            for stored in rows.get(record.id, ()):
                if stored.key != key or stored.ver != version or stored.seq >= record.event_count:
                    continue
                if _same_lifecycle(stored.lifecycle, header, record.inherited_event_count):
                    val = stored.value()  # decoded only now (UNREADABLE, an object: no identity)
                    identity = _own(val.get("identity") if type(val) is dict else None, record.inherited_event_count)
                    if identity is not None:
                        out[record.id] = identity
        return out


def _check(abort: Abort | None) -> None:
    if abort is not None and abort.is_set():
        raise SubagentError(_CANCELLED, "CANCELLED")


def _same_lifecycle(stored: Lifecycle, header: SessionHeader, inherited_event_count: int) -> bool:
    """`stored == Lifecycle.of(header, inherited_event_count)`, without building the latter."""
    return (
        stored.format == header.format
        and stored.created_at == header.created_at
        and stored.cwd == header.cwd
        and stored.is_seeded == header.is_seeded
        and stored.inherited_event_count == inherited_event_count
    )


async def _cancel_on(abort: Abort, scope: trio.CancelScope) -> None:
    await abort.wait()
    scope.cancel()


def _is_subagent(record: SessionRecord) -> bool:
    return record.header is not None and record.header.origin == "subagent"


def _order(record: SessionRecord) -> tuple[int, str]:
    return (record.header.created_at if record.header is not None else -1, record.id)


def _children_of(corpus: list[SessionRecord], parent_id: str) -> list[SessionRecord]:
    return sorted(
        (
            r
            for r in corpus
            if r.header is not None and r.header.origin == "subagent" and r.header.parent_session == parent_id
        ),
        key=_order,
    )


def walk_descendants(corpus: list[SessionRecord], root_id: str) -> list[tuple[SessionRecord, str, int]]:
    """Pre-order over every corpus edge below `root_id`: (record, its parent, depth). Iterative,
    siblings in (`created_at`, id) order, never revisiting the root or a node."""
    children: dict[str, list[SessionRecord]] = {}
    for record in corpus:
        parent = record.header.parent_session if record.header is not None else None
        if parent is not None:
            children.setdefault(parent, []).append(record)
    for siblings in children.values():
        siblings.sort(key=_order)
    out: list[tuple[SessionRecord, str, int]] = []
    seen = {root_id}
    stack: list[tuple[SessionRecord, str, int]] = [(c, root_id, 1) for c in reversed(children.get(root_id, []))]
    while stack:
        record, parent, depth = stack.pop()
        if record.id in seen:
            continue
        seen.add(record.id)
        out.append((record, parent, depth))
        stack.extend((c, record.id, depth + 1) for c in reversed(children.get(record.id, [])))
    return out
