"""Leases with fencing on the PostgreSQL store (SPEC §9, storage/pg_leases.py): two stores on one
database are two hosts. One writer per session: a host keeps its unexpired leases (a cut
connection or a free liveness lock changes nothing); an expired lease, or one whose host's row is
gone, is taken over at epoch + 1, and the old writer's next append writes nothing (`OwnershipLost`).

Time never passes for real here: a lease "expires" by moving its `expires_at` into the past
with an UPDATE (the database clock decides, as it does for the stores)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from events import turn_batch as batch
from events import turn_starts as turns
from log_lines import header, read_all, wire
from subagents.storage import (
    AlreadyOwned,
    HandleClosed,
    OwnershipLost,
    PersistenceFailed,
    PostgresLogStore,
    SessionAlreadyExists,
    SessionNotFound,
)
from subagents.storage.pg_leases import LEASE_CHANNEL
from subagents.storage.pg_leases import LIVENESS_SEED as _SEED
from subagents.storage.pg_schema import MIGRATIONS, SCHEMA_VERSION

pytestmark = pytest.mark.pg

Factory = Callable[..., Any]


@pytest.fixture
def db(pg_url: str, pg_store_factory: Factory) -> Iterator[psycopg.Connection[Any]]:
    """A connection of our own to the module's database; the leases and hosts of earlier tests
    are gone (the store factory empties the session tables)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "DO $$ BEGIN IF to_regclass('leases') IS NOT NULL THEN DELETE FROM leases; DELETE FROM hosts; END IF; END $$"
        )
        yield conn


@pytest.fixture
def host(pg_store_factory: Factory, db: psycopg.Connection[Any]) -> Factory:
    """A store with a short ttl: a host."""

    def make(**options: Any) -> PostgresLogStore:
        return pg_store_factory(**{"lease_ttl": 0.2, **options})

    return make


def expire(db: psycopg.Connection[Any], sid: str) -> None:
    db.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE session_id = %s", (sid,))


def lease(db: psycopg.Connection[Any], sid: str) -> tuple[str, int, bool]:
    """(owner, epoch, unexpired) of the session's lease row."""
    return db.execute("SELECT owner, epoch, expires_at > now() FROM leases WHERE session_id = %s", (sid,)).fetchone()


def kill_owner_connection(db: psycopg.Connection[Any], store: PostgresLogStore) -> None:
    """End the store's owner connection as a killed process's ends, and wait until its server
    process has exited (with it, the liveness lock)."""
    assert db.execute("SELECT pg_terminate_backend(%s, 10000)", (store.owner_backend_pid,)).fetchone() == (True,)


def batches(db: psycopg.Connection[Any]) -> list[tuple[int, int, int]]:
    return db.execute("SELECT first_seq, count, epoch FROM batches ORDER BY first_seq").fetchall()


# --- acquire ------------------------------------------------------------------------------------


def test_a_live_host_keeps_its_unexpired_lease(host: Factory, db: psycopg.Connection[Any]) -> None:
    a, b = host(), host()
    mine = a.create(header("s1"))
    assert lease(db, "s1") == (a.host_id, 1, True) and mine.impl.epoch == 1
    with pytest.raises(AlreadyOwned):
        b.create(header("s1"))  # before publication
    a.append(mine, [batch(0, 2)])
    with pytest.raises(AlreadyOwned):
        b.open_write("s1")
    assert lease(db, "s1") == (a.host_id, 1, True)  # refused: nothing changed
    assert b.held_elsewhere(["s1", "s2"]) == {"s1"} and a.held_elsewhere(["s1"]) == set()


def test_a_second_claim_in_the_same_store_is_refused_without_a_query(
    host: Factory, db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    a = host()
    held = a.create(header("s1"))

    def no_query(*args: Any) -> None:
        raise AssertionError("a query was sent")

    monkeypatch.setattr(a._leases, "_run", no_query)
    with pytest.raises(AlreadyOwned):
        a.open_write("s1")
    with pytest.raises(AlreadyOwned):
        a.create(header("s1"))
    monkeypatch.undo()
    a.close(held)
    with pytest.raises(SessionNotFound):  # unpublished: a claim, then no session
        a.open_write("s1")
    assert lease(db, "s1")[2] is False  # the failed claim released its lease


def test_an_expired_lease_is_taken_over_and_the_stale_writer_writes_nothing(
    host: Factory, db: psycopg.Connection[Any]
) -> None:
    a, b = host(), host()
    old = a.create(header("s1"))
    a.append(old, [batch(0, 1)])
    expire(db, "s1")  # A paused past its ttl: alive (its liveness lock held), lease expired
    new = b.open_write("s1")
    assert new.impl.epoch == 2 and lease(db, "s1") == (b.host_id, 2, True)
    assert a.held_elsewhere(["s1"]) == {"s1"}
    with pytest.raises(OwnershipLost) as info:
        a.append(old, [batch(1, 3)])
    assert info.value.session_id == "s1" and info.value.epoch == 1 and "epoch 1" in info.value.message
    assert info.value.code == "STORAGE_OWNERSHIP_LOST"
    assert batches(db) == [(0, 1, 1)]  # nothing written
    assert db.execute("SELECT event_count FROM sessions").fetchone() == (1,)
    assert old.dead is not None and "epoch 1" in old.dead
    with pytest.raises(OwnershipLost):
        a.append(old, [batch(1, 3)])  # later appends fail the same way
    assert a.write_checkpoint(old, {}) is False
    b.append(new, [batch(1, 3)])
    assert batches(db) == [(0, 1, 1), (1, 2, 2)]  # each batch records its writer's epoch
    a.close(old)  # releases nothing: the lease is B's
    assert lease(db, "s1") == (b.host_id, 2, True)
    b.close(new)
    assert lease(db, "s1") == (b.host_id, 2, False)  # released: expired, the epoch kept
    again = a.open_write("s1")
    assert again.impl.epoch == 3 and again.next_seq == 3
    assert read_all(a, "s1") == turns(0, 3)
    a.close(again)


def test_the_publication_is_fenced_too(host: Factory, db: psycopg.Connection[Any]) -> None:
    a, b = host(), host()
    old = a.create(header("s1"))
    expire(db, "s1")
    new = b.create(header("s1"))
    with pytest.raises(OwnershipLost):
        a.append(old, [batch(0, 2)])
    assert db.execute("SELECT count(*) FROM sessions").fetchone() == (0,)
    assert batches(db) == []
    b.append(new, [batch(0, 1)])
    assert batches(db) == [(0, 1, 2)]
    with pytest.raises(AlreadyOwned):
        a.create(header("s1"))  # A's own stale handle is still open
    a.close(old)
    b.close(new)
    with pytest.raises(SessionAlreadyExists):
        a.create(header("s1"))  # B's lease released: a claim, then the row is there
    assert lease(db, "s1") == (a.host_id, 3, False)  # ... and the claim let go


def test_an_expired_lease_nobody_took_still_lets_its_holder_append(host: Factory, db: psycopg.Connection[Any]) -> None:
    """The deliberate choice (pg_leases): safety comes from the epoch. An append is fenced on the
    session row (pg_append) and renews the lease itself only once half a ttl has passed since the
    handle's last renewal (by the host's clock; the renewal task keeps it fresh otherwise)."""
    a = host(lease_ttl=10)
    now = [1000.0]
    a._leases.monotonic = lambda: now[0]
    handle = a.create(header("s1"))
    a.append(handle, [batch(0, 1)])  # the publication renews (at 1000)
    expire(db, "s1")
    assert lease(db, "s1") == (a.host_id, 1, False)
    now[0] = 1004.9
    assert a.append(handle, [batch(1, 2)]) == 2  # under half a ttl: the lease row is not written
    assert lease(db, "s1") == (a.host_id, 1, False)
    now[0] = 1005.0
    assert a.append(handle, [batch(2, 3)]) == 3  # half a ttl: renewed in the same statement
    assert lease(db, "s1") == (a.host_id, 1, True)
    expire(db, "s1")
    now[0] = 1009.9
    assert a.append(handle, [batch(3, 4)]) == 4  # renewed at 1005: not due again before 1010
    assert lease(db, "s1") == (a.host_id, 1, False)
    assert batches(db) == [(0, 1, 1), (1, 1, 1), (2, 1, 1), (3, 1, 1)]
    a.close(handle)


def test_a_host_cut_off_keeps_its_sessions_until_its_leases_expire(host: Factory, db: psycopg.Connection[Any]) -> None:
    """A host whose owner connection ended (cut by `pg_terminate_backend`, or a killed process:
    the server frees its liveness lock) keeps its sessions while their leases are in force —
    before issue 27 they were taken at once, and a live host that lost its connection for a
    moment had its sessions run (and settled) twice. It reconnects at its next statement and
    takes its lock again; a killed one's sessions are taken once their leases expire."""
    a, b = host(lease_ttl=3600), host()
    handle = a.create(header("s1"))
    a.append(handle, [batch(0, 1)])
    kill_owner_connection(db, a)
    assert lease(db, "s1") == (a.host_id, 1, True)
    assert b.held_elsewhere(["s1"]) == {"s1"}  # unexpired: its host may well run it
    with pytest.raises(AlreadyOwned):
        b.open_write("s1")
    assert a.renew_leases() == frozenset()  # reconnected: the lock and the sessions are its own
    a.append(handle, [batch(1, 2)])
    key = f"SELECT pg_try_advisory_lock(hashtextextended('{a.host_id}', {_SEED}))"
    assert db.execute(key).fetchone() == (False,)  # its liveness lock is held again
    kill_owner_connection(db, a)  # now it dies for good: it renews no more
    db.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE session_id = 's1'")
    taken = b.open_write("s1")
    assert taken.impl.epoch == 2
    b.close(taken)


def test_a_host_whose_row_is_gone_keeps_no_session(host: Factory, db: psycopg.Connection[Any]) -> None:
    """A lease whose owner has no `hosts` row (it closed, or was forgotten) binds nobody."""
    a, b = host(lease_ttl=3600), host()
    a.append(a.create(header("s1")), [batch(0, 1)])
    db.execute("DELETE FROM hosts WHERE id = %s", (a.host_id,))
    assert b.held_elsewhere(["s1"]) == set()
    taken = b.open_write("s1")
    assert taken.impl.epoch == 2
    b.close(taken)


def test_a_closed_store_releases_its_leases_and_host_at_once(host: Factory, db: psycopg.Connection[Any]) -> None:
    a, b = host(lease_ttl=3600), host()
    first = a.create(header("s1"))
    a.append(first, [batch(0, 1)])
    a.create(header("s2"))
    assert db.execute("SELECT id FROM hosts").fetchall() == [(a.host_id,)]
    db.execute(f"LISTEN {LEASE_CHANNEL}")
    a.close_store()
    assert sorted(n.payload for n in db.notifies(timeout=5, stop_after=2)) == ["s1", "s2"]
    assert lease(db, "s1") == (a.host_id, 1, False) and lease(db, "s2") == (a.host_id, 1, False)
    assert db.execute("SELECT count(*) FROM hosts").fetchone() == (0,)
    assert b.held_elsewhere(["s1", "s2"]) == set()
    taken = b.open_write("s1")
    assert taken.impl.epoch == 2
    with pytest.raises(PersistenceFailed, match="closed"):
        a.append(first, [batch(1, 2)])  # a handle left open appends no more
    b.close(taken)
    a.close(first)
    with pytest.raises(HandleClosed):
        a.append(first, [batch(1, 2)])


def test_closing_a_handle_notifies_the_lease_channel(host: Factory, db: psycopg.Connection[Any]) -> None:
    a = host()
    handle = a.create(header("s1"))
    db.execute(f"LISTEN {LEASE_CHANNEL}")
    a.close(handle)
    assert [(n.channel, n.payload) for n in db.notifies(timeout=5, stop_after=1)] == [(LEASE_CHANNEL, "s1")]


def test_hosts_take_turns_one_at_a_time_when_racing_for_an_expired_lease(
    host: Factory, db: psycopg.Connection[Any]
) -> None:
    a = host()
    old = a.create(header("s1"))
    a.append(old, [batch(0, 1)])
    expire(db, "s1")
    racers = [host() for _ in range(4)]
    barrier = threading.Barrier(len(racers))
    outcomes: list[object] = []

    def claim(store: PostgresLogStore) -> None:
        barrier.wait()
        try:
            outcomes.append(store.open_write("s1"))
        except AlreadyOwned as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=claim, args=(store,)) for store in racers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    won = [o for o in outcomes if not isinstance(o, AlreadyOwned)]
    assert len(won) == 1 and len(outcomes) == 4
    assert won[0].impl.epoch == 2 and lease(db, "s1")[1] == 2


# --- renewal ------------------------------------------------------------------------------------


def test_renewal_extends_held_leases_and_reports_the_lost_ones(host: Factory, db: psycopg.Connection[Any]) -> None:
    a, b = host(), host()
    assert a.lease_renew_interval == pytest.approx(0.2 / 3)
    assert a.renew_leases() == frozenset()  # nothing held, nothing registered
    kept, lost, released = a.create(header("s1")), a.create(header("s2")), a.create(header("s3"))
    for handle in (kept, lost, released):
        a.append(handle, [batch(0, 1)])
    a.close(released)
    db.execute("UPDATE leases SET expires_at = now() - interval '1 second'")
    db.execute("UPDATE hosts SET renewed_at = now() - interval '1 hour'")
    taken = b.open_write("s2")
    assert a.renew_leases() == frozenset({"s2"})
    assert lease(db, "s1") == (a.host_id, 1, True)  # renewed
    assert lease(db, "s2") == (b.host_id, 2, True)  # B's, untouched
    assert lease(db, "s3") == (a.host_id, 1, False)  # released: not renewed back
    assert db.execute(
        "SELECT renewed_at > now() - interval '1 minute' FROM hosts WHERE id = %s", (a.host_id,)
    ).fetchone() == (True,)
    count = db.execute("SELECT count(*) FROM batches").fetchone()
    with pytest.raises(OwnershipLost):
        a.append(lost, [batch(1, 2)])  # marked lost: refused before any statement
    assert db.execute("SELECT count(*) FROM batches").fetchone() == count
    assert a.append(kept, [batch(1, 2)]) == 2
    assert a.renew_leases() == frozenset()  # a lost lease is reported once
    b.close(taken)


def test_renewal_takes_the_liveness_lock_again_after_the_owner_connection_was_cut(
    host: Factory, db: psycopg.Connection[Any]
) -> None:
    a, b = host(lease_ttl=3600), host()
    handle = a.create(header("s1"))
    kill_owner_connection(db, a)
    assert a.renew_leases() == frozenset()  # nobody took it meanwhile: still A's
    with pytest.raises(AlreadyOwned):
        b.open_write("s1")  # ... and A is alive again
    a.close(handle)


def test_a_store_registers_its_host_only_when_it_claims_or_is_asked(host: Factory, db: psycopg.Connection[Any]) -> None:
    reader = host()
    reader.list()
    assert reader.held_elsewhere(["s1"]) == set()
    assert db.execute("SELECT count(*) FROM hosts").fetchone() == (0,)  # read-only: nothing written
    server = host(host_id="serving-host-1")
    server.register_host(capacity=3)
    row = db.execute("SELECT id, capacity, pid, hostname IS NOT NULL, started_at <= renewed_at FROM hosts").fetchone()
    assert row[0] == "serving-host-1" and row[1] == 3 and row[2] > 0 and row[3] and row[4]


def test_renewal_takes_a_liveness_lock_it_could_not_take_at_connection(
    host: Factory, db: psycopg.Connection[Any]
) -> None:
    """The lock was still held by another connection (a lost owner connection's server process
    not yet gone, here: our own connection) when the host connected; once that lets go, the
    next renewal takes it, and the host's sessions are its own again."""
    key = "SELECT %s(hashtextextended('host-x', %s))"
    db.execute(key % ("pg_advisory_lock", _SEED))
    a, b = host(host_id="host-x", lease_ttl=3600), host()
    handle = a.create(header("s1"))
    db.execute(key % ("pg_advisory_unlock", _SEED))
    # Nobody holds host-x's liveness lock now, and its lease binds all the same (issue 27: the
    # lease decides, not the lock); the next renewal takes the lock.
    assert b.held_elsewhere(["s1"]) == {"s1"}
    assert a.renew_leases() == frozenset()
    assert db.execute(key % ("pg_try_advisory_lock", _SEED)).fetchone() == (False,)
    assert b.held_elsewhere(["s1"]) == {"s1"}
    with pytest.raises(AlreadyOwned):
        b.open_write("s1")
    a.close(handle)


def test_renewal_writes_a_missing_host_row_again(host: Factory, db: psycopg.Connection[Any]) -> None:
    a = host()
    handle = a.create(header("s1"))
    db.execute("DELETE FROM hosts")
    assert a.renew_leases() == frozenset()
    assert db.execute("SELECT id, renewed_at IS NOT NULL FROM hosts").fetchall() == [(a.host_id, True)]
    a.close(handle)


@pytest.mark.parametrize(
    "options",
    [
        {"host_id": ""},
        {"host_id": 7},
        {"host_id": "a\nb"},
        {"lease_ttl": 0},
        {"lease_ttl": "15"},
        {"lease_renew_interval": -1},
    ],
)
def test_bad_lease_options_are_refused(pg_url: str, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        PostgresLogStore(pg_url, **options)


# --- the schema ---------------------------------------------------------------------------------


def test_a_version_2_database_is_migrated_to_leases(pg_url: str, db: psycopg.Connection[Any]) -> None:
    """A database as a version 2 build left it (a session, batch epochs NULL, no lease tables)
    gains the lease tables in one step; its sessions are claimed at epoch 1."""
    assert SCHEMA_VERSION == 5 and set(MIGRATIONS) == {1, 2, 3, 4, 5}
    store = PostgresLogStore(pg_url)
    try:
        handle = store.create(header("s1"))
        store.append(handle, [batch(0, 1)])
        store.close(handle)
    finally:
        store.close_store()
    db.execute("UPDATE batches SET epoch = NULL")
    db.execute("DROP TABLE leases, hosts, placements")
    db.execute("DROP TRIGGER batches_updated ON batches; DROP TRIGGER batches_deleted ON batches")  # version 4's
    db.execute(
        "ALTER TABLE sessions DROP COLUMN writer, DROP COLUMN writer_epoch"
    )  # version 5's (its triggers: on leases)
    db.execute("UPDATE schema_version SET version = 2")
    store = PostgresLogStore(pg_url)
    try:
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        for table in ("leases", "hosts", "placements"):
            assert db.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone() == (True,)
        handle = store.open_write("s1")
        assert handle.impl.epoch == 1
        store.append(handle, [batch(1, 2)])
        assert batches(db) == [(0, 1, None), (1, 1, 1)]
        assert db.execute("SELECT writer, writer_epoch FROM sessions").fetchall() == [(store.host_id, 1)]
        assert read_all(store, "s1") == turns(0, 2)
        store.close(handle)
    finally:
        store.close_store()


def test_a_host_that_cannot_renew_for_a_ttl_gives_its_sessions_up_before_another_may_take_them(
    host: Factory, db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27: a host cut off from the database stops its sessions once its leases may have
    expired (a ttl after the last renewal it sent), not later: another host may take them then."""
    from subagents.storage import StoreUnreachable

    a = host(lease_ttl=10)
    leases = a._leases  # the store's lease book: its clock and its owner connection
    now = [1000.0]
    leases.monotonic = lambda: now[0]
    handle = a.create(header("s1"))
    a.append(handle, [batch(0, 1)])
    assert a.renew_leases() == frozenset()  # renewed at 1000

    def unreachable() -> Any:
        raise StoreUnreachable("cannot connect to PostgreSQL (test)")

    monkeypatch.setattr(leases, "_connection", unreachable)
    now[0] = 1009.0
    with pytest.raises(StoreUnreachable):
        a.renew_leases()  # within the ttl: tried again at the next interval, nothing given up
    now[0] = 1010.0
    assert a.renew_leases() == {"s1"}  # a ttl since: given up here, its session stops
    with pytest.raises(OwnershipLost):
        a.append(handle, [batch(1, 2)])
    monkeypatch.undo()
    assert a.renew_leases() == frozenset()  # reachable again: nothing more to give up


def session_writer(db: psycopg.Connection[Any], sid: str) -> tuple[str | None, int | None]:
    """(writer, writer_epoch) of the session row: its lease's owner and epoch (schema version 5)."""
    return db.execute("SELECT writer, writer_epoch FROM sessions WHERE id = %s", (sid,)).fetchone()


# --- upgrade ------------------------------------------------------------------------------------

# Version 4's append, as its builds send it (fenced on the lease row): still fenced after the
# upgrade, by its own lease update.
_V4_APPEND = (
    "WITH l AS (UPDATE leases SET expires_at = now() + interval '15 seconds' "
    "WHERE session_id = %(id)s AND owner = %(me)s AND epoch = %(epoch)s RETURNING session_id), "
    "s AS (UPDATE sessions SET event_count = event_count + 1, byte_size = byte_size + %(size)s, last_time = 1 "
    "WHERE id = (SELECT session_id FROM l) AND event_count = %(first)s RETURNING id) "
    "INSERT INTO batches (session_id, first_seq, count, data, compressed, epoch) "
    "SELECT id, %(first)s, 1, %(data)s, false, %(epoch)s FROM s"
)


def _older_append(owner: str, epoch: int, seq: int) -> dict[str, Any]:
    """The arguments of version 4's append of the one event at `seq`."""
    data = b"".join(wire(turns(seq, seq + 1)))
    return {"id": "s1", "me": owner, "epoch": epoch, "first": seq, "size": len(data), "data": data}


def _drop_all_tables(db: psycopg.Connection[Any]) -> None:
    db.execute(
        "DROP TABLE IF EXISTS checkpoints, batches, sessions, schema_version, mailbox, mailbox_rejected, "
        "leases, hosts, placements"
    )
    db.execute("DROP SEQUENCE IF EXISTS sessions_generation_seq")


def test_a_version_4_database_opens_and_upgrades(db: psycopg.Connection[Any], pg_url: str) -> None:
    """A database as version 4 left it, one session held by a live older host: the upgrade copies
    the lease into the session row; the older host's appends stay fenced by its lease; a takeover
    by this build fences it; nothing acknowledged is lost."""
    assert SCHEMA_VERSION == 5
    _drop_all_tables(db)
    try:
        for version in (1, 2, 3, 4):
            for statement in MIGRATIONS[version]:
                db.execute(statement)
        db.execute("INSERT INTO schema_version (version) VALUES (4)")
        store = PostgresLogStore(pg_url)  # a version 5 store writes the session, then it is made older
        handle = store.create(header("s1"))
        store.append(handle, [batch(0, 1)])
        store.close(handle)
        store.close_store()
        db.execute("DROP TRIGGER leases_writer ON leases; DROP TRIGGER leases_truncated ON leases")
        db.execute("ALTER TABLE sessions DROP COLUMN writer, DROP COLUMN writer_epoch")
        db.execute("UPDATE schema_version SET version = 4")
        # An older host holds the session now, unexpired, at epoch 2.
        db.execute("UPDATE leases SET owner = 'older', epoch = 2, expires_at = now() + interval '1 hour'")
        db.execute("INSERT INTO hosts (id) VALUES ('older')")
        older = _older_append("older", 2, 1)
        assert db.execute(_V4_APPEND, older).rowcount == 1  # before the upgrade

        upgraded = PostgresLogStore(pg_url)
        try:
            assert db.execute("SELECT version FROM schema_version").fetchall() == [(5,)]
            assert session_writer(db, "s1") == ("older", 2)  # copied from the lease
            with pytest.raises(AlreadyOwned):
                upgraded.open_write("s1")
            assert db.execute(_V4_APPEND, _older_append("older", 2, 2)).rowcount == 1
            expire(db, "s1")
            new = upgraded.open_write("s1")
            assert new.impl.epoch == 3 and new.next_seq == 3 and session_writer(db, "s1") == (upgraded.host_id, 3)
            assert db.execute(_V4_APPEND, _older_append("older", 2, 3)).rowcount == 0  # the older host is fenced
            assert upgraded.append(new, [batch(3, 4)]) == 4
            assert [e.seq for e in read_all(upgraded, "s1")] == [0, 1, 2, 3]
            assert batches(db) == [(0, 1, 1), (1, 1, 2), (2, 1, 2), (3, 1, 3)]
            upgraded.close(new)
        finally:
            upgraded.close_store()
        PostgresLogStore(pg_url).close_store()  # current: nothing to do
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(5,)]
    finally:
        _drop_all_tables(db)
