"""Bad input and faults of the PostgreSQL store: URLs that are not PostgreSQL's, servers that
refuse, connections cut mid-append (`pg_terminate_backend`) and a server restarted mid-run. An
append is one transaction: after a lost connection it is found committed (and acknowledged) or
not (and sent once more) — never half, never twice."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from events import turn_batch as batch
from events import turn_starts as turns
from log_lines import header, read_all
from pg_faults import lock_waiter, outcome_of
from pg_server import EmbeddedServer, database_url
from subagents.storage import (
    HandleDead,
    InvalidStoreUrl,
    OwnershipLost,
    PersistenceFailed,
    PostgresLogStore,
    StoreUnreachable,
)

pytestmark = pytest.mark.pg

Factory = Callable[..., Any]


@pytest.fixture
def db(pg_url: str, pg_store_factory: Factory) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_line(message: str) -> None:
    assert message and "\n" not in message and "Traceback" not in message


# --- bad URLs and unreachable servers -----------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("", id="empty"),
        pytest.param("./.subagents", id="a-path"),
        pytest.param("http://user:hunter2@host/db", id="another-scheme"),
        pytest.param("postgresql://user:hunter2@host:notaport/db", id="port-not-a-number"),
        pytest.param("postgresql://user:hunter2@host/db?nosuchoption=1", id="unknown-option"),
        pytest.param(None, id="not-a-str"),
    ],
)
def test_a_url_that_is_not_postgresqls_is_refused_in_one_line(url: Any) -> None:
    with pytest.raises(InvalidStoreUrl) as info:
        PostgresLogStore(url)
    assert info.value.code == "STORAGE_INVALID_STORE_URL"
    one_line(info.value.message)
    assert "hunter2" not in info.value.message


def test_a_refused_connection_is_one_clear_line() -> None:
    url = f"postgresql://someone:hunter2@127.0.0.1:{closed_port()}/db"
    with pytest.raises(StoreUnreachable) as info:
        PostgresLogStore(url)
    assert info.value.code == "STORAGE_STORE_UNREACHABLE"
    one_line(info.value.message)
    assert info.value.message.startswith("cannot connect to PostgreSQL at postgresql://someone:***@127.0.0.1:")
    assert "refused" in info.value.message and "hunter2" not in info.value.message


def test_a_store_without_psycopg_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if it were not installed
    with pytest.raises(StoreUnreachable, match=r"needs psycopg 3, which is not installed: pip install") as info:
        PostgresLogStore("postgresql://localhost/db")
    one_line(info.value.message)


def test_a_missing_database_is_unreachable(pg_server: EmbeddedServer) -> None:
    with pytest.raises(StoreUnreachable, match='database "no_such_db" does not exist') as info:
        PostgresLogStore(database_url(pg_server.url, "no_such_db"))
    one_line(info.value.message)


# --- connections cut mid-append -----------------------------------------------------------------


def _wait_for_lock_waiter(db: psycopg.Connection[Any]) -> int:
    """The backend of the append blocked on the session row (an append whose lease needs no
    renewal is fenced on that row alone: pg_append)."""
    return lock_waiter(db, "WITH s AS (UPDATE sessions", "the append")


def test_an_append_cut_before_it_committed_is_sent_once_more(
    pg_store_factory: Factory, db: psycopg.Connection[Any], pg_url: str
) -> None:
    store = pg_store_factory()
    handle = store.create(header("s1"))
    store.append(handle, [batch(0, 1)])
    outcome: list[object] = []
    with psycopg.connect(pg_url) as blocker:  # holds the session row: the append waits on it
        blocker.execute("SELECT 1 FROM sessions WHERE id = 's1' FOR UPDATE")
        worker = threading.Thread(target=lambda: outcome.append(outcome_of(store.append, handle, [batch(1, 3)])))
        worker.start()
        victim = _wait_for_lock_waiter(db)
        db.execute("SELECT pg_terminate_backend(%s)", (victim,))
        blocker.rollback()
        worker.join()
    assert outcome == [3]
    assert handle.next_seq == 3 and handle.dead is None
    assert read_all(store, "s1") == turns(0, 3)
    assert db.execute("SELECT first_seq, count FROM batches ORDER BY first_seq").fetchall() == [(0, 1), (1, 2)]
    assert db.execute("SELECT event_count FROM sessions").fetchone() == (3,)
    store.append(handle, [batch(3, 4)])
    store.close(handle)


def test_an_append_cut_before_it_committed_is_not_sent_again_past_a_takeover(
    pg_store_factory: Factory, db: psycopg.Connection[Any], pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cut statement wrote nothing; before it is sent once more, another host takes the
    session over (this host was paused past its ttl): the resend is fenced — `OwnershipLost`,
    nothing of it written."""
    store, other = pg_store_factory(), pg_store_factory()
    handle = store.create(header("s1"))
    store.append(handle, [batch(0, 1)])
    real = store._appender._resolve  # the store's append path (pg_append)
    taken: list[Any] = []

    def takeover_meanwhile(*args: Any) -> str:
        outcome = real(*args)
        db.execute("UPDATE leases SET expires_at = now() - interval '1 second'")
        taken.append(other.open_write("s1"))
        return outcome

    monkeypatch.setattr(store._appender, "_resolve", takeover_meanwhile)
    outcome: list[object] = []
    with psycopg.connect(pg_url) as blocker:  # holds the session row: the append waits on it
        blocker.execute("SELECT 1 FROM sessions WHERE id = 's1' FOR UPDATE")
        worker = threading.Thread(target=lambda: outcome.append(outcome_of(store.append, handle, [batch(1, 3)])))
        worker.start()
        victim = _wait_for_lock_waiter(db)
        db.execute("SELECT pg_terminate_backend(%s)", (victim,))
        blocker.rollback()
        worker.join()
    assert len(taken) == 1 and isinstance(outcome[0], OwnershipLost), outcome
    assert db.execute("SELECT first_seq, count, epoch FROM batches").fetchall() == [(0, 1, handle.impl.epoch)]
    assert db.execute("SELECT event_count FROM sessions").fetchone() == (1,)
    assert other.append(taken[0], [batch(1, 2)]) == 2
    other.close(taken[0])
    store.close(handle)


@contextmanager
def _cut_after_commit(store: PostgresLogStore, db: psycopg.Connection[Any]) -> Iterator[list[int]]:
    """The next append statement commits, then its connection is terminated before the client
    reads the reply: the client sees a lost connection, the server has the batch. (The append
    runs on the pool's kept cursor of a connection, `Pool.cursor`: the fault goes there.)"""
    real = store._pool.cursor
    cut: list[int] = []

    @contextmanager
    def cursor() -> Iterator[Any]:
        with real() as cur:
            yield _CutAfterCommit(cur, db, cut)

    store._pool.cursor = cursor  # type: ignore[method-assign]  # the fault under test
    try:
        yield cut
    finally:
        store._pool.cursor = real  # type: ignore[method-assign]  # the fault under test, undone


class _CutAfterCommit:
    def __init__(self, cur: psycopg.Cursor[Any], db: psycopg.Connection[Any], cut: list[int]) -> None:
        self._cur, self._db, self._cut = cur, db, cut

    def execute(self, sql: str, params: Any = None) -> Any:
        result = self._cur.execute(sql, params)
        if "INSERT INTO batches" in sql and not self._cut:  # an append statement, of either form
            pid = self._cur.connection.info.backend_pid
            self._cut.append(pid)
            self._db.execute("SELECT pg_terminate_backend(%s)", (pid,))
            self._cur.execute("SELECT 1")  # raises: the server closed this connection
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


@pytest.mark.parametrize("published", [True, False], ids=["append", "publication"])
def test_an_append_cut_after_it_committed_is_acknowledged_once(
    pg_store_factory: Factory, db: psycopg.Connection[Any], published: bool
) -> None:
    store = pg_store_factory()
    handle = store.create(header("s1"))
    first = 0
    if published:
        store.append(handle, [batch(0, 1)])
        first = 1
    with _cut_after_commit(store, db) as cut:
        assert store.append(handle, [batch(first, first + 2)]) == first + 2
    assert len(cut) == 1  # the fault happened
    assert handle.dead is None and handle.published
    assert read_all(store, "s1") == turns(0, first + 2)
    assert db.execute("SELECT count(*), sum(count) FROM batches").fetchone() == (1 + published, first + 2)
    store.close(handle)


def test_a_lost_append_that_commits_after_the_look_is_still_acknowledged(
    pg_store_factory: Factory, db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cut connection's statement may still be running on the server: the first look finds
    nothing (here: it is told so), the statement commits, and the second send then meets a
    moved count. Asked again, the batch there is this very one: acknowledged, once."""
    store = pg_store_factory()
    handle = store.create(header("s1"))
    store.append(handle, [batch(0, 1)])
    real = store._appender._resolve  # the store's append path (pg_append)
    looks: list[str] = []

    def late_commit(*args: Any) -> str:
        looks.append(real(*args))
        return "absent" if len(looks) == 1 else looks[-1]

    monkeypatch.setattr(store._appender, "_resolve", late_commit)
    with _cut_after_commit(store, db):
        assert store.append(handle, [batch(1, 3)]) == 3
    assert looks == ["committed", "committed"]
    assert handle.dead is None
    assert read_all(store, "s1") == turns(0, 3)
    assert db.execute("SELECT count(*) FROM batches").fetchone() == (2,)
    store.close(handle)


def test_an_append_whose_outcome_cannot_be_told_kills_the_handle(
    pg_store_factory: Factory, db: psycopg.Connection[Any]
) -> None:
    """Cut after the commit, and no new connection to ask on: the handle is dead (like after a
    failed fsync); reopening shows the batch, whole, once."""
    store = pg_store_factory()
    handle = store.create(header("s1"))
    store.append(handle, [batch(0, 1)])
    url = store._pool.url
    with _cut_after_commit(store, db):
        store._pool.url = f"postgresql://nobody@127.0.0.1:{closed_port()}/db"  # every new connection refused
        with pytest.raises(PersistenceFailed) as info:
            store.append(handle, [batch(1, 3)])
    store._pool.url = url
    one_line(info.value.message)
    assert handle.dead is not None and "cannot be told" in handle.dead
    with pytest.raises(HandleDead):
        store.append(handle, [batch(1, 3)])
    store.close(handle)
    again = store.open_write("s1")
    assert again.next_seq == 3
    assert read_all(store, "s1") == turns(0, 3)
    store.close(again)


# --- the server restarted mid-run ---------------------------------------------------------------


@pytest.mark.slow  # restarts the shared server (about 1 s)
def test_a_server_restart_mid_run_loses_nothing_acknowledged(
    pg_store_factory: Factory, pg_server: EmbeddedServer, db: psycopg.Connection[Any], pg_url: str
) -> None:
    store = pg_store_factory()
    handle = store.create(header("s1"))
    store.append(handle, [batch(0, 2)])
    with store._pool.connection(), store._pool.connection(), store._pool.connection():
        pass  # the pool keeps these three idle: each of them dies with the server
    db.close()
    pg_server.restart()
    # The pooled connections died with the server: the next append finds out, asks on a fresh
    # connection whether anything committed (nothing did) and writes once.
    assert store.append(handle, [batch(2, 3)]) == 3
    assert [r.event_count for r in store.list()] == [3]
    store.close(handle)
    pg_server.restart()
    assert [r.event_count for r in store.list()] == [3]  # a read finds its connections dead too
    # The write locks went with the owner connection; the store takes new ones.
    again = store.open_write("s1")
    assert again.next_seq == 3
    assert read_all(store, "s1") == turns(0, 3)
    store.close(again)
    with psycopg.connect(pg_url, autocommit=True) as check:
        assert check.execute("SELECT count(*) FROM batches").fetchone() == (2,)
