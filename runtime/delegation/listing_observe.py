"""The listing's last rung (docs/design.md, "Listing"): one observation of each cold candidate
that neither a live answer nor a checkpoint row placed, through the session query.

A bounded number of observers take the candidates in turn (`OBSERVERS`, set per listing), all
reading in one read group so that their reads share the cold reader's thread hops. An
observation's typed query error with a diagnostic becomes that row; anything else fails the
listing (a bug must not hide as a row). Cancellation passes bare, never grouped.
"""

from __future__ import annotations

import trio
from subagents.actors import ReadGroup, raise_bare_cancelled
from subagents.storage import ObservedCheckpoint

from ..foundation.errors import SessionQueryError
from ..query import SessionQuery, SessionRecord, headers_differ
from .lineage import names_absent
from .listing_rows import CorpusShape, DiagnosticRow, Row, RowCache, flags_view, own_identity
from .units import CATALOG_UNIT, FLAGS_UNIT, IDENTITY_UNIT

__all__ = ["observe_rows"]


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
) -> None:
    """Fill `results[i]` for each `i` of `observe` from one observation of `candidates[i]`
    (at most `observers` under way at once); `proved` collects the checkpoint rows the
    observations of child rows proved. Raises the first failure that is not a row."""
    parents, records = shape.parents, shape.records
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
                identity = own_identity(seen.projections.get(IDENTITY_UNIT.key), seen.inherited_event_count)
                catalog = seen.projections.get(CATALOG_UNIT.key)
                flags = flags_view(seen.projections.get(FLAGS_UNIT.key))
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
            results[i] = rows.child(record, identity, has, live=elsewhere, flags=flags)
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
            for _ in range(min(len(observe), observers)):
                observations.start_soon(observer)
    except BaseExceptionGroup as group_error:  # only Cancelled can arrive grouped here: passed on bare
        raise_bare_cancelled(group_error)  # everything else is kept as a value by observe_one
    if failures:
        raise failures[0]
