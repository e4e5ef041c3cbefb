"""The overview's stalled and orphaned children, store-wide (issue 31), with bounded work.

From the corpus listing the overview already holds: the subagent sessions that run (here or
in another process) and whose last durable event is older than `stall_after` are the
candidates for `stalled`; their stored `subagent_timing` rows (one index query) say whether a
turn is open, and one without a covering row is observed (its log read once, its rows written
back) — at most `OBSERVED` of them per overview, the rest counted as unchecked. The children
nobody runs are `orphaned` when their stored timing row covers the log whole and says a turn
is open: one index query that returns only rows holding an open turn (`keep`). A child nobody
runs whose timing row is missing, or behind its log (an open turn's row, or — a second index
query, of the rows holding no open turn (`skip`), none of them decoded — a closed turn's), is
unknown without a read: the most recently active `OBSERVED` of them are observed (their rows
written back, so the next overview reads none of them again), the rest counted as unchecked.
So the work is one listing (already made), three index queries, one identity query for the
rows shown, and at most 2 x `OBSERVED` log reads — whatever the store's size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from ...delegation.lineage import same_lifecycle
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
    from subagents.storage import ObservedCheckpoint, SessionHeader, StoredCheckpoint

    from ...query import SessionQuery, SessionRecord

__all__ = ["OBSERVED", "Stalled", "StalledRow", "TurnMemo", "stalled_sessions"]

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
    unchecked_resting: int = 0  # children nobody runs, rows missing or behind, not observed


async def stalled_sessions(
    query: SessionQuery,
    records: Sequence[SessionRecord],
    now_ms: int,
    stall_after_ms: int,
    runners: Mapping[str, str],
    memo: TurnMemo | None = None,
) -> Stalled:
    """The stalled and orphaned children among `records` (the corpus), longest quiet first.
    `memo`: what the overviews before learned of the children nobody runs (one per console)."""
    children = [
        r
        for r in records
        if r.header is not None and r.header.origin == "subagent" and r.damage is None and r.event_count
    ]
    running = [r for r in children if (r.live or r.held) and now_ms - (last_event_ms(r) or now_ms) > stall_after_ms]
    resting = [r for r in children if not (r.live or r.held)]
    turns = stored_turns(running, await query.checkpoint_rows([r.id for r in running], [TIMING_UNIT.key]))
    unrowed = [r for r in running if r.id not in turns]
    memo = memo if memo is not None else TurnMemo()
    unknown = []
    for record in resting:
        known = memo.get(record)
        if known is None:
            unknown.append(record)
        else:
            turns[record.id] = (known, int(record.event_count or 0) - 1)
    doubtful: list[SessionRecord] = []
    if unknown:
        rows = await query.checkpoint_rows(
            [r.id for r in unknown], [TIMING_UNIT.key], keep={TIMING_UNIT.key: _OPEN_TURN}
        )
        turns |= stored_turns(unknown, rows)
        rest = [r for r in unknown if r.id not in turns]
        whole = _whole(
            rest,
            await query.checkpoint_rows([r.id for r in rest], [TIMING_UNIT.key], skip={TIMING_UNIT.key: _OPEN_TURN})
            if rest
            else {},
        )
        for record in rest:
            if record.id in whole:
                turns[record.id] = (False, int(record.event_count or 0) - 1)
        doubtful = [r for r in unknown if turns.get(r.id, (False, -1))[1] != int(r.event_count or 0) - 1]
        doubtful.sort(key=lambda r: (last_event_ms(r) or 0, r.id), reverse=True)  # the most recent first
    proved: list[ObservedCheckpoint] = []
    for record in [*unrowed[:OBSERVED], *doubtful[:OBSERVED]]:
        try:
            async with query.observe_session(record.id) as seen:
                if seen.observed is not None:
                    proved.append(seen.observed)
                turns[record.id] = (seen.turn_open, int(record.event_count or 0) - 1)
        except SessionQueryError:
            continue  # unreadable now: not said stalled or orphaned on a guess
    if proved:
        await query.write_observed(proved)  # the index is a cache: never an error
    memo.learn(resting, turns)
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
    return Stalled(
        rows=out,
        unchecked=max(0, len(unrowed) - OBSERVED),
        unchecked_resting=max(0, len(doubtful) - OBSERVED),
    )


class TurnMemo:
    """Whether the last turn of each child nobody runs is open, by log: a fact of its bytes, so
    it holds while the log has the same lifecycle and event count (a child that grew, or was made
    again, is asked again). One per console: an overview after the first asks the index only of
    the children that changed, and reads no log it read before."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[int, SessionHeader, int, bool]] = {}

    def get(self, record: SessionRecord) -> bool | None:
        known = self._known.get(record.id)
        if known is None or known[:3] != (record.event_count, record.header, record.inherited_event_count):
            return None
        return known[3]

    def learn(self, resting: Sequence[SessionRecord], turns: Mapping[str, tuple[bool, int]]) -> None:
        """Keep what `turns` says of the `resting` children's whole logs (the others, and the
        children no longer resting or listed, are dropped)."""
        known: dict[str, tuple[int, SessionHeader, int, bool]] = {}
        for record in resting:
            turn, count, header = turns.get(record.id), record.event_count, record.header
            if turn is not None and count is not None and header is not None and turn[1] == count - 1:
                known[record.id] = (count, header, record.inherited_event_count, turn[0])
        self._known = known


def _whole(records: Sequence[SessionRecord], rows: Mapping[str, Sequence[StoredCheckpoint]]) -> set[str]:
    """The records whose stored timing row of this lifecycle reaches their log's end, its value
    not decoded (rows of the query that skips open turns: a closed turn's row)."""
    out: set[str] = set()
    key, version = TIMING_UNIT.key, TIMING_UNIT.state_version
    for record in records:
        header, count = record.header, record.event_count
        if header is None or count is None:
            continue
        for row in rows.get(record.id, ()):
            if row.seq == count - 1 and row.key == key and row.ver == version:
                if same_lifecycle(row.lifecycle, header, record.inherited_event_count):
                    out.add(record.id)
    return out
