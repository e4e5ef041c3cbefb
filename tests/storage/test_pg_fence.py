"""The append's fence on the session row (schema version 5, storage/pg_append.py): the session row
names its lease's owner and epoch in every committed state (a trigger on `leases`), so a writer
whose lease was taken over — by a store, by hand, or by deleting the lease — writes nothing and
learns `OwnershipLost`; a takeover and an append in flight are ordered by the session row's lock;
a renewing append and a takeover never deadlock. (The upgrade from version 4: test_pg_leases.py.)

Time never passes for real: a lease "expires" by an UPDATE of its `expires_at`, and the host's
clock (`Leases.monotonic`) is moved by hand. Concurrent statements are ordered by row locks held
on a connection of the test's own (`lock_waiter` finds the statement waiting on them)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from events import turn_batch as batch
from events import turn_starts as turns
from log_lines import header, read_all
from pg_faults import lock_waiter, outcome_of
from subagents.storage import AlreadyOwned, OwnershipLost, PostgresLogStore

pytestmark = pytest.mark.pg

Factory = Callable[..., Any]
BOUND = 30  # seconds a thread of a race may take (a deadlock is detected after 1 s)


@pytest.fixture
def db(pg_url: str, pg_store_factory: Factory) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "DO $$ BEGIN IF to_regclass('leases') IS NOT NULL THEN DELETE FROM leases; DELETE FROM hosts; END IF; END $$"
        )
        yield conn


def expire(db: psycopg.Connection[Any], sid: str) -> None:
    db.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE session_id = %s", (sid,))


def rows(db: psycopg.Connection[Any]) -> list[tuple[int, int, int]]:
    return db.execute("SELECT first_seq, count, epoch FROM batches ORDER BY first_seq").fetchall()


def writer(db: psycopg.Connection[Any], sid: str) -> tuple[str | None, int | None]:
    return db.execute("SELECT writer, writer_epoch FROM sessions WHERE id = %s", (sid,)).fetchone()


def published(store: PostgresLogStore, sid: str, events: int = 1) -> Any:
    handle = store.create(header(sid))
    store.append(handle, [batch(0, events)])
    return handle


def refused_and_nothing_written(store: PostgresLogStore, handle: Any, db: psycopg.Connection[Any]) -> None:
    before = rows(db), db.execute("SELECT event_count FROM sessions").fetchall()
    with pytest.raises(OwnershipLost) as info:
        store.append(handle, [batch(handle.next_seq, handle.next_seq + 2)])
    assert info.value.epoch == handle.impl.epoch and info.value.code == "STORAGE_OWNERSHIP_LOST"
    assert (rows(db), db.execute("SELECT event_count FROM sessions").fetchall()) == before
    assert handle.dead is not None
    with pytest.raises(OwnershipLost):
        store.append(handle, [batch(handle.next_seq, handle.next_seq + 1)])  # and never again


# --- the session row follows the lease ----------------------------------------------------------


def test_a_takeover_fences_the_old_writers_next_append(pg_store_factory: Factory, db: psycopg.Connection[Any]) -> None:
    a, b = pg_store_factory(lease_ttl=10), pg_store_factory(lease_ttl=10)
    old = published(a, "s1")
    assert writer(db, "s1") == (a.host_id, 1)
    assert a.append(old, [batch(1, 2)]) == 2  # a fresh lease: fenced on the session row alone
    expire(db, "s1")
    new = b.open_write("s1")
    assert new.impl.epoch == 2 and writer(db, "s1") == (b.host_id, 2)  # the takeover's own transaction
    refused_and_nothing_written(a, old, db)
    assert rows(db) == [(0, 1, 1), (1, 1, 1)]
    assert b.append(new, [batch(2, 3)]) == 3
    assert read_all(b, "s1") == turns(0, 3)
    b.close(new)
    assert writer(db, "s1") == (b.host_id, 2)  # a release changes neither owner nor epoch
    a.close(old)


@pytest.mark.parametrize(
    "by_hand",
    [
        pytest.param("UPDATE leases SET owner = 'operator', epoch = epoch + 1", id="takeover"),
        pytest.param("UPDATE leases SET owner = 'operator'", id="owner-only"),
        pytest.param("DELETE FROM leases", id="deleted"),
        pytest.param("TRUNCATE leases", id="truncated"),
    ],
)
def test_a_lease_changed_by_hand_fences_the_writer_too(
    pg_store_factory: Factory, db: psycopg.Connection[Any], by_hand: str
) -> None:
    """The trigger, not the store, keeps the session row in step: an operator's edit (or an older
    build's takeover) fences like a store's."""
    a = pg_store_factory(lease_ttl=10)
    handle = published(a, "s1")
    db.execute(by_hand)
    assert writer(db, "s1") != (a.host_id, 1)
    refused_and_nothing_written(a, handle, db)
    assert rows(db) == [(0, 1, 1)]
    a.close(handle)


def test_a_renewal_leaves_the_session_row_alone(pg_store_factory: Factory, db: psycopg.Connection[Any]) -> None:
    """Renewals and releases change neither owner nor epoch: the trigger writes nothing (the
    session row's version stays the same), so they never wait on an append."""
    a = pg_store_factory(lease_ttl=10)
    handle = published(a, "s1")
    version = db.execute("SELECT xmin::text FROM sessions").fetchone()
    assert a.renew_leases() == frozenset()
    assert db.execute("SELECT xmin::text FROM sessions").fetchone() == version
    a.close(handle)
    assert db.execute("SELECT xmin::text FROM sessions").fetchone() == version


# --- races: ordered by the session row's lock ---------------------------------------------------


@pytest.mark.parametrize("first", ["append", "takeover"])
def test_an_append_in_flight_and_a_takeover_are_ordered_by_the_session_row(
    pg_store_factory: Factory, db: psycopg.Connection[Any], pg_url: str, first: str
) -> None:
    """Both wait on the session row (held here); whichever gets it first commits first. An append
    before the takeover is acknowledged and the new writer reads it; an append after it re-checks
    its fence on the takeover's row and writes nothing."""
    a, b = pg_store_factory(lease_ttl=10), pg_store_factory(lease_ttl=10)
    old = published(a, "s1")
    expire(db, "s1")
    outcomes: dict[str, object] = {}

    def run(name: str, fn: Callable[..., Any], *args: Any) -> threading.Thread:
        thread = threading.Thread(target=lambda: outcomes.__setitem__(name, outcome_of(fn, *args)))
        thread.start()
        return thread

    starts = {
        "append": (lambda: run("append", a.append, old, [batch(1, 3)]), "WITH s AS (UPDATE sessions"),
        "takeover": (lambda: run("takeover", b.open_write, "s1"), "INSERT INTO leases"),
    }
    with psycopg.connect(pg_url) as blocker:
        blocker.execute("SELECT 1 FROM sessions WHERE id = 's1' FOR UPDATE")
        threads = []
        for name in (first, "takeover" if first == "append" else "append"):
            start, statement = starts[name]
            threads.append(start())
            lock_waiter(db, statement, name)  # queued on the row before the next one starts
        blocker.rollback()
        for thread in threads:
            thread.join(BOUND)
            assert not thread.is_alive()
    new = outcomes["takeover"]
    assert not isinstance(new, Exception), new
    assert new.impl.epoch == 2 and writer(db, "s1") == (b.host_id, 2)
    if first == "append":
        assert outcomes["append"] == 3
        assert new.next_seq == 3  # the acknowledged append is the new writer's to read
        assert rows(db) == [(0, 1, 1), (1, 2, 1)]
    else:
        assert isinstance(outcomes["append"], OwnershipLost), outcomes
        assert new.next_seq == 1
        assert rows(db) == [(0, 1, 1)]  # nothing written after the takeover
    end = new.next_seq
    assert b.append(new, [batch(end, end + 1)]) == end + 1
    assert read_all(b, "s1") == turns(0, end + 1)
    b.close(new)
    a.close(old)


def test_a_takeover_that_waited_on_the_publication_names_its_writer_in_the_published_row(
    pg_store_factory: Factory, db: psycopg.Connection[Any], pg_url: str
) -> None:
    """The takeover's statement began before the session row existed and waited on the lease row
    the publication held: its trigger still finds the row the publication committed (a fresh
    snapshot per statement in the trigger), so the publisher's next append is fenced."""
    a, b = pg_store_factory(lease_ttl=10), pg_store_factory(lease_ttl=10)
    handle = a.create(header("s1"))
    outcomes: dict[str, object] = {}
    threads: list[threading.Thread] = []

    def run(name: str, fn: Callable[..., Any], *args: Any) -> None:
        thread = threading.Thread(target=lambda: outcomes.__setitem__(name, outcome_of(fn, *args)))
        thread.start()
        threads.append(thread)

    with psycopg.connect(pg_url) as blocker:
        blocker.execute("SELECT 1 FROM leases WHERE session_id = 's1' FOR UPDATE")
        run("publish", a.append, handle, [batch(0, 1)])
        lock_waiter(db, "WITH l AS (UPDATE leases", "the publication")
        db.execute("DELETE FROM hosts WHERE id = %s", (a.host_id,))  # A "closed": its lease binds nobody
        run("takeover", b.open_write, "s1")
        lock_waiter(db, "INSERT INTO leases", "the takeover")
        blocker.rollback()
        for thread in threads:
            thread.join(BOUND)
            assert not thread.is_alive()
    assert outcomes["publish"] == 1, outcomes
    new = outcomes["takeover"]
    assert not isinstance(new, Exception), outcomes
    assert new.impl.epoch == 2 and new.next_seq == 1
    assert writer(db, "s1") == (b.host_id, 2)
    refused_and_nothing_written(a, handle, db)
    assert b.append(new, [batch(1, 2)]) == 2
    b.close(new)
    a.close(handle)


def test_a_renewing_append_racing_a_takeover_does_not_deadlock(
    pg_store_factory: Factory, db: psycopg.Connection[Any], pg_url: str
) -> None:
    """An append due to renew its lease takes the lease row before the session row — the order a
    takeover takes them in (its trigger writes the session row) — so the two never wait on each
    other crosswise. Here the lease row is held: the append waits on it holding nothing of the
    session's, the takeover queues behind, and when the row is let go exactly one of them wins,
    each outcome consistent (no deadlock error, nothing half)."""
    a, b = pg_store_factory(lease_ttl=10), pg_store_factory(lease_ttl=10)
    now = [1000.0]
    a._leases.monotonic = lambda: now[0]
    old = published(a, "s1")
    now[0] = 1006.0  # past half a ttl: the next append renews in its statement
    outcomes: dict[str, object] = {}
    threads: list[threading.Thread] = []

    def run(name: str, fn: Callable[..., Any], *args: Any) -> None:
        thread = threading.Thread(target=lambda: outcomes.__setitem__(name, outcome_of(fn, *args)))
        thread.start()
        threads.append(thread)

    with psycopg.connect(pg_url) as blocker:
        blocker.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE session_id = 's1'")
        run("append", a.append, old, [batch(1, 3)])
        lock_waiter(db, "WITH l AS (UPDATE leases", "the renewing append")
        # Waiting on the lease, the append holds no lock on the session row.
        db.execute("SELECT 1 FROM sessions WHERE id = 's1' FOR UPDATE NOWAIT")
        run("takeover", b.open_write, "s1")
        lock_waiter(db, "INSERT INTO leases", "the takeover")
        blocker.commit()  # the lease expired: free to take, unless the append renews it first
        for thread in threads:
            thread.join(BOUND)
            assert not thread.is_alive()
    appended, taken = outcomes["append"], outcomes["takeover"]
    if appended == 3:  # the append first: renewed, acknowledged; the takeover refused
        assert isinstance(taken, AlreadyOwned), outcomes
        assert writer(db, "s1") == (a.host_id, 1) and rows(db) == [(0, 1, 1), (1, 2, 1)]
        assert db.execute("SELECT expires_at > now() FROM leases").fetchone() == (True,)
        assert a.append(old, [batch(3, 4)]) == 4
    else:  # the takeover first: the append fenced, nothing of it written
        assert isinstance(appended, OwnershipLost) and not isinstance(taken, Exception), outcomes
        assert taken.impl.epoch == 2 and taken.next_seq == 1 and rows(db) == [(0, 1, 1)]
        b.close(taken)
    a.close(old)
