"""`LogStore.write_observed_checkpoints` (issue 20 item 1): rows a reader proved by folding a whole
log are stored only for the revision it read, and never over rows of the same lifecycle at that
seq or later; both stores."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from log_lines import header, persist_log
from subagents.storage import (
    Batch,
    CheckpointRow,
    FileLogStore,
    Lifecycle,
    LogStore,
    ObservedCheckpoint,
    Offset,
    make_event,
)

Factory = Callable[[], LogStore]


@pytest.fixture(params=["file", "file-zstd", pytest.param("pg", marks=pytest.mark.pg)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogStore]:
    kind, _, form = request.param.partition("-")
    if kind == "pg":
        made = request.getfixturevalue("pg_store_factory")()
    else:
        made = FileLogStore(str(tmp_path), compression="zstd" if form else "none")
    yield made
    if kind != "pg":
        made.close_store()


def publish(store: LogStore, sid: str, events: int) -> None:
    persist_log(store, header(sid, 1), [make_event(i, "turn/start", i + 1, {"turn": i + 1}) for i in range(events)])


def observed(store: LogStore, sid: str, value: object) -> ObservedCheckpoint:
    """What a reader of the whole log as it is now would prove (one unit, "u")."""
    info = store.stat(sid)
    assert info is not None and info.header is not None
    return ObservedCheckpoint(
        session_id=info.id,
        lifecycle=Lifecycle.of(info.header, info.inherited_event_count),
        revision=info.revision,
        event_count=info.event_count,
        rows=(("u", 1, msgspec.json.encode(value)),),
    )


def stored(store: LogStore, sid: str) -> list[tuple[int, object]]:
    rows = (store.read_checkpoint_rows([sid]) or {}).get(sid, [])
    return [(r.seq, r.value()) for r in rows]


def test_rows_are_stored_at_the_log_end_and_restore_from_there(store: LogStore) -> None:
    publish(store, "s", 3)
    assert store.write_observed_checkpoints([observed(store, "s", {"n": 3})]) == 1
    assert stored(store, "s") == [(2, {"n": 3})]
    handle = store.open_write("s")
    try:
        found = store.read_checkpoint("s", handle.header, handle.inherited_event_count)
        assert found is not None
        rows, offset = found
        assert rows == {"u": CheckpointRow(ver=1, seq=2, val={"n": 3})}
        assert store.read_after(handle, offset, 3) == []  # the offset is the log's end: a record boundary
    finally:
        store.close(handle)


def test_a_log_that_changed_since_it_was_read_gets_no_rows(store: LogStore) -> None:
    publish(store, "s", 3)
    seen = observed(store, "s", {"n": 3})
    handle = store.open_write("s")
    try:
        store.append(handle, [Batch(Offset(3), [make_event(3, "turn/start", 9, {"turn": 9})])])
    finally:
        store.close(handle)
    store.list()  # the store knows the new revision
    assert store.write_observed_checkpoints([seen]) == 0
    assert stored(store, "s") == []


def test_rows_at_the_same_seq_or_later_are_kept(store: LogStore) -> None:
    publish(store, "s", 3)
    first = observed(store, "s", {"n": "first"})
    assert store.write_observed_checkpoints([first]) == 1
    assert store.write_observed_checkpoints([observed(store, "s", {"n": "again"})]) == 0  # the same revision
    assert stored(store, "s") == [(2, {"n": "first"})]


def test_older_rows_are_replaced_and_one_bad_entry_hides_no_other(store: LogStore) -> None:
    publish(store, "s", 2)
    publish(store, "t", 2)
    assert store.write_observed_checkpoints([observed(store, "s", {"n": 2})]) == 1
    handle = store.open_write("s")
    try:
        store.append(handle, [Batch(Offset(2), [make_event(2, "turn/start", 9, {"turn": 9})])])
    finally:
        store.close(handle)
    stale = observed(store, "t", {"t": 1})
    stale = ObservedCheckpoint(
        session_id=stale.session_id,
        lifecycle=stale.lifecycle,
        revision=stale.revision,
        event_count=stale.event_count + 5,  # not what the log holds
        rows=stale.rows,
    )
    assert store.write_observed_checkpoints([observed(store, "s", {"n": 3}), stale]) == 1
    assert stored(store, "s") == [(2, {"n": 3})]
    assert stored(store, "t") == []
