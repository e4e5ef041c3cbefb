"""Token usage (SPEC §8): the sums of the `usage` records of `assistant/message` events, per
turn, per session and per tree.

Only a session's own suffix counts (seq >= `inherited_event_count`): a fork or a seeded child
replays its parent's prefix, whose model calls its parent already counts. `calls` is the number
of `assistant/message` events (model replies recorded) and `reported` how many of them carried a
usage record, so a model that reports none shows as such instead of as zero tokens.
`unknown_calls` counts the model calls a crash cut before their reply was recorded (a
`turn/continue` with `lost_model_call`, docs/format.md "Continued turns"): their usage is
unknown, and is shown as unknown (`+1 call unknown`), never as zero.

Two ways in, one arithmetic:
- `usage_of(events, inherited_event_count)` is the pure fold a reader with the events uses: per
  turn and for the session (`show`, `chat /usage`).
- the `usage` projection unit (`USAGE_UNIT`) keeps only the session's totals — constant-size state,
  so a checkpoint row stays small however long the session runs: a live session answers from its
  cell and a cold one from its checkpoint row (written at every turn end), without reading its log.
  `own_totals` takes that path for many sessions at once (`sessions --json`, `tree_usage`), and
  reads a log only when neither answers (an old session, a stale row).

Bad data never raises here: a payload that does not decode, or a usage record that is not two
non-negative ints, is not counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, cast

import attrs
import msgspec
import trio
from subagents.actors import ActorStopped, ReadGroup, snapshot_all
from subagents.storage import Event, Offset, SessionHeader

from .delegation.lineage import same_lifecycle
from .delegation.listing import DiagnosticRow, ListingService
from .foundation.errors import SessionQueryError
from .query import SessionQuery, SessionRecord

__all__ = [
    "USAGE_UNIT",
    "SessionUsage",
    "Tokens",
    "TreeUsage",
    "UsageUnit",
    "describe",
    "own_totals",
    "tree_json",
    "tree_totals",
    "session_usage",
    "tree_usage",
    "usage_lines",
    "usage_of",
]

ASSISTANT: Final = "assistant/message"
CONTINUE: Final = "turn/continue"


@attrs.frozen(kw_only=True)
class Tokens:
    """Token counts summed over `calls` model replies, `reported` of which carried usage."""

    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0
    reported: int = 0
    unknown_calls: int = 0  # model calls lost to a crash: their usage is unknown
    # Prompt-cache counts (apart from `input_tokens`, as a model call's usage records them).
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            calls=self.calls + other.calls,
            reported=self.reported + other.reported,
            unknown_calls=self.unknown_calls + other.unknown_calls,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )

    def to_json(self) -> dict[str, int]:
        out = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "calls": self.calls,
            "reported": self.reported,
        }
        if self.unknown_calls:  # only when there are some: the common shape stays as it was
            out["unknown_calls"] = self.unknown_calls
        for key in ("cache_read_tokens", "cache_write_tokens"):  # likewise
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_json(cls, value: object) -> Tokens | None:
        """The counts of a `to_json` object (a unit view or checkpoint state), or None for any
        other shape (a tampered row is a miss, never an error)."""
        if type(value) is not dict:
            return None
        counts = [value.get(k) for k in ("input_tokens", "output_tokens", "calls", "reported")]
        if any(type(c) is not int or c < 0 for c in counts):
            return None
        ints = cast("list[int]", counts)  # each checked above
        optional = [value.get(k, 0) for k in ("unknown_calls", "cache_read_tokens", "cache_write_tokens")]
        if any(type(c) is not int or c < 0 for c in optional):
            return None
        unknown, cache_read, cache_write = cast("list[int]", optional)
        return cls(
            input_tokens=ints[0],
            output_tokens=ints[1],
            calls=ints[2],
            reported=ints[3],
            unknown_calls=unknown,
            cache_read_tokens=cache_read,
            cache_write_tokens=cache_write,
        )


@attrs.frozen(kw_only=True)
class SessionUsage:
    """One session's own usage: per turn (turn number → tokens, ascending) and in total."""

    session_id: str
    turns: tuple[tuple[int, Tokens], ...]
    total: Tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "turns": [{"turn": turn, **tokens.to_json()} for turn, tokens in self.turns],
            "total": self.total.to_json(),
        }


@attrs.frozen(kw_only=True)
class TreeUsage:
    """A session and its subagent descendants: `total` over the `sessions` counted (the root
    included); `skipped` names the descendants that could not be read (damaged, unavailable),
    which are not counted."""

    session_id: str
    own: Tokens
    total: Tokens
    sessions: int
    skipped: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "own": self.own.to_json(),
            "total": self.total.to_json(),
            "sessions": self.sessions,
            "skipped": list(self.skipped),
        }


def describe(tokens: Tokens) -> str:
    """One line for people: `120 in, 30 out tokens (2 model calls)`, or `not reported (2 model
    calls)` when no reply carried usage; a partial report says how many did."""
    calls = f"{tokens.calls} model call{'s' if tokens.calls != 1 else ''}"
    n = tokens.unknown_calls
    unknown = f" +{n} call{'s' if n != 1 else ''} unknown" if n else ""
    if tokens.reported == 0:
        return f"not reported ({calls}){unknown}"
    partly = f", {tokens.reported} reporting" if tokens.reported != tokens.calls else ""
    cache = ""
    if tokens.cache_read_tokens or tokens.cache_write_tokens:
        cache = f", cache {tokens.cache_read_tokens} read, {tokens.cache_write_tokens} written"
    return f"{tokens.input_tokens} in, {tokens.output_tokens} out tokens{cache} ({calls}{partly}){unknown}"


def usage_lines(session: SessionUsage, tree: TreeUsage | None = None) -> list[str]:
    """What a host shows for `/usage`: a line per turn, the session's total and, given the tree,
    its total (naming the descendants it skipped)."""
    lines = [f"turn {turn}: {describe(tokens)}" for turn, tokens in session.turns]
    lines.append(f"session {session.session_id}: {describe(session.total)}")
    if tree is not None:
        others = tree.sessions - 1
        line = f"with {others} subagent{'s' if others != 1 else ''}: {describe(tree.total)}"
        if tree.skipped:
            line += f"; skipped (unreadable): {', '.join(tree.skipped)}"
        lines.append(line)
    return lines


# --- the pure fold ------------------------------------------------------------------------------


class _Counts(msgspec.Struct):
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class _Reply(msgspec.Struct):
    """The two keys of an `assistant/message` payload usage needs (the rest is not decoded)."""

    turn: int
    usage: _Counts | None = None


_reply = msgspec.json.Decoder(_Reply)


class _Continue(msgspec.Struct):
    """The two keys of a `turn/continue` payload usage needs."""

    turn: int
    lost_model_call: bool = False


_continue = msgspec.json.Decoder(_Continue)


def _lost_call(event: Event) -> int | None:
    """The turn of a `turn/continue` that lost a model call, else None (a bad payload too)."""
    try:
        marker = _continue.decode(event.data)
    except (msgspec.DecodeError, RecursionError):
        return None
    return marker.turn if marker.lost_model_call is True else None


def _read(event: Event) -> tuple[int, int, int, int, int] | None:
    """(turn, input, output, cache read, cache written) of an assistant message — (turn, -1, -1,
    0, 0) when it has no usable usage record — or None when its payload does not decode."""
    try:
        reply = _reply.decode(event.data)
    except (msgspec.DecodeError, RecursionError):
        return None
    usage = reply.usage
    if usage is None or min(usage.input_tokens, usage.output_tokens) < 0:
        return (reply.turn, -1, -1, 0, 0)
    cache_read, cache_write = max(usage.cache_read_tokens, 0), max(usage.cache_write_tokens, 0)
    return (reply.turn, usage.input_tokens, usage.output_tokens, cache_read, cache_write)


def _own_replies(events: Iterable[Event], own_from: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(turn, input, output, cache read, cache written tokens) of each readable `assistant/message`
    at or after seq `own_from`; input and output are -1 when the reply carries no usage record,
    -2 for a model call a crash lost (a `turn/continue` with `lost_model_call`)."""
    for event in events:
        if event.seq < own_from:
            continue
        if event.type == ASSISTANT:
            read = _read(event)
            if read is not None:
                yield read
        elif event.type == CONTINUE:
            turn = _lost_call(event)
            if turn is not None:
                yield (turn, -2, -2, 0, 0)


def _count(counts: list[int], reply: tuple[int, int, int, int, int]) -> None:
    """Add one reply to `[input, output, calls, reported, unknown, cache read, cache written]`."""
    _turn, tokens_in, tokens_out, cache_read, cache_write = reply
    if tokens_in == -2:
        counts[4] += 1
        return
    counts[2] += 1
    if tokens_in >= 0:
        counts[0] += tokens_in
        counts[1] += tokens_out
        counts[3] += 1
        counts[5] += cache_read
        counts[6] += cache_write


def _tokens(c: Sequence[int]) -> Tokens:
    return Tokens(
        input_tokens=c[0],
        output_tokens=c[1],
        calls=c[2],
        reported=c[3],
        unknown_calls=c[4],
        cache_read_tokens=c[5],
        cache_write_tokens=c[6],
    )


def usage_of(events: Iterable[Event], inherited_event_count: int = 0) -> tuple[dict[int, Tokens], Tokens]:
    """Usage per turn and in total over the own suffix of a session's `events` (seq >=
    `inherited_event_count`). Pure; never raises on bad payloads (they are not counted)."""
    per_turn: dict[int, list[int]] = {}
    for reply in _own_replies(events, inherited_event_count):
        _count(per_turn.setdefault(reply[0], [0] * 7), reply)
    turns = {turn: _tokens(c) for turn, c in sorted(per_turn.items())}
    return turns, sum(turns.values(), Tokens())


# --- the projection unit ------------------------------------------------------------------------


class UsageUnit:
    """The `usage` unit: a session's own token totals. State `{own_from: K, input_tokens,
    output_tokens, calls, reported}` (plus `unknown_calls` and the cache counts when not 0); the
    view is the counts (`Tokens.to_json`)."""

    key = "usage"
    state_version = 1
    types: Final = frozenset({ASSISTANT, CONTINUE})

    def initial(self, header: SessionHeader, inherited_event_count: Offset) -> dict[str, int]:
        return {"own_from": inherited_event_count, **Tokens().to_json()}

    def apply(self, state: dict[str, int], event: Event) -> dict[str, int]:
        if event.type not in self.types:
            return state
        return self.fold(state, (event,))

    def fold(self, state: dict[str, int], events: Sequence[Event]) -> dict[str, int]:
        """The left fold of `apply` over contiguous events, counted in locals and built once (a
        long read costs one decode per reply, not a new state per reply)."""
        own_from = state.get("own_from") if type(state) is dict else None
        if type(own_from) is not int:
            return state  # not a state this unit made: left as it is
        t = Tokens.from_json(state) or Tokens()
        counts = [
            t.input_tokens,
            t.output_tokens,
            t.calls,
            t.reported,
            t.unknown_calls,
            t.cache_read_tokens,
            t.cache_write_tokens,
        ]
        changed = False
        for reply in _own_replies(events, own_from):
            changed = True
            _count(counts, reply)
        if not changed:
            return state
        return {"own_from": own_from, **_tokens(counts).to_json()}

    def view(self, state: dict[str, int]) -> dict[str, int]:
        return (Tokens.from_json(state) or Tokens()).to_json()


USAGE_UNIT: Final = UsageUnit()


# --- reading it ---------------------------------------------------------------------------------


async def session_usage(query: SessionQuery, session_id: str) -> SessionUsage:
    """`session_id`'s own usage, per turn and in total, from its events (a live session's durable
    events, or its log). Raises the query's `SessionQueryError` (not found, damaged, ...)."""
    async with query.observe_session(session_id) as seen:
        turns, total = usage_of(seen.events, seen.inherited_event_count)
    return SessionUsage(session_id=session_id, turns=tuple(turns.items()), total=total)


OBSERVERS = 8  # sessions `own_totals` reads at once when no cell or row answers


async def own_totals(query: SessionQuery, records: Sequence[SessionRecord]) -> dict[str, Tokens | None]:
    """Each record's own totals (None: damaged or unreadable), keyed by id: a live session from
    its `usage` cell, a cold one from a checkpoint row of its lifecycle that covers its whole log,
    else one observation (at most `OBSERVERS` at once, their reads in one group). Never raises
    for one session's trouble."""
    out: dict[str, Tokens | None] = {}
    live_refs, live_ids, cold = [], [], []
    for record in records:
        ref = query.sessions.get(record.id) if record.live else None
        if ref is not None:
            live_refs.append(ref)
            live_ids.append(record.id)
        elif record.damage is not None or record.header is None:
            out[record.id] = None
        elif record.event_count is not None and record.event_count <= record.inherited_event_count:
            out[record.id] = Tokens()  # no own events: nothing to read
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
                out[sid] = Tokens.from_json(answer.get(USAGE_UNIT.key))
    observe = []
    if cold:
        rows = await query.checkpoint_rows([r.id for r in cold], [USAGE_UNIT.key])
        for record in cold:
            found = _from_rows(record, rows.get(record.id, ()))
            if found is None:
                observe.append(record)
            else:
                out[record.id] = found
    if observe:
        group = ReadGroup()
        limiter = trio.CapacityLimiter(OBSERVERS)

        async def observe_one(record: SessionRecord) -> None:
            async with limiter:
                try:
                    async with query.observe_session(record.id, group=group) as seen:
                        out[record.id] = Tokens.from_json(seen.projections.get(USAGE_UNIT.key))
                except SessionQueryError:
                    out[record.id] = None

        async with trio.open_nursery() as nursery:
            for record in observe:
                nursery.start_soon(observe_one, record)
    return {r.id: out.get(r.id) for r in records}


def _from_rows(record: SessionRecord, rows: Iterable[Any]) -> Tokens | None:
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
                return Tokens.from_json(value)
    return None


async def tree_usage(query: SessionQuery, listing: ListingService, session_id: str) -> TreeUsage:
    """`session_id`'s own usage plus that of every subagent below it (`listing.list_descendants`).
    A descendant that is damaged or cannot be read is named in `skipped`, never an error. Raises
    the query's `SessionQueryError` when `session_id` itself cannot be read, and the listing's
    errors when the tree cannot be listed."""
    root = await session_usage(query, session_id)
    rows = await listing.list_descendants(session_id)
    corpus: dict[str, SessionRecord] = {r.id: r for r in await query.list_sessions()}
    skipped = [row.id for row in rows if isinstance(row, DiagnosticRow) or row.id not in corpus]
    wanted = [corpus[row.id] for row in rows if row.id not in skipped]
    totals = await own_totals(query, wanted)
    total, counted = root.total, 1
    for sid, tokens in totals.items():
        if tokens is None:
            skipped.append(sid)
        else:
            total, counted = total + tokens, counted + 1
    return TreeUsage(session_id=session_id, own=root.total, total=total, sessions=counted, skipped=tuple(skipped))


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
