"""The overview's stalled and orphaned children, store-wide (issue 31), with bounded work.

From the corpus listing the overview already holds: the subagent sessions that run (here or
in another process) and whose last durable event is older than `stall_after` are the
candidates for `stalled`; their stored `subagent_timing` rows (one index query) say whether a
turn is open, and one without a covering row is observed (its log read once, its rows written
back) — at most `OBSERVED` of them per overview, the rest counted as unchecked. The children
nobody runs are `orphaned` when their stored timing row covers the log whole and says a turn
is open: one index query that returns only rows holding an open turn (`keep`), never a log
read. So the work is one listing (already made), two index queries, one identity query for
the rows shown, and at most `OBSERVED` log reads — whatever the store's size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from ...delegation.listing_rows import (
    ELSEWHERE,
    HERE,
    Liveness,
    last_event_ms,
    session_liveness,
    stored_identities,
    stored_turns,
)
from ...delegation.units import IDENTITY_UNIT, TIMING_UNIT
from ...foundation.errors import SessionQueryError

if TYPE_CHECKING:
    from subagents.storage import ObservedCheckpoint

    from ...query import SessionQuery, SessionRecord

__all__ = ["OBSERVED", "Stalled", "StalledRow", "stalled_sessions"]

OBSERVED = 20  # running quiet children without a timing row, observed per overview at most
_OPEN_TURN = b'"active"'  # in a timing row's JSON only while a turn is open (units.py)


@attrs.frozen(kw_only=True)
class StalledRow:
    id: str
    parent: str | None
    liveness: Liveness
    runner: str | None
    last_ms: int | None
    label: str | None
    agent_type: str | None


@attrs.frozen(kw_only=True)
class Stalled:
    rows: list[StalledRow]
    unchecked: int  # running quiet children not observed (over `OBSERVED`): not known either way


async def stalled_sessions(
    query: SessionQuery,
    records: Sequence[SessionRecord],
    now_ms: int,
    stall_after_ms: int,
    runners: Mapping[str, str],
) -> Stalled:
    """The stalled and orphaned children among `records` (the corpus), longest quiet first."""
    children = [
        r
        for r in records
        if r.header is not None and r.header.origin == "subagent" and r.damage is None and r.event_count
    ]
    running = [r for r in children if (r.live or r.held) and now_ms - (last_event_ms(r) or now_ms) > stall_after_ms]
    resting = [r for r in children if not (r.live or r.held)]
    turns = stored_turns(running, await query.checkpoint_rows([r.id for r in running], [TIMING_UNIT.key]))
    unrowed = [r for r in running if r.id not in turns]
    proved: list[ObservedCheckpoint] = []
    for record in unrowed[:OBSERVED]:
        try:
            async with query.observe_session(record.id) as seen:
                if seen.observed is not None:
                    proved.append(seen.observed)
                turns[record.id] = (seen.turn_open, int(record.event_count or 0) - 1)
        except SessionQueryError:
            continue  # unreadable now: not said stalled on a guess
    if proved:
        await query.write_observed(proved)  # the index is a cache: never an error
    if resting:
        rows = await query.checkpoint_rows(
            [r.id for r in resting], [TIMING_UNIT.key], keep={TIMING_UNIT.key: _OPEN_TURN}
        )
        turns |= stored_turns(resting, rows)
    said = []
    for record in [*running, *resting]:
        liveness = session_liveness(record, turns.get(record.id), now_ms, stall_after_ms)
        if liveness is not None:
            said.append((record, liveness))
    said.sort(key=lambda pair: (last_event_ms(pair[0]) or 0, pair[0].id))
    shown = [record for record, _ in said]
    identities = stored_identities(shown, await query.checkpoint_rows([r.id for r in shown], [IDENTITY_UNIT.key]))
    out = []
    for record, liveness in said:
        header = record.header
        identity = identities.get(record.id)
        label = identity[0].get("label") if identity is not None else None
        out.append(
            StalledRow(
                id=record.id,
                parent=header.parent_session if header is not None else None,
                liveness=liveness,
                runner=(runners.get(record.id) or ELSEWHERE) if record.held else HERE if record.live else None,
                last_ms=last_event_ms(record),
                label=label if isinstance(label, str) else None,
                agent_type=header.agent_preset if header is not None else None,
            )
        )
    return Stalled(rows=out, unchecked=max(0, len(unrowed) - OBSERVED))
