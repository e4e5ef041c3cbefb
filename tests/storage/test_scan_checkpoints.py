"""Checkpoint rows from the index's own scans (issue 28 item 1): a file store given projection
units folds every log it scans whole for its index row, and writes the rows that proves beside
the row, in the same index transaction — by the rules of a reader's observed rows: at the log's
last event, bound to its lifecycle, from the end of the scanned records; never for a damaged log,
a log without events, a log whose last frame is torn into recovered lines, or a unit that broke
or whose state is not JSON; and the rows of a log rescanned whole are replaced, never kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from log_lines import header, persist_log
from subagents.storage import Batch, FileLogStore, ProjectionRegistry, make_event

FORMS = ("none", "zstd")


class Count:
    key = "count"
    state_version = 1
    view = None

    def initial(self, header: Any, inherited_event_count: int) -> int:
        return 0

    def apply(self, state: int, event: Any) -> int:
        return state + 1


class Broken:
    key = "broken"
    state_version = 1
    view = None

    def initial(self, header: Any, inherited_event_count: int) -> int:
        return 0

    def apply(self, state: int, event: Any) -> int:
        raise RuntimeError("a unit bug")


class NotJson:
    key = "not_json"
    state_version = 1
    view = None

    def initial(self, header: Any, inherited_event_count: int) -> Any:
        return 0

    def apply(self, state: Any, event: Any) -> Any:
        return object()  # not JSON


UNITS = ProjectionRegistry([Count(), Broken(), NotJson()])
KEYS = ["count", "broken", "not_json"]


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[list[FileLogStore]]:
    opened: list[FileLogStore] = []
    yield opened
    for store in opened:
        store.close_store()


def events(n: int, start: int = 0) -> list[Any]:
    return [make_event(start + i, "turn/start", start + i + 1, {"turn": start + i + 1}) for i in range(n)]


def stored(store: FileLogStore, ids: list[str]) -> dict[str, list[tuple[str, int, int, Any, int]]]:
    found = store.read_checkpoint_rows(ids, KEYS) or {}
    return {sid: sorted((r.key, r.ver, r.seq, r.value(), r.log_offset) for r in rows) for sid, rows in found.items()}


def log_path(root: Path, sid: str) -> Path:
    (path,) = (root / "sessions" / sid).glob("session.jsonl*")
    return path


@pytest.mark.parametrize("compression", FORMS)
def test_a_whole_scan_writes_the_rows_of_every_healthy_unit(
    tmp_path: Path, stores: list[FileLogStore], compression: Any
) -> None:
    writer = FileLogStore(str(tmp_path), compression=compression, use_index=False)
    stores.append(writer)
    persist_log(writer, header("a", 1), events(5))
    persist_log(writer, header("b", 2), [])  # header only: nothing folded, no row
    store = FileLogStore(str(tmp_path), projections=UNITS)
    stores.append(store)
    assert stored(store, ["a", "b"]) == {"a": [], "b": []}  # (the index is made by this read)
    infos = {info.id: info for info in store.list()}
    assert infos["a"].event_count == 5
    size = log_path(tmp_path, "a").stat().st_size
    # Only the unit that folded to the end with a JSON state: at the last event, from the end.
    assert stored(store, ["a", "b"]) == {"a": [("count", 1, 4, 5, size)], "b": []}


@pytest.mark.parametrize("compression", FORMS)
def test_no_rows_without_units_or_for_a_damaged_log(
    tmp_path: Path, stores: list[FileLogStore], compression: Any
) -> None:
    writer = FileLogStore(str(tmp_path), compression=compression, use_index=False)
    stores.append(writer)
    persist_log(writer, header("a", 1), events(5))
    persist_log(writer, header("d", 2), events(5))
    path = log_path(tmp_path, "d")
    data = bytearray(path.read_bytes())
    data[len(data) // 2 + 4] ^= 0xFF  # a flipped byte in the middle: damaged, not torn
    path.write_bytes(bytes(data))
    plain = FileLogStore(str(tmp_path))
    stores.append(plain)
    assert {i.id: i.damage for i in plain.list()} == {"a": None, "d": "corrupt"}
    assert stored(plain, ["a", "d"]) == {"a": [], "d": []}  # no units given: the scan folds nothing
    for name in ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    store = FileLogStore(str(tmp_path), projections=UNITS)
    stores.append(store)
    assert {i.id: i.damage for i in store.list()} == {"a": None, "d": "corrupt"}
    found = stored(store, ["a", "d"])
    assert found["d"] == [] and [key for key, *_ in found["a"]] == ["count"]


def test_a_torn_tail_gets_rows_only_over_whole_records(tmp_path: Path, stores: list[FileLogStore]) -> None:
    writer = FileLogStore(str(tmp_path), compression="none", use_index=False)
    stores.append(writer)
    persist_log(writer, header("t", 1), events(3))
    path = log_path(tmp_path, "t")
    whole = path.stat().st_size
    with path.open("ab") as f:
        f.write(b'{"seq":3,"type":"turn/st')  # a torn last line: cut by the next writer
    store = FileLogStore(str(tmp_path), projections=UNITS)
    stores.append(store)
    (info,) = store.list()
    assert (info.event_count, info.damage) == (3, None)
    assert stored(store, ["t"]) == {"t": [("count", 1, 2, 3, whole)]}


@pytest.mark.parametrize("compression", FORMS)
def test_a_log_rescanned_whole_gets_its_new_rows(tmp_path: Path, stores: list[FileLogStore], compression: Any) -> None:
    """Rows of the old revision go in the transaction that writes the rescan's (a log replaced
    by a longer one, not a pure append of it)."""
    store = FileLogStore(str(tmp_path), compression=compression, projections=UNITS)
    stores.append(store)
    persist_log(store, header("r", 1), events(4))
    store.list()
    assert [row[:4] for row in stored(store, ["r"])["r"]] == [("count", 1, 3, 4)]
    other = FileLogStore(str(tmp_path / "other"), compression=compression, use_index=False)
    stores.append(other)
    persist_log(other, header("r", 7), events(6))  # another lifecycle of the id, more events
    log_path(tmp_path / "other", "r").replace(log_path(tmp_path, "r"))
    (info,) = store.list()
    assert (info.event_count, info.header) == (6, header("r", 7))
    assert [row[:4] for row in stored(store, ["r"])["r"]] == [("count", 1, 5, 6)]
    fresh = FileLogStore(str(tmp_path), projections=UNITS)
    stores.append(fresh)
    assert fresh.read_checkpoint("r", header("r", 7), 0) is not None  # bound to the new lifecycle
    assert fresh.read_checkpoint("r", header("r", 1), 0) is None


def test_a_grown_log_is_not_folded_again(tmp_path: Path, stores: list[FileLogStore]) -> None:
    """A log that only grew is scanned from where its row stopped: nothing is folded (its rows
    lag until a reader or its writer proves newer ones)."""
    store = FileLogStore(str(tmp_path), compression="none", projections=UNITS)
    stores.append(store)
    persist_log(store, header("g", 1), events(2))
    store.list()
    handle = store.open_write("g")
    try:
        store.append(handle, [Batch(handle.next_seq, events(3, start=2))])
    finally:
        store.close(handle)
    other = FileLogStore(str(tmp_path), projections=UNITS)
    stores.append(other)
    (info,) = other.list()
    assert info.event_count == 5
    assert [row[:4] for row in stored(other, ["g"])["g"]] == [("count", 1, 1, 2)]


# --- a store focused on one parent ----------------------------------------------------------------


def test_a_focused_list_reads_whole_only_the_focus_and_what_names_it(
    tmp_path: Path, stores: list[FileLogStore]
) -> None:
    writer = FileLogStore(str(tmp_path), compression="none", use_index=False)
    stores.append(writer)
    persist_log(writer, header("p", 1), events(2))
    persist_log(writer, header("c", 2, origin="subagent", parent_session="p"), events(3))
    persist_log(writer, header("o", 3, origin="subagent", parent_session="q"), events(4))
    persist_log(writer, header("q", 4), events(5))
    persist_log(writer, header("g", 5, origin="subagent", parent_session="q"), events(6))
    garbled = log_path(tmp_path, "g")
    garbled.write_bytes(b"{not a header\n" + garbled.read_bytes().split(b"\n", 1)[1])
    store = FileLogStore(str(tmp_path), projections=UNITS, focus="p")
    stores.append(store)
    infos = {info.id: info for info in store.list()}
    assert {sid for sid, info in infos.items() if info.checked} == {"p", "c", "g"}
    assert (infos["p"].event_count, infos["c"].event_count, infos["g"].damage) == (2, 3, "corrupt")
    for sid, created_at, parent in (("o", 3, "q"), ("q", 4, None)):
        info = infos[sid]
        assert info.header is not None and (info.header.created_at, info.header.parent_session) == (created_at, parent)
        assert (info.damage, info.event_count) == (None, 0)
    # Only the logs read whole have rows (and their checkpoint rows).
    found = stored(store, ["p", "c", "o", "q"])
    assert (bool(found["p"]), bool(found["c"]), found["o"], found["q"]) == (True, True, [], [])

    # A line-1 answer follows its log: a grown log is answered from its line 1 again, at its
    # new revision; a log whose line 1 now names the focus is read whole.
    handle = writer.open_write("o")
    try:
        writer.append(handle, [Batch(handle.next_seq, events(1, start=4))])
    finally:
        writer.close(handle)
    persist_log(writer, header("n", 6, origin="subagent", parent_session="p"), events(1))
    again = {info.id: info for info in store.list()}
    assert not again["o"].checked and again["o"].revision != infos["o"].revision
    assert again["o"].revision.size == log_path(tmp_path, "o").stat().st_size
    assert again["n"].checked and again["n"].event_count == 1
    # A stat reads whole whatever the focus.
    now = store.stat("o")
    assert now is not None and now.checked and now.event_count == 5
