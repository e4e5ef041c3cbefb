"""Table tests for the `subagent` and `subagent_timing` projection units (SPEC 3.5, 3.6;
reference-notes 4.4, 4.5), alone and driven through `ProjectionRegistry`/`ProjectionCells`.

Events are built with `make_event` (so every one is a valid envelope) except the two that only a
hand-written log can hold: undecodable and absurdly nested descriptor data.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import msgspec
import pytest
from clocks import T
from events import seed_marker, turn_end_event, turn_start_event
from log_lines import header
from registries import HostileView
from subagents.runtime.delegation.descriptor import SubagentDescriptor, ToolFilter, snapshot_descriptor
from subagents.runtime.delegation.units import (
    IDENTITY_UNIT,
    SUBAGENT_UNITS,
    TIMING_UNIT,
    is_own_identity,
)
from subagents.storage import Event, ProjectionBroken, SessionHeader, make_event
from subagents.storage.projection import CheckpointRow, ProjectionRegistry

HEADER = header("child-1", T, origin="subagent", delegation_depth=1)
SEEDED = header("child-2", T, is_seeded=True, parent_session="parent", origin="subagent", delegation_depth=1)

ONE_SHOT = {"version": 2, "mode": "one-shot", "provider": "spawn"}
ONE_SHOT_LABELLED = {**ONE_SHOT, "label": "count files"}
CONTINUABLE = {
    "version": 2,
    "mode": "continuable",
    "provider": "fork",
    "label": "review",
    "agent_model": "m",
    "tool_filter": {"deny": ["shell"]},
}
MALFORMED = {**ONE_SHOT, "persona": "one-shot children have none"}
UNSUPPORTED = {**ONE_SHOT, "version": 3}


# --- event builders ---------------------------------------------------------------------------


def descriptor(seq: int, data: dict[str, Any], time: int | None = None) -> Event:
    return make_event(seq, "subagent/descriptor", T + seq if time is None else time, data)


def raw_descriptor(seq: int, raw: bytes) -> Event:
    """A descriptor with data no Event can be built with (readers and Event itself refuse it):
    forced in, to show the unit resets instead of raising even then."""
    event = Event(seq=seq, type="subagent/descriptor", time=T + seq, data=msgspec.Raw(b"{}"))
    msgspec.structs.force_setattr(event, "data", msgspec.Raw(raw))
    return event


def step(seq: int, time: int, kind: str = "step/start") -> Event:
    return make_event(seq, kind, time, {"turn": 1, "step": 0})


def user(seq: int, time: int) -> Event:
    message = {"id": f"u{seq}", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}
    return make_event(seq, "user/message", time, {"turn": 1, "step": 0, "message": message}, surface_op="append")


def other_events(start: int) -> list[Event]:
    """One event of every non-descriptor kind the identity unit must ignore."""
    message = {"id": "a", "role": "assistant", "content": [{"type": "text", "text": "ok"}], "source": {"kind": "model"}}
    return [
        turn_start_event(start, T),
        step(start + 1, T),
        user(start + 2, T),
        make_event(
            start + 3,
            "assistant/message",
            T,
            {"turn": 1, "step": 0, "message": message, "finish": "stop"},
            surface_op="append",
        ),
        make_event(start + 4, "tool/call", T, {"turn": 1, "step": 0, "call_id": "c", "name": "ls", "arguments": "{}"}),
        step(start + 5, T, "step/end"),
        turn_end_event(start + 6, T),
        make_event(
            start + 7,
            "subagent/catalog",
            T,
            {"version": 1, "child_id": "x", "child_created_at": T, "mode": "one-shot"},
        ),
        make_event(start + 8, "subagent/settled", T, {"child_id": "x", "reason_kind": "completed"}),
        make_event(start + 9, "compaction/summary", T, {"text": "s"}),
        make_event(start + 10, "future/thing", T, {"version": 2, "mode": "one-shot"}, ignorable=True),
        seed_marker(start + 11, T + start + 11),
    ]


def fold(unit: Any, events: list[Event], inherited: int = 0) -> Any:
    state = unit.initial(HEADER, inherited)
    for event in events:
        state = unit.apply(state, event)
    return state


def json_round_trip(value: Any) -> Any:
    return json.loads(json.dumps(value))


# --- identity: one descriptor ------------------------------------------------------------------

NESTED = b'{"version":2,"mode":"one-shot","provider":' + b"[" * 100_000 + b"]" * 100_000 + b"}"

SINGLE: list[tuple[str, Event, dict[str, Any]]] = [
    ("one-shot", descriptor(4, ONE_SHOT), {"identity": {"mode": "one-shot", "seq": 4}}),
    (
        "one-shot labelled",
        descriptor(4, ONE_SHOT_LABELLED),
        {"identity": {"mode": "one-shot", "label": "count files", "seq": 4}},
    ),
    ("continuable", descriptor(7, CONTINUABLE), {"identity": {"mode": "continuable", "label": "review", "seq": 7}}),
    ("malformed", descriptor(4, MALFORMED), {}),
    ("continuable without label", descriptor(4, {"version": 2, "mode": "continuable", "provider": "p"}), {}),
    ("version as string", descriptor(4, {**ONE_SHOT, "version": "2"}), {}),
    ("version 1", descriptor(4, {**ONE_SHOT, "version": 1}), {}),
    ("version 3", descriptor(4, UNSUPPORTED), {}),
    ("empty object", descriptor(4, {}), {}),
    ("not JSON", raw_descriptor(4, b"{not json"), {}),
    ("truncated JSON", raw_descriptor(4, b'{"version":2,'), {}),
    ("invalid UTF-8", raw_descriptor(4, b'{"version":2,"mode":"one-shot","provider":"\xff"}'), {}),
    ("nested past the decoder's depth", raw_descriptor(4, NESTED), {}),
]


@pytest.mark.parametrize(("event", "expected"), [s[1:] for s in SINGLE], ids=[s[0] for s in SINGLE])
def test_identity_of_one_descriptor(event: Event, expected: dict[str, Any]) -> None:
    state = fold(IDENTITY_UNIT, [event])
    assert state == expected
    assert json_round_trip(state) == state
    view = IDENTITY_UNIT.view(state)
    assert view == expected.get("identity")
    # The view is `null` or the identity, and either survives JSON (an absent key would not).
    assert json_round_trip({"subagent": view}) == {"subagent": expected.get("identity")}


def test_identity_initial_state_and_view() -> None:
    assert IDENTITY_UNIT.key == "subagent"
    assert IDENTITY_UNIT.state_version == 2
    state = IDENTITY_UNIT.initial(HEADER, 0)
    assert state == {}
    assert IDENTITY_UNIT.view(state) is None
    assert json.dumps({"subagent": IDENTITY_UNIT.view(state)}) == '{"subagent": null}'


def test_identity_built_from_snapshot_descriptor() -> None:
    d = SubagentDescriptor(
        mode="continuable", provider="fork", label="L", persona="p", tool_filter=ToolFilter(allow=["read"])
    )
    state = fold(IDENTITY_UNIT, [descriptor(2, snapshot_descriptor(d))])
    assert state == {"identity": {"mode": "continuable", "label": "L", "seq": 2}}


# --- identity: sequences, last wins ------------------------------------------------------------

SEQUENCES: list[tuple[str, list[Event], dict[str, Any] | None]] = [
    ("none", [], None),
    ("only other events", other_events(0), None),
    (
        "one then another: last wins",
        [descriptor(0, ONE_SHOT), descriptor(1, CONTINUABLE)],
        {"mode": "continuable", "label": "review", "seq": 1},
    ),
    ("later malformed resets", [descriptor(0, CONTINUABLE), descriptor(1, MALFORMED)], None),
    ("later unsupported resets", [descriptor(0, CONTINUABLE), descriptor(1, UNSUPPORTED)], None),
    ("later undecodable resets", [descriptor(0, CONTINUABLE), raw_descriptor(1, b"{x")], None),
    (
        "a good one after a bad one restores",
        [descriptor(0, CONTINUABLE), descriptor(1, MALFORMED), descriptor(2, ONE_SHOT_LABELLED)],
        {"mode": "one-shot", "label": "count files", "seq": 2},
    ),
    (
        "other events do not disturb it",
        [descriptor(0, ONE_SHOT), *other_events(1)],
        {"mode": "one-shot", "seq": 0},
    ),
    (
        "seq is the event's own",
        [*other_events(0), descriptor(12, ONE_SHOT), *other_events(13)],
        {"mode": "one-shot", "seq": 12},
    ),
]


@pytest.mark.parametrize(("events", "expected"), [s[1:] for s in SEQUENCES], ids=[s[0] for s in SEQUENCES])
def test_identity_fold(events: list[Event], expected: dict[str, Any] | None) -> None:
    state = fold(IDENTITY_UNIT, events)
    assert IDENTITY_UNIT.view(state) == expected
    assert state == ({} if expected is None else {"identity": expected})
    assert json_round_trip({"subagent": IDENTITY_UNIT.view(state)}) == {"subagent": expected}


def test_identity_ignores_other_events_by_identity() -> None:
    for state in ({}, {"identity": {"mode": "one-shot", "seq": 0}}):
        for event in other_events(1):
            assert IDENTITY_UNIT.apply(state, event) is state, event.type


def test_identity_never_mutates_state_in_place() -> None:
    state = fold(IDENTITY_UNIT, [descriptor(0, CONTINUABLE)])
    before = copy.deepcopy(state)
    for event in [descriptor(1, ONE_SHOT), descriptor(2, MALFORMED), raw_descriptor(3, b"{")]:
        IDENTITY_UNIT.apply(state, event)
        assert state == before
    # A served view is a copy: changing it leaves the state alone.
    view = IDENTITY_UNIT.view(state)
    view["label"] = "changed"
    assert state == before


@pytest.mark.parametrize(
    ("identity", "inherited", "own"),
    [
        ({"mode": "one-shot", "seq": 5}, 0, True),
        ({"mode": "one-shot", "seq": 5}, 5, True),
        ({"mode": "one-shot", "seq": 5}, 6, False),
        ({"mode": "continuable", "label": "x", "seq": 0}, 1, False),
        (None, 0, False),
    ],
)
def test_is_own_identity(identity: dict[str, Any] | None, inherited: int, own: bool) -> None:
    assert is_own_identity(identity, inherited) is own


def test_a_replayed_ancestor_descriptor_is_not_own() -> None:
    # A fork seed replays the parent's log, descriptor included; the child's own comes later.
    inherited = [descriptor(0, CONTINUABLE), *other_events(1)]  # seqs 0..12
    cut = len(inherited)
    state = fold(IDENTITY_UNIT, inherited, cut)
    assert not is_own_identity(IDENTITY_UNIT.view(state), cut)
    state = IDENTITY_UNIT.apply(IDENTITY_UNIT.apply(state, seed_marker(cut, T + cut)), descriptor(cut + 1, ONE_SHOT))
    assert is_own_identity(IDENTITY_UNIT.view(state), cut)


# --- timing ------------------------------------------------------------------------------------

INITIAL_TIMING = {"settled_ms": 0, "descriptor_seen": False}

TIMING: list[tuple[str, list[Event], dict[str, Any], dict[str, Any]]] = [
    ("nothing", [], INITIAL_TIMING, {"settled_ms": 0}),
    (
        "turn open before the descriptor is pending",
        [turn_start_event(0, 100)],
        {"settled_ms": 0, "pending_turn_start": 100, "descriptor_seen": False},
        {"settled_ms": 0},
    ),
    (
        "a turn before the descriptor counts for nothing",
        [turn_start_event(0, 100), user(1, 120), turn_end_event(2, 150)],
        INITIAL_TIMING,
        {"settled_ms": 0},
    ),
    (
        "descriptor after a completed turn: nothing active",
        [turn_start_event(0, 100), turn_end_event(1, 150), descriptor(2, ONE_SHOT, 160)],
        {"settled_ms": 0, "descriptor_seen": True},
        {"settled_ms": 0},
    ),
    (
        "descriptor mid-turn: active since the turn's start",
        [turn_start_event(0, 100), user(1, 110), descriptor(2, ONE_SHOT, 120)],
        {"settled_ms": 0, "active": {"since": 100, "through": 120}, "descriptor_seen": True},
        {"settled_ms": 0, "active": {"since": 100, "through": 120}},
    ),
    (
        "active through follows every event",
        [turn_start_event(0, 100), descriptor(1, ONE_SHOT, 120), step(2, 130), user(3, 145)],
        {"settled_ms": 0, "active": {"since": 100, "through": 145}, "descriptor_seen": True},
        {"settled_ms": 0, "active": {"since": 100, "through": 145}},
    ),
    (
        "descriptor mid-turn, turn ends: settled from the turn's start",
        [turn_start_event(0, 100), descriptor(1, ONE_SHOT, 120), step(2, 130), turn_end_event(3, 200)],
        {"settled_ms": 100, "descriptor_seen": True},
        {"settled_ms": 100},
    ),
    (
        "descriptor first, then a turn",
        [descriptor(0, ONE_SHOT, 50), turn_start_event(1, 100), step(2, 130)],
        {"settled_ms": 0, "active": {"since": 100, "through": 130}, "descriptor_seen": True},
        {"settled_ms": 0, "active": {"since": 100, "through": 130}},
    ),
    (
        "settled accumulates over turns",
        [
            descriptor(0, ONE_SHOT, 50),
            turn_start_event(1, 100),
            turn_end_event(2, 160),
            step(3, 170),  # between turns: nothing active, nothing counted
            turn_start_event(4, 200, 2),
            user(5, 230),
            turn_end_event(6, 260, 2),
            turn_start_event(7, 1000, 3),
            turn_end_event(8, 1005, 3),
        ],
        {"settled_ms": 125, "descriptor_seen": True},
        {"settled_ms": 125},
    ),
    (
        "settled accumulates with a turn open",
        [
            descriptor(0, ONE_SHOT, 50),
            turn_start_event(1, 100),
            turn_end_event(2, 160),
            turn_start_event(3, 300, 2),
            step(4, 310),
        ],
        {"settled_ms": 60, "active": {"since": 300, "through": 310}, "descriptor_seen": True},
        {"settled_ms": 60, "active": {"since": 300, "through": 310}},
    ),
    (
        "a later descriptor resets settled and keeps the open turn's start",
        [
            descriptor(0, ONE_SHOT, 50),
            turn_start_event(1, 100),
            turn_end_event(2, 160),
            turn_start_event(3, 200, 2),
            descriptor(4, CONTINUABLE, 250),
        ],
        {"settled_ms": 0, "active": {"since": 200, "through": 250}, "descriptor_seen": True},
        {"settled_ms": 0, "active": {"since": 200, "through": 250}},
    ),
    (
        "a malformed descriptor resets timing too",
        [descriptor(0, ONE_SHOT, 50), turn_start_event(1, 100), turn_end_event(2, 160), descriptor(3, MALFORMED, 170)],
        {"settled_ms": 0, "descriptor_seen": True},
        {"settled_ms": 0},
    ),
    (
        "an undecodable descriptor still counts as seen",
        [turn_start_event(0, 100), raw_descriptor(1, b"{nope")],
        {"settled_ms": 0, "active": {"since": 100, "through": T + 1}, "descriptor_seen": True},
        {"settled_ms": 0, "active": {"since": 100, "through": T + 1}},
    ),
    (
        "a turn start while active restarts the open turn",
        [descriptor(0, ONE_SHOT, 50), turn_start_event(1, 100), turn_start_event(2, 400, 2)],
        {"settled_ms": 0, "active": {"since": 400, "through": 400}, "descriptor_seen": True},
        {"settled_ms": 0, "active": {"since": 400, "through": 400}},
    ),
    (
        "negative duration clamps to 0",
        [
            descriptor(0, ONE_SHOT, 50),
            turn_start_event(1, 100),
            turn_end_event(2, 160),
            turn_start_event(3, 900, 2),
            turn_end_event(4, 800, 2),
        ],
        {"settled_ms": 60, "descriptor_seen": True},
        {"settled_ms": 60},
    ),
    (
        "descriptor later than its turn's end clamps to 0",
        [turn_start_event(0, 500), descriptor(1, ONE_SHOT, 600), turn_end_event(2, 450)],
        {"settled_ms": 0, "descriptor_seen": True},
        {"settled_ms": 0},
    ),
]


@pytest.mark.parametrize(("events", "state", "view"), [t[1:] for t in TIMING], ids=[t[0] for t in TIMING])
def test_timing_fold(events: list[Event], state: dict[str, Any], view: dict[str, Any]) -> None:
    folded = fold(TIMING_UNIT, events)
    assert folded == state
    assert json_round_trip(folded) == folded
    assert TIMING_UNIT.view(folded) == view
    assert json_round_trip(TIMING_UNIT.view(folded)) == view


def test_timing_key_and_version() -> None:
    assert TIMING_UNIT.key == "subagent_timing"
    assert TIMING_UNIT.state_version == 2
    assert TIMING_UNIT.initial(HEADER, 0) == INITIAL_TIMING


IGNORED: list[tuple[str, list[Event], Event]] = [
    ("turn end before a descriptor with nothing pending", [], turn_end_event(0, 10)),
    ("another event before a descriptor", [], step(0, 10)),
    ("another event while a turn is pending", [turn_start_event(0, 10)], user(1, 20)),
    ("turn end after a descriptor with nothing active", [descriptor(0, ONE_SHOT)], turn_end_event(1, 10)),
    (
        "another event between turns",
        [descriptor(0, ONE_SHOT), turn_start_event(1, 5), turn_end_event(2, 9)],
        step(3, 10),
    ),
]


@pytest.mark.parametrize(("prefix", "event"), [i[1:] for i in IGNORED], ids=[i[0] for i in IGNORED])
def test_timing_returns_the_same_state_when_nothing_changes(prefix: list[Event], event: Event) -> None:
    state = fold(TIMING_UNIT, prefix)
    assert TIMING_UNIT.apply(state, event) is state


def test_timing_never_mutates_state_in_place() -> None:
    events = [
        turn_start_event(0, 100),
        descriptor(1, ONE_SHOT, 120),
        step(2, 130),
        turn_end_event(3, 200),
        turn_start_event(4, 300),
    ]
    state = TIMING_UNIT.initial(HEADER, 0)
    for event in events:
        before = copy.deepcopy(state)
        TIMING_UNIT.apply(state, event)
        assert state == before, event.type
        state = TIMING_UNIT.apply(state, event)
    view = TIMING_UNIT.view(state)
    view["active"]["since"] = 0
    assert state["active"]["since"] == 300


# --- through the registry ----------------------------------------------------------------------


def child_log() -> tuple[list[Event], int]:
    """A fork child: an inherited prefix holding the parent's own descriptor and a turn, the
    end-seed marker at the cut, then the child's descriptor mid-turn, turns, and a bad descriptor
    followed by a good one."""
    inherited = [
        descriptor(0, CONTINUABLE, T),
        turn_start_event(1, T + 10),
        user(2, T + 20),
        turn_end_event(3, T + 50),
    ]
    cut = len(inherited)
    own = [
        seed_marker(cut, T + cut),
        turn_start_event(cut + 1, T + 100),
        user(cut + 2, T + 110),
        descriptor(cut + 3, ONE_SHOT_LABELLED, T + 120),
        step(cut + 4, T + 130),
        turn_end_event(cut + 5, T + 200),
        turn_start_event(cut + 6, T + 300, 2),
        descriptor(cut + 7, MALFORMED, T + 310),
        step(cut + 8, T + 320),
        turn_end_event(cut + 9, T + 400, 2),
        descriptor(cut + 10, CONTINUABLE, T + 410),
        turn_start_event(cut + 11, T + 500, 3),
        step(cut + 12, T + 530),
    ]
    return inherited + own, cut


class Exploding:
    """A unit whose `apply` raises at one seq (a bug): only its own cell may break."""

    key = "exploding"
    state_version = 1

    def __init__(self, at_seq: int) -> None:
        self.at_seq = at_seq

    def initial(self, header: SessionHeader, inherited_event_count: int) -> Any:
        return {"n": 0}

    def apply(self, state: Any, event: Event) -> Any:
        if event.seq == self.at_seq:
            raise ZeroDivisionError("apply bug")
        return {"n": state["n"] + 1}

    def view(self, state: Any) -> Any:
        return state["n"]


EXPECTED_END_VIEWS = {
    "subagent": {"mode": "continuable", "label": "review", "seq": 14},
    "subagent_timing": {"settled_ms": 0, "active": {"since": T + 500, "through": T + 530}},
    "subagent_catalog": {},  # a child that made no children of its own
    "subagent_flags": {"stopped": False, "in_doubt": 0},  # never stopped, nothing in doubt
}


def test_registry_folds_both_units_to_the_expected_views() -> None:
    events, cut = child_log()
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    cells = registry.cells(SEEDED, cut)
    cells.fold(events)
    assert cells.snapshot(["subagent"]) == {"subagent": EXPECTED_END_VIEWS["subagent"]}
    assert cells.snapshot() == EXPECTED_END_VIEWS
    assert is_own_identity(cells.snapshot(["subagent"])["subagent"], cut)
    assert json_round_trip(cells.snapshot()) == EXPECTED_END_VIEWS


PARENT = {"mode": "continuable", "label": "review", "seq": 0}
OWN = {"mode": "one-shot", "label": "count files", "seq": 7}

CUTS: list[tuple[int, dict[str, Any] | None, dict[str, Any], bool]] = [
    # (events folded, subagent view, subagent_timing view, own identity)
    (1, PARENT, {"settled_ms": 0}, False),
    (4, PARENT, {"settled_ms": 40}, False),
    (6, PARENT, {"settled_ms": 40, "active": {"since": T + 100, "through": T + 100}}, False),
    (8, OWN, {"settled_ms": 0, "active": {"since": T + 100, "through": T + 120}}, True),
    (10, OWN, {"settled_ms": 100}, True),
    (12, None, {"settled_ms": 0, "active": {"since": T + 300, "through": T + 310}}, False),
    (14, None, {"settled_ms": 100}, False),
    (15, {"mode": "continuable", "label": "review", "seq": 14}, {"settled_ms": 0}, True),
]


@pytest.mark.parametrize(("count", "identity", "timing", "own"), CUTS, ids=[f"first {c[0]}" for c in CUTS])
def test_registry_views_at_each_cut(count: int, identity: Any, timing: Any, own: bool) -> None:
    events, cut = child_log()
    cells = ProjectionRegistry(SUBAGENT_UNITS).cells(SEEDED, cut)
    cells.fold(events[:count])
    assert cells.snapshot() == {
        "subagent": identity,
        "subagent_timing": timing,
        "subagent_catalog": {},
        "subagent_flags": {"stopped": False, "in_doubt": 0},
    }
    assert is_own_identity(cells.snapshot(["subagent"])["subagent"], cut) is own


def test_checkpoint_rows_carry_version_watermark_and_plain_json_state() -> None:
    events, cut = child_log()
    cells = ProjectionRegistry(SUBAGENT_UNITS).cells(SEEDED, cut)
    assert cells.checkpoint() == {}  # nothing folded, nothing to store
    cells.fold(events)
    rows = cells.checkpoint()
    last = events[-1].seq
    assert rows == {
        "subagent": CheckpointRow(
            ver=2, seq=last, val={"identity": {"mode": "continuable", "label": "review", "seq": 14}}
        ),
        "subagent_timing": CheckpointRow(
            ver=2,
            seq=last,
            val={"settled_ms": 0, "active": {"since": T + 500, "through": T + 530}, "descriptor_seen": True},
        ),
        "subagent_catalog": CheckpointRow(ver=1, seq=last, val={"own_from": cut, "children": {}}),
        "subagent_flags": CheckpointRow(ver=1, seq=last, val={"own_from": cut, "stopped": False, "in_doubt": 0}),
    }
    for row in rows.values():
        assert json_round_trip(row.val) == row.val


LOG_LENGTH = 17


@pytest.mark.parametrize("split", range(LOG_LENGTH + 1))
def test_restoring_from_checkpoint_rows_matches_folding_from_scratch(split: int) -> None:
    events, cut = child_log()
    assert len(events) == LOG_LENGTH
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    scratch = registry.cells(SEEDED, cut)
    scratch.fold(events)

    first = registry.cells(SEEDED, cut)
    first.fold(events[:split])
    # Rows as the index would hand them back: through JSON.
    rows = {
        key: CheckpointRow(ver=row.ver, seq=row.seq, val=json_round_trip(row.val))
        for key, row in first.checkpoint().items()
    }
    restored = registry.cells(SEEDED, cut, rows)
    assert restored.floor == (split - 1 if split else -1)
    restored.fold(events[restored.floor + 1 :])
    assert restored.snapshot() == scratch.snapshot() == EXPECTED_END_VIEWS
    assert restored.checkpoint() == scratch.checkpoint()
    # Folding the whole log again is harmless: cells skip what they have seen.
    assert restored.fold(events) == 0
    assert restored.snapshot() == EXPECTED_END_VIEWS


def test_rows_of_another_version_are_ignored() -> None:
    events, cut = child_log()
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    stale = {
        # A version-1 identity row (no seq) must be refolded, not trusted.
        "subagent": CheckpointRow(ver=1, seq=len(events) - 1, val={"identity": {"mode": "one-shot"}}),
        "subagent_timing": CheckpointRow(ver=1, seq=len(events) - 1, val={"settledMs": 5}),
    }
    cells = registry.cells(SEEDED, cut, stale)
    assert cells.floor == -1
    cells.fold(events)
    assert cells.snapshot() == EXPECTED_END_VIEWS


def test_a_broken_view_of_another_unit_does_not_break_a_keyed_snapshot() -> None:
    events, cut = child_log()
    cells = ProjectionRegistry([*SUBAGENT_UNITS, HostileView()]).cells(SEEDED, cut)
    cells.fold(events)
    assert cells.snapshot(["subagent"]) == {"subagent": EXPECTED_END_VIEWS["subagent"]}
    assert cells.snapshot(["subagent", "subagent_timing", "subagent_catalog", "subagent_flags"]) == EXPECTED_END_VIEWS
    with pytest.raises(ProjectionBroken) as exc:
        cells.snapshot(["hostile_view"])
    assert exc.value.key == "hostile_view"
    with pytest.raises(ProjectionBroken):
        cells.snapshot()
    # The hostile unit's state is healthy, only its view is not: it is still checkpointed.
    assert cells.checkpoint()["hostile_view"].val == len(events)


def test_a_raising_apply_breaks_only_its_own_key() -> None:
    events, cut = child_log()
    cells = ProjectionRegistry([Exploding(at_seq=6), *SUBAGENT_UNITS]).cells(SEEDED, cut)
    cells.fold(events[:9])
    cells.fold(events[9:])
    with pytest.raises(ProjectionBroken) as exc:
        cells.snapshot(["exploding"])
    assert exc.value.key == "exploding"
    assert isinstance(exc.value.cause, ZeroDivisionError)
    with pytest.raises(ProjectionBroken):
        cells.snapshot()
    assert cells.snapshot(["subagent"]) == {"subagent": EXPECTED_END_VIEWS["subagent"]}
    assert cells.snapshot(["subagent", "subagent_timing", "subagent_catalog", "subagent_flags"]) == EXPECTED_END_VIEWS
    assert set(cells.checkpoint()) == {"subagent", "subagent_timing", "subagent_catalog", "subagent_flags"}
