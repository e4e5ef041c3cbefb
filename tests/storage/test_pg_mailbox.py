"""The PostgreSQL mailbox beyond the shared contract (test_mailbox_conformance.py runs that as its
`pg` parameter): the schema migration that adds it, bad rows never stopping a drain, wake-ups by
LISTEN/NOTIFY from any connection (waited for on the fd, never on time) and their poll fallback,
and connections cut mid-deliver (`pg_terminate_backend`): the delivery is there once or not at all.
"""

from __future__ import annotations

import json
import select
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from clocks import T
from log_lines import header
from mailboxes import MailboxHarness, envelope, trio_owner_wakes
from pg_faults import lock_waiter, outcome_of
from pg_server import EmbeddedServer
from subagents.storage import (
    Batch,
    DeliveryIds,
    Envelope,
    InvalidStoreUrl,
    MailboxWatch,
    Offset,
    PersistenceFailed,
    PostgresLogStore,
    PostgresMailbox,
    StoreUnreachable,
    UnsupportedLog,
    make_event,
    pg_mailbox,
)
from subagents.storage.envelope import encode_envelope
from subagents.storage.pg_listener import PgSessionWatch
from subagents.storage.pg_schema import MIGRATIONS, SCHEMA_VERSION

pytestmark = pytest.mark.pg

SID = "child-1"
GOOD_ID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
BAD_ID = "01ARZ3NDEKTSV4RRFFQ69G5FB0"


@pytest.fixture
def harness(pg_url: str, tmp_path: Path) -> Iterator[MailboxHarness]:
    made = MailboxHarness("pg", tmp_path, pg_url)
    yield made
    made.close()


@pytest.fixture
def db(pg_url: str, harness: MailboxHarness) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def woken(fd: int) -> bool:
    """Readable once the notification arrives (waited for on the fd; 10 s bound, never reached)."""
    return bool(select.select([fd], [], [], 10.0)[0])


def rejected_rows(db: psycopg.Connection[Any], sid: str = SID) -> list[tuple[str, bytes, str]]:
    rows = db.execute(
        "SELECT name, envelope, reason FROM mailbox_rejected WHERE session_id = %s ORDER BY name", (sid,)
    ).fetchall()
    return [(name, bytes(data), reason) for name, data, reason in rows]


# --- the schema ---------------------------------------------------------------------------------


def _drop_all(db: psycopg.Connection[Any]) -> None:
    db.execute(
        "DROP TABLE IF EXISTS checkpoints, batches, sessions, schema_version, mailbox, mailbox_rejected, "
        "leases, hosts, placements"
    )
    db.execute("DROP SEQUENCE IF EXISTS sessions_generation_seq")


def test_a_version_1_store_is_migrated_to_the_mailbox_keeping_its_sessions(
    db: psycopg.Connection[Any], pg_url: str
) -> None:
    _drop_all(db)
    for statement in MIGRATIONS[1]:  # a database as the build before the mailbox left it
        db.execute(statement)
    db.execute("INSERT INTO schema_version (version) VALUES (1)")
    db.execute(
        "INSERT INTO sessions (id, header, created_at, is_seeded, inherited_event_count, delegation_depth, "
        "event_count, byte_size) VALUES ('old', 'x', 1, false, 0, 0, 0, 1)"
    )
    mailbox = PostgresMailbox(pg_url)
    try:
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        assert db.execute("SELECT to_regclass('mailbox') IS NOT NULL").fetchone() == (True,)
        assert db.execute("SELECT id FROM sessions").fetchall() == [("old",)]
        env = envelope(mailbox.ids)
        mailbox.deliver(SID, env)
        assert mailbox.drain(SID) == [env]
    finally:
        mailbox.close()
    PostgresLogStore(pg_url).close_store()  # the log store finds the current schema: nothing to do
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    _drop_all(db)


def test_a_newer_schema_is_refused_by_the_mailbox_and_left_untouched(
    harness: MailboxHarness, db: psycopg.Connection[Any], pg_url: str
) -> None:
    sender = harness.new()
    env = envelope(sender.ids)
    sender.deliver(SID, env)
    db.execute("UPDATE schema_version SET version = %s", (SCHEMA_VERSION + 1,))
    try:
        with pytest.raises(UnsupportedLog) as info:
            PostgresMailbox(pg_url)
        assert info.value.code == "STORAGE_UNSUPPORTED_FORMAT"
        assert db.execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION + 1,)
        assert db.execute("SELECT delivery_id FROM mailbox").fetchall() == [(env.delivery_id,)]
    finally:
        db.execute("UPDATE schema_version SET version = %s", (SCHEMA_VERSION,))


def test_a_mailbox_needs_a_url_or_a_pool_and_a_url_must_be_postgresqls(pg_url: str) -> None:
    with pytest.raises(TypeError):
        PostgresMailbox()
    with pytest.raises(InvalidStoreUrl):
        PostgresMailbox("./.subagents")


def test_a_mailbox_on_the_log_stores_pool_leaves_it_open_when_closed(harness: MailboxHarness, pg_url: str) -> None:
    store = PostgresLogStore(pg_url)
    try:
        mailbox = PostgresMailbox(pool=store.pool)
        env = envelope(mailbox.ids)
        mailbox.deliver(SID, env)
        mailbox.close()
        handle = store.create(header(SID))
        store.append(handle, [Batch(Offset(0), [make_event(0, "turn/start", T, {"turn": 1})])])
        store.close(handle)
        assert PostgresMailbox(pool=store.pool).drain(SID) == [env]
    finally:
        store.close_store()


# --- bad rows -----------------------------------------------------------------------------------


def _good_bytes(delivery_id: str, **changes: object) -> bytes:
    record = {"delivery_id": delivery_id, "kind": "message", "sender": None, "body": {}, "created_at": T, **changes}
    return json.dumps(record).encode()


BAD_ROWS = {
    "junk bytes": (BAD_ID, b"\x00\xff\xfejunk"),
    "empty": (BAD_ID, b""),
    "torn JSON": (BAD_ID, _good_bytes(BAD_ID)[:-9]),
    "unknown kind": (BAD_ID, _good_bytes(BAD_ID, kind="shout")),
    "a str for an int": (BAD_ID, _good_bytes(BAD_ID, created_at=str(T))),
    "a float for an int": (BAD_ID, _good_bytes(BAD_ID, created_at=T + 0.5)),
    "a list body": (BAD_ID, _good_bytes(BAD_ID, body=[1])),
    "a NaN in the body": (BAD_ID, _good_bytes(BAD_ID).replace(b'"body": {}', b'"body": {"x": NaN}')),
    "an unknown key": (BAD_ID, _good_bytes(BAD_ID, extra=1)),
    "a missing key": (BAD_ID, b'{"delivery_id":"%s","kind":"stop"}' % BAD_ID.encode()),
    "another id inside": (BAD_ID, _good_bytes(GOOD_ID)),
    "not a ULID id": ("hello", _good_bytes("hello")),
    "a lower-case ULID id": (BAD_ID.lower(), _good_bytes(BAD_ID.lower())),
    "deep nesting": (BAD_ID, b'{"body":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_bad_row_is_moved_aside_with_its_reason_and_never_stops_a_drain(
    harness: MailboxHarness, db: psycopg.Connection[Any], case: str
) -> None:
    delivery_id, data = BAD_ROWS[case]
    mailbox = harness.new()
    before, after = envelope(mailbox.ids, 1, at=T - 1), envelope(mailbox.ids, 2, at=T + 1)
    mailbox.deliver(SID, before)
    harness.plant(SID, delivery_id, data)
    mailbox.deliver(SID, after)
    report = mailbox.drain_report(SID)
    assert report.envelopes == [before, after]
    assert [(r.name, r.moved_to) for r in report.rejected] == [(delivery_id, delivery_id)]
    assert report.rejected[0].reason
    assert rejected_rows(db) == [(delivery_id, data, report.rejected[0].reason)]  # the evidence, byte for byte
    assert sorted(harness.names(SID)) == sorted([f"{before.delivery_id}.json", f"{after.delivery_id}.json"])
    again = harness.new().drain_report(SID)
    assert again.envelopes == [before, after] and again.rejected == []


def test_an_oversized_row_is_rejected_unread(
    harness: MailboxHarness, db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_mailbox, "MAX_ENVELOPE_BYTES", 100)
    data = _good_bytes(BAD_ID, body={"pad": "x" * 200})
    harness.plant(SID, BAD_ID, data)
    report = harness.new().drain_report(SID)
    assert report.envelopes == []
    assert [(r.name, r.reason) for r in report.rejected] == [
        (BAD_ID, f"the envelope is {len(data)} bytes; an envelope is at most 100")
    ]
    assert rejected_rows(db)[0][1] == data


def test_a_name_rejected_twice_is_kept_twice(harness: MailboxHarness, db: psycopg.Connection[Any]) -> None:
    mailbox = harness.new()
    harness.plant(SID, "junk", b"1")
    assert [r.moved_to for r in mailbox.drain_report(SID).rejected] == ["junk"]
    harness.plant(SID, "junk", b"2")
    assert [r.moved_to for r in mailbox.drain_report(SID).rejected] == ["junk~1"]
    assert [(name, data) for name, data, _ in rejected_rows(db)] == [("junk", b"1"), ("junk~1", b"2")]


def test_a_row_that_cannot_be_moved_stays_is_reported_by_every_drain_and_stops_none(
    harness: MailboxHarness, db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    mailbox = harness.new()
    env = envelope(mailbox.ids)
    mailbox.deliver(SID, env)
    harness.plant(SID, BAD_ID, b"junk")
    monkeypatch.setattr(pg_mailbox, "_REJECT", "SELECT no_such_column FROM mailbox_rejected")
    for _ in range(2):
        report = mailbox.drain_report(SID)
        assert report.envelopes == [env]
        assert [(r.name, r.moved_to) for r in report.rejected] == [(BAD_ID, None)]
    assert harness.names(SID) == sorted([f"{env.delivery_id}.json", f"{BAD_ID}.json"])
    assert rejected_rows(db) == []


# --- wake-ups -----------------------------------------------------------------------------------


def test_a_delivery_committed_by_any_connection_wakes_a_trio_watcher(
    harness: MailboxHarness, db: psycopg.Connection[Any], pg_url: str
) -> None:
    """Another host's writer is any client that inserts the row and notifies in one transaction:
    the fd wakes at its commit, not before."""
    env = Envelope(delivery_id=GOOD_ID, kind="message", sender=None, body={"text": "hi"}, created_at=T)

    def foreign_delivery(watch: MailboxWatch | PgSessionWatch) -> None:
        assert isinstance(watch, PgSessionWatch) and watch.listening
        with psycopg.connect(pg_url) as other:  # not autocommit: one transaction
            other.execute(
                "INSERT INTO mailbox (session_id, delivery_id, envelope, created_at) VALUES (%s, %s, %s, %s)",
                (SID, env.delivery_id, encode_envelope(env), env.created_at),
            )
            other.execute("SELECT pg_notify('subagents_mailbox', %s)", (SID,))
            assert not readable(watch.fileno())  # an uncommitted NOTIFY sends nothing
            other.commit()

    # The conformance suite's owner loop (test_mailbox_conformance.py), woken by another client.
    assert trio_owner_wakes(harness.new(), SID, foreign_delivery) == [[env]]


def _listener_pid(db: psycopg.Connection[Any]) -> int:
    row = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN subagents_mailbox'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_broken_listen_connection_turns_the_watch_into_polling(
    harness: MailboxHarness, db: psycopg.Connection[Any]
) -> None:
    owner = harness.new(poll_interval=0.25)
    with owner.watch(SID) as watch:
        fd = watch.fileno()
        db.execute("SELECT pg_terminate_backend(%s)", (_listener_pid(db),))
        assert woken(fd)  # the server's goodbye (or the end of the stream) wakes the owner
        while not watch.clear():  # the goodbye may come before the end of the stream
            assert woken(fd)
        assert not watch.listening and watch.poll_interval == 0.25
        assert not readable(watch.fileno())  # a pipe now: no busy loop on a dead socket
        assert not watch.clear()
        owner.deliver(SID, envelope(owner.ids))  # found by the next poll's drain
        assert len(owner.drain(SID)) == 1
    with pytest.raises(ValueError):
        watch.fileno()


def test_a_watch_without_a_listen_connection_polls(harness: MailboxHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    owner = harness.new(poll_interval=0.5)

    def refused(url: str, app: str) -> Any:
        raise StoreUnreachable("cannot connect to PostgreSQL: refused")

    monkeypatch.setattr(pg_mailbox, "connect", refused)
    with owner.watch(SID) as watch:
        assert isinstance(watch, MailboxWatch) and watch.poll_interval == 0.5


def test_a_watch_closed_stops_listening(harness: MailboxHarness, db: psycopg.Connection[Any]) -> None:
    owner = harness.new()
    watch = owner.watch(SID)
    _listener_pid(db)
    watch.close()
    watch.close()  # idempotent
    settle_listeners(db, 0)  # the server notices the closed socket in its own time
    assert not watch.clear()


# --- connections cut mid-deliver ----------------------------------------------------------------


def _wait_for_lock_waiter(db: psycopg.Connection[Any]) -> int:
    """The backend of the delivery blocked on the row."""
    return lock_waiter(db, "WITH ins AS (INSERT INTO mailbox", "the delivery")


@pytest.mark.parametrize("blocker_ends", ["rollback", "commit"])
def test_a_delivery_cut_before_it_committed_is_there_once(
    harness: MailboxHarness, db: psycopg.Connection[Any], pg_url: str, blocker_ends: str
) -> None:
    """The delivery waits on a row another transaction is inserting under its id; its backend is
    terminated there. Sent once more, it inserts the row (the other rolled back) or finds the same
    bytes (the other committed them): there once, either way."""
    mailbox = harness.new()
    env = envelope(mailbox.ids)
    outcome: list[object] = []
    with psycopg.connect(pg_url) as blocker:
        blocker.execute(
            "INSERT INTO mailbox (session_id, delivery_id, envelope, created_at) VALUES (%s, %s, %s, %s)",
            (SID, env.delivery_id, encode_envelope(env), env.created_at),
        )
        worker = threading.Thread(target=lambda: outcome.append(outcome_of(mailbox.deliver, SID, env)))
        worker.start()
        victim = _wait_for_lock_waiter(db)
        db.execute("SELECT pg_terminate_backend(%s)", (victim,))
        getattr(blocker, blocker_ends)()
        worker.join()
    assert outcome == [None]
    assert db.execute("SELECT count(*) FROM mailbox").fetchone() == (1,)
    assert harness.new().drain(SID) == [env]


class _CutAfterCommit:
    """A connection whose delivery statements commit, then lose their connection before the
    client reads the reply (`times` of them)."""

    def __init__(self, conn: psycopg.Connection[Any], db: psycopg.Connection[Any], cuts: list[int]) -> None:
        self._conn, self._db, self._cuts = conn, db, cuts

    def execute(self, sql: str, params: Any = None) -> Any:
        result = self._conn.execute(sql, params)
        if sql.startswith("WITH ins AS") and len(self._cuts) < self.times:
            pid = self._conn.info.backend_pid
            self._cuts.append(pid)
            self._db.execute("SELECT pg_terminate_backend(%s)", (pid,))
            self._conn.execute("SELECT 1")  # raises: the server closed this connection
        return result

    times = 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@contextmanager
def _cut_after_commit(mailbox: PostgresMailbox, db: psycopg.Connection[Any], times: int) -> Iterator[list[int]]:
    real = mailbox._pool.connection
    cuts: list[int] = []

    @contextmanager
    def connection() -> Iterator[Any]:
        with real() as conn:
            cut = _CutAfterCommit(conn, db, cuts)
            cut.times = times
            yield cut

    mailbox._pool.connection = connection  # type: ignore[method-assign]  # the fault under test
    try:
        yield cuts
    finally:
        mailbox._pool.connection = real  # type: ignore[method-assign]  # the fault under test, undone


def test_a_delivery_cut_after_it_committed_is_acknowledged_once(
    harness: MailboxHarness, db: psycopg.Connection[Any]
) -> None:
    mailbox = harness.new()
    env = envelope(mailbox.ids)
    with mailbox.watch(SID) as watch, _cut_after_commit(mailbox, db, times=1) as cuts:
        mailbox.deliver(SID, env)  # the retry finds its own bytes: the same delivery
        assert len(cuts) == 1  # the fault happened
        assert woken(watch.fileno()) and watch.clear()  # the committed attempt notified
    assert db.execute("SELECT count(*) FROM mailbox").fetchone() == (1,)
    assert harness.new().drain(SID) == [env]


def test_a_delivery_whose_outcome_cannot_be_told_fails_and_is_there_once_or_not_at_all(
    harness: MailboxHarness, db: psycopg.Connection[Any]
) -> None:
    mailbox = harness.new()
    env = envelope(mailbox.ids)
    with _cut_after_commit(mailbox, db, times=2) as cuts:
        with pytest.raises(PersistenceFailed) as info:
            mailbox.deliver(SID, env)
    assert len(cuts) == 2
    assert "\n" not in info.value.message and "deliver" in info.value.message
    assert db.execute("SELECT count(*) FROM mailbox").fetchone() == (1,)  # committed by the first attempt
    mailbox.deliver(SID, env)  # a sender's retry: the same delivery
    assert harness.new().drain(SID) == [env]


def test_concurrent_deliveries_of_one_id_make_one_row_and_conflicts_are_told(
    harness: MailboxHarness, db: psycopg.Connection[Any]
) -> None:
    ids = DeliveryIds()
    env = envelope(ids)
    other = Envelope(delivery_id=env.delivery_id, kind="stop", sender=None, body={}, created_at=T)
    barrier = threading.Barrier(6)
    outcomes: list[object] = []
    lock = threading.Lock()

    def send(value: Envelope) -> None:
        mailbox = harness.new()
        barrier.wait()
        result = outcome_of(mailbox.deliver, SID, value)
        with lock:
            outcomes.append((value is env, type(result).__name__))

    threads = [threading.Thread(target=send, args=(env if k % 2 else other,)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (stored,) = harness.new().drain(SID)
    winner = stored == env
    assert sorted(outcomes) == sorted(
        [(True, "NoneType" if winner else "DeliveryConflict")] * 3
        + [(False, "DeliveryConflict" if winner else "NoneType")] * 3
    )
    assert db.execute("SELECT count(*) FROM mailbox").fetchone() == (1,)


def test_a_server_restart_mid_run_loses_no_delivery_and_the_watch_polls(
    harness: MailboxHarness, pg_server: EmbeddedServer, pg_url: str
) -> None:
    owner, sender = harness.new(), harness.new()
    first, second = envelope(sender.ids, 1), envelope(sender.ids, 2)
    sender.deliver(SID, first)
    assert owner.drain(SID) == [first]  # both pools now hold a connection that dies with the server
    with owner.watch(SID) as watch:
        pg_server.restart()
        assert woken(watch.fileno())  # the listening connection ended with the server
        while not watch.clear():  # the server's goodbye may come before the end of the stream
            assert woken(watch.fileno())
        assert not watch.listening and watch.poll_interval is not None
        sender.deliver(SID, second)  # a dead pooled connection is replaced, once
        assert owner.drain(SID) == [first, second]
        owner.ack(SID, first.delivery_id)
    with owner.watch(SID) as again:  # a new watch listens again
        assert isinstance(again, PgSessionWatch) and again.listening
        sender.deliver(SID, envelope(sender.ids, 3))
        assert woken(again.fileno()) and again.clear()
    assert [e.body["n"] for e in harness.new().drain(SID)] == [2, 3]


# --- one LISTEN connection per mailbox (storage/pg_listener.py) ---------------------------------
# One server connection however many sessions are watched; a notification wakes only the watches
# of its session; a broken listener turns every watch into polling; watches made at once from
# many threads still share one listener.

LISTENERS = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN subagents_mailbox'"
)


def listeners(db: psycopg.Connection[Any]) -> int:
    return int(db.execute(LISTENERS).fetchone()[0])


def settle_listeners(db: psycopg.Connection[Any], expected: int) -> None:
    """Wait until the server counts `expected` listening backends (a closed socket is noticed by
    the server in its own time; 10 s bound, never reached)."""
    deadline = time.monotonic() + 10
    while listeners(db) != expected:
        assert time.monotonic() < deadline, f"{listeners(db)} listening backends, not {expected}"
        time.sleep(0.01)


def signalled(harness: MailboxHarness, watch: Any) -> bool:
    return harness.woken(watch.fileno())


def test_every_watch_of_a_mailbox_shares_one_listening_connection(
    harness: MailboxHarness, db: psycopg.Connection[Any]
) -> None:
    owner = harness.new()
    sessions = [f"child-{i}" for i in range(15)]
    watches = {sid: [owner.watch(sid), owner.watch(sid)] for sid in sessions}  # two owners each
    try:
        assert all(isinstance(w, PgSessionWatch) and w.listening for ws in watches.values() for w in ws)
        assert listeners(db) == 1  # not 30
        harness.new().deliver("child-7", envelope(owner.ids))  # from another "host"
        assert all(signalled(harness, w) for w in watches["child-7"])
        assert all(w.clear() for w in watches["child-7"])
        # Both of child-7's watches were signalled in the same pass as any other would have been.
        others = [w for sid, ws in watches.items() if sid != "child-7" for w in ws]
        assert not any(w.clear() for w in others)
    finally:
        for ws in watches.values():
            for w in ws:
                w.close()
    settle_listeners(db, 0)  # the last watch closed: the connection is gone
    with owner.watch("child-1") as again:  # and the next watch listens again
        assert again.listening and listeners(db) == 1
        harness.new().deliver("child-1", envelope(owner.ids, 2))
        assert signalled(harness, again) and again.clear()


def test_a_broken_listener_turns_every_watch_into_polling_and_a_new_watch_listens_again(
    harness: MailboxHarness, db: psycopg.Connection[Any]
) -> None:
    owner = harness.new(poll_interval=0.25)
    watches = [owner.watch(f"child-{i}") for i in range(3)]
    try:
        db.execute("SELECT pg_terminate_backend(%s)", (_listener_pid(db),))
        for watch in watches:
            assert signalled(harness, watch)  # woken once: drain what may have been missed
            assert watch.clear()
            assert not watch.listening and watch.poll_interval == 0.25
            assert not watch.clear()
        with owner.watch("child-0") as fresh:
            assert fresh.listening and fresh.poll_interval is None
            harness.new().deliver("child-0", envelope(owner.ids))
            assert signalled(harness, fresh) and fresh.clear()
            assert not watches[0].clear()  # the old one stays the polling form: nothing signals it
    finally:
        for watch in watches:
            watch.close()


def test_watches_made_at_once_from_many_threads_share_one_listener(
    harness: MailboxHarness, db: psycopg.Connection[Any]
) -> None:
    owner = harness.new()
    barrier = threading.Barrier(12)
    made: dict[int, Any] = {}

    def make(i: int) -> None:
        barrier.wait()
        made[i] = owner.watch(f"child-{i}")  # one key per thread

    threads = [threading.Thread(target=make, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert len(made) == 12 and all(w.listening for w in made.values())
        settle_listeners(db, 1)  # a listener opened by a thread that lost the race is stopped
        harness.new().deliver("child-5", envelope(owner.ids))
        assert signalled(harness, made[5]) and made[5].clear()
    finally:
        for watch in made.values():
            watch.close()
    settle_listeners(db, 0)


def test_a_closed_mailbox_stops_its_listener(harness: MailboxHarness, db: psycopg.Connection[Any]) -> None:
    mailbox = harness.new(poll_interval=0.5)
    watch = mailbox.watch("child-1")
    assert listeners(db) == 1
    mailbox.close()
    settle_listeners(db, 0)
    assert signalled(harness, watch) and watch.clear()  # told once: it polls from now on
    assert not watch.listening and watch.poll_interval == 0.5
    watch.close()
    assert not watch.clear()  # a closed watch says nothing


def test_a_listener_whose_socket_is_past_fd_setsize_still_wakes(
    harness: MailboxHarness, db: psycopg.Connection[Any]
) -> None:
    """A host with many resident sessions holds many fds (two per watch, inotify instances,
    sockets): the listening socket's number may run past select()'s FD_SETSIZE (1024)."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))  # raises if the hard limit is lower
    fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        owner = harness.new()
        with owner.watch("child-1") as watch:
            assert watch.fileno() > 1024
            harness.new().deliver("child-1", envelope(owner.ids))
            assert signalled(harness, watch) and watch.clear()
            assert watch.listening  # the listener did not break on its fd's number
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_listener_that_breaks_at_once_gives_a_polling_watch_not_a_reconnect_loop(
    harness: MailboxHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from subagents.storage import pg_listener, pg_mailbox

    connects = []
    real_connect = pg_mailbox.connect

    def counting(url: str, app: str) -> Any:
        connects.append(url)
        return real_connect(url, app)

    class Broken(pg_listener.PgListener):
        def add(self, session_id: str) -> Any:
            assert len(connects) <= 3, "reconnecting in a loop"  # fails the test instead of hanging it
            self.stop()  # as if the connection broke before the first watch joined
            self.join(10)
            return super().add(session_id)

    monkeypatch.setattr(pg_mailbox, "connect", counting)
    monkeypatch.setattr(pg_mailbox, "PgListener", Broken)
    owner = harness.new(poll_interval=0.5)
    with owner.watch("child-1") as watch:
        assert not isinstance(watch, PgSessionWatch) and watch.poll_interval == 0.5
    assert len(connects) == 1
