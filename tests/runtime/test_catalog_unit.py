"""The `subagent_catalog` projection unit (issue 13, item 1): the children a session's own
`subagent/catalog` events name, a pure fold that never raises on bad data."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from clocks import T
from events import seed_marker, turn_end_event
from log_lines import header
from subagents.runtime.delegation.lineage import catalog_entries
from subagents.runtime.delegation.units import CATALOG_UNIT, SUBAGENT_UNITS
from subagents.storage import Event, make_event
from subagents.storage.projection import CheckpointRow, ProjectionRegistry

HEADER = header("p", T)


def catalog(seq: int, child_id: str, created_at: int, mode: str = "continuable", label: str | None = "x") -> Event:
    data: dict[str, Any] = {"version": 1, "child_id": child_id, "child_created_at": created_at, "mode": mode}
    if label is not None:
        data["label"] = label
    return make_event(seq, "subagent/catalog", T + seq, data)


def raw_catalog(seq: int, raw: bytes) -> Event:
    """Data no Event can be built with (readers refuse it): forced in, to show the unit skips it."""
    event = catalog(seq, "placeholder", 1)  # (an Event built by hand must hold a valid payload too)
    msgspec.structs.force_setattr(event, "data", msgspec.Raw(raw))
    return event


def fold(events: list[Event], k: int = 0) -> Any:
    state = CATALOG_UNIT.initial(HEADER, k)
    for event in events:
        state = CATALOG_UNIT.apply(state, event)
    return state


def test_it_is_registered_with_the_subagent_units() -> None:
    assert CATALOG_UNIT in SUBAGENT_UNITS and CATALOG_UNIT.key == "subagent_catalog"


def test_every_catalogued_child_is_named_with_its_creation_time_mode_and_label() -> None:
    state = fold(
        [catalog(0, "b", 20), catalog(1, "a", 10, "one-shot", None), make_event(2, "turn/start", T, {"turn": 1})]
    )
    view = CATALOG_UNIT.view(state)
    assert view == {
        "b": {"created_at": 20, "mode": "continuable", "label": "x"},
        "a": {"created_at": 10, "mode": "one-shot"},
    }
    assert json.loads(json.dumps(view)) == view and json.loads(json.dumps(state)) == state
    assert [e.id for e in catalog_entries(view)] == ["a", "b"]  # (created_at, id) order


def test_events_it_ignores_return_the_very_same_state() -> None:
    state = fold([catalog(0, "a", 1)])
    assert CATALOG_UNIT.apply(state, make_event(1, "turn/start", T, {"turn": 1})) is state


@pytest.mark.parametrize(
    "raw",
    [
        b'{"version": 2, "child_id": "z", "child_created_at": 1, "mode": "continuable"}',
        b'{"version": 1, "child_id": "z", "child_created_at": "1", "mode": "continuable"}',
        b'{"version": 1, "child_id": "z", "child_created_at": 1, "mode": "continuable", "extra": 1}',
        b'{"version": 1, "child_id": "bad\\u0001id", "child_created_at": 1, "mode": "continuable"}',
        b'{"version": 1, "child_id": "", "child_created_at": 1, "mode": "continuable"}',
        b"[" * 5000 + b"]" * 5000,
        b"not json",
    ],
)
def test_a_bad_entry_is_skipped_and_never_hides_its_siblings(raw: bytes) -> None:
    state = fold([catalog(0, "a", 1), raw_catalog(1, raw), catalog(2, "b", 2)])
    assert sorted(CATALOG_UNIT.view(state)) == ["a", "b"]


def test_a_forks_inherited_catalog_names_none_of_its_own_children() -> None:
    # seq 0..1 inherited (the parent's catalog), 2 the end-seed marker, then its own.
    events = [catalog(0, "parents-child", 1), turn_end_event(1, T, 1), seed_marker(2, T), catalog(3, "mine", 5)]
    assert list(CATALOG_UNIT.view(fold(events, k=2))) == ["mine"]


def test_a_tampered_checkpoint_state_folds_without_raising() -> None:
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    for val in ({"children": []}, {"own_from": "0", "children": {}}, [], None, {"own_from": 0, "children": {"a": 3}}):
        cells = registry.cells(HEADER, 0, {"subagent_catalog": CheckpointRow(ver=1, seq=0, val=val)})
        cells.fold([catalog(1, "b", 2)])
        snapshot = cells.snapshot(["subagent_catalog"])["subagent_catalog"]
        assert isinstance(snapshot, dict)  # never a broken cell


def test_the_view_is_a_copy() -> None:
    state = fold([catalog(0, "a", 1)])
    view = CATALOG_UNIT.view(state)
    view["a"]["mode"] = "changed"
    view["z"] = {}
    assert CATALOG_UNIT.view(state) == {"a": {"created_at": 1, "mode": "continuable", "label": "x"}}
