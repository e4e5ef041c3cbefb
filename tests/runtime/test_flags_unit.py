"""The `subagent_flags` projection unit (issue 27, items 2 and 5): whether a session is stopped
(the stop-marker verdict, folded one event at a time) and how many results of its last turn are
in doubt, over its own suffix only; a pure fold that never raises on bad data."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import msgspec
import pytest
from clocks import T
from events import seed_marker, turn_end_event, turn_start_event
from flag_events import call_event, message_event, result_event, stopped_event
from log_lines import header
from subagents.runtime.delegation.units import FLAGS_UNIT, SUBAGENT_UNITS
from subagents.storage import Event, make_event, stopped
from subagents.storage.projection import CheckpointRow, ProjectionRegistry

HEADER = header("c", T)
NOTHING = {"stopped": False, "in_doubt": 0}


def fold(events: list[Event], k: int = 0) -> Any:
    state = FLAGS_UNIT.initial(HEADER, k)
    for event in events:
        state = FLAGS_UNIT.apply(state, event)
    return state


def view(events: list[Event], k: int = 0) -> Any:
    return FLAGS_UNIT.view(fold(events, k))


def forced(event: Event, raw: bytes) -> Event:
    """`event` with data no Event can be built with (readers refuse it): forced in, to show the
    unit never raises on it."""
    msgspec.structs.force_setattr(event, "data", msgspec.Raw(raw))
    return event


def test_it_is_registered_with_the_subagent_units() -> None:
    assert FLAGS_UNIT in SUBAGENT_UNITS and FLAGS_UNIT.key == "subagent_flags"


def test_a_fresh_session_has_no_flags_and_its_state_is_plain_json() -> None:
    state = fold([turn_start_event(0, T), message_event(1), turn_end_event(2, T)])
    assert FLAGS_UNIT.view(state) == NOTHING
    assert json.loads(json.dumps(state)) == state


def test_a_marker_stops_it_and_only_an_explicit_message_clears_it() -> None:
    events = [turn_start_event(0, T), stopped_event(1), turn_end_event(2, T)]
    assert view(events)["stopped"] is True
    # A settlement notice, a compaction, a tool result or a new turn clear nothing.
    notice = [message_event(3, "subagent-settled", 2), message_event(4, "compaction", 2), turn_start_event(5, T, 2)]
    assert view(events + notice)["stopped"] is True
    # A person's words or another agent's message do.
    assert view([*events, message_event(3, "user", 2)])["stopped"] is False
    assert view([*events, message_event(3, "agent-message", 2)])["stopped"] is False
    # And a later marker stops it again.
    assert view([*events, message_event(3, "user", 2), stopped_event(4)])["stopped"] is True


KINDS = ["stop", "user", "agent", "notice", "turn"]


def _event(seq: int, kind: str) -> Event:
    if kind == "stop":
        return stopped_event(seq)
    if kind == "turn":
        return turn_start_event(seq, T)
    return message_event(seq, {"user": "user", "agent": "agent-message", "notice": "subagent-settled"}[kind])


@pytest.mark.parametrize("k", [0, 2])
def test_stopped_is_the_stop_markers_verdict_after_every_event(k: int) -> None:
    """The fold agrees with `storage.stop_verdict.stopped` (the one definition the registry and
    the tree stop read) on every prefix of every short log, a seeded one's inherited prefix
    included (a fork inherits its parent's history, not its stop)."""
    for kinds in itertools.product(KINDS, repeat=4):
        events = [_event(seq, kind) for seq, kind in enumerate(kinds)]
        state = FLAGS_UNIT.initial(HEADER, k)
        for n, event in enumerate(events, 1):
            state = FLAGS_UNIT.apply(state, event)
            assert FLAGS_UNIT.view(state)["stopped"] is stopped(events[:n], k), (kinds, n)


def test_in_doubt_counts_the_results_in_doubt_of_the_last_turn() -> None:
    turn = [
        turn_start_event(0, T),
        call_event(1, "a"),
        result_event(2, "a"),
        call_event(3, "b"),
        result_event(4, "b", in_doubt=False),  # an idempotent tool run again: not in doubt
        call_event(5, "c"),
        result_event(6, "c"),
    ]
    assert view(turn)["in_doubt"] == 2  # while the turn is open
    ended = [*turn, turn_end_event(7, T)]
    assert view(ended)["in_doubt"] == 2  # and once it ended: its parent lists it settled
    assert view([*ended, message_event(8, "subagent-settled", 2)])["in_doubt"] == 2
    assert view([*ended, turn_start_event(8, T, 2)])["in_doubt"] == 0  # its next turn clears it


def test_a_forks_inherited_events_count_for_neither() -> None:
    # seq 0..3 inherited (the parent's stop and its in-doubt result), 4 the end-seed marker.
    inherited = [turn_start_event(0, T), call_event(1, "a"), result_event(2, "a"), stopped_event(3)]
    assert view([*inherited, seed_marker(4, T)], k=4) == NOTHING
    assert view([*inherited, seed_marker(4, T), call_event(5, "b"), result_event(6, "b")], k=4)["in_doubt"] == 1


def test_events_it_ignores_return_the_very_same_state() -> None:
    state = fold([stopped_event(0), turn_start_event(1, T), call_event(2, "a"), result_event(3, "a")])
    for event in [
        call_event(4, "b"),
        result_event(5, "b", in_doubt=False),
        message_event(6, "subagent-settled"),
        stopped_event(7),  # already stopped
        turn_end_event(8, T),
        make_event(9, "step/start", T, {"turn": 1, "step": 2}),
    ]:
        assert FLAGS_UNIT.apply(state, event) is state, event.type
    fresh = fold([])
    assert FLAGS_UNIT.apply(fresh, turn_start_event(0, T)) is fresh  # nothing in doubt to clear
    assert FLAGS_UNIT.apply(fresh, message_event(0)) is fresh  # nothing stopped to clear


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[" * 5000 + b"]" * 5000,
        b"[1, 2]",
        b'"a string"',
        b'{"message": []}',
        b'{"message": {"source": "user"}}',
        b'{"message": {"source": {"kind": ["user"]}}}',  # unhashable
        b'{"message": {"source": {"kind": {"a": 1}}}}',
        b'{"in_doubt": "yes"}',
        b'{"in_doubt": 1}',
    ],
)
def test_bad_payloads_never_raise_and_count_for_nothing(raw: bytes) -> None:
    base = [turn_start_event(0, T), stopped_event(1)]
    bad_message = forced(message_event(2), raw)
    bad_result = forced(result_event(3, "a"), raw)
    state = fold([*base, bad_message, bad_result])
    assert FLAGS_UNIT.view(state) == {"stopped": True, "in_doubt": 0}


@pytest.mark.parametrize(
    "val",
    [
        None,
        [],
        "x",
        {},
        {"own_from": "0", "stopped": False, "in_doubt": 0},
        {"own_from": 0, "stopped": "yes", "in_doubt": 0},
        {"own_from": 0, "stopped": False, "in_doubt": -1},
        {"own_from": 0, "stopped": False, "in_doubt": 1.5},
        {"own_from": 0, "stopped": False, "in_doubt": 0, "extra": 1},
    ],
)
def test_a_tampered_checkpoint_state_folds_without_raising_and_views_as_none(val: Any) -> None:
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    cells = registry.cells(HEADER, 0, {"subagent_flags": CheckpointRow(ver=1, seq=0, val=val)})
    cells.fold([stopped_event(1), turn_start_event(2, T), call_event(3, "a"), result_event(4, "a"), message_event(5)])
    assert cells.snapshot(["subagent_flags"]) == {"subagent_flags": None}  # never a broken cell


def test_restoring_from_rows_at_every_split_matches_folding_from_scratch() -> None:
    events = [
        turn_start_event(0, T),
        call_event(1, "a"),
        result_event(2, "a"),
        stopped_event(3),
        turn_end_event(4, T),
        message_event(5, "user", 2),
        turn_start_event(6, T, 2),
        call_event(7, "b", 2),
        result_event(8, "b", 2),
        stopped_event(9),
    ]
    registry = ProjectionRegistry([FLAGS_UNIT])
    scratch = registry.cells(HEADER, 0)
    scratch.fold(events)
    assert scratch.snapshot() == {"subagent_flags": {"stopped": True, "in_doubt": 1}}
    for split in range(len(events) + 1):
        first = registry.cells(HEADER, 0)
        first.fold(events[:split])
        rows = {
            key: CheckpointRow(ver=row.ver, seq=row.seq, val=json.loads(json.dumps(row.val)))
            for key, row in first.checkpoint().items()
        }
        restored = registry.cells(HEADER, 0, rows)
        restored.fold(events[restored.floor + 1 :])
        assert restored.snapshot() == scratch.snapshot() and restored.checkpoint() == scratch.checkpoint()


def _random_event(rng: random.Random, seq: int) -> Event:
    kind = rng.choice(["stop", "user", "agent", "notice", "turn", "doubt", "result", "end", "bad-msg", "bad-res"])
    if kind == "stop":
        return stopped_event(seq)
    if kind in ("user", "agent", "notice"):
        return message_event(seq, {"user": "user", "agent": "agent-message", "notice": "subagent-settled"}[kind])
    if kind == "turn":
        return turn_start_event(seq, T)
    if kind == "end":
        return turn_end_event(seq, T)
    if kind in ("doubt", "result"):
        return result_event(seq, f"c{seq}", in_doubt=kind == "doubt")
    if kind == "bad-msg":
        return forced(message_event(seq), rng.choice([b"not json", b"[1]", b'{"message": {"source": {"kind": [1]}}}']))
    return forced(result_event(seq, "x"), rng.choice([b"not json", b"[1]", b'{"in_doubt": "yes"}']))


@pytest.mark.parametrize("seed", range(40))
def test_the_batch_fold_gives_exactly_the_left_fold_of_apply(seed: int) -> None:
    """`fold` over any run, from any state the unit makes (or a tampered one), is the plain
    left fold of `apply` (what the registry relies on when it calls it instead)."""
    rng = random.Random(seed)
    events = [_random_event(rng, seq) for seq in range(rng.randrange(1, 60))]
    k = rng.choice([0, 0, rng.randrange(len(events))])
    start = rng.randrange(len(events))
    state = fold(events[:start], k)
    if rng.random() < 0.1:
        state = rng.choice([None, {"stopped": True}, {"own_from": 0, "stopped": False, "in_doubt": -2}])
    run = events[start:]
    expected = state
    for event in run:
        expected = FLAGS_UNIT.apply(expected, event)
    assert FLAGS_UNIT.fold(state, run) == expected
    if expected is state:
        assert FLAGS_UNIT.fold(state, run) is state  # unchanged: the very same object


def test_the_batch_fold_decodes_only_what_can_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long log never stopped: only the last turn's tool results are decoded, no message; once
    stopped, only the messages after the marker, from the end until an explicit one."""
    from subagents.runtime.delegation import units

    events: list[Event] = []
    for turn in range(1, 51):
        events += [turn_start_event(len(events), T, turn), message_event(len(events) + 1, "user", turn)]
        events += [result_event(len(events), f"c{len(events)}", turn) for _ in range(3)]
    results: list[int] = []
    messages: list[int] = []
    doubt, explicit = units._doubt, units.is_explicit_message

    class Counting:
        def decode(self, data: Any) -> Any:
            results.append(1)
            return doubt.decode(data)

    def counting_explicit(event: Event) -> bool:
        messages.append(event.seq)
        return explicit(event)

    monkeypatch.setattr(units, "_doubt", Counting())
    monkeypatch.setattr(units, "is_explicit_message", counting_explicit)
    state = FLAGS_UNIT.fold(FLAGS_UNIT.initial(HEADER, 0), events)
    assert FLAGS_UNIT.view(state) == {"stopped": False, "in_doubt": 3}
    assert (len(results), messages) == (3, [])
    results.clear()

    n = len(events)
    tail = [stopped_event(n), message_event(n + 1, "subagent-settled"), message_event(n + 2, "compaction")]
    state = FLAGS_UNIT.fold(state, tail)
    assert FLAGS_UNIT.view(state) == {"stopped": True, "in_doubt": 3}
    assert (len(results), messages) == (0, [n + 2, n + 1])
