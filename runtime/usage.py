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
  `usage_totals.own_totals` takes that path for many sessions at once (`sessions --json`,
  `tree_usage`), and reads a log only when neither answers (an old session, a stale row).

Bad data never raises here: a payload that does not decode, or a usage record that is not two
non-negative ints, is not counted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

import attrs
import msgspec
from subagents.storage import Event, Offset, SessionHeader

from .foundation.budgets import TurnCount, count_turns
from .foundation.pricing import PriceTable, format_cost

__all__ = [
    "USAGE_UNIT",
    "SessionUsage",
    "Tokens",
    "TreeUsage",
    "UsageUnit",
    "cost_of",
    "describe",
    "recorded_model",
    "usage_lines",
    "usage_of",
]

if TYPE_CHECKING:
    pass

_log = logging.getLogger(__name__)

ASSISTANT: Final = "assistant/message"
CONTINUE: Final = "turn/continue"
MODEL: Final = "session/model"
TURN: Final = "turn/start"
TURN_END: Final = "turn/end"  # a budget's end of a turn with no model call: not counted
# Compaction's summary call is a model call too: its `usage` is counted in the turn its
# `compaction/start` names.
SUMMARY: Final = "compaction/summary"
COMPACTING: Final = "compaction/start"

# One model's counts: (model spec as `session/model` recorded it, "" when none was; input,
# output, cache read, cache written tokens). What cost is derived from (runtime/pricing.py).
ModelCounts = tuple[str, int, int, int, int]


def _merged(a: tuple[ModelCounts, ...], b: tuple[ModelCounts, ...]) -> tuple[ModelCounts, ...]:
    if not b:
        return a
    if not a:
        return b
    out: dict[str, list[int]] = {}
    for model, *counts in (*a, *b):
        slot = out.setdefault(model, [0, 0, 0, 0])
        for i, n in enumerate(counts):
            slot[i] += n
    return tuple((m, *c) for m, c in sorted(out.items()))  # type: ignore[misc]  # four ints each


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
    reasoning_tokens: int = 0  # of `output_tokens`, what providers reported as reasoning
    # The same reported counts by the model that made the calls (sorted by model): cost's input.
    # Not compared: two `Tokens` are equal when their counts are.
    models: tuple[ModelCounts, ...] = attrs.field(default=(), eq=False)

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            calls=self.calls + other.calls,
            reported=self.reported + other.reported,
            unknown_calls=self.unknown_calls + other.unknown_calls,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            models=_merged(self.models, other.models),
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
        for key in ("cache_read_tokens", "cache_write_tokens", "reasoning_tokens"):  # likewise
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
        optional_keys = ("unknown_calls", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")
        optional = [value.get(k, 0) for k in optional_keys]
        if any(type(c) is not int or c < 0 for c in optional):
            return None
        unknown, cache_read, cache_write, reasoning = cast("list[int]", optional)
        models = _models_from_json(value.get("models", {}))
        if models is None:
            return None
        return cls(
            input_tokens=ints[0],
            output_tokens=ints[1],
            calls=ints[2],
            reported=ints[3],
            unknown_calls=unknown,
            cache_read_tokens=cache_read,
            cache_write_tokens=cache_write,
            reasoning_tokens=reasoning,
            models=models,
        )


def _models_from_json(value: object) -> tuple[ModelCounts, ...] | None:
    """The per-model counts of a unit state (`{model: [in, out, cache read, cache written]}`),
    or None for any other shape."""
    if type(value) is not dict:
        return None
    out: list[ModelCounts] = []
    for model, counts in sorted(value.items()):
        if type(counts) is not list or len(counts) != 4 or any(type(c) is not int or c < 0 for c in counts):
            return None
        out.append((model, *counts))
    return tuple(out)


def _models_json(models: tuple[ModelCounts, ...]) -> dict[str, list[int]]:
    return {model: list(counts) for model, *counts in models}


def cost_of(tokens: Tokens, prices: PriceTable) -> float | None:
    """What `tokens` cost at `prices`, or None (unknown) when a call's usage is unknown (not
    reported, or lost to a crash) or a model that made calls has no price."""
    if tokens.reported != tokens.calls or tokens.unknown_calls:
        return None
    total = 0.0
    for model, tokens_in, tokens_out, cache_read, cache_write in tokens.models:
        price = prices.price_of(model)
        if price is None:
            return None
        total += price.cost(tokens_in, tokens_out, cache_read, cache_write)
    if sum(t[1] + t[2] + t[3] + t[4] for t in tokens.models) != (
        tokens.input_tokens + tokens.output_tokens + tokens.cache_read_tokens + tokens.cache_write_tokens
    ):
        return None  # counts from a reader that kept no models (an old checkpoint row): unknown
    return total


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


def describe(tokens: Tokens, prices: PriceTable | None = None) -> str:
    """One line for people: `120 in, 30 out tokens (2 model calls)`, or `not reported (2 model
    calls)` when no reply carried usage; a partial report says how many did. Given a price table
    (a non-empty one), `, cost $0.0012` or `, cost unknown` follows."""
    line = _describe(tokens)
    if prices and tokens.calls + tokens.unknown_calls:
        line += f", cost {format_cost(cost_of(tokens, prices))}"
    return line


def _describe(tokens: Tokens) -> str:
    calls = f"{tokens.calls} model call{'s' if tokens.calls != 1 else ''}"
    n = tokens.unknown_calls
    unknown = f" +{n} call{'s' if n != 1 else ''} unknown" if n else ""
    if tokens.reported == 0:
        return f"not reported ({calls}){unknown}"
    partly = f", {tokens.reported} reporting" if tokens.reported != tokens.calls else ""
    cache = ""
    if tokens.cache_read_tokens or tokens.cache_write_tokens:
        cache = f", cache {tokens.cache_read_tokens} read, {tokens.cache_write_tokens} written"
    reasoning = f" ({tokens.reasoning_tokens} reasoning)" if tokens.reasoning_tokens else ""
    out = f"{tokens.output_tokens} out tokens{reasoning}"
    return f"{tokens.input_tokens} in, {out}{cache} ({calls}{partly}){unknown}"


def usage_lines(session: SessionUsage, tree: TreeUsage | None = None, prices: PriceTable | None = None) -> list[str]:
    """What a host shows for `/usage`: a line per turn, the session's total and, given the tree,
    its total (naming the descendants it skipped); with prices, each line's cost."""
    lines = [f"turn {turn}: {describe(tokens, prices)}" for turn, tokens in session.turns]
    lines.append(f"session {session.session_id}: {describe(session.total, prices)}")
    if tree is not None:
        others = tree.sessions - 1
        line = f"with {others} subagent{'s' if others != 1 else ''}: {describe(tree.total, prices)}"
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
    reasoning_tokens: int = 0


class _Reply(msgspec.Struct):
    """The two keys of an `assistant/message` payload usage needs (the rest is not decoded)."""

    turn: int
    usage: _Counts | None = None


_reply = msgspec.json.Decoder(_Reply)


class _Summary(msgspec.Struct):
    """The key of a `compaction/summary` payload usage needs."""

    usage: _Counts | None = None


_summary = msgspec.json.Decoder(_Summary)


class _Turn(msgspec.Struct):
    turn: int = 0


_turn = msgspec.json.Decoder(_Turn)


def _read_summary(event: Event, turn: int) -> tuple[int, int, int, int, int, int] | None:
    """As `_read`, for a `compaction/summary`: None when it does not decode or carries no usage
    (a summary call of a version that did not record it was never counted)."""
    try:
        usage = _summary.decode(event.data).usage
    except (msgspec.DecodeError, RecursionError):
        return None
    if usage is None or min(usage.input_tokens, usage.output_tokens) < 0:
        return None
    cache_read, cache_write = max(usage.cache_read_tokens, 0), max(usage.cache_write_tokens, 0)
    reasoning = min(max(usage.reasoning_tokens, 0), usage.output_tokens)
    return (turn, usage.input_tokens, usage.output_tokens, cache_read, cache_write, reasoning)


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


def _read(event: Event) -> tuple[int, int, int, int, int, int] | None:
    """(turn, input, output, cache read, cache written, reasoning) of an assistant message —
    (turn, -1, -1, 0, 0, 0) when it has no usable usage record — or None when its payload does
    not decode."""
    try:
        reply = _reply.decode(event.data)
    except (msgspec.DecodeError, RecursionError):
        return None
    usage = reply.usage
    if usage is None or min(usage.input_tokens, usage.output_tokens) < 0:
        return (reply.turn, -1, -1, 0, 0, 0)
    cache_read, cache_write = max(usage.cache_read_tokens, 0), max(usage.cache_write_tokens, 0)
    reasoning = min(max(usage.reasoning_tokens, 0), usage.output_tokens)
    return (reply.turn, usage.input_tokens, usage.output_tokens, cache_read, cache_write, reasoning)


class _Model(msgspec.Struct):
    model: str | None = None


_model = msgspec.json.Decoder(_Model)


def recorded_model(event: Event) -> str:  # public: `show` tracks the model in force with it
    """The model a `session/model` event names ("" when unreadable: it is ignorable)."""
    try:
        model = _model.decode(event.data).model
    except (msgspec.DecodeError, RecursionError):
        return ""
    return model if isinstance(model, str) else ""


# (turn, input, output, cache read, cache written, model, reasoning)
Reply = tuple[int, int, int, int, int, str, int]


def _own_replies(events: Iterable[Event], own_from: int, model: str = "") -> Iterator[Reply]:
    """(turn, input, output, cache read, cache written tokens, model) of each readable
    `assistant/message` at or after seq `own_from`; input and output are -1 when the reply
    carries no usage record, -2 for a model call a crash lost (a `turn/continue` with
    `lost_model_call`). `model` is the one in force before `events` ("" for none); the
    `session/model` events met on the way (an inherited prefix's too) change it."""
    compacting = 0  # the turn of the compaction in progress
    for event in events:
        if event.type == MODEL:
            model = recorded_model(event)
            continue
        if event.seq < own_from:
            continue
        if event.type == ASSISTANT:
            read = _read(event)
            if read is not None:
                yield (*read[:5], model, read[5])
        elif event.type == COMPACTING:
            try:
                compacting = _turn.decode(event.data).turn
            except (msgspec.DecodeError, RecursionError):
                compacting = 0
        elif event.type == SUMMARY:
            read = _read_summary(event, compacting)
            if read is not None:
                yield (*read[:5], model, read[5])
        elif event.type == CONTINUE:
            turn = _lost_call(event)
            if turn is not None:
                yield (turn, -2, -2, 0, 0, model, 0)


def _count(counts: list[int], reply: Reply, models: dict[str, list[int]]) -> None:
    """Add one reply to `[input, output, calls, reported, unknown, cache read, cache written,
    reasoning]` and to its model's `[input, output, cache read, cache written]`."""
    _turn, tokens_in, tokens_out, cache_read, cache_write, model, reasoning = reply
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
        counts[7] += reasoning
        slot = models.setdefault(model, [0, 0, 0, 0])
        slot[0] += tokens_in
        slot[1] += tokens_out
        slot[2] += cache_read
        slot[3] += cache_write


def _tokens(c: Sequence[int], models: Mapping[str, list[int]]) -> Tokens:
    return Tokens(
        input_tokens=c[0],
        output_tokens=c[1],
        calls=c[2],
        reported=c[3],
        unknown_calls=c[4],
        cache_read_tokens=c[5],
        cache_write_tokens=c[6],
        reasoning_tokens=c[7],
        models=tuple((m, *n) for m, n in sorted(models.items())),  # type: ignore[misc]  # four ints each
    )


def usage_of(
    events: Iterable[Event], inherited_event_count: int = 0, model: str = ""
) -> tuple[dict[int, Tokens], Tokens]:
    """Usage per turn and in total over the own suffix of a session's `events` (seq >=
    `inherited_event_count`); `model` is the one in force before them (a stream's earlier batch
    named it). Pure; never raises on bad payloads (they are not counted)."""
    per_turn: dict[int, tuple[list[int], dict[str, list[int]]]] = {}
    for reply in _own_replies(events, inherited_event_count, model):
        counts, models = per_turn.setdefault(reply[0], ([0] * 8, {}))
        _count(counts, reply, models)
    turns = {turn: _tokens(c, m) for turn, (c, m) in sorted(per_turn.items())}
    return turns, sum(turns.values(), Tokens())


# --- the projection unit ------------------------------------------------------------------------


class UsageUnit:
    """The `usage` unit: a session's own token totals. State `{own_from: K, input_tokens,
    output_tokens, calls, reported}` (plus `unknown_calls` and the cache counts when not 0),
    `model` (the one its last `session/model` named) and `models` (`{model: [input, output, cache
    read, cache written]}`, what cost is derived from), `turns` (its turns that count: budgets.py
    `turn_counted`) and `bare` (its last turn has recorded no model call yet); the view is the
    counts (`Tokens.to_json` with `models` and `turns`)."""

    key = "usage"
    # 2: `model` and `models`; 3: `turns`; 4: `turns` less a turn a budget refused before its
    # first call, and `bare` (an older row is not read: its log is)
    state_version = 4
    types: Final = frozenset({ASSISTANT, CONTINUE, MODEL, SUMMARY, TURN, TURN_END})

    def initial(self, header: SessionHeader, inherited_event_count: Offset) -> dict[str, Any]:
        return {"own_from": inherited_event_count, **Tokens().to_json()}

    def apply(self, state: dict[str, Any], event: Event) -> dict[str, Any]:
        if event.type not in self.types:
            return state
        return self.fold(state, (event,))

    def fold(self, state: dict[str, Any], events: Sequence[Event]) -> dict[str, Any]:
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
            t.reasoning_tokens,
        ]
        models = {m: list(n) for m, *n in t.models}
        before = state.get("model", "")
        before = model = before if type(before) is str else ""
        counted = TurnCount(turns_of(state), state.get("bare") is True)
        changed = False
        for event in events:
            if event.type == MODEL:
                changed, model = True, recorded_model(event)
        if (after := count_turns(events, own_from, counted)) != counted:
            changed, counted = True, after
        for reply in _own_replies(events, own_from, before):
            changed = True
            _count(counts, reply, models)
        if not changed:
            return state
        out: dict[str, Any] = {"own_from": own_from, **_tokens(counts, models).to_json()}
        if model:
            out["model"] = model
        if models:
            out["models"] = _models_json(_tokens(counts, models).models)
        if counted.turns:
            out["turns"] = counted.turns
        if counted.bare:
            out["bare"] = True
        return out

    def view(self, state: dict[str, Any]) -> dict[str, Any]:
        tokens = Tokens.from_json(state) or Tokens()
        out: dict[str, Any] = tokens.to_json()
        if tokens.models:
            out["models"] = _models_json(tokens.models)
        if turns := turns_of(state):
            out["turns"] = turns
        return out


def turns_of(value: object) -> int:
    """The turns a unit state or view counts (its own `turn/start` events; 0 when absent or
    tampered): what a budget's `max_turns` shared down the tree reads of a descendant."""
    turns = value.get("turns", 0) if type(value) is dict else 0
    return turns if type(turns) is int and turns > 0 else 0


USAGE_UNIT: Final = UsageUnit()
