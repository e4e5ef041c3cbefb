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

from ...delegation.agents_text import state_word
from ...delegation.listing import ChildRow
from ...delegation.listing_rows import last_event_ms
from ...usage import Tokens, TreeUsage, describe
from ...usage_totals import own_totals, tree_totals
from ..cli.common import iso_time
from ..transcript import render, transcript

if TYPE_CHECKING:
    from ...foundation.json_values import JsonObject
    from ...query import SessionRecord
    from ...read_side import ReadSide

__all__ = ["PAGE_SIZE", "Moment", "overview", "roots_page", "session_view", "subtree"]

PAGE_SIZE = 50  # roots per tree page
RECENT = 20  # sessions on the overview
QUIET_PARENTS = 10  # parents whose children the overview lists to find the stalled ones


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


async def overview(side: ReadSide) -> JsonObject:
    """Counts by state, the most recent sessions and the stalled children (those of the parents
    of the running sessions that have been quiet longest: a bounded number of listings)."""
    records = await side.query.list_sessions(probe_locks=True)
    now = _now_ms()
    held = [r.id for r in records if r.held]
    runners = await side.query.holders(held) if held else {}
    counts = Counter(state_of(r) for r in records)
    recent = sorted(records, key=lambda r: last_event_ms(r) or 0, reverse=True)[:RECENT]
    stall_ms = side.listing.stall_after_ms
    quiet = [
        r
        for r in records
        if (r.live or r.held)
        and r.header is not None
        and r.header.parent_session is not None
        and now - (last_event_ms(r) or now) > stall_ms
    ]
    parents = list(dict.fromkeys(str(r.header.parent_session) for r in quiet if r.header is not None))
    stalled: list[JsonObject] = []
    for parent in parents[:QUIET_PARENTS]:
        for row in await side.listing.list_children(parent):
            if isinstance(row, ChildRow) and row.liveness is not None:
                stalled.append(child_row(row, now, parent))
    return {
        "hosts": await _hosts(side, now),
        "total": len(records),
        "roots": sum(1 for r in records if r.header is not None and r.header.parent_session is None),
        "counts": sorted(counts.items()),
        "recent": [record_row(r, now, runners) for r in recent],
        "stalled": stalled,
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
    ancestor."""
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
    rows = []
    for r in shown:
        row = record_row(r, now, runners)
        row["descendants"] = below.get(r.id, 0)
        rows.append(row)
    return {"rows": rows, "page": page, "pages": pages, "roots": len(roots)}


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
    with its own usage and its subtree's, and the root's: from the usage cells and checkpoint
    rows of these sessions only (a log is read only when neither answers)."""
    now = _now_ms()
    listed = await side.listing.list_descendants(root_id, require_parent=True)
    # The records of the corpus the listing was made of: no second listing.
    records = [r for r in (side.query.recorded(sid) for sid in [root_id, *(row.id for row in listed)]) if r is not None]
    own = await own_totals(side.query, records)
    trees = tree_totals(records, own)
    rows: list[JsonObject] = []
    for row in listed:
        if isinstance(row, ChildRow):
            shown = child_row(row, now)
            shown |= _usage(own.get(row.id), trees.get(row.id))
            rows.append(shown)
        else:
            rows.append(
                {"id": row.id, "kind": "diagnostic", "reason": row.reason, "parent": row.parent_id, "depth": row.depth}
            )
    return {"rows": rows, **_usage(own.get(root_id), trees.get(root_id))}


def _usage(own: Tokens | None, tree: TreeUsage | None) -> JsonObject:
    return {
        "usage": describe(own) if own is not None else None,
        "tree_usage": None if tree is None or tree.sessions <= 1 else describe(tree.total),
        "tree_skipped": list(tree.skipped) if tree is not None else [],
    }


async def session_view(side: ReadSide, session_id: str) -> JsonObject:
    """A session's transcript entries, each with its rendered lines (runtime/hosts/transcript.py);
    raises what `observe_session` and the transcript raise (the app maps them to pages)."""
    async with side.query.observe_session(session_id) as observation:
        header = observation.header
        entries = transcript(
            observation.events,
            session_id=session_id,
            inherited_event_count=observation.inherited_event_count,
            inherited_from=header.parent_session,
            held=observation.held,
        )
        last = observation.events[-1].time if observation.events else None
        count = len(observation.events)
    now = _now_ms()
    shown = []
    inherited = False
    for entry in entries:
        kind = str(entry["type"])
        if kind == "inherited":
            inherited = True
        elif kind == "own":
            inherited = False
        shown.append(
            {
                "seq": entry.get("seq"),
                "type": kind,
                "lines": render([entry]),
                "inherited": inherited and kind != "inherited",
            }
        )
    return {
        "id": session_id,
        "parent": header.parent_session,
        "origin": header.origin,
        "depth": header.delegation_depth,
        "created": moment(header.created_at, now),
        "last_event": moment(last, now),
        "events": count,
        "held": observation.held,
        "entries": shown,
    }
