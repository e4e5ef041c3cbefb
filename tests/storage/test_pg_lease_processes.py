"""Leases across real processes (SPEC §9, issues 19 and 27): a host process SIGKILLed mid-run
gives its sessions up once their leases expire (a free liveness lock alone is not a dead host: a
live host whose connections were cut keeps them and writes on); a host process SIGSTOPped
keeps them until its lease expires, and once another host took over, its next append after
SIGCONT writes nothing (`OwnershipLost`). The lease "expires" by an UPDATE of `expires_at`: no
time passes for real. The child process is driven line by line over its stdin/stdout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from clocks import T
from events import turn_start_event
from log_lines import read_all
from subagents.storage import AlreadyOwned, Batch, Offset

pytestmark = pytest.mark.pg

Factory = Callable[..., Any]

# A host: creates session s1 with one event, says "ready <epoch>", then appends one event per
# "append" line, answering "ok <next seq>" or the error's code.
_HOST = """
import sys
from subagents.storage import Batch, Offset, PostgresLogStore, SessionHeader, SessionId, StorageError, make_event
store = PostgresLogStore(sys.argv[1], host_id=sys.argv[2], lease_ttl=3600)
handle = store.create(SessionHeader(id=SessionId("s1"), created_at=1))
store.append(handle, [Batch(Offset(0), [make_event(0, "turn/start", 1, {"turn": 0})])])
print("ready", handle.impl.epoch, flush=True)
for line in sys.stdin:
    seq = handle.next_seq
    try:
        print("ok", store.append(handle, [Batch(Offset(seq), [make_event(seq, "turn/start", 1, {"turn": seq})])]), flush=True)
    except StorageError as exc:
        print(exc.code, flush=True)
"""


@pytest.fixture
def db(pg_url: str, pg_store_factory: Factory) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DO $$ BEGIN IF to_regclass('leases') IS NOT NULL THEN DELETE FROM leases; END IF; END $$")
        yield conn


@pytest.fixture
def host_process(pg_url: str, db: psycopg.Connection[Any]) -> Iterator[subprocess.Popen[str]]:
    """Host A, after the tables were emptied for this test."""
    process = subprocess.Popen(
        [sys.executable, "-c", _HOST, pg_url, "host-a"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().split() == ["ready", "1"]
        yield process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
            process.kill()
        process.wait(timeout=30)


def _ask(process: subprocess.Popen[str]) -> str:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("append\n")
    process.stdin.flush()
    return process.stdout.readline().strip()


def _wait_for_host_gone(db: psycopg.Connection[Any], host_pid: int) -> None:
    """Until the killed host's server processes (named by its pid: pg_connect.application_name)
    have ended, its liveness lock with them. They are ending already: terminating one waits
    (at most 10 s) for its exit."""
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s", (f"subagents {host_pid}@%",)
    ).fetchall()
    for (pid,) in rows:
        db.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))


@pytest.mark.slow  # starts a host process
def test_a_killed_host_s_session_is_taken_once_its_lease_expires(
    host_process: subprocess.Popen[str], pg_store_factory: Factory, db: psycopg.Connection[Any]
) -> None:
    """Issue 27: a free liveness lock is not a dead host (a live host's connection may have been
    cut): a killed host's session waits for its lease — before, it was taken at once."""
    b = pg_store_factory()
    with pytest.raises(AlreadyOwned):
        b.open_write("s1")  # host A lives
    assert b.held_elsewhere(["s1"]) == {"s1"}
    host_process.kill()
    host_process.wait(timeout=30)
    _wait_for_host_gone(db, host_process.pid)
    assert db.execute("SELECT expires_at > now() FROM leases").fetchone() == (True,)  # an hour left
    assert b.held_elsewhere(["s1"]) == {"s1"}
    with pytest.raises(AlreadyOwned):
        b.open_write("s1")
    db.execute("UPDATE leases SET expires_at = now() - interval '1 second'")  # its ttl ran out
    assert b.held_elsewhere(["s1"]) == set()
    taken = b.open_write("s1")
    assert taken.impl.epoch == 2
    assert b.append(taken, [Batch(Offset(1), [turn_start_event(1, T)])]) == 2
    b.close(taken)


@pytest.mark.slow  # starts a host process
def test_a_host_whose_connections_are_cut_keeps_its_session_and_writes_on(
    host_process: subprocess.Popen[str], pg_store_factory: Factory, db: psycopg.Connection[Any]
) -> None:
    """Every server process of a live host ended (`pg_terminate_backend`, as an operator or a
    failover proxy would): nobody takes its session, and its next append goes through."""
    b = pg_store_factory()
    _wait_for_host_gone(db, host_process.pid)  # its liveness lock is free now
    with pytest.raises(AlreadyOwned):
        b.open_write("s1")
    assert _ask(host_process) == "ok 2"  # reconnected: the same epoch writes on
    assert db.execute("SELECT epoch FROM batches ORDER BY first_seq").fetchall() == [(1,), (1,)]


@pytest.mark.slow  # starts a host process and pauses it
def test_a_paused_host_keeps_its_session_until_its_lease_expires_then_writes_nothing(
    host_process: subprocess.Popen[str], pg_store_factory: Factory, db: psycopg.Connection[Any]
) -> None:
    b = pg_store_factory()
    assert _ask(host_process) == "ok 2"
    os.kill(host_process.pid, signal.SIGSTOP)
    with pytest.raises(AlreadyOwned):
        b.open_write("s1")  # paused, not dead: its lease stands
    db.execute("UPDATE leases SET expires_at = now() - interval '1 second'")  # past its ttl
    taken = b.open_write("s1")
    assert taken.impl.epoch == 2
    os.kill(host_process.pid, signal.SIGCONT)
    assert _ask(host_process) == "STORAGE_OWNERSHIP_LOST"
    assert _ask(host_process) == "STORAGE_OWNERSHIP_LOST"  # never again
    assert db.execute("SELECT first_seq, epoch FROM batches ORDER BY first_seq").fetchall() == [(0, 1), (1, 1)]
    assert b.append(taken, [Batch(Offset(2), [turn_start_event(2, T)])]) == 3
    assert [e.seq for e in read_all(b, "s1")] == [0, 1, 2]  # contiguous: one writer at a time
    assert db.execute("SELECT epoch FROM batches ORDER BY first_seq").fetchall() == [(1,), (1,), (2,)]
    b.close(taken)
