"""The read-only listings: `children`, `agents`, `sessions` (with usage) and `show` (README,
"The CLI").

Each opens a read side (runtime/read_side.py), reads one state of the store through its session
query and listing, and prints it; nothing is written but the index (a cache). A session that is
not there is a usage error (exit 2); a damaged log `show` cannot read is one line naming the
seq or byte offset (exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from subagents.storage import StorageError, StoreUnreachable, SubagentsError

from ...delegation.agents_text import render_agents, state_word
from ...delegation.listing import ChildRow
from ...delegation.listing_rows import ELSEWHERE, HERE, last_event_ms, session_liveness, stored_turns
from ...delegation.listing_stall import configured_stall_after
from ...delegation.units import TIMING_UNIT
from ...foundation.errors import CommandFailed, QuerySessionNotFound, SessionQueryError, SubagentError, UsageError
from ...foundation.pricing import PriceTable, load_prices
from ...read_side import open_read_side
from ...usage import TreeUsage, cost_of, usage_of
from ...usage_totals import own_totals, tree_json, tree_totals, with_descendants
from ..transcript import render, transcript, tree_entry
from .common import cell_text, iso_time, table_lines

if TYPE_CHECKING:
    from ...delegation.listing_rows import Liveness, Row
    from ...foundation.json_values import JsonObject
    from ...query import SessionQuery, SessionRecord

__all__ = ["children_command", "sessions_command", "show_command"]


async def children_command(args: argparse.Namespace) -> int:
    rows, created = await _list(args)
    if args.command == "agents":
        # Nothing runs in this process: a continuable child is `running` when another process
        # holds it (the listing says so), `ready` otherwise.
        running = {row.id for row in rows if isinstance(row, ChildRow) and row.activity == "running"}
        print(render_agents(rows, args.descendants, lambda sid: "running" if sid in running else "ready"))
    elif args.json:
        print(json.dumps([row.to_json(liveness=True) for row in rows], ensure_ascii=False))
    else:
        _print_table(rows, args.descendants, created)
    return 0


async def _list(args: argparse.Namespace) -> tuple[list[Row], dict[str, int]]:
    # One parent's children (or one root's descendants) need no more than line 1 of the logs
    # that line 1 places elsewhere.
    stall_after = configured_stall_after()  # subagents.toml's, or 5 minutes (a bad value: exit 2)
    async with open_read_side(
        args.root, store=args.store, focus=args.parent_id, subtree=args.descendants, stall_after=stall_after
    ) as runtime:
        try:
            # A parent the corpus has no record of is `ListingParentNotFound` (a usage error).
            if args.descendants:
                rows = await runtime.listing.list_descendants(args.parent_id, require_parent=True)
            else:
                rows = await runtime.listing.list_children(args.parent_id, require_parent=True)
        except (SessionQueryError, SubagentError) as exc:
            raise UsageError(exc.message) from None
        # Creation times from the very corpus the listing was made of (no second listing).
        created = {}
        for row in rows:
            record = runtime.query.recorded(row.id)
            if record is not None and record.header is not None:
                created[row.id] = record.header.created_at
    return list(rows), created


async def sessions_command(args: argparse.Namespace) -> int:
    stall_after = configured_stall_after()  # as `children` (a bad value: exit 2)
    async with open_read_side(args.root, store=args.store) as runtime:
        try:
            records = await runtime.query.list_sessions(probe_locks=True)
        except SessionQueryError as exc:
            raise UsageError(exc.message) from None
        # Usage (JSON only): own totals from cells and checkpoint rows (a log is read only when
        # neither answers), tree totals summed from those over the corpus's lineage, no more reads.
        own = await own_totals(runtime.query, records) if args.json else {}
        # Who runs the sessions another process holds (one more probe, only when any is held).
        held = [r.id for r in records if r.held]
        runners = await runtime.query.holders(held) if held else {}
        liveness = await _liveness(runtime.query, records, round(stall_after * 1000))
    rows = [_session_row(r, runners.get(r.id), liveness.get(r.id)) for r in records]
    if args.json:
        trees = tree_totals(records, own)
        prices = _prices()
        for row in rows:
            tokens, tree = own.get(row["id"]), trees.get(row["id"])
            row["usage"] = None if tokens is None else tokens.to_json()
            row["tree_usage"] = None if tree is None else tree_json(tree)
            if prices:  # derived from the usage and the models recorded (null: unknown)
                row["cost"] = None if tokens is None else cost_of(tokens, prices)
                row["tree_cost"] = None if tree is None or tree.skipped else cost_of(tree.total, prices)
        print(json.dumps(rows, ensure_ascii=False))
        return 0
    if not rows:
        print("(no sessions)")
        return 0
    cells = []
    for row in rows:
        # `stalled` (it runs) and `orphaned` (nobody does) in place of `live`/`persisted`.
        word = str(row.get("liveness") or ("live" if row["live"] else "persisted"))
        state = f"{word} ({row['runner']})" if row["live_elsewhere"] else word
        last = row["last_event"]
        cells.append(
            [
                row["id"],
                iso_time(row["created"]),
                row["origin"] or "-",
                row["parent"] or "-",
                cell_text(row["depth"]),
                cell_text(row["events"]),
                state,
                iso_time(last if isinstance(last, int) else None),
                row["damage"] or "-",
            ]
        )
    header = ["ID", "CREATED", "ORIGIN", "PARENT", "DEPTH", "EVENTS", "STATE", "LAST EVENT", "DAMAGE"]
    print("\n".join(table_lines(header, cells)))
    return 0


def _prices() -> PriceTable | None:
    """`[prices]` of subagents.toml for the costs shown; a table that cannot be used is named on
    stderr and the costs are left out (a read-only command still shows what it can)."""
    try:
        return load_prices()
    except ValueError as exc:
        print(f"subagents: costs not shown: {exc}", file=sys.stderr)
        return None


async def _liveness(query: SessionQuery, records: Sequence[SessionRecord], stall_after_ms: int) -> dict[str, Liveness]:
    """`stalled`/`orphaned` of the subagent sessions (issue 29 item 4; only a child's
    `subagent_timing` unit tells an open turn) from their stored timing rows, read in one
    query; one clock reading. A child without such a row (a damaged index lost it, or it was
    checkpointed before the unit existed) is observed — its log read once, its rows written
    back — so a damaged index never changes the answer (the index is a cache)."""
    children = [
        r
        for r in records
        if r.header is not None and r.header.origin == "subagent" and r.damage is None and r.event_count
    ]
    if not children:
        return {}
    rows = await query.checkpoint_rows([r.id for r in children], (TIMING_UNIT.key,))
    turns = stored_turns(children, rows)
    proved = []
    for record in children:
        if record.id in turns:
            continue
        try:
            async with query.observe_session(record.id) as seen:
                if seen.observed is not None:
                    proved.append(seen.observed)
                turns[record.id] = (seen.turn_open, record.event_count - 1 if record.event_count else -1)
        except SessionQueryError:
            continue  # unreadable now: its row says what it can next time
    if proved:
        await query.write_observed(proved)  # the index is a cache: never an error
    now = time.time_ns() // 1_000_000
    out = {}
    for record in children:
        said = session_liveness(record, turns.get(record.id), now, stall_after_ms)
        if said is not None:
            out[record.id] = said
    return out


def _session_row(record: SessionRecord, runner: str | None = None, liveness: Liveness | None = None) -> JsonObject:
    header = record.header
    row: JsonObject = {
        "id": record.id,
        "created": header.created_at if header is not None else None,
        "origin": header.origin if header is not None else None,
        "parent": header.parent_session if header is not None else None,
        "depth": header.delegation_depth if header is not None else None,
        "events": record.event_count,
        "live": record.live or record.held,
        "live_elsewhere": record.held,  # another process holds its lock
        "persisted": record.persisted,
        "damage": record.damage,
        # Issue 29: the time its last durable event carries, and who runs it while it is live.
        "last_event": last_event_ms(record),
        "runner": (runner or ELSEWHERE) if record.held else HERE if record.live else None,
    }
    if liveness is not None:  # issue 29: `stalled` (it runs) or `orphaned` (nobody does), only when so
        row["liveness"] = liveness
    return row


async def show_command(args: argparse.Namespace) -> int:
    async with open_read_side(args.root, store=args.store) as runtime:
        try:
            prices = _prices()
            async with runtime.query.observe_session(args.session_id) as observation:
                entries = transcript(
                    observation.events,
                    session_id=args.session_id,
                    inherited_event_count=observation.inherited_event_count,
                    inherited_from=observation.header.parent_session,
                    held=observation.held,
                    prices=prices,
                )
                own = usage_of(observation.events, observation.inherited_event_count)[1]
            # The subtree's total, as `sessions --json` and chat `/usage` give it: its
            # descendants' own totals from their cells and checkpoint rows.
            try:
                tree: TreeUsage | str = await with_descendants(runtime.query, runtime.listing, args.session_id, own)
            except SubagentsError as exc:  # a tree that cannot be listed: the transcript still shows
                tree = getattr(exc, "message", None) or str(exc)
            if isinstance(tree, str) or tree.sessions > 1 or tree.skipped:
                entries.append(tree_entry(tree, prices))
        except QuerySessionNotFound:
            raise UsageError(f'session "{args.session_id}" not found') from None
        except SessionQueryError as exc:
            if isinstance(exc.__cause__, StoreUnreachable):  # the store did not answer: as a refused connection
                raise UsageError(exc.message) from None
            raise CommandFailed(exc.message) from None  # damaged, unsupported, unreadable
        except StorageError as exc:  # a payload the transcript could not decode
            seq = getattr(exc, "seq", None)
            at = f" (seq {seq})" if seq is not None and f"seq {seq}" not in str(exc) else ""
            raise CommandFailed(f"{exc}{at}") from None
    if args.json:
        print(json.dumps(entries, ensure_ascii=False))
    else:
        print("\n".join(render(entries)))
    return 0


def _print_table(rows: Sequence[Row], descendants: bool, created: dict[str, int]) -> None:
    if not rows:
        print("(no subagents)")
        return
    header = [
        "ID",
        *(["PARENT", "DEPTH"] if descendants else []),
        "STATE",
        "MODE",
        "CREATED",
        "LAST EVENT",
        "RUNNER",
        "CHILDREN",
        "LABEL",
    ]
    cells = []
    for row in rows:
        where = [row.parent_id, str(row.depth)] if descendants else []
        when = iso_time(created.get(row.id))
        if isinstance(row, ChildRow):
            children = "yes" if row.has_children else "no"
            # The words `agents` uses (the JSON keeps the SPEC's `activity`, and says `liveness`).
            state = state_word(row, "running" if row.activity == "running" else "ready")
            state += f", {row.in_doubt} in doubt" if row.in_doubt > 0 else ""
            last = iso_time(row.last_event)
            runner = cell_text(row.runner)
            cells.append([row.id, *where, state, row.mode, when, last, runner, children, cell_text(row.label)])
        else:
            cells.append([row.id, *where, f"diagnostic: {row.reason}", "-", when, "-", "-", "-", "-"])
    print("\n".join(table_lines(header, cells)))
