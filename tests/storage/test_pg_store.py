"""What the PostgreSQL store holds beyond the shared `LogStore` contract (that runs in
test_log_store_conformance.py with the `pg` parameter): the schema and its version, batch rows
holding format 1's exact lines, zstd above a threshold, checkpoints, single-query listings,
damage planted in rows, and who holds a session."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import zstandard
from clocks import T
from events import assistant_event, turn_start_event
from events import turn_batch as batch
from events import turn_starts as turns
from log_lines import header, log_file, read_all
from subagents.storage import (
    AlreadyOwned,
    Batch,
    CheckpointRow,
    CorruptLog,
    FileLogStore,
    Lifecycle,
    Offset,
    OwnershipLost,
    PostgresLogStore,
    UnsupportedLog,
)
from subagents.storage.pg_schema import SCHEMA_VERSION

pytestmark = pytest.mark.pg

Factory = Callable[..., Any]


@pytest.fixture
def make(pg_store_factory: Factory) -> Factory:
    return pg_store_factory


@pytest.fixture
def db(pg_url: str, pg_store_factory: Factory) -> Iterator[psycopg.Connection[Any]]:
    """A connection of our own to the module's database, to look at and plant rows."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


def publish(store: PostgresLogStore, sid: str, *calls: list[Batch]) -> None:
    handle = store.create(header(sid))
    for batches in calls:
        store.append(handle, batches)
    store.close(handle)


# --- the schema ---------------------------------------------------------------------------------


def test_the_store_creates_the_current_schema(make: Factory, db: psycopg.Connection[Any]) -> None:
    make()
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    tables = {row[0] for row in db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"schema_version", "sessions", "batches", "checkpoints", "mailbox", "mailbox_rejected"} <= tables
    make()  # a second store on a current schema changes nothing
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


def test_a_newer_schema_is_refused_and_left_untouched(make: Factory, db: psycopg.Connection[Any]) -> None:
    publish(make(), "s1", [batch(0, 2)])
    newer = SCHEMA_VERSION + 1
    db.execute("UPDATE schema_version SET version = %s", (newer,))
    try:
        with pytest.raises(UnsupportedLog) as info:
            make()
        assert info.value.code == "STORAGE_UNSUPPORTED_FORMAT" and info.value.session_id is None
        assert info.value.message == (
            f"the PostgreSQL store has schema version {newer}; this build knows versions up to {SCHEMA_VERSION}"
        )
        assert db.execute("SELECT version FROM schema_version").fetchone() == (newer,)
        assert db.execute("SELECT event_count FROM sessions").fetchall() == [(2,)]
    finally:
        db.execute("UPDATE schema_version SET version = %s", (SCHEMA_VERSION,))


def test_stores_starting_at_once_create_one_schema(make: Factory, db: psycopg.Connection[Any]) -> None:
    db.execute(
        "DROP TABLE IF EXISTS checkpoints, batches, sessions, schema_version, mailbox, mailbox_rejected, "
        "leases, hosts, placements"
    )
    db.execute("DROP SEQUENCE IF EXISTS sessions_generation_seq")
    failures: list[BaseException] = []
    barrier = threading.Barrier(4)

    def start() -> None:
        barrier.wait()
        try:
            make()
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


# --- batch rows ---------------------------------------------------------------------------------


def test_batch_rows_hold_the_exact_lines_of_format_1(
    make: Factory, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """One row per durable append (several batches in one call are one row), and the header row
    plus the rows' lines are byte for byte the plain file the file store writes."""
    calls = [[batch(0, 2)], [batch(2, 3), batch(3, 5)], [Batch(Offset(5), [assistant_event(5, T + 5, text="é ☃")])]]
    publish(make(), "s1", *calls)
    files = FileLogStore(str(tmp_path), compression="none")
    publish(files, "s1", *calls)
    rows = db.execute("SELECT first_seq, count, data, compressed FROM batches ORDER BY first_seq").fetchall()
    assert [(r[0], r[1], r[3]) for r in rows] == [(0, 2, False), (2, 3, False), (5, 1, False)]
    head = db.execute("SELECT header FROM sessions WHERE id = 's1'").fetchone()[0]
    assert head + b"".join(r[2] for r in rows) == log_file(tmp_path, "s1").read_bytes()


def test_batches_above_the_threshold_are_zstd_frames(make: Factory, db: psycopg.Connection[Any]) -> None:
    store = make(compress_above=200)
    big = assistant_event(1, T + 1, text="word " * 100)
    publish(store, "s1", [batch(0, 1)], [Batch(Offset(1), [big])])
    rows = db.execute("SELECT first_seq, data, compressed FROM batches ORDER BY first_seq").fetchall()
    assert [r[2] for r in rows] == [False, True]
    framed = rows[1][1]
    assert framed.startswith(b"\x28\xb5\x2f\xfd")  # a zstd frame, with its checksum
    assert zstandard.ZstdDecompressor().decompress(framed).count(b"\n") == 1
    assert read_all(store, "s1") == [turn_start_event(0, T), big]


def test_each_appending_thread_makes_one_compressor_and_keeps_it(
    make: Factory, db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compressor costs more to make than a batch costs to compress: each thread that appends
    makes one and keeps it; two threads appending at once each use their own (a zstd compressor
    shared across threads is unsafe), and every frame reads back whole."""
    from subagents.storage import zstd_framing

    made: list[str] = []
    real = zstd_framing.new_compressor

    def counting() -> zstandard.ZstdCompressor:
        made.append(threading.current_thread().name)
        return real()

    monkeypatch.setattr(zstd_framing, "new_compressor", counting)
    store = make(compress_above=10)
    barrier = threading.Barrier(2)

    def appends(sid: str) -> None:
        handle = store.create(header(sid))
        barrier.wait()
        for k in range(20):
            store.append(handle, [Batch(Offset(k), [assistant_event(k, T + k, text=f"{sid} {k} " * 20)])])
        store.close(handle)

    threads = [threading.Thread(target=appends, args=(f"s{i}",), name=f"appender-{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(made) == ["appender-0", "appender-1"]
    assert db.execute("SELECT count(*), bool_and(compressed) FROM batches").fetchone() == (40, True)
    for sid in ("s0", "s1"):
        assert read_all(store, sid) == [assistant_event(k, T + k, text=f"{sid} {k} " * 20) for k in range(20)]


def test_a_batch_above_64_kb_is_compressed_by_a_compressor_of_its_own(
    make: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compressor keeps the memory of the largest input it compressed: the one a thread keeps
    compresses batches up to 64 KB; a larger batch gets a compressor of its own, dropped after."""
    from subagents.storage import zstd_framing

    made: list[zstandard.ZstdCompressor] = []
    real = zstd_framing.new_compressor

    def counting() -> zstandard.ZstdCompressor:
        made.append(real())
        return made[-1]

    monkeypatch.setattr(zstd_framing, "new_compressor", counting)
    monkeypatch.setattr(zstd_framing._per_thread, "compressor", None)  # this thread's, made afresh
    store = make(compress_above=10)
    big = [assistant_event(k, T + k, text="x" * 1000 + str(k)) for k in range(1, 80)]
    publish(
        store, "s1", [batch(0, 1)], [Batch(Offset(1), big)], [Batch(Offset(80), [assistant_event(80, T, text="y")])]
    )
    assert len(made) == 2  # the thread's own (for the small batches), one for the big batch
    assert read_all(store, "s1")[1:80] == big


def test_the_pool_keeps_one_cursor_per_connection_and_drops_a_broken_ones(make: Factory) -> None:
    """The append's statement runs on a cursor kept with its connection (no new cursor per
    append); a connection the server cut is dropped with its cursor."""
    pool = make()._pool
    with pool.cursor() as first:
        conn = first.connection
    with pool.cursor() as again:
        assert again is first and again.execute("SELECT 1").fetchone() == (1,)
    with pool.connection() as same:
        assert same is conn
        same.close()  # as a cut connection is found
    with pool.cursor() as fresh:
        assert fresh is not first and fresh.connection is not conn
        assert fresh.execute("SELECT 2").fetchone() == (2,)
    assert list(pool._cursors) == [fresh.connection]


def test_a_listing_and_a_stat_are_one_query_each(make: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    store = make()
    for i in range(30):
        publish(store, f"s{i:02}", [batch(0, 1 + i % 3)])
    checkouts = _count_checkouts(store, monkeypatch)
    rows = store.list()
    assert len(checkouts) == 1
    assert [r.id for r in rows] == [f"s{i:02}" for i in range(30)]
    assert [r.event_count for r in rows] == [1 + i % 3 for i in range(30)]
    assert store.stat("s07") == rows[7]
    assert len(checkouts) == 2
    assert store.read_checkpoint_rows([r.id for r in rows]) == {r.id: [] for r in rows}
    assert len(checkouts) == 3


def _count_checkouts(store: PostgresLogStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    real = store._pool.connection

    def counting() -> Any:
        seen.append(1)
        return real()

    monkeypatch.setattr(store._pool, "connection", counting)
    return seen


def test_an_unchanged_row_is_listed_as_the_same_object_and_a_changed_one_anew(
    make: Factory, db: psycopg.Connection[Any]
) -> None:
    store = make()
    publish(store, "a", [batch(0, 1)])
    publish(store, "b", [batch(0, 1)])
    first = store.list()
    again = store.list()
    assert [x is y for x, y in zip(first, again)] == [True, True]
    handle = store.open_write("a")
    store.append(handle, [batch(1, 2)])
    store.close(handle)
    db.execute("UPDATE sessions SET header = %s WHERE id = 'b'", (b"not json\n",))  # same counts, other line 1
    a, b = store.list()
    assert a is not first[0] and a.event_count == 2 and a.damage is None
    assert b is not first[1] and b.damage == "corrupt" and b.header is None


def test_revision_grows_with_appends_and_tells_lifecycles_apart(make: Factory, db: psycopg.Connection[Any]) -> None:
    store = make()
    publish(store, "a", [batch(0, 1)])
    publish(store, "b", [batch(0, 1)])
    a, b = store.stat("a"), store.stat("b")
    assert a is not None and b is not None
    assert a.revision.size == b.revision.size and a.revision.inode != b.revision.inode
    handle = store.open_write("a")
    store.append(handle, [batch(1, 2)])
    store.close(handle)
    again = store.stat("a")
    assert again is not None and again.revision.size > a.revision.size and again.revision.inode == a.revision.inode


# --- checkpoints --------------------------------------------------------------------------------


def test_checkpoints_round_trip_and_restore_from_their_offset(make: Factory) -> None:
    store = make()
    handle = store.create(header("s1"))
    store.append(handle, [batch(0, 3)])
    rows = {"u": CheckpointRow(ver=1, seq=2, val={"n": 3}), "v": CheckpointRow(ver=2, seq=2, val=[1, "x"])}
    assert store.write_checkpoint(handle, rows) is True
    store.append(handle, [batch(3, 5)])
    found = store.read_checkpoint("s1", header("s1"), 0)
    assert found == (rows, 3)
    reader = store.open_read("s1")
    assert store.read_after(reader, 3, 3) == turns(3, 5)
    assert store.read_after(handle, 3, 3) == turns(3, 5)
    assert store.read_after(reader, 3, 4) is None  # the offset must stand for the seq asked
    assert store.read_after(reader, 9, 9) == []
    loaded = store.read_checkpoint_rows(["s1", "other"], keys=["v"])
    assert loaded is not None and loaded["other"] == []
    assert [(s.key, s.ver, s.seq, s.log_offset, s.value()) for s in loaded["s1"]] == [("v", 2, 2, 3, [1, "x"])]
    assert loaded["s1"][0].lifecycle == Lifecycle.of(header("s1"), 0)
    skipped = store.read_checkpoint_rows(["s1"], skip={"u": b'"n":3'})
    assert skipped is not None and [s.key for s in skipped["s1"]] == ["v"]
    store.close(reader)
    store.close(handle)


def test_checkpoints_of_another_lifecycle_or_version_are_not_served(make: Factory) -> None:
    store = make()
    handle = store.create(header("s1"))
    store.append(handle, [batch(0, 1)])
    assert store.write_checkpoint(handle, {"u": CheckpointRow(ver=1, seq=0, val=1)})
    assert store.read_checkpoint("s1", header("s1", created_at=T + 1), 0) is None
    assert store.read_checkpoint("s1", header("s1"), 0) == ({"u": CheckpointRow(ver=1, seq=0, val=1)}, 1)
    store.close(handle)


def test_a_checkpoint_never_leads_the_log(make: Factory, db: psycopg.Connection[Any]) -> None:
    store = make()
    handle = store.create(header("s1"))
    assert store.write_checkpoint(handle, {"u": CheckpointRow(ver=1, seq=0, val=1)}) is False  # unpublished
    store.append(handle, [batch(0, 2)])
    assert store.write_checkpoint(handle, {"u": CheckpointRow(ver=1, seq=0, val=1)}) is True  # stale rows: none kept
    assert store.read_checkpoint("s1", header("s1"), 0) is None
    db.execute("UPDATE sessions SET event_count = 3 WHERE id = 's1'")  # the log moved on without this handle
    assert store.write_checkpoint(handle, {"u": CheckpointRow(ver=1, seq=1, val=1)}) is False
    assert store.read_checkpoint("s1", header("s1"), 0) is None
    db.execute("UPDATE sessions SET event_count = 2 WHERE id = 's1'")
    assert store.write_checkpoint(handle, {"u": CheckpointRow(ver=1, seq=1, val=object())}) is False  # not JSON
    store.close(handle)


def test_a_checkpoint_write_is_one_statement(make: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    """One round trip (the count check, the stale units' delete and the rows' upsert together),
    not a transaction of several statements: the actor waits for it between two commits."""
    store = make()
    handle = store.create(header("s1"))
    store.append(handle, [batch(0, 2)])
    assert store.write_checkpoint(
        handle, {"u": CheckpointRow(ver=1, seq=1, val=1), "v": CheckpointRow(ver=1, seq=1, val=2)}
    )
    store.append(handle, [batch(2, 3)])
    sent = _record_statements(store, monkeypatch)
    assert store.write_checkpoint(
        handle, {"u": CheckpointRow(ver=2, seq=2, val=3), "w": CheckpointRow(ver=1, seq=2, val=4)}
    )
    assert len(sent) == 1, sent
    found = store.read_checkpoint("s1", header("s1"), 0)
    assert found == ({"u": CheckpointRow(ver=2, seq=2, val=3), "w": CheckpointRow(ver=1, seq=2, val=4)}, 3)
    store.close(handle)


def _record_statements(store: PostgresLogStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement (and transaction block) the store sends from now on, on pooled connections."""
    sent: list[str] = []
    real = store._pool.connection

    class Recorded:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            sent.append(str(query)[:40])
            return self._inner.execute(query, *args, **kwargs)

        def executemany(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            sent.append(str(query)[:40])
            return self._inner.executemany(query, *args, **kwargs)

        def transaction(self, *args: Any, **kwargs: Any) -> Any:
            sent.append("BEGIN ... COMMIT")
            return self._inner.transaction(*args, **kwargs)

        def cursor(self, *args: Any, **kwargs: Any) -> Any:
            return Recorded(self._inner.cursor(*args, **kwargs))

        def __enter__(self) -> Any:
            self._inner.__enter__()
            return self

        def __exit__(self, *exc: Any) -> Any:
            return self._inner.__exit__(*exc)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    @contextmanager
    def connection() -> Iterator[Any]:
        with real() as conn:
            yield Recorded(conn)

    monkeypatch.setattr(store._pool, "connection", connection)
    monkeypatch.setattr(store._pool, "_cursors", {})  # the kept cursors are made anew, on recorded connections
    return sent


# --- damage planted in rows ---------------------------------------------------------------------


def test_a_garbled_batch_is_corruption_located_by_seq(make: Factory, db: psycopg.Connection[Any]) -> None:
    store = make()
    publish(store, "s1", [batch(0, 2)], [batch(2, 4)])
    db.execute("UPDATE batches SET data = %s WHERE first_seq = 2", (b'{"seq":2,"type":"turn/start"\n',))
    reader = store.open_read("s1")
    with pytest.raises(CorruptLog) as info:
        store.read(reader)
    assert info.value.seq == 2 and "'s1'" in str(info.value)
    assert store.read(reader, Offset(0), Offset(2)) == turns(0, 2)  # the rows before it still read
    assert store.read_after(reader, 2, 2) is None  # a checkpoint restore falls back to a fold
    store.close(reader)


def test_a_damaged_zstd_frame_is_corruption(make: Factory, db: psycopg.Connection[Any]) -> None:
    store = make(compress_above=10)
    publish(store, "s1", [batch(0, 3)])
    data = bytearray(db.execute("SELECT data FROM batches").fetchone()[0])
    data[-6] ^= 0xFF
    db.execute("UPDATE batches SET data = %s", (bytes(data),))
    reader = store.open_read("s1")
    with pytest.raises(CorruptLog) as info:
        store.read(reader)
    assert info.value.seq == 0
    store.close(reader)


def test_a_missing_batch_is_corruption_for_readers_and_writers(make: Factory, db: psycopg.Connection[Any]) -> None:
    store = make()
    publish(store, "s1", [batch(0, 1)], [batch(1, 2)], [batch(2, 3)])
    db.execute("DELETE FROM batches WHERE first_seq = 1")
    reader = store.open_read("s1")
    with pytest.raises(CorruptLog, match="seq 1 is missing"):
        store.read(reader)
    store.close(reader)
    with pytest.raises(CorruptLog, match="batches hold 2 events but the session row counts 3"):
        store.open_write("s1")
    with pytest.raises(CorruptLog):  # the refused open released its claim: refused alike again
        store.open_write("s1")


@pytest.mark.parametrize(
    ("planted", "damage"),
    [
        pytest.param(b'{"type":"session","format":2,"id":"s1"}\n', "unsupported", id="another-format"),
        pytest.param(b"not json\n", "corrupt", id="not-json"),
        pytest.param(b'{"type":"session"}', "corrupt", id="no-newline"),
    ],
)
def test_a_damaged_header_row_is_listed_with_its_damage(
    make: Factory, db: psycopg.Connection[Any], planted: bytes, damage: str
) -> None:
    store = make()
    publish(store, "s1", [batch(0, 1)])
    publish(store, "s2", [batch(0, 2)])
    db.execute("UPDATE sessions SET header = %s WHERE id = 's1'", (planted,))
    rows = {r.id: r for r in store.list()}
    assert rows["s1"].damage == damage and rows["s1"].event_count == 1
    assert rows["s2"].damage is None and rows["s2"].header == header("s2")
    assert store.stat("s1") == rows["s1"]
    with pytest.raises(UnsupportedLog if damage == "unsupported" else CorruptLog):
        store.open_read("s1")


def test_a_row_whose_id_is_no_valid_session_id_is_not_listed(make: Factory, db: psycopg.Connection[Any]) -> None:
    store = make()
    publish(store, "s1", [batch(0, 1)])
    db.execute(
        "INSERT INTO sessions SELECT 'bad' || chr(1), header, created_at, parent_session, origin, "
        "is_seeded, inherited_event_count, delegation_depth, event_count, last_time, byte_size FROM sessions"
    )
    assert [r.id for r in store.list()] == ["s1"]


# --- who holds a session ------------------------------------------------------------------------


def test_held_elsewhere_names_the_sessions_another_host_writes(make: Factory) -> None:
    """Each store is a host (storage/pg_leases.py): another store's unexpired leases are held
    elsewhere, in this process or any other (tests/storage/test_pg_lease_processes.py)."""
    mine, theirs = make(), make()
    held_by_them = theirs.create(header("theirs"))
    held_by_me = mine.create(header("mine"))
    assert mine.held_elsewhere(["theirs", "mine", "nobody", "bad\x01id"]) == {"theirs"}
    assert theirs.held_elsewhere(["theirs", "mine"]) == {"mine"}
    theirs.close(held_by_them)
    mine.close(held_by_me)
    assert mine.held_elsewhere(["theirs", "mine"]) == set()


def test_a_lost_owner_connection_lets_another_host_take_over_and_fences_the_old_writer(
    make: Factory, db: psycopg.Connection[Any]
) -> None:
    """The owner connection holds the host's liveness lock; when it is cut (here: terminated)
    the host's lease still binds (issue 27: a cut connection is not a dead host; before, another
    host took the session at once); once it expires — the host renewed nothing meanwhile —
    another host takes the session over (epoch + 1), and the old handle's next append is refused
    by its lease epoch — `OwnershipLost`, nothing of it written, and never again."""
    a, b = make(), make()
    old = a.create(header("s1"))
    a.append(old, [batch(0, 1)])
    # Terminated, waiting (at most 10 s) until its server process has exited: its lock is gone.
    assert db.execute("SELECT pg_terminate_backend(%s, 10000)", (a.owner_backend_pid,)).fetchone() == (True,)
    with pytest.raises(AlreadyOwned):
        b.open_write("s1")
    db.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE session_id = 's1'")
    new = b.open_write("s1")
    assert new.impl.epoch == old.impl.epoch + 1
    b.append(new, [batch(1, 2)])
    with pytest.raises(OwnershipLost) as info:
        a.append(old, [batch(1, 3)])
    assert info.value.session_id == "s1" and info.value.epoch == old.impl.epoch
    assert f"epoch {old.impl.epoch}" in info.value.message
    with pytest.raises(OwnershipLost):
        a.append(old, [batch(1, 3)])  # the handle never writes again
    assert read_all(b, "s1") == turns(0, 2)
    assert db.execute("SELECT first_seq, epoch FROM batches ORDER BY first_seq").fetchall() == [
        (0, old.impl.epoch),
        (1, new.impl.epoch),
    ]
    assert a.read(old) == turns(0, 1) and a.read_after(old, 1, 1) == []  # the old writer's view: its own
    fresh = a.create(header("s2"))  # the store takes its liveness lock again, on a new connection
    with pytest.raises(AlreadyOwned):
        a.open_write("s1")  # ... and B's lease is real
    b.close(new)
    a.close(old)  # releases nothing: the lease is B's
    again = a.open_write("s1")
    assert again.next_seq == 2 and again.impl.epoch == new.impl.epoch + 1
    a.close(again)
    a.close(fresh)
