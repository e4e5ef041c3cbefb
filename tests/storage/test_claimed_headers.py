"""A damaged line 1 that is still a JSON object keeps what it says of its lineage (`claimed`),
through the index cache and across stores (issue 13, item 1; SPEC 5.4 step 3). On files and on
PostgreSQL, where line 1 is the `sessions` row's header, edited by hand (issue 18)."""

from __future__ import annotations

import json

import pytest
from log_lines import header, persist_log
from places import Place
from subagents.storage import HeaderClaim, LogStore, make_event
from subagents.storage.testing import MemoryLogStore


def publish(store: LogStore, sid: str, parent: str = "p") -> None:
    persist_log(
        store, header(sid, 42, origin="subagent", parent_session=parent), [make_event(0, "turn/start", 43, {"turn": 1})]
    )


def header_with(**changes: object) -> bytes:
    line = {
        "type": "session",
        "format": 1,
        "id": "c",
        "created_at": 42,
        "is_seeded": False,
        "inherited_event_count": 0,
        "delegation_depth": 1,
        "parent_session": "p",
        "origin": "subagent",
    }
    line.update(changes)
    return json.dumps(line).encode()


@pytest.mark.parametrize(
    ("line", "claim"),
    [
        (header_with(colour="blue"), HeaderClaim("subagent", "p", 42)),
        (header_with(delegation_depth="1"), HeaderClaim("subagent", "p", 42)),
        (header_with(id="someone-else"), HeaderClaim("subagent", "p", 42)),
        (header_with(created_at="soon", parent_session=7), HeaderClaim("subagent", None, None)),
        (header_with(format=2, colour="blue"), HeaderClaim("subagent", "p", 42)),
        (b"[1, 2]", None),
        (b"{not json", None),
    ],
)
def test_list_reports_the_claim_of_a_damaged_header_and_the_index_keeps_it(
    place: Place, line: bytes, claim: HeaderClaim | None
) -> None:
    store = place.store(compression="none")
    publish(store, "c")
    publish(store, "healthy")
    place.rewrite("c", lambda data: line + b"\n" + data.split(b"\n", 1)[1])
    (info,) = [i for i in store.list() if i.id == "c"]
    assert info.header is None and info.damage is not None and info.claimed == claim
    (healthy,) = [i for i in store.list() if i.id == "healthy"]
    assert healthy.claimed is None and healthy.header is not None
    again = place.store(compression="none")  # files: answered from the index rows
    assert [i.claimed for i in again.list() if i.id == "c"] == [claim]
    assert again.stat("c") == info


def test_the_memory_store_reports_claims_too() -> None:
    store = MemoryLogStore(compression="none")
    publish(store, "c")
    path = "sessions/c/session.jsonl"
    rest = store.crash_fs.read_bytes(path).split(b"\n", 1)[1]
    store.crash_fs.write_bytes(path, header_with(colour="blue") + b"\n" + rest)
    (info,) = store.list()
    assert info.header is None and info.damage == "corrupt" and info.claimed == HeaderClaim("subagent", "p", 42)


def test_checkpoint_rows_can_be_read_for_some_units_and_skip_a_usual_value() -> None:
    from subagents.storage.index import SessionIndex
    from subagents.storage.projection import CheckpointRow, Lifecycle

    index = SessionIndex(None)
    for sid, catalog in (("a", {"children": {}}), ("b", {"children": {"x": {"created_at": 1, "mode": "one-shot"}}})):
        session_header = header(sid, 1)
        rows = {
            "subagent": CheckpointRow(ver=2, seq=0, val={}),
            "subagent_timing": CheckpointRow(ver=2, seq=0, val={}),
            "subagent_catalog": CheckpointRow(ver=1, seq=0, val=catalog),
        }
        assert index.save_checkpoint(session_header.id, Lifecycle.of(session_header, 0), rows, 10)
    every = index.load_checkpoints(["a", "b"])
    assert every is not None and sorted(s.key for s in every["a"]) == [
        "subagent",
        "subagent_catalog",
        "subagent_timing",
    ]
    some = index.load_checkpoints(
        ["a", "b", "nobody"], ["subagent", "subagent_catalog"], {"subagent_catalog": b'"children":{}'}
    )
    assert some is not None
    assert {sid: sorted(s.key for s in rows) for sid, rows in some.items()} == {
        "a": ["subagent"],
        "b": ["subagent", "subagent_catalog"],
        "nobody": [],
    }
