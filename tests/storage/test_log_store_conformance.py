"""One conformance suite for every `LogStore`: the file store, the memory store, the faulty wrapper
and the PostgreSQL store (issue 18).

Runs through the `store`/`store_factory` fixtures (tests/conftest.py), so each test runs against
all of them (projection checkpoints included); the file-system walks at the end use a
`FileLogStore` on a tmp dir directly.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pg_damage
import pytest
import zstandard
from clocks import T
from events import seed_marker
from log_lines import header, log_file, read_all, rel_folder, wire
from subagents.storage import (
    AlreadyOwned,
    Batch,
    CorruptLog,
    Event,
    FileLogStore,
    HandleClosed,
    InvalidEvent,
    InvalidRange,
    InvalidSessionId,
    LogStore,
    Offset,
    PostgresLogStore,
    SequenceConflict,
    SessionAlreadyExists,
    SessionId,
    SessionNotFound,
    StorageError,
    encode_session_id,
    make_event,
)
from subagents.storage import catalog as catalog_module
from subagents.storage.file_store import _LOG_NAMES
from subagents.storage.fs import OsFs
from subagents.storage.index import INDEX_NAME
from subagents.storage.projection import CheckpointRow, Lifecycle
from subagents.storage.testing import FaultyLogStore, MemoryLogStore

StoreFactory = Callable[[], LogStore]

T0 = T + 1

CODES: dict[type[StorageError], str] = {
    AlreadyOwned: "STORAGE_ALREADY_OWNED",
    HandleClosed: "STORAGE_HANDLE_CLOSED",
    InvalidEvent: "STORAGE_INVALID_EVENT",
    InvalidSessionId: "STORAGE_INVALID_SESSION_ID",
    SequenceConflict: "STORAGE_SEQUENCE_CONFLICT",
    SessionAlreadyExists: "STORAGE_SESSION_ALREADY_EXISTS",
    SessionNotFound: "STORAGE_SESSION_NOT_FOUND",
}


@contextmanager
def raises(kind: type[StorageError], session_id: str | None = None) -> Iterator[pytest.ExceptionInfo[Any]]:
    """`pytest.raises` that also checks the stable code and, if given, that the message names the session."""
    with pytest.raises(kind) as info:
        yield info
    err = info.value
    assert isinstance(err, StorageError)
    assert isinstance(err.code, str) and err.code.startswith("STORAGE_")
    assert err.code == CODES[kind]
    if session_id is not None:
        assert repr(session_id) in str(err)


def turn(seq: int, n: int = 1) -> Event:
    return make_event(seq, "turn/start", T0 + seq, {"turn": n})


def events(start: int, stop: int) -> list[Event]:
    return [turn(seq) for seq in range(start, stop)]


def batch(start: int, stop: int) -> Batch:
    return Batch(Offset(start), events(start, stop))


def publish(store: LogStore, sid: str = "s1", count: int = 1) -> None:
    """Create, append `count` events and close."""
    handle = store.create(header(sid))
    store.append(handle, [batch(0, count)])
    store.close(handle)


# --- creation and publication -------------------------------------------------------------------


def test_create_writes_nothing_visible(store: LogStore) -> None:
    handle = store.create(header("s1"))
    assert handle.session_id == "s1"
    assert handle.header == header("s1")
    assert handle.next_seq == 0
    assert handle.published is False
    assert handle.inherited_event_count == 0
    assert store.list() == []
    assert store.stat("s1") is None
    with raises(SessionNotFound, "s1"):
        store.open_read("s1")
    assert store.read(handle) == []
    store.close(handle)


def test_unpublished_session_stays_invisible_after_close(store: LogStore) -> None:
    store.close(store.create(header("s1")))
    assert store.list() == []
    assert store.stat("s1") is None
    with raises(SessionNotFound, "s1"):
        store.open_read("s1")
    with raises(SessionNotFound, "s1"):
        store.open_write("s1")


def test_unpublished_session_can_be_created_again(store: LogStore) -> None:
    store.close(store.create(header("s1", agent_preset="old")))
    handle = store.create(header("s1", agent_preset="new"))
    store.append(handle, [batch(0, 1)])
    store.close(handle)
    info = store.stat("s1")
    assert info is not None
    assert info.header == header("s1", agent_preset="new")


def test_first_append_publishes(store: LogStore) -> None:
    handle = store.create(header("s1", cwd="/work", origin="subagent", parent_session=SessionId("p")))
    assert store.append(handle, [batch(0, 2)]) == 2
    assert handle.published is True
    assert handle.next_seq == 2
    info = store.stat("s1")
    assert info is not None
    assert info.id == "s1"
    assert info.header == handle.header
    assert info.event_count == 2
    assert [i.id for i in store.list()] == ["s1"]
    assert read_all(store, "s1") == events(0, 2)
    store.close(handle)


def test_empty_append_publishes_nothing(store: LogStore) -> None:
    handle = store.create(header("s1"))
    assert store.append(handle, []) == 0
    assert store.append(handle, [Batch(Offset(0), [])]) == 0
    assert handle.published is False
    assert store.stat("s1") is None
    store.close(handle)


# --- appending ----------------------------------------------------------------------------------


def test_append_returns_the_next_seq(store: LogStore) -> None:
    handle = store.create(header())
    assert store.append(handle, [batch(0, 1)]) == 1
    assert store.append(handle, [batch(1, 4)]) == 4
    assert store.append(handle, [batch(4, 5)]) == 5
    assert handle.next_seq == 5
    assert store.read(handle) == events(0, 5)
    store.close(handle)


def test_several_batches_in_one_call(store: LogStore) -> None:
    handle = store.create(header())
    assert store.append(handle, [batch(0, 2), batch(2, 3), batch(3, 6)]) == 6
    assert store.append(handle, [batch(6, 7), batch(7, 9)]) == 9
    assert store.read(handle) == events(0, 9)
    store.close(handle)
    assert read_all(store, "s1") == events(0, 9)


@pytest.mark.parametrize(
    "batches",
    [
        pytest.param([batch(2, 3)], id="ahead"),
        pytest.param([batch(5, 6)], id="far-ahead"),
        pytest.param([batch(0, 1)], id="behind"),
        pytest.param([batch(1, 2), batch(5, 6)], id="second-batch-gap"),
        pytest.param([batch(1, 3), batch(2, 4)], id="second-batch-overlap"),
    ],
)
def test_sequence_conflict_writes_nothing_and_keeps_the_handle(store: LogStore, batches: list[Batch]) -> None:
    handle = store.create(header())
    store.append(handle, [batch(0, 1)])
    before = store.stat("s1")
    with raises(SequenceConflict, "s1"):
        store.append(handle, batches)
    assert handle.next_seq == 1
    after = store.stat("s1")
    assert after is not None and before is not None
    assert after.event_count == 1
    assert after.revision == before.revision
    assert store.append(handle, [batch(1, 3)]) == 3
    assert store.read(handle) == events(0, 3)
    store.close(handle)


def test_sequence_conflict_before_publication_publishes_nothing(store: LogStore) -> None:
    handle = store.create(header())
    with raises(SequenceConflict, "s1"):
        store.append(handle, [batch(1, 2)])
    assert store.stat("s1") is None
    assert handle.published is False
    assert store.append(handle, [batch(0, 1)]) == 1
    store.close(handle)


def test_sequence_conflict_reports_what_was_expected(store: LogStore) -> None:
    handle = store.create(header())
    store.append(handle, [batch(0, 3)])
    with raises(SequenceConflict) as info:
        store.append(handle, [batch(5, 6)])
    assert info.value.expected == 5
    assert info.value.actual == 3
    store.close(handle)


@pytest.mark.parametrize(
    "batches",
    [
        pytest.param([Batch(Offset(0), [turn(1)])], id="wrong-first-seq"),
        pytest.param([Batch(Offset(0), [turn(0), turn(2)])], id="gap-inside"),
        pytest.param([Batch(Offset(0), [turn(0), turn(0)])], id="repeat-inside"),
        pytest.param([Batch(Offset(0), [turn(1), turn(0)])], id="reversed"),
        pytest.param([batch(0, 1), Batch(Offset(1), [turn(2)])], id="second-batch-mismatch"),
        pytest.param([Batch(Offset(0), [{"seq": 0}])], id="not-an-event"),  # type: ignore[list-item]  # deliberately not an Event: the refusal under test
    ],
)
def test_batch_whose_events_do_not_match_its_expected_seq_is_refused(store: LogStore, batches: list[Batch]) -> None:
    handle = store.create(header())
    with raises(InvalidEvent, "s1"):
        store.append(handle, batches)
    assert store.stat("s1") is None
    assert handle.next_seq == 0
    assert store.append(handle, [batch(0, 2)]) == 2
    with raises(InvalidEvent, "s1"):
        store.append(handle, [Batch(Offset(2), [turn(3)])])
    info = store.stat("s1")
    assert info is not None and info.event_count == 2
    store.close(handle)


# --- reading ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "stop", "expected"),
    [
        (0, None, range(0, 5)),
        (0, 5, range(0, 5)),
        (2, None, range(2, 5)),
        (1, 3, range(1, 3)),
        (4, 5, range(4, 5)),
        (0, 0, range(0, 0)),
        (3, 3, range(3, 3)),
        (5, None, range(5, 5)),
        (5, 5, range(5, 5)),
    ],
)
def test_read_ranges(store: LogStore, start: int, stop: int | None, expected: range) -> None:
    writer = store.create(header())
    store.append(writer, [batch(0, 5)])
    reader = store.open_read("s1")
    want = [turn(seq) for seq in expected]
    stop_offset = None if stop is None else Offset(stop)
    assert store.read(reader, Offset(start), stop_offset) == want
    assert store.read(writer, Offset(start), stop_offset) == want
    store.close(reader)
    store.close(writer)


def test_read_accepts_an_abort_poll(store: LogStore) -> None:
    publish(store, "s1", 3)
    reader = store.open_read("s1")
    assert store.read(reader, poll=lambda: None) == events(0, 3)
    assert store.read(reader, Offset(1), Offset(2), poll=lambda: None) == events(1, 2)
    store.close(reader)


def test_open_read_sees_later_appends(store: LogStore) -> None:
    writer = store.create(header())
    store.append(writer, [batch(0, 1)])
    reader = store.open_read("s1")
    assert reader.session_id == "s1"
    assert reader.header == header()
    assert reader.inherited_event_count == 0
    assert store.read(reader) == events(0, 1)
    store.append(writer, [batch(1, 3)])
    assert store.read(reader) == events(0, 3)
    assert store.read(reader, Offset(1)) == events(1, 3)
    store.close(reader)
    store.close(writer)


def test_several_readers_and_a_writer_coexist(store: LogStore) -> None:
    writer = store.create(header())
    store.append(writer, [batch(0, 2)])
    r1 = store.open_read("s1")
    r2 = store.open_read("s1")
    store.append(writer, [batch(2, 3)])
    assert store.read(r1) == events(0, 3)
    assert store.read(r2) == events(0, 3)
    for h in (r1, r2, writer):
        store.close(h)


def test_read_handle_survives_the_writer_closing(store: LogStore) -> None:
    writer = store.create(header())
    store.append(writer, [batch(0, 2)])
    reader = store.open_read("s1")
    store.close(writer)
    assert store.read(reader) == events(0, 2)
    store.close(reader)


# --- streaming reads (read_chunks) ---------------------------------------------------------------

BIG_TEXT = 4_000  # characters of each summary: a log of 800 events is about 3.3 MB plain


def summary(seq: int) -> Event:
    text = f"{seq:06d} " + "".join(random.Random(seq).choices("abcdefghijklmnopqrstuvwxyz ", k=BIG_TEXT))
    return make_event(seq, "compaction/summary", T0 + seq, {"text": text})


def publish_big(store: LogStore, sid: str = "s1", events: int = 800, per_batch: int = 5, k: int = 0) -> None:
    """A log of several MB in many batches (several chunks on files, pages of rows on
    PostgreSQL); seeded with `k` inherited events when `k`."""
    handle = store.create(header(sid, is_seeded=k > 0), inherited_event_count=Offset(k))
    every = [summary(seq) for seq in range(k)]
    if k:
        every.append(seed_marker(k, T0 + k))
    every += [summary(seq) for seq in range(len(every), events)]
    batches = [Batch(Offset(i), every[i : i + per_batch]) for i in range(0, events, per_batch)]
    for call in range(0, len(batches), 8):  # a zstd frame per call
        store.append(handle, batches[call : call + 8])
    store.close(handle)


def streamed(store: LogStore, handle: Any, start: int = 0) -> tuple[list[Event], StorageError | None, int]:
    """The stream's events, concatenated; the error that ended it, if any; how many chunks."""
    got: list[Event] = []
    chunks = 0
    try:
        for chunk in store.read_chunks(handle, start=Offset(start)):
            assert chunk, "a stream yields non-empty chunks"
            got.extend(chunk)
            chunks += 1
    except StorageError as exc:
        return got, exc, chunks
    return got, None, chunks


def assert_streams_as_read(
    store: LogStore, handle: Any, start: int = 0
) -> tuple[list[Event], StorageError | None, int]:
    """`list(chain(read_chunks(start)))` is `read(start)`; a damaged log raises the same error
    (type, seq, offset, message) from both."""
    want: list[Event] | None
    try:
        want, error = store.read(handle, Offset(start)), None
    except StorageError as exc:
        want, error = None, exc
    got, got_error, chunks = streamed(store, handle, start)
    if error is None:
        assert got_error is None, got_error
        assert got == want
    else:
        assert type(got_error) is type(error) and str(got_error) == str(error), (got_error, error)
    return got, got_error, chunks


@pytest.mark.parametrize("start", [0, 1, 7, 399, 799, 800, 900])
def test_read_chunks_concatenate_to_read(store: LogStore, start: int) -> None:
    publish_big(store)
    reader = store.open_read("s1")
    got, error, _ = assert_streams_as_read(store, reader, start)
    assert error is None and [e.seq for e in got] == list(range(start, 800))
    writer = store.open_write("s1")
    assert_streams_as_read(store, writer, start)
    store.close(writer)
    store.close(reader)


@pytest.mark.parametrize("start", [0, 2, 3, 4, 500])
def test_read_chunks_of_a_seeded_log(store: LogStore, start: int) -> None:
    publish_big(store, k=3)
    reader = store.open_read("s1")
    got, error, _ = assert_streams_as_read(store, reader, start)
    assert error is None and len(got) == 800 - start
    store.close(reader)


def test_read_chunks_of_small_and_unpublished_logs(store: LogStore) -> None:
    writer = store.create(header())
    assert list(store.read_chunks(writer)) == []
    store.append(writer, [batch(0, 3)])
    assert [e for chunk in store.read_chunks(writer) for e in chunk] == events(0, 3)
    reader = store.open_read("s1")
    assert list(store.read_chunks(reader)) == [events(0, 3)]
    assert list(store.read_chunks(reader, start=Offset(3))) == []
    store.append(writer, [batch(3, 5)])  # a reader sees later appends, as `read` does
    assert_streams_as_read(store, reader)
    store.close(writer)
    store.close(reader)


def test_read_chunks_refuses_a_closed_handle_and_a_bad_start_at_the_call(store: LogStore) -> None:
    publish(store, "s1", 2)
    reader = store.open_read("s1")
    with pytest.raises(InvalidRange):
        store.read_chunks(reader, start=-1)  # type: ignore[arg-type]  # what a caller may pass
    store.close(reader)
    with raises(HandleClosed, "s1"):
        store.read_chunks(reader)


def test_read_chunks_calls_the_poll_and_passes_its_exception(store: LogStore) -> None:
    publish_big(store)
    reader = store.open_read("s1")
    polls: list[int] = []
    assert sum(len(c) for c in store.read_chunks(reader, poll=lambda: polls.append(1))) == 800
    assert polls  # between chunks (and rows)

    class Stop(Exception):
        pass

    def stop() -> None:
        raise Stop

    with pytest.raises(Stop):
        for _ in store.read_chunks(reader, poll=stop):
            pass
    store.close(reader)


def _file_store(store: LogStore) -> FileLogStore | None:
    inner = store.inner if isinstance(store, FaultyLogStore) else store
    return inner if isinstance(inner, FileLogStore) else None


def _edit_log(store: FileLogStore, sid: str, edit: Callable[[bytes], bytes]) -> None:
    """Rewrite a log file in place through the store's own `Fs` (on disk or in memory)."""
    folder = rel_folder(sid)
    (path,) = [f"{folder}/{name}" for name in _LOG_NAMES.values() if store.fs.revision(f"{folder}/{name}")]
    file = store.fs.open(path, "append")
    try:
        data = edit(file.pread(0, file.size()))
        file.truncate(0)
        file.write(data)
    finally:
        file.close()


def _damage(store: LogStore, sid: str, where: str) -> None:
    """Damage the log at about 60% of it (`where="middle"`), or tear its tail (`"tail"`)."""
    files = _file_store(store)
    if files is None:
        assert isinstance(store, PostgresLogStore)
        assert where == "middle", "a PostgreSQL batch row is whole or absent: it has no torn tail"
        pg_damage.garble_batch(store.url, sid, 480)
        return
    zstd = files.compression == "zstd"

    def edit(data: bytes) -> bytes:
        if where == "tail":
            if zstd:
                frame = zstandard.ZstdCompressor(write_checksum=True).compress(
                    b"".join(wire([summary(seq) for seq in range(800, 803)]))
                )
                return data + frame[: len(frame) // 2] + b"\0" * 100
            return data + wire([summary(800)])[0] + b'{"seq":801,"type":"compaction/sum'
        at = len(data) * 3 // 5
        if zstd:
            return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1 :]
        line = data.index(b'{"seq":', at)
        return data[:line] + b'{"seq":!' + data[line + len(b'{"seq":') :]

    _edit_log(files, sid, edit)


# A PostgreSQL batch row is whole or absent: it has no torn tail (its damage is the middle case).
_TORN_AND_DAMAGED = [
    *[pytest.param(backend, "middle") for backend in ("file", "file-zstd", "memory", "memory-zstd", "faulty")],
    pytest.param("pg", "middle", marks=pytest.mark.pg),
    *[pytest.param(backend, "tail") for backend in ("file", "file-zstd", "memory", "memory-zstd", "faulty")],
]


@pytest.mark.parametrize(("store_factory", "where"), _TORN_AND_DAMAGED, indirect=["store_factory"])
@pytest.mark.parametrize("start", [0, 600])
def test_read_chunks_of_a_damaged_or_torn_log_fail_or_end_as_read(store: LogStore, where: str, start: int) -> None:
    publish_big(store)
    _damage(store, "s1", where)
    reader = store.open_read("s1")
    got, error, chunks = assert_streams_as_read(store, reader, start)
    if where == "tail":
        assert error is None and [e.seq for e in got] == list(range(start, 800 + len(got) - (800 - start)))
        assert len(got) >= 800 - start  # a torn zstd frame may give back its complete lines
    elif _file_store(store) is None and start > 480:
        assert error is None  # PostgreSQL reads the rows from `start` on only, `read` alike
    else:
        assert isinstance(error, CorruptLog)
        if start == 0:
            assert chunks >= 1 and got and got[-1].seq < 480 + 5  # the earlier chunks came first
    store.close(reader)


# --- closing ------------------------------------------------------------------------------------


def test_close_is_idempotent(store: LogStore) -> None:
    writer = store.create(header())
    store.append(writer, [batch(0, 1)])
    reader = store.open_read("s1")
    for h in (reader, writer):
        store.close(h)
        store.close(h)
        assert h.closed is True
    unpublished = store.create(header("s2"))
    store.close(unpublished)
    store.close(unpublished)


def test_closed_write_handle_refuses_append_and_read(store: LogStore) -> None:
    writer = store.create(header())
    store.append(writer, [batch(0, 1)])
    store.close(writer)
    with raises(HandleClosed, "s1"):
        store.append(writer, [batch(1, 2)])
    with raises(HandleClosed, "s1"):
        store.read(writer)
    assert read_all(store, "s1") == events(0, 1)


def test_closed_unpublished_handle_refuses_append(store: LogStore) -> None:
    writer = store.create(header())
    store.close(writer)
    with raises(HandleClosed, "s1"):
        store.append(writer, [batch(0, 1)])
    assert store.stat("s1") is None


def test_closed_read_handle_refuses_read(store: LogStore) -> None:
    publish(store)
    reader = store.open_read("s1")
    store.close(reader)
    with raises(HandleClosed, "s1"):
        store.read(reader)


# --- ownership ----------------------------------------------------------------------------------


def test_second_create_of_the_same_id_is_already_owned(store: LogStore) -> None:
    first = store.create(header())
    with raises(AlreadyOwned, "s1"):
        store.create(header())
    store.append(first, [batch(0, 1)])
    with raises(AlreadyOwned, "s1"):
        store.create(header())
    store.close(first)


def test_open_write_of_an_owned_session_is_already_owned(store: LogStore) -> None:
    first = store.create(header())
    store.append(first, [batch(0, 1)])
    with raises(AlreadyOwned, "s1"):
        store.open_write("s1")
    store.close(first)
    second = store.open_write("s1")
    with raises(AlreadyOwned, "s1"):
        store.open_write("s1")
    store.close(second)


def test_open_write_of_a_session_being_created_is_already_owned(store: LogStore) -> None:
    first = store.create(header())
    with raises(AlreadyOwned, "s1"):
        store.open_write("s1")
    store.close(first)


def test_ownership_spans_store_instances_on_one_root(store_factory: StoreFactory) -> None:
    a = store_factory()
    b = store_factory()
    first = a.create(header())
    with raises(AlreadyOwned, "s1"):
        b.create(header())
    a.append(first, [batch(0, 1)])
    with raises(AlreadyOwned, "s1"):
        b.open_write("s1")
    a.close(first)
    second = b.open_write("s1")
    with raises(AlreadyOwned, "s1"):
        a.open_write("s1")
    assert b.append(second, [batch(1, 2)]) == 2
    b.close(second)
    assert read_all(a, "s1") == events(0, 2)


def test_held_elsewhere_takes_no_lock_and_names_only_held_sessions(store_factory: StoreFactory) -> None:
    """`held_elsewhere` reads who holds a lock without taking it. A writer of another store
    instance is elsewhere for the memory store (it has no processes) and the PostgreSQL store
    (each store is a host with leases of its own), and not for the file stores (the same
    process: tests/storage/test_locks.py holds one from another process); a closed handle, an
    unknown id or an invalid one is never held."""
    from subagents.storage import PostgresLogStore
    from subagents.storage.testing import MemoryLogStore

    a, b = store_factory(), store_factory()
    elsewhere = isinstance(a, (MemoryLogStore, PostgresLogStore))
    first = a.create(header("s1"))
    assert b.held_elsewhere(["s1", "s2", "nobody", "bad\x01id"]) == ({"s1"} if elsewhere else set())
    a.append(first, [batch(0, 1)])
    other = a.create(header("s2"))
    assert b.held_elsewhere(["s1", "s2"]) == ({"s1", "s2"} if elsewhere else set())
    a.close(first)
    a.close(other)
    assert b.held_elsewhere(["s1", "s2"]) == set()
    second = b.open_write("s1")
    assert a.held_elsewhere(["s1"]) == ({"s1"} if elsewhere else set())
    # Asking took nothing: the writer still appends, and another writer is still refused.
    assert b.append(second, [batch(1, 2)]) == 2
    with raises(AlreadyOwned, "s1"):
        a.open_write("s1")
    b.close(second)
    assert a.held_elsewhere(["s1"]) == set() and a.held_elsewhere([]) == set()


def test_holders_name_who_holds_what_held_elsewhere_names(store_factory: StoreFactory) -> None:
    """`holders` (issue 29: who runs a listed session) answers for the same ids as
    `held_elsewhere`, each with its holder: the owner host of the lease on PostgreSQL, `another
    process` for the memory store (it has no processes to name: tests/storage/test_locks.py
    names a real pid)."""
    from subagents.storage import ANOTHER_PROCESS, PostgresLogStore
    from subagents.storage.testing import MemoryLogStore

    a, b = store_factory(), store_factory()
    first = a.create(header("s1"))
    a.append(first, [batch(0, 1)])
    if isinstance(a, PostgresLogStore):
        assert b.holders(["s1", "nobody", "bad\x01id"]) == {"s1": f"host {a.host_id}"}
    elif isinstance(a, MemoryLogStore):
        assert b.holders(["s1", "nobody", "bad\x01id"]) == {"s1": ANOTHER_PROCESS}
    else:
        assert b.holders(["s1", "nobody", "bad\x01id"]) == {}  # this very process
    assert set(b.holders(["s1"])) == b.held_elsewhere(["s1"])
    a.close(first)
    assert b.holders(["s1"]) == {} and b.holders([]) == {}


def test_ownership_is_released_after_close(store: LogStore) -> None:
    first = store.create(header())
    store.close(first)
    second = store.create(header())
    store.append(second, [batch(0, 1)])
    store.close(second)
    third = store.open_write("s1")
    store.close(third)
    fourth = store.open_write("s1")
    store.close(fourth)


def test_ownership_is_per_session(store: LogStore) -> None:
    a = store.create(header("a"))
    b = store.create(header("b"))
    store.append(a, [batch(0, 1)])
    store.append(b, [batch(0, 2)])
    store.close(a)
    store.close(b)
    assert [(i.id, i.event_count) for i in store.list()] == [("a", 1), ("b", 2)]


def test_create_of_a_published_session_already_exists(store: LogStore) -> None:
    publish(store)
    with raises(SessionAlreadyExists, "s1"):
        store.create(header())
    # The refused create released its claim: the session can still be opened for writing.
    handle = store.open_write("s1")
    store.close(handle)


def test_create_of_a_published_session_from_another_store_already_exists(store_factory: StoreFactory) -> None:
    publish(store_factory())
    with raises(SessionAlreadyExists, "s1"):
        store_factory().create(header())


def test_open_write_of_an_unknown_id_creates_nothing(store: LogStore) -> None:
    with raises(SessionNotFound, "nope"):
        store.open_write("nope")
    assert store.list() == []
    assert store.stat("nope") is None
    with raises(SessionNotFound, "nope"):
        store.open_read("nope")
    # Nothing was claimed either.
    handle = store.create(header("nope"))
    store.close(handle)


def test_unknown_ids_are_not_found(store: LogStore) -> None:
    publish(store, "other")
    assert store.stat("nope") is None
    with raises(SessionNotFound, "nope"):
        store.open_read("nope")
    with raises(SessionNotFound, "nope"):
        store.open_write("nope")


# --- reopening ----------------------------------------------------------------------------------


def test_reopen_continues_at_the_event_count(store: LogStore) -> None:
    h = header("s1", delegation_depth=1, agent_preset="p")
    writer = store.create(h)
    store.append(writer, [batch(0, 3)])
    store.close(writer)
    again = store.open_write("s1")
    assert again.session_id == "s1"
    assert again.header == h
    assert again.next_seq == 3
    assert again.published is True
    assert again.inherited_event_count == 0
    assert store.read(again) == events(0, 3)
    with raises(SequenceConflict, "s1"):
        store.append(again, [batch(0, 1)])
    assert store.append(again, [batch(3, 5)]) == 5
    store.close(again)
    assert read_all(store, "s1") == events(0, 5)


def test_reopen_from_another_store_instance(store_factory: StoreFactory) -> None:
    publish(store_factory(), "s1", 2)
    other = store_factory()
    again = other.open_write("s1")
    assert again.next_seq == 2
    assert other.append(again, [batch(2, 3)]) == 3
    other.close(again)
    assert read_all(store_factory(), "s1") == events(0, 3)


# --- seeded logs --------------------------------------------------------------------------------


def seeded(k: int, own: int = 0) -> list[Event]:
    """Inherited events 0..k-1, the marker at k, then `own` own events."""
    return events(0, k) + [seed_marker(k, T0 + k)] + [turn(k + 1 + i) for i in range(own)]


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("own", [0, 2])
def test_seeded_log_publishes_with_its_seed_and_marker(store: LogStore, k: int, own: int) -> None:
    h = header("child", is_seeded=True)
    writer = store.create(h, inherited_event_count=Offset(k))
    assert writer.inherited_event_count == k
    assert store.append(writer, [Batch(Offset(0), seeded(k, own))]) == k + 1 + own
    store.close(writer)
    info = store.stat("child")
    assert info is not None
    assert info.damage is None
    assert info.inherited_event_count == k
    assert info.event_count == k + 1 + own
    assert info.header == h
    reader = store.open_read("child")
    assert reader.inherited_event_count == k
    assert store.read(reader) == seeded(k, own)
    store.close(reader)
    again = store.open_write("child")
    assert again.inherited_event_count == k
    assert again.header.is_seeded is True
    assert again.next_seq == k + 1 + own
    store.close(again)


def test_seeded_first_append_may_span_several_batches(store: LogStore) -> None:
    writer = store.create(header("child", is_seeded=True), inherited_event_count=Offset(2))
    log = seeded(2, 1)
    assert store.append(writer, [Batch(Offset(0), log[:1]), Batch(Offset(1), log[1:3]), Batch(Offset(3), log[3:])]) == 4
    assert store.append(writer, [batch(4, 5)]) == 5
    store.close(writer)
    assert read_all(store, "child") == log + [turn(4)]


@pytest.mark.parametrize(
    "first_append",
    [
        pytest.param(events(0, 2), id="seed-without-marker"),
        pytest.param(events(0, 1), id="part-of-seed"),
        pytest.param(events(0, 3), id="other-event-at-k"),
        pytest.param(events(0, 2) + [make_event(2, "session/end-seed", T0, {})], id="untagged-marker"),
        pytest.param([seed_marker(0, T0), turn(1), turn(2)], id="marker-too-early"),
        pytest.param(events(0, 1) + [seed_marker(1, T0 + 1), turn(2)], id="marker-before-k"),
        pytest.param(events(0, 3) + [seed_marker(3, T0 + 3)], id="marker-after-k"),
    ],
)
def test_seeded_first_append_must_end_the_seed_with_the_tagged_marker(
    store: LogStore, first_append: list[Event]
) -> None:
    writer = store.create(header("child", is_seeded=True), inherited_event_count=Offset(2))
    with raises(InvalidEvent, "child"):
        store.append(writer, [Batch(Offset(0), first_append)])
    assert writer.published is False
    assert store.stat("child") is None
    assert store.append(writer, [Batch(Offset(0), seeded(2))]) == 3
    store.close(writer)


@pytest.mark.parametrize(
    ("is_seeded", "k"),
    [pytest.param(False, 2, id="cut-without-seeded"), pytest.param(True, 0, id="seeded-without-cut")],
)
def test_create_requires_is_seeded_exactly_with_an_inherited_cut(store: LogStore, is_seeded: bool, k: int) -> None:
    # Every error the storage layer raises on purpose is a StorageError with a stable code.
    with pytest.raises(StorageError) as info:
        store.create(header("child", is_seeded=is_seeded), inherited_event_count=Offset(k))
    assert info.value.code.startswith("STORAGE_")
    assert isinstance(info.value, ValueError)
    assert store.list() == []
    handle = store.create(header("child"))  # nothing was claimed
    store.close(handle)


def test_unseeded_log_may_hold_a_marker_anywhere(store: LogStore) -> None:
    writer = store.create(header())
    log = [turn(0), seed_marker(1, T0 + 1), make_event(2, "session/end-seed", T0, {})]
    assert store.append(writer, [Batch(Offset(0), log)]) == 3
    store.close(writer)
    info = store.stat("s1")
    assert info is not None and info.damage is None and info.inherited_event_count == 0


# --- stat and list ------------------------------------------------------------------------------


def test_stat_row_fields(store: LogStore) -> None:
    h = header("s1", cwd="/w", parent_session=SessionId("p"), origin="subagent", delegation_depth=2, agent_preset="a")
    writer = store.create(h)
    store.append(writer, [batch(0, 2)])
    info = store.stat("s1")
    assert info is not None
    assert info.id == "s1"
    assert info.header == h
    assert info.damage is None
    assert info.inherited_event_count == 0
    assert info.event_count == 2
    assert info.revision.size > 0
    first = info.revision
    store.append(writer, [batch(2, 3)])
    info2 = store.stat("s1")
    assert info2 is not None
    assert info2.event_count == 3
    assert info2.revision != first
    assert info2.revision.size > first.size
    assert store.stat("s1") == info2  # unchanged log, unchanged row
    store.close(writer)


def test_list_rows_match_stat(store: LogStore) -> None:
    publish(store, "b", 2)
    publish(store, "a", 1)
    publish(store, "a/b", 3)
    rows = {info.id: info for info in store.list()}
    assert set(rows) == {"a", "b", "a/b"}
    for sid, info in rows.items():
        assert store.stat(sid) == info
        assert info.damage is None
        assert info.header == header(sid)
    assert rows["a/b"].event_count == 3


def timed(seq: int, time: int) -> Event:
    return make_event(seq, "turn/start", time, {"turn": 1})


def test_list_and_stat_report_the_last_events_time(store_factory: StoreFactory) -> None:
    """`last_time` is the last event's `time` field — not the greatest, not a file's mtime —
    after appends, after a reopen, and from a fresh store that rebuilds its rows (issue 29)."""
    store = store_factory()
    writer = store.create(header("s1"))
    assert store.stat("s1") is None
    store.append(writer, [Batch(Offset(0), [timed(0, T0 + 50), timed(1, T0 + 10)])])
    info = store.stat("s1")
    assert info is not None and info.last_time == T0 + 10
    assert [i.last_time for i in store.list()] == [T0 + 10]
    store.append(writer, [Batch(Offset(2), [timed(2, T0 + 7)])])
    assert [i.last_time for i in store.list()] == [T0 + 7]
    assert store.stat("s1") == store.list()[0]
    store.close(writer)
    again = store_factory()
    assert [i.last_time for i in again.list()] == [T0 + 7]
    reopened = again.open_write("s1")
    again.append(reopened, [Batch(Offset(3), [timed(3, T0 + 99)])])
    info = again.stat("s1")
    assert info is not None and (info.event_count, info.last_time) == (4, T0 + 99)
    again.close(reopened)
    files = _file_store(again)
    if files is not None and isinstance(files.fs, OsFs):
        os.remove(os.path.join(files.fs.root, INDEX_NAME))  # every row rebuilt by a whole scan
    fresh = store_factory()
    assert [(i.event_count, i.last_time) for i in fresh.list()] == [(4, T0 + 99)]
    stat = fresh.stat("s1")
    assert stat is not None and stat.last_time == T0 + 99


@pytest.mark.parametrize(("store_factory", "where"), _TORN_AND_DAMAGED, indirect=["store_factory"])
def test_a_damaged_or_torn_log_lists_its_last_good_events_time(store_factory: StoreFactory, where: str) -> None:
    """A damaged log's row has the time of the last event before the damage; a torn one's, the
    last complete event's (every event of `publish_big` has time T0 + seq)."""
    store = store_factory()
    publish_big(store)
    _damage(store, "s1", where)
    for info in (store_factory().stat("s1"), *store_factory().list()):
        assert info is not None
        if info.event_count:
            assert info.last_time == T0 + info.event_count - 1
        else:
            assert info.last_time == 0
        files = _file_store(store)
        if where == "middle" and files is not None and files.compression == "none":
            # a damaged log's events before the damage were decoded: their last time is known
            # (a garbled zstd frame hides them all: 0 events, and no time)
            assert info.damage == "corrupt" and 0 < info.event_count < 800 and info.last_time > 0


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("bad", [b'{"seq":!\n', b'{"seq":5,"type":"turn/start","time":1,"data":{}}\n', b"\xff\n"])
def test_a_log_damaged_after_its_events_lists_the_last_good_events_time(
    tmp_path: Path, compression: Any, bad: bytes
) -> None:
    """Damage inside whole records (a line that is no event, a seq gap, no UTF-8) after good
    events: the row counts the events before it and has the last one's time, from the bytes the
    scan read (a zstd log: its frames are intact, only a line is bad)."""
    store = FileLogStore(str(tmp_path), compression=compression)
    writer = store.create(header("s1"))
    store.append(writer, [Batch(Offset(0), [timed(0, T0 + 5), timed(1, T0 + 9)])])
    store.append(writer, [Batch(Offset(2), [timed(2, T0 + 3)])])
    store.close(writer)
    lines = b"".join(wire([timed(3, T0 + 8)])) + bad + b"".join(wire([timed(5, T0 + 70)]))
    with open(log_file(tmp_path, "s1", compression), "ab") as f:
        f.write(zstandard.ZstdCompressor(write_checksum=True).compress(lines) if compression == "zstd" else lines)
    for fresh in (store, FileLogStore(str(tmp_path), compression=compression)):
        (info,) = fresh.list()
        assert (info.damage, info.event_count, info.last_time) == ("corrupt", 4, T0 + 8)
        assert fresh.stat("s1") == info


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_growth_scan_reports_the_last_appended_events_time(
    tmp_path: Path, compression: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log that only grew (appended to by another writer) is scanned from its row's end, and
    the row then has the time of the last event it gained."""
    store = FileLogStore(str(tmp_path), compression=compression)
    writer = store.create(header("s1"))
    store.append(writer, [Batch(Offset(0), [timed(0, T0 + 5)])])
    store.close(writer)
    assert [i.last_time for i in store.list()] == [T0 + 5]
    lines = b"".join(wire([timed(1, T0 + 40), timed(2, T0 + 30)]))
    with open(log_file(tmp_path, "s1", compression), "ab") as f:
        f.write(zstandard.ZstdCompressor(write_checksum=True).compress(lines) if compression == "zstd" else lines)

    def whole(*_args: object, **_kwargs: object) -> object:
        raise AssertionError("scanned whole: expected a growth scan")

    monkeypatch.setattr(catalog_module, "scan_whole", whole)
    for fresh in (store, FileLogStore(str(tmp_path), compression=compression)):
        assert [(i.event_count, i.last_time) for i in fresh.list()] == [(3, T0 + 30)]


def test_list_skips_unpublished_sessions(store: LogStore) -> None:
    publish(store, "published", 1)
    store.close(store.create(header("closed-unpublished")))
    pending = store.create(header("pending"))
    assert [i.id for i in store.list()] == ["published"]
    store.append(pending, [batch(0, 1)])
    assert sorted(i.id for i in store.list()) == ["pending", "published"]
    store.close(pending)


def test_list_of_an_empty_store_is_empty(store: LogStore) -> None:
    assert store.list() == []


def test_list_sees_sessions_of_another_store_instance(store_factory: StoreFactory) -> None:
    publish(store_factory(), "x", 2)
    rows = store_factory().list()
    assert [(r.id, r.event_count) for r in rows] == [("x", 2)]


# --- projection checkpoints (SPEC 3.5) -------------------------------------------------------------
# A checkpoint's `log_offset` is the store's own (a byte offset in a file, an event count in
# PostgreSQL): only what `read_checkpoint` returned is handed back to `read_after`.


def test_checkpoints_round_trip_and_restore_from_their_offset(store: LogStore) -> None:
    handle = store.create(header("s1"))
    store.append(handle, [batch(0, 3)])
    rows = {"u": CheckpointRow(ver=1, seq=2, val={"n": 3}), "v": CheckpointRow(ver=2, seq=2, val=[1, "x"])}
    assert store.write_checkpoint(handle, rows) is True
    store.append(handle, [batch(3, 5)])
    found = store.read_checkpoint("s1", header("s1"), 0)
    assert found is not None
    got, offset = found
    assert got == rows
    reader = store.open_read("s1")
    for h in (reader, handle):
        after = store.read_after(h, offset, 3)
        assert after is not None and wire(after) == wire(events(3, 5))
    assert store.read_after(reader, offset, 4) is None  # the offset does not hold seq 4: fold from the start
    loaded = store.read_checkpoint_rows(["s1", "other"], keys=["v"])
    assert loaded is not None and loaded["other"] == []
    assert [(s.key, s.ver, s.seq, s.log_offset, s.value()) for s in loaded["s1"]] == [("v", 2, 2, offset, [1, "x"])]
    assert loaded["s1"][0].lifecycle == Lifecycle.of(header("s1"), 0)
    skipped = store.read_checkpoint_rows(["s1"], skip={"u": b'"n":3'})
    assert skipped is not None and [s.key for s in skipped["s1"]] == ["v"]
    # `keep`, the converse: a row of that unit only when its JSON holds the bytes.
    kept = store.read_checkpoint_rows(["s1"], keep={"u": b'"n":3'})
    assert kept is not None and sorted(s.key for s in kept["s1"]) == ["u", "v"]
    kept = store.read_checkpoint_rows(["s1"], keep={"u": b'"n":4'})
    assert kept is not None and [s.key for s in kept["s1"]] == ["v"]
    kept = store.read_checkpoint_rows(["s1", "other"], ["u"], keep={"u": b'"n":4', "v": b"nothing"})
    assert kept == {"s1": [], "other": []}
    store.close(reader)
    store.close(handle)


def test_a_checkpoint_at_the_end_continues_with_nothing(store: LogStore) -> None:
    handle = store.create(header("s1"))
    store.append(handle, [batch(0, 2)])
    assert store.write_checkpoint(handle, {"u": CheckpointRow(ver=1, seq=1, val=2)})
    found = store.read_checkpoint("s1", header("s1"), 0)
    assert found is not None
    assert store.read_after(handle, found[1], 2) == []
    store.close(handle)


def test_a_later_checkpoint_replaces_the_earlier_rows(store_factory: StoreFactory) -> None:
    store = store_factory()
    handle = store.create(header("s1"))
    store.append(handle, [batch(0, 1)])
    assert store.write_checkpoint(
        handle, {"u": CheckpointRow(ver=1, seq=0, val=1), "v": CheckpointRow(ver=1, seq=0, val=1)}
    )
    store.append(handle, [batch(1, 3)])
    assert store.write_checkpoint(handle, {"u": CheckpointRow(ver=1, seq=2, val=3)})
    store.close(handle)
    observers = [store]
    if not isinstance(store, MemoryLogStore):  # its index lives in the instance, not in the `CrashFs`
        observers.append(store_factory())  # as another process finds them
    for observer in observers:
        found = observer.read_checkpoint("s1", header("s1"), 0)
        assert found is not None and found[0] == {"u": CheckpointRow(ver=1, seq=2, val=3)}
        rows = observer.read_checkpoint_rows(["s1"])
        assert rows is not None and [(s.key, s.seq) for s in rows["s1"]] == [("u", 2)]


def test_checkpoints_of_another_lifecycle_are_not_served(store: LogStore) -> None:
    handle = store.create(header("s1"))
    store.append(handle, [batch(0, 1)])
    assert store.write_checkpoint(handle, {"u": CheckpointRow(ver=1, seq=0, val=1)})
    assert store.read_checkpoint("s1", header("s1", created_at=T + 1), 0) is None
    assert store.read_checkpoint("s1", header("s1"), 1) is None
    found = store.read_checkpoint("s1", header("s1"), 0)
    assert found is not None and found[0] == {"u": CheckpointRow(ver=1, seq=0, val=1)}
    assert store.read_checkpoint("nobody", header("nobody"), 0) is None
    store.close(handle)


def test_a_checkpoint_never_leads_the_log(store: LogStore) -> None:
    handle = store.create(header("s1"))
    assert store.write_checkpoint(handle, {"u": CheckpointRow(ver=1, seq=0, val=1)}) is False  # unpublished
    assert store.read_checkpoint("s1", header("s1"), 0) is None
    store.append(handle, [batch(0, 2)])
    # Rows of an older seq than the durable log's last: nothing to keep (not a failure).
    assert store.write_checkpoint(handle, {"u": CheckpointRow(ver=1, seq=0, val=1)}) is True
    assert store.read_checkpoint("s1", header("s1"), 0) is None
    assert store.write_checkpoint(handle, {"u": CheckpointRow(ver=1, seq=1, val=object())}) is False  # not JSON
    assert store.read_checkpoint("s1", header("s1"), 0) is None
    store.close(handle)


# --- session ids --------------------------------------------------------------------------------

INVALID_IDS = [
    pytest.param("", id="empty"),
    pytest.param("a\x00b", id="nul"),
    pytest.param("a\nb", id="newline"),
    pytest.param("\x7f", id="del"),
    pytest.param("\x85", id="nel"),
    pytest.param("x" * 81, id="81-bytes"),
    pytest.param("é" * 40 + "x", id="81-bytes-multibyte"),
    pytest.param("\ud800", id="lone-surrogate"),
]

AWKWARD_VALID_IDS = [
    pytest.param("a/b", id="slash"),
    pytest.param("../escape", id="dotdot-slash"),
    pytest.param("/abs", id="absolute"),
    pytest.param("..", id="dotdot"),
    pytest.param(".", id="dot"),
    pytest.param(".hidden", id="leading-dot"),
    pytest.param("~", id="tilde"),
    pytest.param("~2F", id="looks-encoded"),
    pytest.param("lock", id="lock-name"),
    pytest.param("sessions", id="sessions-name"),
    pytest.param("index.sqlite3", id="index-name"),
    pytest.param("x" * 80, id="80-bytes"),
    pytest.param("😀" * 20, id="80-bytes-4-byte-chars"),
    pytest.param("a b\u2028c", id="spaces"),
]


@pytest.mark.parametrize("bad", INVALID_IDS)
def test_invalid_ids_are_refused_before_touching_the_store(store: LogStore, bad: str) -> None:
    with raises(InvalidSessionId):
        store.open_read(bad)
    with raises(InvalidSessionId):
        store.open_write(bad)
    with raises(InvalidSessionId):
        store.stat(bad)
    with raises(InvalidSessionId):
        header(bad)
    assert store.list() == []


@pytest.mark.parametrize("sid", AWKWARD_VALID_IDS)
def test_awkward_valid_ids_round_trip_through_the_store(store: LogStore, sid: str) -> None:
    publish(store, sid, 2)
    publish(store, "plain", 1)
    info = store.stat(sid)
    assert info is not None
    assert info.id == sid
    assert info.header == header(sid)
    assert info.event_count == 2
    assert sorted(i.id for i in store.list()) == sorted([sid, "plain"])
    assert read_all(store, sid) == events(0, 2)
    again = store.open_write(sid)
    assert again.next_seq == 2
    store.close(again)
    with raises(SessionAlreadyExists, sid):
        store.create(header(sid))


def _walk(root: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(found)


@pytest.mark.parametrize("bad", INVALID_IDS)
def test_invalid_ids_leave_the_file_system_untouched(tmp_path: Path, bad: str) -> None:
    store = FileLogStore(str(tmp_path))
    for op in (store.open_read, store.open_write, store.stat):
        with raises(InvalidSessionId):
            op(bad)
    assert _walk(tmp_path) == []


@pytest.mark.parametrize("compression", sorted(_LOG_NAMES))
@pytest.mark.parametrize("sid", AWKWARD_VALID_IDS)
def test_awkward_ids_stay_inside_their_folder_on_disk(tmp_path: Path, sid: str, compression: Any) -> None:
    root = tmp_path / "root"
    root.mkdir()
    store = FileLogStore(str(root), compression=compression)
    handle = store.create(header(sid))
    folder = rel_folder(sid)
    store.append(handle, [batch(0, 1)])
    store.close(handle)
    assert _walk(tmp_path) == ["root"] + [f"root/{p}" for p in _walk(root)]
    found = _walk(root)
    assert found == sorted(["sessions", folder, f"{folder}/lock", f"{folder}/{_LOG_NAMES[compression]}"])
    assert os.listdir(root / "sessions") == [encode_session_id(sid)]


@pytest.mark.parametrize(
    ("sid", "folder"),
    [
        ("a/b", "a~2Fb"),
        ("..", "~2E."),
        (".", "~2E"),
        (".hidden", "~2Ehidden"),
        ("x.y", "x.y"),
        ("~", "~7E"),
        ("../escape", "~2E.~2Fescape"),
        ("é", "~C3~A9"),
    ],
)
def test_folder_names_on_disk_are_the_documented_encoding(tmp_path: Path, sid: str, folder: str) -> None:
    store = FileLogStore(str(tmp_path))
    publish(store, sid)
    assert os.listdir(tmp_path / "sessions") == [folder]
    assert (tmp_path / "sessions" / folder / _LOG_NAMES[store.compression]).is_file()


def test_open_write_of_an_unknown_id_creates_no_folder(tmp_path: Path) -> None:
    store = FileLogStore(str(tmp_path))
    with raises(SessionNotFound, "a/b"):
        store.open_write("a/b")
    with raises(SessionNotFound, "a/b"):
        store.open_read("a/b")
    assert store.stat("a/b") is None
    assert _walk(tmp_path) == []
