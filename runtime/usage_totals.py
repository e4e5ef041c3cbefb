"""Usage read from sessions and trees (SPEC §8; the counts, the fold and the unit are in
`usage.py`): a session's own usage from its events, many sessions' totals from their `usage`
cells and checkpoint rows (a log only where neither answers), a tree's sums over the corpus's
lineage, the spending a budget's ledger is seeded with, and the usage fields of an ACP answer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import trio
from subagents.actors import ActorStopped, ReadGroup, snapshot_all
from subagents.storage import SubagentsError

from .delegation.lineage import same_lifecycle
from .delegation.listing import DiagnosticRow, ListingService
from .foundation.errors import SessionQueryError
from .foundation.pricing import PriceTable
from .query import SessionQuery, SessionRecord
from .usage import USAGE_UNIT, SessionUsage, Tokens, TreeUsage, cost_of, turns_of, usage_of

if TYPE_CHECKING:
    from .agent.tree_ledger import Seeded

__all__ = [
    "descendant_spent",
    "own_totals",
    "prompt_usage_fields",
    "session_usage",
    "tree_json",
    "tree_totals",
    "tree_usage",
    "with_descendants",
]

_log = logging.getLogger(__name__)


async def session_usage(query: SessionQuery, session_id: str) -> SessionUsage:
    """`session_id`'s own usage, per turn and in total, from its events (a live session's durable
    events, or its log). Raises the query's `SessionQueryError` (not found, damaged, ...)."""
    async with query.observe_session(session_id) as seen:
        turns, total = usage_of(seen.events, seen.inherited_event_count)
    return SessionUsage(session_id=session_id, turns=tuple(turns.items()), total=total)


OBSERVERS = 8  # sessions `own_totals` reads at once when no cell or row answers


async def own_totals(
    query: SessionQuery, records: Sequence[SessionRecord], *, observe: bool = True
) -> dict[str, Tokens | None]:
    """Each record's own totals (None: damaged or unreadable), keyed by id: a live session from
    its `usage` cell, a cold one from a checkpoint row of its lifecycle that covers its whole log,
    else one observation (at most `OBSERVERS` at once, their reads in one group). Never raises
    for one session's trouble. `observe=False`: no log is read, and a record neither a cell nor
    a row answers for is left out of the answer (the web console's roots page: bounded work)."""
    values = await _own_values(query, records, observe=observe)
    return {sid: None if value is None else Tokens.from_json(value) for sid, value in values.items()}


async def _own_values(
    query: SessionQuery, records: Sequence[SessionRecord], *, observe: bool = True
) -> dict[str, dict[str, Any] | None]:
    """`own_totals`' answers as the unit's views (its counts and `turns`)."""
    out: dict[str, dict[str, Any] | None] = {}
    live_refs, live_ids, cold = [], [], []
    for record in records:
        ref = query.sessions.get(record.id) if record.live else None
        if ref is not None:
            live_refs.append(ref)
            live_ids.append(record.id)
        elif record.damage is not None or record.header is None:
            out[record.id] = None
        elif record.event_count is not None and record.event_count <= record.inherited_event_count:
            out[record.id] = Tokens().to_json()  # no own events: nothing to read
        else:
            cold.append(record)
    by_id = {r.id: r for r in records}
    if live_refs:
        answers = await snapshot_all(live_refs, [USAGE_UNIT.key])
        for sid, answer in zip(live_ids, answers, strict=True):
            if isinstance(answer, ActorStopped):
                cold.append(by_id[sid])  # it stopped meanwhile: what it left on disk
            elif isinstance(answer, Exception):
                out[sid] = None  # a broken cell
            else:
                out[sid] = _valid(answer.get(USAGE_UNIT.key))
    observing = []
    if cold:
        rows = await query.checkpoint_rows([r.id for r in cold], [USAGE_UNIT.key])
        for record in cold:
            found = _from_rows(record, rows.get(record.id, ()))
            if found is None:
                observing.append(record)
            else:
                out[record.id] = found
    if observing and observe:
        group = ReadGroup()
        limiter = trio.CapacityLimiter(OBSERVERS)

        async def observe_one(record: SessionRecord) -> None:
            async with limiter:
                try:
                    async with query.observe_session(record.id, group=group) as seen:
                        out[record.id] = _valid(seen.projections.get(USAGE_UNIT.key))
                except SessionQueryError:
                    out[record.id] = None

        async with trio.open_nursery() as nursery:
            for record in observing:
                nursery.start_soon(observe_one, record)
    return {r.id: out.get(r.id) for r in records if observe or r.id in out}


def _valid(value: object) -> dict[str, Any] | None:
    """A unit view or state whose counts read (else None: a broken cell, a tampered row)."""
    return value if type(value) is dict and Tokens.from_json(value) is not None else None


def _from_rows(record: SessionRecord, rows: Iterable[Any]) -> dict[str, Any] | None:
    """The totals a checkpoint row proves: this unit's version, this lifecycle, and its last folded
    seq the log's last event (a row behind the log would miss the events after it)."""
    header, count = record.header, record.event_count
    if header is None or count is None:
        return None
    for row in rows:
        if (
            row.key == USAGE_UNIT.key
            and row.ver == USAGE_UNIT.state_version
            and row.seq == count - 1
            and same_lifecycle(row.lifecycle, header, record.inherited_event_count)
        ):
            value = row.value()
            if type(value) is dict and value.get("own_from") == record.inherited_event_count:
                return _valid(value)
    return None


async def tree_usage(query: SessionQuery, listing: ListingService, session_id: str) -> TreeUsage:
    """`session_id`'s own usage plus that of every subagent below it (`listing.list_descendants`).
    A descendant that is damaged or cannot be read is named in `skipped`, never an error. Raises
    the query's `SessionQueryError` when `session_id` itself cannot be read, and the listing's
    errors when the tree cannot be listed."""
    root = await session_usage(query, session_id)
    return await with_descendants(query, listing, session_id, root.total)


async def with_descendants(query: SessionQuery, listing: ListingService, session_id: str, own: Tokens) -> TreeUsage:
    """`own` (the session's own usage, already read) plus that of every subagent below it, as
    `tree_usage`. Raises the listing's errors when the tree cannot be listed."""
    rows = await listing.list_descendants(session_id)
    corpus: dict[str, SessionRecord] = {r.id: r for r in await query.list_sessions()} if rows else {}
    skipped = [row.id for row in rows if isinstance(row, DiagnosticRow) or row.id not in corpus]
    wanted = [corpus[row.id] for row in rows if row.id not in skipped]
    totals = await own_totals(query, wanted) if wanted else {}
    total, counted = own, 1
    for sid, tokens in totals.items():
        if tokens is None:
            skipped.append(sid)
        else:
            total, counted = total + tokens, counted + 1
    return TreeUsage(session_id=session_id, own=own, total=total, sessions=counted, skipped=tuple(skipped))


def tree_totals(records: Sequence[SessionRecord], own: Mapping[str, Tokens | None]) -> dict[str, TreeUsage]:
    """Tree usage of every record from the corpus's own lineage (subagent headers naming their
    parent) and the own totals already at hand: no further read. A subtree member whose totals are
    None is skipped. Records whose own totals are None get no entry."""
    children: dict[str, list[str]] = {}
    for record in records:
        header = record.header
        if header is not None and header.origin == "subagent" and header.parent_session is not None:
            children.setdefault(header.parent_session, []).append(record.id)
    out: dict[str, TreeUsage] = {}
    for record in records:
        mine = own.get(record.id)
        if mine is None:
            continue
        total, counted, skipped = mine, 1, []
        seen: set[str] = {record.id}
        stack = list(children.get(record.id, ()))
        while stack:
            sid = stack.pop()
            if sid in seen:
                continue
            seen.add(sid)
            tokens = own.get(sid)
            if tokens is None:
                skipped.append(sid)
            else:
                total, counted = total + tokens, counted + 1
            stack.extend(children.get(sid, ()))
        out[record.id] = TreeUsage(
            session_id=record.id, own=mine, total=total, sessions=counted, skipped=tuple(sorted(skipped))
        )
    return out


def tree_json(tree: TreeUsage) -> dict[str, Any]:
    """A tree's totals as `sessions --json` shows them: the counts, how many sessions they sum
    and the ids skipped."""
    return {**tree.total.to_json(), "sessions": tree.sessions, "skipped": list(tree.skipped)}


async def descendant_spent(
    query: SessionQuery, listing: ListingService, session_id: str, prices: PriceTable
) -> dict[str, Seeded]:
    """`session_id`'s descendants for the tree ledger's seed (runtime/agent/tree_ledger.py), by
    id: each one's parent and own spending — tokens (every kind), cost at `prices` (None:
    unknown), turns started. From their cells and checkpoint rows (`own_totals`), a log only
    when neither answers. A descendant that cannot be read counts as nothing spent — it is still
    bounded by its own recorded budget; a tree that cannot be listed, likewise (a warning is
    logged)."""
    from .agent.tree_ledger import OwnSpent, Seeded

    try:
        rows = await listing.list_descendants(session_id)
        corpus: dict[str, SessionRecord] = {r.id: r for r in await query.list_sessions()}
    except SubagentsError as exc:
        _log.warning("the budget of %s is seeded without its descendants: %s", session_id, exc)
        return {}
    wanted = [corpus[row.id] for row in rows if not isinstance(row, DiagnosticRow) and row.id in corpus]
    values = await _own_values(query, wanted)
    out: dict[str, Seeded] = {}
    for row in rows:
        value = values.get(row.id)
        tokens = (Tokens.from_json(value) if value is not None else None) or Tokens()
        cost = cost_of(tokens, prices) if tokens.calls or tokens.unknown_calls else 0.0
        unpriced = None
        if cost is None:  # the model without a price, if that is why
            unpriced = next((m or "(none recorded)" for m, *_n in tokens.models if prices.price_of(m) is None), None)
        count = tokens.input_tokens + tokens.output_tokens + tokens.cache_read_tokens + tokens.cache_write_tokens
        spent = OwnSpent(tokens=count, cost=cost, unpriced=unpriced, turns=turns_of(value))
        out[row.id] = Seeded(parent=row.parent_id or session_id, spent=spent)
    return out


async def prompt_usage_fields(
    query: SessionQuery, listing: ListingService, session_id: str, turn: int | None, prices: PriceTable
) -> dict[str, Any]:
    """What an ACP `session/prompt` answer carries of usage (the one host with its own shape):
    the turn's `usage` as the SDK's schema has it (`totalTokens`, `inputTokens`, `outputTokens`,
    and `cachedReadTokens`, `cachedWriteTokens` when the cache was used) and, under `_meta["trio-subagents"]`
    (the schema has no place for them), the turn's `cost` with prices and the `tree`'s usage
    (the session and its descendants, as `sessions --json` gives it, with its `cost`). Empty when
    nothing can be read: a prompt's answer never fails for its usage."""
    try:
        session = await session_usage(query, session_id)
        tree = await tree_usage(query, listing, session_id)
    except SubagentsError:
        return {}
    tokens = dict(session.turns).get(turn) if turn is not None else None
    out: dict[str, Any] = {}
    meta: dict[str, Any] = {"tree": tree_json(tree)}
    if prices:
        meta["tree"]["cost"] = None if tree.skipped else cost_of(tree.total, prices)
    if tokens is not None and tokens.reported:
        usage = {
            "totalTokens": tokens.input_tokens
            + tokens.output_tokens
            + tokens.cache_read_tokens
            + tokens.cache_write_tokens,
            "inputTokens": tokens.input_tokens,
            "outputTokens": tokens.output_tokens,
        }
        if tokens.cache_read_tokens or tokens.cache_write_tokens:  # only then: the common shape stays
            usage |= {"cachedReadTokens": tokens.cache_read_tokens, "cachedWriteTokens": tokens.cache_write_tokens}
        out["usage"] = usage
        if prices:
            meta["cost"] = cost_of(tokens, prices)
    out["_meta"] = {"trio-subagents": meta}
    return out
