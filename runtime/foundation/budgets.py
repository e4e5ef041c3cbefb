"""Budgets (SPEC §8, docs/format.md "Budgets"): how much an agent may still do.

A `Budget` bounds a session: `deadline` (epoch ms on the runtime clock) its own work (a child's
is never later than its parent's); `max_turns` (turns started, the current one included),
`max_tokens` (every token of the usage records of its `assistant/message` and
`compaction/summary` events), `max_cost` (their cost at the `[prices]` table's prices) and
`max_descendants` (subagents started below it) its work *and its descendants'*: those are shared
down the tree, charged to every ancestor and checked against every ancestor before each model
call by the runtime's ledger (runtime/agent/tree_ledger.py); `exhausted` here checks the
session's own turns and tokens (what a session without a ledger has). `seconds` is a
deadline relative to the moment the budget is applied (`resolved`): the root's budget is
resolved when the runtime opens, a `subagent` call's when the child is made. What is spent is
never stored: it is recounted from the logs (`spent_of` here for a session's own turns and
tokens), so a cold resume carries on where the last process stopped.

A child's budget is its parent's remainder, lowered by what its caller asked for (`clamped`),
and recorded in its descriptor: a reservation out of its parent's remainder. The agent loop
checks its own turns, tokens and deadline here (`exhausted`) and the shared limits through the
ledger, and ends the turn with `turn/end {reason: {kind: "budget", message}}`; the message names
the budget that ran out, and by how much the last call overshot it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TypeVar

import attrs
import msgspec
from subagents.storage import Event

__all__ = [
    "DEADLINE_TEXT",
    "Budget",
    "Spent",
    "CALL_TYPES",
    "TurnCount",
    "budget_json",
    "count_turns",
    "exhausted",
    "parse_budget",
    "remainder",
    "reply_tokens",
    "spent_of",
    "turn_counted",
]

DEADLINE_TEXT = "deadline reached"


_T = TypeVar("_T")  # a validated field's type: what the checks below test the value against
_N = TypeVar("_N", int, float)


def _check_count(_inst: object, attribute: attrs.Attribute[_T], value: _T) -> None:
    if value is None:
        return
    if type(value) is not int or value < 0:
        raise ValueError(f"{attribute.name} must be an int >= 0, got {value!r}")


def _check_cost(_inst: object, _attribute: attrs.Attribute[_T], value: _T) -> None:
    if value is None:
        return
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:  # type: ignore[arg-type]  # an int or float once the type test passed
        raise ValueError(f"max_cost must be a finite number >= 0, got {value!r}")


def _check_seconds(_inst: object, _attribute: attrs.Attribute[_T], value: _T) -> None:
    if value is None:
        return
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:  # type: ignore[arg-type]  # `value` is an int or float once the type test passed
        raise ValueError(f"seconds must be a finite number > 0, got {value!r}")


@attrs.frozen(kw_only=True)
class Budget:
    """Limits on one session's own work; `None` is unlimited. Raises `ValueError` for a negative
    or non-int count, or a `seconds` that is not a finite number > 0."""

    max_turns: int | None = attrs.field(default=None, validator=_check_count)
    max_tokens: int | None = attrs.field(default=None, validator=_check_count)
    deadline: int | None = attrs.field(default=None, validator=_check_count)  # epoch ms, runtime clock
    seconds: float | None = attrs.field(default=None, validator=_check_seconds)  # relative, until resolved
    # Shared down the tree (runtime/agent/tree_ledger.py): the cost of the session's and its
    # descendants' model calls (at the `[prices]` table's prices), and how many descendants it
    # may start.
    max_cost: float | None = attrs.field(default=None, validator=_check_cost)
    max_descendants: int | None = attrs.field(default=None, validator=_check_count)

    @property
    def unlimited(self) -> bool:
        return all(getattr(self, key) is None for key in (*_KEYS, "seconds"))

    def resolved(self, now_ms: int) -> Budget:
        """`seconds` turned into an absolute `deadline` (the earlier of the two)."""
        if self.seconds is None:
            return self
        relative = now_ms + math.ceil(self.seconds * 1000)
        return attrs.evolve(self, deadline=_lower(self.deadline, relative), seconds=None)

    def clamped(self, ceiling: Budget | None) -> Budget:
        """Each limit the lower of this one and `ceiling`'s (both resolved)."""
        if ceiling is None:
            return self
        return Budget(
            max_turns=_lower(self.max_turns, ceiling.max_turns),
            max_tokens=_lower(self.max_tokens, ceiling.max_tokens),
            deadline=_lower(self.deadline, ceiling.deadline),
            max_cost=_lower(self.max_cost, ceiling.max_cost),
            max_descendants=_lower(self.max_descendants, ceiling.max_descendants),
        )


def _lower(a: _N | None, b: _N | None) -> _N | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


@attrs.frozen
class Spent:
    """What a session has used of its budget: turns started and tokens (input, output and cache)."""

    turns: int = 0
    tokens: int = 0


class _Counts(msgspec.Struct):
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class _Reply(msgspec.Struct):
    usage: _Counts | None = None


_reply = msgspec.json.Decoder(_Reply)


def reply_tokens(event: Event) -> int:
    """Every token of an `assistant/message`'s usage record — input, output, cache read and
    written, as the running agent counts them — (0 when it has none or it does not decode: bad
    data is not counted, as in runtime/usage.py)."""
    try:
        usage = _reply.decode(event.data).usage
    except (msgspec.DecodeError, RecursionError):
        return 0
    if usage is None or usage.input_tokens < 0 or usage.output_tokens < 0:
        return 0
    cache = max(usage.cache_read_tokens, 0) + max(usage.cache_write_tokens, 0)
    return usage.input_tokens + usage.output_tokens + cache


def spent_of(events: Iterable[Event], inherited_event_count: int) -> Spent:
    """Turns started (`count_turns`) and tokens used over a session's own suffix (seq >= the
    inherited count): a fork's inherited prefix was its parent's spending."""
    tokens = 0
    for event in events:
        if event.seq >= inherited_event_count and event.type in CALL_TYPES:  # a model call's usage
            tokens += reply_tokens(event)
    return Spent(count_turns(events, inherited_event_count).turns, tokens)


# --- which turns count ------------------------------------------------------------------------

# The events that record a model call (its reply, compaction's summary).
CALL_TYPES = frozenset({"assistant/message", "compaction/summary"})


def turn_counted(called: bool, reason_kind: object) -> bool:
    """Whether a turn counts as started (for `max_turns`, its own and every ancestor's): every
    turn does but one that a budget ended (`reason_kind` "budget") before any model call of it
    was recorded (`called`) — its first call was refused, so nothing was sent. (A deadline that
    cuts the first call before it answers leaves no record either: that turn does not count.)"""
    return called or reason_kind != "budget"


@attrs.frozen
class TurnCount:
    """A fold's running count: the turns counted, and whether the last turn started has
    recorded no model call yet (`bare`: it is not counted if a budget ends it so)."""

    turns: int = 0
    bare: bool = False


class _Reason(msgspec.Struct):
    kind: object = None


class _End(msgspec.Struct):
    reason: _Reason | None = None


class _Continue(msgspec.Struct):
    lost_model_call: object = False


_end = msgspec.json.Decoder(_End)
_continue = msgspec.json.Decoder(_Continue)


def count_turns(events: Iterable[Event], own_from: int, start: TurnCount = TurnCount()) -> TurnCount:
    """The turns of the events at or after seq `own_from` that count (`turn_counted`), on top
    of `start` (an earlier batch's count). A model call is an `assistant/message`, a
    `compaction/summary` or a `turn/continue` that lost one (it was sent). A payload that does
    not decode is read as no call and no budget end."""
    turns, bare = start.turns, start.bare
    for event in events:
        if event.seq < own_from:
            continue
        kind = event.type
        if kind == "turn/start":
            turns, bare = turns + 1, True
        elif kind in CALL_TYPES:
            bare = False
        elif kind == "turn/continue" and bare:
            try:
                bare = _continue.decode(event.data).lost_model_call is not True
            except (msgspec.DecodeError, RecursionError):
                pass
        elif kind == "turn/end" and bare:
            try:
                reason = _end.decode(event.data).reason
            except (msgspec.DecodeError, RecursionError):
                reason = None
            if not turn_counted(False, None if reason is None else reason.kind):
                turns = max(0, turns - 1)
            bare = False
    return TurnCount(turns, bare)


def exhausted(budget: Budget, spent: Spent, *, first_call: bool, now_ms: int | None) -> str | None:
    """The message of the budget that has run out before a model call, or None. Turns count only
    before a turn's first call (the turn in progress is `spent.turns`); `now_ms` is read only when
    the budget has a deadline (a scenario clock's readings stay as they were without one)."""
    if first_call and budget.max_turns is not None and spent.turns > budget.max_turns:
        return f"max_turns {budget.max_turns} reached"
    if budget.max_tokens is not None and spent.tokens >= budget.max_tokens:
        over = spent.tokens - budget.max_tokens  # the last call's overshoot, reported
        return f"max_tokens {budget.max_tokens} reached: {spent.tokens} used" + (f" ({over} over)" if over else "")
    if budget.deadline is not None and now_ms is not None and now_ms >= budget.deadline:
        return DEADLINE_TEXT
    return None


def remainder(budget: Budget | None, spent: Spent, *, in_turn: bool) -> Budget | None:
    """What is left of `budget` for a child by the session's own spending: the turns not yet
    started (the current one counts as left), the tokens not yet used, the same deadline. None
    when unlimited. The ledger's remainder (its tree's turns and tokens) lowers it further."""
    if budget is None:
        return None
    turns = None
    if budget.max_turns is not None:
        turns = max(0, budget.max_turns - spent.turns + (1 if in_turn else 0))
    tokens = None if budget.max_tokens is None else max(0, budget.max_tokens - spent.tokens)
    return Budget(max_turns=turns, max_tokens=tokens, deadline=budget.deadline)


# --- the descriptor's `budget` extra ----------------------------------------------------------

_KEYS = ("max_turns", "max_tokens", "deadline", "max_cost", "max_descendants")


def budget_json(budget: Budget) -> dict[str, int | float]:
    """The descriptor's `budget` object: the limits that are set (a resolved budget)."""
    return {key: getattr(budget, key) for key in _KEYS if getattr(budget, key) is not None}


def parse_budget(value: object) -> Budget | str:
    """A descriptor's `budget` object read back, or the reason it is malformed."""
    if type(value) is not dict:
        return "must be an object"
    if not value:
        return "needs at least one of " + ", ".join(_KEYS)
    for key, item in value.items():
        if key not in _KEYS:
            return f'has unknown field "{key}"'
        if key == "max_cost":
            if type(item) not in (int, float) or not math.isfinite(item) or item < 0:
                return f'field "{key}" must be a number >= 0'
        elif type(item) is not int or item < 0:
            return f'field "{key}" must be an int >= 0'
    return Budget(**value)
