"""The listing's last rung (docs/design.md, "Listing"): one observation of each cold candidate
that neither a live answer nor a checkpoint row placed, through the session query — and, the
same way, of each cold parent whose catalog no checkpoint row answers for (`observe_catalogs`).

A bounded number of observers take the candidates in turn (`OBSERVERS`, set per listing), all
reading in one read group so that their reads share the cold reader's thread hops. An
observation's typed query error with a diagnostic becomes that row; anything else fails the
listing (a bug must not hide as a row). Cancellation passes bare, never grouped. A session
observed for its catalog that is a candidate too (below a root) is read once: its row is made
from that observation, and kept (not the observation) until the listing places it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import attrs
import trio
from subagents.actors import ReadGroup, raise_bare_cancelled
from subagents.storage import ObservedCheckpoint

from ..foundation.errors import SessionQueryError
from ..foundation.json_values import JsonObject
from ..query import SessionQuery, SessionRecord, headers_differ
from .lineage import CatalogEntry, catalog_entries, names_absent
from .listing_rows import (
    ELSEWHERE,
    ChildRow,
    CorpusShape,
    DiagnosticRow,
    Reason,
    Row,
    RowCache,
    flags_view,
    own_identity,
)
from .units import CATALOG_UNIT, FLAGS_UNIT, IDENTITY_UNIT

__all__ = ["observe_catalogs", "observe_rows"]


@attrs.frozen
class Seen:
    """What one observation of a session told a listing: its catalog, and — should it be a
    candidate too — its row's makings (or the diagnostic it lists as)."""

    catalog: list[CatalogEntry]
    identity: JsonObject | None = None
    flags: tuple[bool, int] = (False, 0)
    held: bool = False
    diagnostic: Reason | None = None
    turn_open: bool = False


async def _observe(
    query: SessionQuery, record: SessionRecord, group: ReadGroup
) -> tuple[Seen, ObservedCheckpoint | None] | BaseException:
    """One observation of `record` (a failure that is not a row: returned, to be raised)."""
    try:
        async with query.observe_session(record.id, group=group) as seen:
            if record.header is not None and headers_differ(record.header, seen.header):
                return Seen([], diagnostic="corrupt"), None  # lifecycle witness
            identity = own_identity(seen.projections.get(IDENTITY_UNIT.key), seen.inherited_event_count)
            catalog = catalog_entries(seen.projections.get(CATALOG_UNIT.key))
            flags = flags_view(seen.projections.get(FLAGS_UNIT.key))
            found = Seen(catalog, identity, flags, seen.held, turn_open=seen.turn_open)
            return found, None if seen.held else seen.observed
    except SessionQueryError as exc:
        if exc.diagnostic is None:
            return exc
        return Seen([], diagnostic=exc.diagnostic), None
    except Exception as exc:  # a bug must not hide as a row: it fails the listing
        return exc


def _row(record: SessionRecord, seen: Seen, shape: CorpusShape, rows: RowCache) -> Row:
    if seen.diagnostic is not None:
        return DiagnosticRow(id=record.id, reason=seen.diagnostic)
    if seen.identity is None:
        return DiagnosticRow(id=record.id, reason="corrupt")  # no own identity
    has = record.id in shape.parents or names_absent(record.id, seen.catalog, shape.records)
    runner = ELSEWHERE if seen.held else None
    return rows.child(record, seen.identity, has, runner, flags=seen.flags, turn_open=seen.turn_open)


async def _each(items: list[int], observers: int, one: Callable[[int], Awaitable[None]]) -> None:
    """`one(i)` for each of `items`, at most `observers` under way: the listing's memory is
    bounded by the observations under way, not by the children, and enough stay under way for
    the cold reader to fill its thread hops."""
    queue = iter(items)

    async def observer() -> None:
        for i in queue:
            await one(i)

    try:
        async with trio.open_nursery() as observations:
            for _ in range(min(len(items), observers)):
                observations.start_soon(observer)
    except BaseExceptionGroup as group_error:  # only Cancelled can arrive grouped here: passed on bare
        raise_bare_cancelled(group_error)  # everything else is kept as a value by `_observe`


async def observe_rows(
    query: SessionQuery,
    candidates: list[SessionRecord],
    observe: list[int],
    *,
    shape: CorpusShape,
    rows: RowCache,
    results: list[Row | None],
    proved: list[ObservedCheckpoint],
    observers: int,
    made: Mapping[str, Row] | None = None,
) -> None:
    """Fill `results[i]` for each `i` of `observe` from one observation of `candidates[i]`
    (at most `observers` under way at once) — or with the row this listing made already from
    one (`made`: its rows are in `proved` then); `proved` collects the checkpoint rows the
    observations of child rows proved. Raises the first failure that is not a row."""
    failures: list[BaseException] = []
    earlier = made or {}
    # Every observation of this listing reads in one group: their reads share thread hops.
    group = ReadGroup()

    async def observe_one(i: int) -> None:
        record = candidates[i]
        before = earlier.get(record.id)
        if before is not None:
            results[i] = before
            return
        found = await _observe(query, record, group)
        if isinstance(found, BaseException):
            failures.append(found)
            return
        now, observed = found
        row = results[i] = _row(record, now, shape, rows)
        if observed is not None and isinstance(row, ChildRow):
            proved.append(observed)  # a child row: what its observation proved is kept

    await _each(observe, observers, observe_one)
    if failures:
        raise failures[0]


async def observe_catalogs(
    query: SessionQuery,
    owners: list[SessionRecord],
    *,
    shape: CorpusShape,
    rows: RowCache,
    proved: list[ObservedCheckpoint],
    observers: int,
) -> tuple[dict[str, list[CatalogEntry]], dict[str, Row]]:
    """The catalog of each of `owners` (cold parents no checkpoint row answers for) from one
    observation of its log, at most `observers` under way at once, in one read group — and the
    row each would list as, should it be a candidate too (made now: the observation is not
    kept); what an observation of a healthy log proved joins `proved` (written back: the next
    listing answers from the rows). An owner that cannot be observed (a typed query error:
    gone, damaged), or whose header changed since the corpus was taken, names nobody; any other
    failure fails the listing."""
    out: dict[str, list[CatalogEntry]] = {}
    made: dict[str, Row] = {}
    failures: list[BaseException] = []
    group = ReadGroup()

    async def observe_one(i: int) -> None:
        found = await _observe(query, owners[i], group)
        if isinstance(found, BaseException):
            failures.append(found)
            return
        seen, observed = found
        owner = owners[i]
        out[owner.id] = seen.catalog
        made[owner.id] = _row(owner, seen, shape, rows)
        if observed is not None:
            proved.append(observed)

    await _each(list(range(len(owners))), observers, observe_one)
    if failures:
        raise failures[0]
    return out, made
