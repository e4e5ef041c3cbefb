"""What the console's pages show, read through the read side (runtime/read_side.py), as plain
values the templates render (and escape). Nothing here reads every log: the overview and the
tree's roots come from one listing of the corpus (the index, and line 1 of a log without an
index row), a subtree from the listing service's rows of one root, a session page from one
observation of that session.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

import attrs
import trio
from subagents.storage import FileLogStore, StorageError

from ...delegation.agents_text import state_word
from ...delegation.listing import ChildRow
from ...delegation.listing_rows import last_event_ms
from ...foundation.pricing import PriceTable, format_cost, load_prices
from ...usage import Tokens, TreeUsage, describe
from ...usage_totals import own_totals, tree_totals
from ..cli.common import iso_time
from ..transcript import render, transcript
from .recorded_model import models_recorded
from .stalled import TurnMemo, stalled_sessions

if TYPE_CHECKING:
    from subagents.storage import Event, SessionHeader

    from ...foundation.json_values import JsonObject
    from ...query import SessionRecord
    from ...read_side import ReadSide

__all__ = ["PAGE_SIZE", "Moment", "overview", "roots_page", "session_view", "subtree"]

PAGE_SIZE = 50  # roots per tree page
RECENT = 20  # sessions on the overview


@attrs.frozen
class Moment:
    """A time as the pages show it: UTC ISO-8601 and how long ago."""

    iso: str
    ago: str


def moment(ms: int | None, now_ms: int) -> Moment | None:
    if ms is None or ms <= 0:
        return None
    return Moment(iso_time(ms), _ago(now_ms - ms))


def _ago(delta_ms: int) -> str:
    seconds = delta_ms // 1000
    if seconds < 0:
        return "in the future"
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def state_of(record: SessionRecord) -> str:
    """One word for a session of the corpus."""
    if record.damage is not None:
        return "damaged"
    if record.live:
        return "live here"
    if record.held:
        return "live elsewhere"
    return "persisted"


def record_row(record: SessionRecord, now_ms: int, runners: dict[str, str]) -> JsonObject:
    header = record.header
    return {
        "id": record.id,
        "state": state_of(record),
        "damage": record.damage,
        "parent": header.parent_session if header is not None else None,
        "origin": header.origin if header is not None else None,
        "depth": header.delegation_depth if header is not None else None,
        "events": record.event_count,
        "created": moment(header.created_at if header is not None else None, now_ms),
        "last_event": moment(last_event_ms(record), now_ms),
        "runner": runners.get(record.id),
    }


async def overview(side: ReadSide, memo: TurnMemo | None = None) -> JsonObject:
    """Counts by state, the most recent sessions and the stalled or orphaned children of the
    whole store (runtime/hosts/web/stalled.py: stored timing rows, bounded reads)."""
    records = await side.query.list_sessions(probe_locks=True)
    now = _now_ms()
    held = [r.id for r in records if r.held]
    runners = await side.query.holders(held) if held else {}
    counts = Counter(state_of(r) for r in records)
    recent = sorted(records, key=lambda r: last_event_ms(r) or 0, reverse=True)[:RECENT]
    stall_ms = side.listing.stall_after_ms
    stalled = await stalled_sessions(side.query, records, now, stall_ms, runners, memo)
    return {
        "hosts": await _hosts(side, now),
        "total": len(records),
        "roots": sum(1 for r in records if r.header is not None and r.header.parent_session is None),
        "counts": sorted(counts.items()),
        "recent": [record_row(r, now, runners) for r in recent],
        "stalled": [
            {
                "id": row.id,
                "parent": row.parent,
                "state": row.liveness,
                "runner": row.runner,
                "last_event": moment(row.last_ms, now),
                "label": row.label,
                "agent_type": row.agent_type,
            }
            for row in stalled.rows
        ],
        "unchecked": stalled.unchecked,
        "unchecked_resting": stalled.unchecked_resting,
        "stall_after": stall_ms // 1000,
    }


async def _hosts(side: ReadSide, now_ms: int) -> list[JsonObject] | None:
    """The hosts a PostgreSQL store knows (as `subagents hosts`); None on a folder."""
    leased = side.log_store.leased
    if leased is None:
        return None
    rows = await trio.to_thread.run_sync(lambda: leased.placements().hosts())
    return [
        {
            "id": row.host_id,
            "started": moment(row.started_at or None, now_ms),
            "capacity": row.capacity,
            "held": row.sessions_held,
            "renewed": moment(row.renewed_at, now_ms),
            "alive": row.alive,
        }
        for row in rows
    ]


async def roots_page(side: ReadSide, page: int) -> JsonObject:
    """One page of root sessions (no parent; and damaged logs whose lineage is unknown, as
    diagnostic rows), newest first, each with how many sessions of the corpus name it as an
    ancestor, its agent type (its header's `agent_preset`, in the listing row), the models its
    recorded calls ran, its own usage and its subtree's (`_page_usage`)."""
    records = await side.query.list_sessions(probe_locks=True)
    now = _now_ms()
    parent_of = {r.id: r.header.parent_session for r in records if r.header is not None}
    below: Counter[str] = Counter()
    for sid in parent_of:
        seen: set[str] = set()
        up = parent_of.get(sid)
        while up is not None and up not in seen:  # a lineage loop in damaged headers ends here
            seen.add(str(up))
            below[str(up)] += 1
            up = parent_of.get(up)
    roots = [r for r in records if r.header is None or r.header.parent_session is None]
    pages = max(1, -(-len(roots) // PAGE_SIZE))
    page = min(max(page, 1), pages)
    shown = roots[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
    held = [r.id for r in shown if r.held]
    runners = await side.query.holders(held) if held else {}
    prices, price_problem = _prices()
    usage = await _page_usage(side, records, shown, prices)
    rows = []
    for r in shown:
        row = record_row(r, now, runners)
        row["descendants"] = below.get(r.id, 0)
        row |= usage.get(r.id, {})
        rows.append(row)
    return {"rows": rows, "page": page, "pages": pages, "roots": len(roots), "price_problem": price_problem}


async def _page_usage(
    side: ReadSide, records: list[SessionRecord], shown: list[SessionRecord], prices: PriceTable | None
) -> dict[str, JsonObject]:
    """The usage of the roots `shown`: each root's own from its `usage` checkpoint row (a log
    read only when no row answers: at most a page of logs), its subtree's from the rows of its
    descendants in the corpus's lineage only — one index query, no log read; a descendant no row
    answers for is counted as not read (its tree page reads it)."""
    by_parent: dict[str, list[SessionRecord]] = {}
    for r in records:
        if r.header is not None and r.header.parent_session is not None:
            by_parent.setdefault(str(r.header.parent_session), []).append(r)
    trees: dict[str, list[SessionRecord]] = {}
    for root in shown:
        seen, stack, found = {root.id}, list(by_parent.get(root.id, ())), []
        while stack:
            r = stack.pop()
            if r.id not in seen:  # a lineage loop in damaged headers ends here
                seen.add(r.id)
                found.append(r)
                stack.extend(by_parent.get(r.id, ()))
        trees[root.id] = found
    own = await own_totals(side.query, shown)
    below = await own_totals(side.query, [r for found in trees.values() for r in found], observe=False)
    out: dict[str, JsonObject] = {}
    for root in shown:
        mine = own.get(root.id)
        total, unread, skipped = mine, 0, 0
        for r in trees[root.id]:
            if r.id not in below:
                unread += 1
            elif (tokens := below[r.id]) is None:
                skipped += 1
            elif total is not None:
                total = total + tokens
        out[root.id] = {
            "agent_type": root.header.agent_preset if root.header is not None else None,
            "model": _models(mine),
            "usage": describe(mine, prices) if mine is not None else None,
            "tree_usage": _described(total, prices, bool(unread or skipped))
            if total is not None and trees[root.id]
            else None,
            "tree_unread": unread,
            "tree_skipped_count": skipped,
        }
    recorded = await models_recorded(side, shown, {sid: _text(row["model"]) for sid, row in out.items()})
    for sid, model in recorded.items():
        out[sid]["model"] = model
    return out


def _models(tokens: Tokens | None) -> str | None:
    """The models a session's recorded calls ran (its usage's per-model counts), or None."""
    names = sorted({model for model, *_ in tokens.models if model}) if tokens is not None else []
    return ", ".join(names) or None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _prices() -> tuple[PriceTable | None, str | None]:
    """`[prices]` of subagents.toml, read per page (two small files) so an edit shows on the next
    load; a table that cannot be used leaves costs out and is named on the page."""
    try:
        prices = load_prices()
    except ValueError as exc:
        return None, str(exc)
    return (prices or None), None


def child_row(row: ChildRow, now_ms: int, parent: str | None = None) -> JsonObject:
    return {
        "id": row.id,
        "kind": "child",
        "parent": row.parent_id if row.parent_id is not None else parent,
        "depth": row.depth,
        # Nothing runs in the console's process: `running` when another process holds it.
        "state": state_word(row, "running" if row.activity == "running" else "ready"),
        "activity": row.activity,
        "mode": row.mode,
        "label": row.label,
        "liveness": row.liveness,
        "runner": row.runner,
        "last_event": moment(row.last_event, now_ms),
        "has_children": row.has_children,
    }


async def subtree(side: ReadSide, root_id: str) -> JsonObject:
    """The descendants of `root_id` in pre-order (child rows and diagnostic rows), each child
    with its agent type (its header's, from the corpus record the listing was made of), the
    models its recorded calls ran, its own usage and its subtree's, and the root's: from the
    usage cells and checkpoint rows of these sessions only (a log is read only when neither
    answers)."""
    now = _now_ms()
    listed = await side.listing.list_descendants(root_id, require_parent=True)
    # The records of the corpus the listing was made of: no second listing.
    records = [r for r in (side.query.recorded(sid) for sid in [root_id, *(row.id for row in listed)]) if r is not None]
    by_id: dict[str, SessionRecord] = {r.id: r for r in records}
    own = await own_totals(side.query, records)
    trees = tree_totals(records, own)
    prices, price_problem = _prices()
    rows: list[JsonObject] = []
    for row in listed:
        if isinstance(row, ChildRow):
            shown = child_row(row, now)
            record = by_id.get(row.id)
            shown["agent_type"] = record.header.agent_preset if record is not None and record.header else None
            shown["model"] = _models(own.get(row.id))
            shown |= _usage(own.get(row.id), trees.get(row.id), prices)
            rows.append(shown)
        else:
            rows.append(
                {"id": row.id, "kind": "diagnostic", "reason": row.reason, "parent": row.parent_id, "depth": row.depth}
            )
    children = [r for r in records if r.id != root_id]
    recorded = await models_recorded(side, children, {str(row["id"]): _text(row.get("model")) for row in rows})
    for row in rows:
        if (model := recorded.get(str(row["id"]))) is not None:
            row["model"] = model
    return {"rows": rows, "price_problem": price_problem, **_usage(own.get(root_id), trees.get(root_id), prices)}


def _usage(own: Tokens | None, tree: TreeUsage | None, prices: PriceTable | None = None) -> JsonObject:
    return {
        "usage": describe(own, prices) if own is not None else None,
        "tree_usage": None
        if tree is None or tree.sessions <= 1
        else _described(tree.total, prices, bool(tree.skipped)),
        "tree_skipped": list(tree.skipped) if tree is not None else [],
    }


def _described(tokens: Tokens, prices: PriceTable | None, partial: bool) -> str:
    """`describe`, its cost unknown when sessions of the sum were not counted (a partial sum
    is no price)."""
    if not (partial and prices):
        return describe(tokens, prices)
    return describe(tokens) + (", cost unknown" if tokens.calls + tokens.unknown_calls else "")


async def session_view(side: ReadSide, session_id: str, before: int | None = None) -> JsonObject:
    """A session's transcript entries, each with its rendered lines (runtime/hosts/transcript.py),
    at most `PAGE_EVENTS` of them: a log that long or longer shows its last `PAGE_EVENTS` events
    (or those before seq `before`), read from the window's first seq (`SessionQuery.read_from`:
    on PostgreSQL only those rows; a log file is scanned but only the window is decoded into a
    transcript), with links to the events before and after it. A shorter log is observed whole
    as `show` does. Raises what `observe_session`, the store and the transcript raise (the app
    maps them to pages)."""
    try:
        info, held = await side.query.stat(session_id)
    except StorageError:
        info, held = None, False  # the observation below meets it again and says it as before
    count = int(info.event_count) if info is not None and info.damage is None and info.header is not None else None
    if count is None or (before is None and count <= PAGE_EVENTS):
        return await _whole_view(side, session_id)
    assert info is not None and info.header is not None  # `count` says so
    header = info.header
    end = count if before is None else min(max(before, 0), count)
    start = max(0, end - PAGE_EVENTS)
    try:
        inherited_count, events = await _window(side, session_id, start, end)
    except StorageError:  # gone or unreachable since the stat: the observation says which, as before
        return await _whole_view(side, session_id)
    prices, _problem = _prices()
    entries = transcript(
        events,
        session_id=session_id,
        inherited_event_count=inherited_count,
        inherited_from=header.parent_session,
        held=held and before is None,
        prices=prices,
    )
    if start > 0 or end < count:  # a window: a cut's marker outside it, and part of a turn's usage, left out
        entries = _windowed(entries, start, inherited_count, last=end >= count)
    now = _now_ms()
    return {
        **_facts(header, session_id, now, last=info.last_time or None, count=count, held=held),
        "entries": [_shown(entry, inherited_count) for entry in entries],
        "turn_usage": _turn_usage(entries),
        "first": start,
        "end": end,
        "earlier": start if start > 0 else None,
        "later": None if end >= count else min(end + PAGE_EVENTS, count),
        "latest": end >= count,
    }


PAGE_EVENTS = 200  # events a session page shows at most


async def _window(side: ReadSide, session_id: str, start: int, end: int) -> tuple[int, list[Event]]:
    """The session's inherited event count and its events `[start, end)`: from a log file, only
    the records holding them are decoded (`FileLogStore.read_window`); elsewhere, or when the
    file does not split as expected, `SessionQuery.read_from` (PostgreSQL reads from a seq)."""
    store = side.log_store
    if isinstance(store, FileLogStore) and start < end:

        def read() -> tuple[int, list[Event]] | None:
            handle = store.open_read(session_id)
            try:
                window = store.read_window(handle, start, end)
                return None if window is None else (handle.inherited_event_count, window)
            finally:
                store.close(handle)

        found = await trio.to_thread.run_sync(read)
        if found is not None:
            return found
    inherited_count, events = await side.query.read_from(session_id, start)
    return inherited_count, [e for e in events if e.seq < end]


async def _whole_view(side: ReadSide, session_id: str) -> JsonObject:
    """A session observed whole (a short log; or one the stat could not place: its damage or
    absence is raised here as the page's error)."""
    prices, _problem = _prices()
    async with side.query.observe_session(session_id) as observation:
        header = observation.header
        entries = transcript(
            observation.events,
            session_id=session_id,
            inherited_event_count=observation.inherited_event_count,
            inherited_from=header.parent_session,
            held=observation.held,
            prices=prices,
        )
        last = observation.events[-1].time if observation.events else None
        count = len(observation.events)
        inherited_count = observation.inherited_event_count
        held = observation.held
    return {
        **_facts(header, session_id, _now_ms(), last=last, count=count, held=held),
        "entries": [_shown(entry, inherited_count) for entry in entries],
        "turn_usage": _turn_usage(entries),
        "first": 0,
        "end": count,
        "earlier": None,
        "later": None,
        "latest": True,
    }


def _facts(header: SessionHeader, session_id: str, now: int, *, last: int | None, count: int, held: bool) -> JsonObject:
    return {
        "id": session_id,
        "parent": header.parent_session,
        "origin": header.origin,
        "depth": header.delegation_depth,
        "agent_type": header.agent_preset,
        "created": moment(header.created_at, now),
        "last_event": moment(last, now),
        "events": count,
        "held": held,
    }


def _shown(entry: JsonObject, inherited_count: int) -> JsonObject:
    kind = str(entry["type"])
    seq = entry.get("seq")
    return {
        "seq": seq,
        "type": kind,
        "lines": render([entry]),
        # A fork's copy of its parent's event (its seq below the inherited cut).
        "inherited": isinstance(seq, int) and seq < inherited_count,
        "in_doubt": bool(entry.get("in_doubt")),
    }


def _windowed(entries: list[JsonObject], start: int, inherited_count: int, *, last: bool) -> list[JsonObject]:
    """`entries` of a window of the log from seq `start`: the `inherited` and `own` markers go
    when the window holds only own events; a turn begun before the window loses its usage (the
    window holds part of its calls), and so does one that ends after it unless the window is the
    log's `last` (its open turn's usage is as far as it went); the window's total goes too (the
    tree page has the session's)."""
    started = {e.get("turn") for e in entries if e["type"] == "turn/start"}
    ended = {e.get("turn") for e in entries if e["type"] == "turn/end"}
    whole = started if last else started & ended
    out = []
    for entry in entries:
        kind = entry["type"]
        if kind in ("inherited", "own") and start >= inherited_count:
            continue
        if kind == "turn/end" and entry.get("turn") not in whole and "usage" in entry:
            entry = {k: v for k, v in entry.items() if k != "usage"}
        if kind == "usage":
            turns = entry["turns"]
            kept = (
                [t for t in turns if isinstance(t, dict) and t.get("turn") in whole] if isinstance(turns, list) else []
            )
            entry = {"type": "usage", "turns": kept, "total": None}
        out.append(entry)
    return out


def _turn_usage(entries: list[JsonObject]) -> list[JsonObject]:
    """Each turn's usage as the transcript's last entry sums it (a window: its whole turns)."""
    last = entries[-1] if entries else None
    turns = last.get("turns") if last is not None and last["type"] == "usage" else None
    out = []
    for item in turns if isinstance(turns, list) else []:
        tokens = Tokens.from_json(item)
        if isinstance(item, dict) and tokens is not None:
            cost = item.get("cost", ...)
            priced = "" if cost is ... else f", cost {format_cost(cost if isinstance(cost, (int, float)) else None)}"
            out.append({"turn": item.get("turn"), "usage": describe(tokens) + priced})
    return out
