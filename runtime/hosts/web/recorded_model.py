"""The model a row shows before its session's usage names one (issue 31): a session that has made
no model call yet — a child waiting on its first reply, one whose calls failed — has no model in
its usage's per-model counts, yet its log already says what it runs.

What it says, cheapest first, never a read of every log:
1. its `usage` checkpoint row of this lifecycle (one index query for every such row on the page):
   the unit's state keeps the model its last `session/model` named (`UsageUnit`: a session writes
   `session/model` before the first turn it runs with a provider model). A row behind the log
   still names the model as of its seq; a later `session/model` (a resume on another model)
   shows once a row or a call catches up.
2. else (no such row; or, for a child, a row that names none) the head of its log — the store's
   first chunk only (a frame, or about a MB of plain bytes; a page of batch rows on PostgreSQL),
   for at most `HEAD_READS` sessions a page, those without a row first: the last
   `session/model` there, else its `subagent/descriptor`'s model route (an agent type naming a
   provider and model: `provider:model`, the spec the host builds the child from).
A session whose head says neither (a scripted model records no `session/model`) shows none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec
import trio
from subagents.storage import Event, Offset, StorageError

from ...agent.model_record import MODEL_TYPE
from ...delegation.descriptor import parse_descriptor
from ...delegation.lineage import same_lifecycle
from ...delegation.units import DESCRIPTOR_TYPE
from ...foundation.errors import MalformedDescriptor
from ...usage import USAGE_UNIT, recorded_model

if TYPE_CHECKING:
    from subagents.storage import LogStore, StoredCheckpoint

    from ...query_corpus import SessionRecord
    from ...read_side import ReadSide

__all__ = ["HEAD_READS", "models_recorded"]

HEAD_READS = 20  # log heads read at most per page (the rest show no model until a row names it)
_READERS = 4  # head reads at once (worker threads)
_decode = msgspec.json.Decoder()


async def models_recorded(
    side: ReadSide, records: Sequence[SessionRecord], shown: Mapping[str, str | None]
) -> dict[str, str]:
    """The model recorded by each of `records` whose `shown` model (its calls') is None, where
    its usage row or its log's head names one (see the module docstring). Never raises for one
    session's trouble: it shows no model."""
    wanting = [
        r
        for r in records
        if not shown.get(r.id) and r.damage is None and r.header is not None and (r.event_count or 0) > 0
    ]
    if not wanting:
        return {}
    out: dict[str, str] = {}
    rows = await side.query.checkpoint_rows([r.id for r in wanting], [USAGE_UNIT.key])
    heads: list[SessionRecord] = []
    routes: list[SessionRecord] = []
    for record in wanting:
        named = _row_model(record, rows.get(record.id, ()))
        if named:
            out[record.id] = named
        elif named is None:
            heads.append(record)  # no row of this lifecycle: its head may say
        elif record.header is not None and record.header.parent_session is not None:
            routes.append(record)  # no `session/model` in it: a child's descriptor may name a route
    limiter = trio.CapacityLimiter(_READERS)
    store = side.log_store

    async def read_head(record: SessionRecord) -> None:
        try:
            events = await trio.to_thread.run_sync(_head, store, record.id, limiter=limiter)
        except StorageError:
            return  # gone, damaged or unreachable since the listing: no model shown
        named = head_model(events)
        if named:
            out[record.id] = named

    async with trio.open_nursery() as nursery:
        for record in [*heads, *routes][:HEAD_READS]:
            nursery.start_soon(read_head, record)
    return out


def _row_model(record: SessionRecord, rows: Sequence[StoredCheckpoint]) -> str | None:
    """The model a usage row of this lifecycle names ("" for a row that names none: the log up
    to its seq recorded no `session/model`, and its head would not either when it covers it);
    None when no row of this lifecycle answers."""
    header = record.header
    assert header is not None  # `models_recorded` asks only for records with one
    for row in rows:
        if row.key != USAGE_UNIT.key or row.ver != USAGE_UNIT.state_version:
            continue
        if not same_lifecycle(row.lifecycle, header, record.inherited_event_count):
            continue
        value = row.value()
        model = value.get("model") if type(value) is dict else None
        if isinstance(model, str) and model:
            return model
        return "" if row.seq >= (record.event_count or 0) - 1 else None
    return None


def _head(store: LogStore, session_id: str) -> list[Event]:
    """The first chunk of a log (a bounded read; see `LogReader.read_chunks`)."""
    handle = store.open_read(session_id)
    try:
        chunks = store.read_chunks(handle, start=Offset(0))
        try:
            return next(chunks, [])
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()  # the store's read-ahead goes before the handle does
    finally:
        store.close(handle)


def head_model(events: Sequence[Event]) -> str | None:
    """The model the events name: the last `session/model`, else the descriptor's model route."""
    for event in reversed(events):
        if event.type == MODEL_TYPE and (named := recorded_model(event)):
            return named
    for event in events:
        if event.type == DESCRIPTOR_TYPE:
            try:
                descriptor = parse_descriptor(_decode.decode(event.data))
            except (msgspec.DecodeError, RecursionError, MalformedDescriptor):
                return None  # no valid descriptor: no route it names
            if descriptor is None or descriptor.agent_provider is None:
                return None
            return f"{descriptor.agent_provider}:{descriptor.agent_model or ''}"
    return None
