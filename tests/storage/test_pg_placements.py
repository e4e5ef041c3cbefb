"""The placement queue and host registry on PostgreSQL (storage/pg_placements.py, SPEC §9): two
stores on one database are two hosts. A placement goes to exactly one claimer; a claim whose
host is gone (its `hosts` row removed, or not renewed for a ttl — never a free liveness lock
alone) is claimable again; only live hosts with capacity count as serving.

Time never passes for real here: a host "stops renewing" by moving its `renewed_at` into the
past with an UPDATE (the database clock decides, as it does for the stores)."""

from __future__ import annotations

import select
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from clocks import T
from events import turn_start_event
from log_lines import header
from subagents.storage import Batch, Claim, Offset, PostgresLogStore

pytestmark = pytest.mark.pg

Factory = Callable[..., Any]


@pytest.fixture
def db(pg_url: str, pg_store_factory: Factory) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "DO $$ BEGIN IF to_regclass('placements') IS NOT NULL THEN "
            "DELETE FROM placements; DELETE FROM leases; DELETE FROM hosts; END IF; END $$"
        )
        yield conn


@pytest.fixture
def host(pg_store_factory: Factory, db: psycopg.Connection[Any]) -> Factory:
    def make(name: str) -> PostgresLogStore:
        return pg_store_factory(host_id=name)

    return make


def test_a_placement_is_claimed_once_oldest_first_and_finished_by_its_claimer(host: Factory) -> None:
    a, b = host("host-a").placements(), host("host-b").placements()
    for sid in ("s1", "s2", "s3"):
        a.enqueue(sid)
    a.enqueue("s1")  # again: still one placement
    assert b.claim(2) == [Claim("s1", 1), Claim("s2", 1)]
    assert a.claim(5) == [Claim("s3", 1)]
    assert a.claim(5) == b.claim(5) == []
    a.finish("s1")  # not a's claim: nothing happens
    b.unclaim("s2")
    assert a.claim(5) == [Claim("s2", 2)]  # claimed before: its second attempt
    b.finish("s1")
    a.finish("s2")
    a.finish("s3")
    a.enqueue("s1")  # a new placement of a finished one starts counting again
    assert b.claim(5) == [Claim("s1", 1)]


def test_a_claim_leaves_the_placements_its_host_skips_to_the_others(host: Factory) -> None:
    a, b = host("host-a").placements(), host("host-b").placements()
    for sid in ("s1", "s2", "s3"):
        a.enqueue(sid)
    assert a.claim(5, skip={"s1", "s3"}) == [Claim("s2", 1)]  # given back here before: not taken again
    assert a.claim(5, skip=["s1", "s3"]) == []
    assert b.claim(5, skip=()) == [Claim("s1", 1), Claim("s3", 1)]
    a.enqueue("s4", claimed_before=True)  # a settlement made and lost: its next claim settles again
    assert b.claim(5) == [Claim("s4", 2)]


def test_hosts_claiming_at_once_never_get_the_same_placement(host: Factory) -> None:
    queues = [host(f"host-{i}").placements() for i in range(4)]
    for i in range(40):
        queues[0].enqueue(f"s{i:02}")
    got: list[list[Claim]] = [[] for _ in queues]
    start = threading.Barrier(len(queues))

    def claim(i: int) -> None:
        start.wait()
        while batch := queues[i].claim(3):
            got[i].extend(batch)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(queues))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    claimed = [c.session_id for batch in got for c in batch]
    assert sorted(claimed) == [f"s{i:02}" for i in range(40)]  # each exactly once


def test_claims_of_a_host_that_is_gone_or_stopped_renewing_are_reclaimed(
    host: Factory, db: psycopg.Connection[Any]
) -> None:
    gone_store, paused_store, me_store = host("gone"), host("paused"), host("me")
    gone, paused, me = gone_store.placements(), paused_store.placements(), me_store.placements()
    for sid in ("s1", "s2", "s3"):
        me.enqueue(sid)
    gone.serve(1)
    paused.serve(1)
    me.serve(1)
    assert gone.claim(1) == [Claim("s1", 1)] and paused.claim(1) == [Claim("s2", 1)] and me.claim(1) == [Claim("s3", 1)]
    assert me.reclaim_orphans() == []  # every claimer is alive and renewing
    gone_store.close_store()  # its liveness lock is freed with its connection
    assert me.reclaim_orphans() == ["s1"]
    db.execute("UPDATE hosts SET renewed_at = now() - interval '1 hour' WHERE id = 'paused'")
    assert me.reclaim_orphans() == ["s2"]  # alive, but silent past its ttl
    assert me.claim(5) == [Claim("s1", 2), Claim("s2", 2)]
    assert me.reclaim_orphans() == []  # its own claims are never orphans to itself


def test_a_claim_whose_child_is_still_held_by_a_live_host_is_not_reclaimed(
    host: Factory, db: psycopg.Connection[Any]
) -> None:
    paused_store, me_store, other_store = host("paused"), host("me"), host("other")
    paused, me, other = paused_store.placements(), me_store.placements(), other_store.placements()
    for queue in (paused, me, other):
        queue.serve(1)
    me.enqueue("s1")
    assert paused.claim(1) == [Claim("s1", 1)]
    # Its host renews late (or the hosts' ttls differ), but it still holds the child's lease.
    db.execute(
        "INSERT INTO leases (session_id, owner, epoch, expires_at) VALUES ('s1', 'paused', 1, now() + interval '1 hour')"
    )
    db.execute("UPDATE hosts SET renewed_at = now() - interval '1 hour' WHERE id = 'paused'")
    assert me.reclaim_orphans() == []  # before: reclaimed, and other hosts fought over the running child
    db.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE session_id = 's1'")
    assert me.reclaim_orphans() == ["s1"]  # its lease expired too: the child is up for failover
    assert other.claim(1) == [Claim("s1", 2)]
    # The child settled on "paused" after all (its lease was still its own): its finish ends the
    # placement though "other" claimed it meanwhile — before, the row stayed and was settled again.
    paused.finish("s1")
    assert db.execute("SELECT count(*) FROM placements").fetchone() == (0,)
    me.enqueue("s2")
    assert other.claim(1) == [Claim("s2", 1)]
    db.execute(
        "INSERT INTO leases (session_id, owner, epoch, expires_at) VALUES ('s2', 'other', 1, now() + interval '1 hour')"
    )
    paused.finish("s2")  # neither its claim nor its lease: nothing happens
    assert db.execute("SELECT session_id FROM placements").fetchall() == [("s2",)]


def test_a_placement_is_taken_back_unless_a_live_host_claimed_it(host: Factory) -> None:
    parent, server = host("parent"), host("server")
    mine, theirs = parent.placements(), server.placements()
    theirs.serve(1)
    for sid in ("s1", "s2", "s3"):
        mine.enqueue(sid)
    assert theirs.claim(1) == [Claim("s1", 1)]
    assert mine.take_back("s1") is None  # a live host runs it
    assert mine.take_back("s2") == 0 and mine.take_back("s2") is None  # unclaimed: taken back, once
    assert mine.take_back("nothing") is None
    server.close_store()  # the server goes: its claim is taken back too
    assert mine.take_back("s1") == 1
    assert mine.claim(5) == [Claim("s3", 1)]


def test_only_live_hosts_with_capacity_serve_and_hosts_lists_them(host: Factory, db: psycopg.Connection[Any]) -> None:
    a_store, b_store = host("host-a"), host("host-b")
    a, b = a_store.placements(), b_store.placements()
    assert a.serving_hosts() == 0
    a.serve(3)
    b_store.register_host(None)  # a host that runs sessions but serves no placements
    assert a.serving_hosts() == b.serving_hosts() == 1
    rows = {row.host_id: row for row in b.hosts()}
    assert set(rows) == {"host-a", "host-b"}
    assert rows["host-a"].capacity == 3 and rows["host-a"].alive and rows["host-a"].renewed_at is not None
    assert rows["host-b"].capacity == 0 and rows["host-a"].sessions_held == 0
    db.execute("UPDATE hosts SET renewed_at = now() - interval '1 hour' WHERE id = 'host-a'")
    assert b.serving_hosts() == 0
    assert not {row.host_id: row for row in b.hosts()}["host-a"].alive
    a.close()  # withdraws: capacity 0
    a_store.renew_leases()
    assert b.serving_hosts() == 0


def test_a_watch_wakes_on_an_enqueue_from_another_host(host: Factory) -> None:
    a, b = host("host-a").placements(), host("host-b").placements()
    with a.watch() as watch:
        assert not watch.clear()
        b.enqueue("s1")
        readable, _, _ = select.select([watch.fileno()], [], [], 30)  # the notification, not a timer
        assert readable and watch.clear()


def test_sessions_dropped_with_work_are_found_and_released_ones_are_not(
    host: Factory, db: psycopg.Connection[Any]
) -> None:
    crashed, paused, clean, me, cut = host("crashed"), host("paused"), host("clean"), host("me"), host("cut")
    child = {"parent_session": "p", "origin": "subagent", "delegation_depth": 1}
    stores = ((crashed, "s-crashed"), (paused, "s-paused"), (clean, "s-clean"), (me, "s-mine"), (cut, "s-cut"))
    for store, sid in (*stores, (crashed, "s-root")):
        handle = store.create(header(sid, **({} if sid == "s-root" else child)))
        store.append(handle, [Batch(Offset(0), [turn_start_event(0, T)])])
        if store is clean:
            store.close(handle)  # let go cleanly: no work left behind
    for sid in ("s-nobody", "s-queued"):
        handle = me.create(header(sid, **child))
        me.append(handle, [Batch(Offset(0), [turn_start_event(0, T)])])
        me.close(handle)
    sweeper = me.placements()
    assert sweeper.dropped(10) == []  # every holder is alive and within its lease
    # A cut owner connection is not a dead host (issue 27): its sessions are not dropped while
    # their leases are in force — before, "s-cut" was resumed elsewhere while its host ran it.
    for store in (crashed, cut):
        assert db.execute("SELECT pg_terminate_backend(%s, 10000)", (store.owner_backend_pid,)).fetchone() == (True,)
    assert sweeper.dropped(10) == []
    cut.renew_leases()  # its next renewal reconnects and takes its liveness lock again
    assert cut.owner_backend_pid is not None
    # "crashed" was killed (it renews no more): its leases expire; a root is never dropped work.
    db.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE owner = 'crashed'")
    db.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE session_id = 's-paused'")
    assert sweeper.dropped(10) == ["s-crashed", "s-paused"]
    assert sweeper.dropped(1) == ["s-crashed"]
    # mail from a session waiting for one nobody holds is work too; for a held one it is its
    # owner's; an operator's (sender null: `send --queue`) runs nothing, and a root's waits for a person
    for sid, envelope in (
        ("s-clean", b"{}"),
        ("s-mine", b"{}"),
        ("s-nobody", b'{"kind":"message","sender":"p","body":{}}'),
        ("s-queued", b'{"kind":"message","sender":null,"body":{"text":"later"}}'),
        ("s-root", b"{}"),
        ("s-cut", b"{}"),
    ):
        db.execute(
            "INSERT INTO mailbox (session_id, delivery_id, envelope, created_at) VALUES (%s, %s, %s, 0)",
            (sid, "01J00000000000000000000000", envelope),
        )
    assert sweeper.dropped(10) == ["s-clean", "s-crashed", "s-nobody", "s-paused"]
    sweeper.enqueue("s-crashed")  # a placement covers it: the claims serve it, not the sweep
    assert sweeper.dropped(10) == ["s-clean", "s-nobody", "s-paused"]


def test_hosts_gone_past_an_age_are_forgotten_unless_a_lease_of_theirs_is_in_force(
    host: Factory, db: psycopg.Connection[Any]
) -> None:
    old, holding, recent, me = host("old"), host("holding"), host("recent"), host("me")
    for store in (old, holding, recent, me):
        store.register_host(None)
    holding.create(header("s1"))
    db.execute("UPDATE hosts SET renewed_at = now() - interval '2 days' WHERE id IN ('old', 'holding', 'me')")
    db.execute("UPDATE hosts SET renewed_at = now() - interval '1 hour' WHERE id = 'recent'")
    sweeper = me.placements()
    # "holding" still has a lease in force (a ttl longer than its silence); "me" never forgets itself
    assert sweeper.forget_hosts(86400) == ["old"]
    assert sorted(row.host_id for row in sweeper.hosts()) == ["holding", "me", "recent"]
    assert sweeper.forget_hosts(60) == ["recent"]
    old.renew_leases()  # a forgotten host that comes back writes its row again
    assert "old" in {row.host_id for row in sweeper.hosts()}
