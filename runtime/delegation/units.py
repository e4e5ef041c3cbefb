"""The projection units of subagent sessions: `subagent` (identity), `subagent_timing`, the
parent's `subagent_catalog` and `subagent_flags` (stopped, in doubt).

All are pure folds over a session's events (docs/design.md, "Projections and checkpoints"):
state is plain JSON, never mutated in place (every change is a new dict), and `apply` returns
the very same state object for events the unit does not look at. None raises on bad data.

`subagent` (docs/format.md, "The subagent descriptor"). State `{identity?: {mode, label?,
seq}}`. Every `subagent/descriptor` event replaces the state — last wins: a valid payload gives
an identity stamped with the event's seq; a malformed, unsupported or undecodable one gives
`{}`. The view is the identity or `None`, a sentinel that survives a JSON round trip (an absent
key would not clear a client's stale value). `seq` lets a reader tell the child's own descriptor
from one a fork seed replayed: see `is_own_identity`.

`subagent_timing` (how long a child has worked since its descriptor). State
`{settled_ms, active?: {since, through}, pending_turn_start?, descriptor_seen}`:

    turn/start           descriptor seen → active = {since: t, through: t}
                         otherwise       → pending_turn_start = t
    subagent/descriptor  (valid or not)  → {settled_ms: 0, descriptor_seen: true,
                                            active: {since: active.since or pending_turn_start,
                                                     through: t}  (only if either exists)}
    turn/end             before a descriptor → drop pending_turn_start
                         after, while active → settled_ms += max(0, t - active.since); drop active
    anything else        while active → active.through = t

so `settled_ms` counts completed turns after the (last) descriptor, and a turn that was already
open when the descriptor was written counts from its own start. The view is
`{settled_ms, active?}`.

`subagent_catalog` (a parent's view of the children it made from its
`subagent/catalog` events: docs/format.md, "The vocabulary"). State
`{own_from: K, children: {child_id: {created_at, mode, label?}}}`: every valid
`subagent/catalog` event of the session's own suffix (`seq >= K`, the inherited cut: a fork's
seed replays its parent's catalog, which names the parent's children, not the fork's) adds or
replaces its child's entry; an invalid payload or an invalid child id is skipped — one bad entry
must not hide the siblings the others name. The view is the `children` mapping. Listings take it
from a live parent's cell, else the parent's checkpoint rows (so a child whose own log is missing
or unreadable still shows as a diagnostic without the parent's log being read), else one
observation of the parent's log (issue 28: no index row hides a child).

`subagent_flags` (what a listing row says of a child beyond its identity; issue 27 items 2 and
5). State `{own_from: K, stopped: bool, in_doubt: int}`, over the session's own suffix only
(`seq >= K`: a fork's seed replays its parent's events, not its stop or its turns):

    session/stopped                       → stopped = true
    user/message, explicit (storage.stop_verdict.is_explicit_message) → stopped = false
    turn/start                            → in_doubt = 0
    tool/result with `in_doubt: true`     → in_doubt += 1

so `stopped` is the stop-marker verdict (the last marker not followed by an explicit message:
`storage.stop_verdict.stopped`, folded one event at a time) and `in_doubt` counts the in-doubt
results of the session's last turn, open or ended. The last turn rather than the open one: a
child's continued turn usually ends before its parent lists it (it settles), and it is then that
the parent must see that some of its work may or may not have happened; the child's next turn
(the parent's next message) clears it. An undecodable payload is not in doubt and not explicit.
A state of any other shape (a tampered checkpoint row) is left as it is and views as `None`, so
a listing shows no flags for it (the listing observes such a cold child afresh: its cold read
folds from the start). The view is `{stopped, in_doubt}` or `None`. Its batch `fold` gives the
same state decoding only the payloads that can decide it (a cold read of a long log).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec
from subagents.storage import (
    Event,
    InvalidSessionId,
    Offset,
    SessionHeader,
    SubagentCatalogData,
    check_session_id,
    is_explicit_message,
)

from .descriptor import MalformedDescriptor, parse_descriptor

__all__ = [
    "CATALOG_UNIT",
    "FLAGS_UNIT",
    "IDENTITY_UNIT",
    "SUBAGENT_UNITS",
    "SubagentCatalogUnit",
    "SubagentFlagsUnit",
    "TIMING_UNIT",
    "SubagentIdentityUnit",
    "SubagentTimingUnit",
    "is_own_identity",
]

DESCRIPTOR_TYPE: Final = "subagent/descriptor"

JsonObject = dict[str, Any]  # plain JSON state

_any_json = msgspec.json.Decoder()


def is_own_identity(identity: JsonObject | None, inherited_event_count: int) -> bool:
    """Whether an identity view came from the session's own suffix, not from a fork seed.

    `identity` is the `subagent` view (`None` means no valid descriptor, so never own).
    """
    return identity is not None and identity["seq"] >= inherited_event_count


class SubagentIdentityUnit:
    """The `subagent` unit: the identity of the last valid descriptor, or none."""

    key = "subagent"
    state_version = 2
    types: Final = frozenset({DESCRIPTOR_TYPE})  # every other event leaves the state as it is

    def initial(self, header: SessionHeader, inherited_event_count: Offset) -> JsonObject:
        return {}

    def apply(self, state: JsonObject, event: Event) -> JsonObject:
        if event.type != DESCRIPTOR_TYPE:
            return state
        try:
            descriptor = parse_descriptor(_any_json.decode(event.data))
        except (msgspec.DecodeError, RecursionError, MalformedDescriptor):
            # Not JSON (hand-built raw data), nested past msgspec's depth limit, or not a
            # descriptor: all mean "no valid descriptor", never a failed fold.
            return {}
        if descriptor is None:  # another version: unsupported, no identity
            return {}
        identity: JsonObject = {"mode": descriptor.mode}
        if descriptor.label is not None:
            identity["label"] = descriptor.label
        identity["seq"] = event.seq
        return {"identity": identity}

    def view(self, state: JsonObject) -> JsonObject | None:
        identity = state.get("identity")
        # A copy: a caller may keep or change the value it is served without touching the cell.
        return None if identity is None else dict(identity)


_TIMING_TYPES: Final = frozenset({DESCRIPTOR_TYPE, "turn/start", "turn/end"})


def _timing(
    settled_ms: int,
    descriptor_seen: bool,
    active: JsonObject | None = None,
    pending_turn_start: int | None = None,
) -> JsonObject:
    state: JsonObject = {"settled_ms": settled_ms}
    if active is not None:
        state["active"] = active
    if pending_turn_start is not None:
        state["pending_turn_start"] = pending_turn_start
    state["descriptor_seen"] = descriptor_seen
    return state


def _canonical(state: object) -> tuple[int, bool, int | None, int | None, int | None] | None:
    """(settled_ms, descriptor_seen, active since, active through, pending_turn_start) of a
    state shaped as `_timing` builds them (every state `apply` makes), else None."""
    if type(state) is not dict or not 2 <= len(state) <= 4:
        return None
    settled = state.get("settled_ms")
    seen = state.get("descriptor_seen")
    active = state.get("active")
    pending = state.get("pending_turn_start")
    if type(settled) is not int or type(seen) is not bool or (pending is not None and type(pending) is not int):
        return None
    if len(state) != 2 + (active is not None) + (pending is not None):
        return None  # another key (or an explicit null)
    if active is None:
        return settled, seen, None, None, pending
    if type(active) is not dict or len(active) != 2 or not seen:
        return None  # (`apply` makes a turn active only after a descriptor)
    since, through = active.get("since"), active.get("through")
    if type(since) is not int or type(through) is not int:
        return None
    return settled, seen, since, through, pending


class SubagentTimingUnit:
    """The `subagent_timing` unit: time spent in turns since the child's descriptor."""

    key = "subagent_timing"
    state_version = 2

    def initial(self, header: SessionHeader, inherited_event_count: Offset) -> JsonObject:
        return _timing(0, False)

    def apply(self, state: JsonObject, event: Event) -> JsonObject:
        kind = event.type
        time = event.time
        seen: bool = state["descriptor_seen"]
        active: JsonObject | None = state.get("active")
        if kind == DESCRIPTOR_TYPE:
            since = active["since"] if active is not None else state.get("pending_turn_start")
            return _timing(0, True, None if since is None else {"since": since, "through": time})
        if kind == "turn/start":
            if seen:
                return _timing(state["settled_ms"], True, {"since": time, "through": time})
            return _timing(state["settled_ms"], False, pending_turn_start=time)
        if kind == "turn/end":
            if not seen:
                if "pending_turn_start" not in state:
                    return state
                return _timing(state["settled_ms"], False)
            if active is None:
                return state
            return _timing(state["settled_ms"] + max(0, time - active["since"]), True)
        if active is None:
            return state
        return _timing(
            state["settled_ms"],
            seen,
            {"since": active["since"], "through": time},
            state.get("pending_turn_start"),
        )

    def fold(self, state: JsonObject, events: Sequence[Event]) -> JsonObject:
        """The left fold of `apply` over contiguous events, with one Python step per turn
        boundary or descriptor instead of one per event: every other event only moves
        `active.through` to its own time, so while a turn is active at the end of the run,
        `through` is the time of the run's last event (`apply` keeps a turn active only after a
        descriptor, and then every turn/start, turn/end or descriptor replaces or ends it). A
        state of that shape is folded in local variables and built once; any other goes through
        `apply`, event by event."""
        canonical = _canonical(state)
        if canonical is None:
            for event in events:
                state = self.apply(state, event)
            return state
        marks = [event for event in events if event.type in _TIMING_TYPES]
        settled, seen, since, through, pending = canonical
        changed = False
        for event in marks:
            kind, time = event.type, event.time
            if kind == DESCRIPTOR_TYPE:
                start = since if since is not None else pending
                settled, seen, pending = 0, True, None
                since, through = (None, None) if start is None else (start, time)
            elif kind == "turn/start":
                if seen:
                    since, through, pending = time, time, None
                else:
                    since, through, pending = None, None, time
            elif not seen:  # turn/end before any descriptor
                if pending is None:
                    continue  # `apply` returns the state as it is
                since, through, pending = None, None, None
            elif since is None:
                continue  # a turn/end while no turn is active: the state as it is
            else:
                settled += max(0, time - since)
                since, through, pending = None, None, None
            changed = True
        if since is not None and events and events[-1].type not in _TIMING_TYPES:
            through = events[-1].time
            changed = True
        if not changed:
            return state
        return _timing(settled, seen, None if since is None else {"since": since, "through": through}, pending)

    def view(self, state: JsonObject) -> JsonObject:
        out: JsonObject = {"settled_ms": state["settled_ms"]}
        active = state.get("active")
        if active is not None:
            out["active"] = {"since": active["since"], "through": active["through"]}
        return out


CATALOG_TYPE: Final = "subagent/catalog"
_catalog_payload = msgspec.json.Decoder(SubagentCatalogData)


def catalog_children(state: object) -> dict[str, Any]:
    """The `children` mapping of a catalog state (a fresh empty one for any other shape: a
    tampered checkpoint row must not break the fold)."""
    children = state.get("children") if type(state) is dict else None
    return children if type(children) is dict else {}


class SubagentCatalogUnit:
    """The `subagent_catalog` unit: the children a session's own `subagent/catalog` events name."""

    key = "subagent_catalog"
    state_version = 1
    types: Final = frozenset({CATALOG_TYPE})

    def initial(self, header: SessionHeader, inherited_event_count: Offset) -> JsonObject:
        return {"own_from": inherited_event_count, "children": {}}

    def apply(self, state: JsonObject, event: Event) -> JsonObject:
        if event.type != CATALOG_TYPE:
            return state
        own_from = state.get("own_from") if type(state) is dict else None
        if type(own_from) is not int or event.seq < own_from:
            return state  # a fork's inherited catalog names its parent's children
        try:
            data = _catalog_payload.decode(event.data)
            child_id = check_session_id(data.child_id)
        except (msgspec.DecodeError, RecursionError, InvalidSessionId):
            return state  # (msgspec.ValidationError is a DecodeError)
        entry: JsonObject = {"created_at": data.child_created_at, "mode": data.mode}
        if isinstance(data.label, str):
            entry["label"] = data.label
        children = dict(catalog_children(state))
        children[child_id] = entry
        return {"own_from": own_from, "children": children}

    def view(self, state: JsonObject) -> JsonObject:
        # Copies: a caller may keep or change what it is served without touching the cell.
        return {cid: dict(entry) for cid, entry in catalog_children(state).items() if type(entry) is dict}


class _Doubt(msgspec.Struct):
    """The one key of a `tool/result` payload the flags read (the others are skipped unbuilt)."""

    in_doubt: object = None


_doubt = msgspec.json.Decoder(_Doubt)


def _is_in_doubt(event: Event) -> bool:
    try:
        return _doubt.decode(event.data).in_doubt is True
    except (msgspec.DecodeError, RecursionError):  # not an object (hand-built data): not in doubt
        return False


def _is_explicit(event: Event) -> bool:
    try:
        return is_explicit_message(event)
    except (msgspec.DecodeError, RecursionError, AttributeError, TypeError):
        # Not JSON, not objects where a message has them, an unhashable `kind` (hand-built
        # data): no message a person or an agent sent.
        return False


def _flags(own_from: int, stopped: bool, in_doubt: int) -> JsonObject:
    return {"own_from": own_from, "stopped": stopped, "in_doubt": in_doubt}


def flags_of(state: object) -> tuple[int, bool, int] | None:
    """(own_from, stopped, in_doubt) of a state shaped as `_flags` builds them, else None."""
    if type(state) is not dict or len(state) != 3:
        return None
    own_from, stopped, in_doubt = state.get("own_from"), state.get("stopped"), state.get("in_doubt")
    if type(own_from) is not int or type(stopped) is not bool or type(in_doubt) is not int or in_doubt < 0:
        return None
    return own_from, stopped, in_doubt


class SubagentFlagsUnit:
    """The `subagent_flags` unit: whether the session is stopped, and how many results of its
    last turn are in doubt."""

    key = "subagent_flags"
    state_version = 1
    types: Final = frozenset({"session/stopped", "user/message", "turn/start", "tool/result"})

    def initial(self, header: SessionHeader, inherited_event_count: Offset) -> JsonObject:
        return _flags(inherited_event_count, False, 0)

    def apply(self, state: JsonObject, event: Event) -> JsonObject:
        kind = event.type
        if kind not in self.types:
            return state
        flags = flags_of(state)
        if flags is None or event.seq < flags[0]:
            return state  # a tampered state stays as it is; an inherited event is the parent's
        own_from, stopped, in_doubt = flags
        if kind == "tool/result":
            return _flags(own_from, stopped, in_doubt + 1) if _is_in_doubt(event) else state
        if kind == "turn/start":
            return _flags(own_from, stopped, 0) if in_doubt else state
        if kind == "session/stopped":
            return state if stopped else _flags(own_from, True, in_doubt)
        return _flags(own_from, False, in_doubt) if stopped and _is_explicit(event) else state

    def fold(self, state: JsonObject, events: Sequence[Event]) -> JsonObject:
        """The left fold of `apply` over contiguous events, decoding only the payloads that can
        decide the result: the `tool/result`s after the run's last `turn/start` (the earlier
        ones are cleared by it), and — only when the session is stopped or the run holds a
        marker — the `user/message`s after the run's last marker, from the end until one is
        explicit (the last marker or explicit message decides; neither: as it was). A cold
        read of a long log then decodes a handful of payloads, not every tool result."""
        flags = flags_of(state)
        if flags is None:
            return state  # (as `apply`: a tampered state stays as it is)
        own_from, stopped, in_doubt = flags
        types = self.types
        marks = [event for event in events if event.type in types and event.seq >= own_from]
        if not marks:
            return state
        last_turn = len(marks) - 1
        while last_turn >= 0 and marks[last_turn].type != "turn/start":
            last_turn -= 1
        doubt = 0 if last_turn >= 0 else in_doubt
        for event in marks[last_turn + 1 :]:
            if event.type == "tool/result" and _is_in_doubt(event):
                doubt += 1
        now = stopped
        if stopped or any(event.type == "session/stopped" for event in marks):
            for event in reversed(marks):
                if event.type == "session/stopped":
                    now = True
                    break
                if event.type == "user/message" and _is_explicit(event):
                    now = False
                    break
        if (now, doubt) == (stopped, in_doubt):
            return state
        return _flags(own_from, now, doubt)

    def view(self, state: JsonObject) -> JsonObject | None:
        flags = flags_of(state)
        return None if flags is None else {"stopped": flags[1], "in_doubt": flags[2]}


IDENTITY_UNIT: Final = SubagentIdentityUnit()
TIMING_UNIT: Final = SubagentTimingUnit()
CATALOG_UNIT: Final = SubagentCatalogUnit()
FLAGS_UNIT: Final = SubagentFlagsUnit()
SUBAGENT_UNITS: Final = (IDENTITY_UNIT, TIMING_UNIT, CATALOG_UNIT, FLAGS_UNIT)
