"""The PostgreSQL mailbox's watches share one LISTEN connection (storage/pg_listener.py): one
server connection per mailbox however many sessions are watched, a notification wakes only the
watches of its session, a broken listener turns every watch into polling, and watches made at
once from many threads still share one listener."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from mailboxes import MailboxHarness, envelope
from subagents.storage import PgSessionWatch

pytestmark = pytest.mark.pg

LISTENERS = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN subagents_mailbox'"
)


@pytest.fixture
def harness(pg_url: str, tmp_path: Path) -> Iterator[MailboxHarness]:
    made = MailboxHarness("pg", tmp_path, pg_url)
    yield made
    made.close()


@pytest.fixture
def db(pg_url: str, harness: MailboxHarness) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


def listeners(db: psycopg.Connection[Any]) -> int:
    return int(db.execute(LISTENERS).fetchone()[0])


def settle_listeners(db: psycopg.Connection[Any], expected: int) -> None:
    """Wait until the server counts `expected` listening backends (a closed socket is noticed by
    the server in its own time; 10 s bound, never reached)."""
    deadline = time.monotonic() + 10
    while listeners(db) != expected:
        assert time.monotonic() < deadline, f"{listeners(db)} listening backends, not {expected}"
        time.sleep(0.01)


def readable(harness: MailboxHarness, watch: Any) -> bool:
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
        assert all(readable(harness, w) for w in watches["child-7"])
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
        assert readable(harness, again) and again.clear()


def test_a_broken_listener_turns_every_watch_into_polling_and_a_new_watch_listens_again(
    harness: MailboxHarness, db: psycopg.Connection[Any]
) -> None:
    owner = harness.new(poll_interval=0.25)
    watches = [owner.watch(f"child-{i}") for i in range(3)]
    try:
        (pid,) = db.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN subagents_mailbox'"
        ).fetchone()
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for watch in watches:
            assert readable(harness, watch)  # woken once: drain what may have been missed
            assert watch.clear()
            assert not watch.listening and watch.poll_interval == 0.25
            assert not watch.clear()
        with owner.watch("child-0") as fresh:
            assert fresh.listening and fresh.poll_interval is None
            harness.new().deliver("child-0", envelope(owner.ids))
            assert readable(harness, fresh) and fresh.clear()
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
        assert readable(harness, made[5]) and made[5].clear()
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
    assert readable(harness, watch) and watch.clear()  # told once: it polls from now on
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
            assert readable(harness, watch) and watch.clear()
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
