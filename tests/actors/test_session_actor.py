"""The session actor (SPEC 4, 3.5): group commit, expected seqs, live projections, stopping.

Every test runs on the in-memory file store and on PostgreSQL (the `backend` fixture,
tests/helpers/backends.py). A failed fsync is, on PostgreSQL, an append whose connection the
server cut twice in a row (its outcome unknown: the handle is dead); a partial write the store
cuts back is an append statement that failed whole (tests/helpers/pg_faults.py).

Theory of operation. The actor calls storage through `trio.to_thread`, so even over the
in-memory `MemoryLogStore` these tests involve threads: they run on the real clock and never
sleep. They wait on results, on `wait_all_tasks_blocked` (a requester parked on its reply, a
sender parked on a full mailbox, the actor parked on its storage thread all count as blocked)
and on `FaultyLogStore.hang("append")`, which holds the actor inside one storage append until
`release()`. That hang is what makes groups deterministic: while the actor is held, requests
sent one after another (each parked before the next is sent) queue in the mailbox in that
order, and once released the actor drains all of them into one group.

`trio.fail_after(BOUND)` wraps every test body only as a safety net, and `_released` ends every
hang on the way out, so a failing test fails instead of hanging on a storage thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
import trio
from backends import Backend
from clocks import T, fixed_ms
from drafts import descriptor_draft, note, turn_start
from log_lines import header, wire
from registries import HostileView
from registries import subagent_registry as registry
from subagents.actors import (
    ActorStopped,
    AppendResult,
    EventDraft,
    SessionActor,
    SessionRef,
    open_session_store,
)
from subagents.runtime import SUBAGENT_UNITS
from subagents.storage import (
    Event,
    InvalidEvent,
    LogStore,
    NonLosslessData,
    Offset,
    PersistenceFailed,
    ProjectionBroken,
    ProjectionRegistry,
    SequenceConflict,
    SessionHeader,
)
from subagents.storage.testing import FaultyLogStore
from trio.testing import wait_all_tasks_blocked

BOUND = 10  # seconds; a safety net only, never the mechanism of a test
now_ms = fixed_ms()


@contextmanager
def _released(faulty: FaultyLogStore) -> Iterator[None]:
    """End every storage hang on the way out, so a failing test cannot strand a thread."""
    try:
        yield
    finally:
        faulty.release()


class Calls:
    """Requests started as tasks, each in its own cancel scope, with their outcomes recorded."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self.results: dict[str, Any] = {}
        self.errors: dict[str, BaseException] = {}
        self.finished: list[str] = []
        self._scopes: dict[str, trio.CancelScope] = {}

    def start(self, name: str, fn: Callable[[], Awaitable[Any]]) -> None:
        scope = self._scopes[name] = trio.CancelScope()

        async def run() -> None:
            with scope:
                try:
                    self.results[name] = await fn()
                except Exception as exc:
                    self.errors[name] = exc
                self.finished.append(name)

        self._nursery.start_soon(run)

    async def start_parked(self, name: str, fn: Callable[[], Awaitable[Any]]) -> None:
        """Start a request and wait until it is parked (sent and waiting, or blocked sending)."""
        self.start(name, fn)
        await wait_all_tasks_blocked()

    def cancel(self, name: str) -> None:
        self._scopes[name].cancel()

    def cancelled(self, name: str) -> bool:
        return self._scopes[name].cancelled_caught


@asynccontextmanager
async def running_actor(
    log_store: LogStore, sid: str, *, capacity: int = 16, units: Sequence[Any] = SUBAGENT_UNITS
) -> AsyncIterator[tuple[SessionActor, SessionRef]]:
    """A bare actor over a new session, as the session store would start it."""
    handle = log_store.create(header(sid))
    cells = ProjectionRegistry(units).cells(handle.header, handle.inherited_event_count)
    actor = SessionActor(log_store, handle, cells, now_ms=now_ms, capacity=capacity)
    async with trio.open_nursery() as nursery:
        ref: SessionRef = await nursery.start(actor.run)
        try:
            yield actor, ref
        finally:
            actor.stop()


# --- group commit -------------------------------------------------------------------------------


async def test_group_commit_gives_contiguous_seqs_with_few_fsyncs_and_acks_only_durable_events(
    backend: Backend,
) -> None:
    tasks = 100
    drafts = {i: [note(task=i, k=k) for k in range(i % 3 + 1)] for i in range(tasks)}
    results: dict[int, AppendResult] = {}
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        ref = await store.create(header("s"))
        fsyncs_before = backend.durable_writes()
        with trio.fail_after(BOUND):

            async def append(i: int) -> None:
                results[i] = await ref.append(drafts[i])

            async with trio.open_nursery() as nursery:
                for i in range(tasks):
                    nursery.start_soon(append, i)
        fsyncs = backend.durable_writes() - fsyncs_before
        # A power cut (a dead process) right after the last acknowledgement.
        backend.crash()

        # Contiguous and non-overlapping: the ranges tile [0, total) exactly.
        total = sum(len(d) for d in drafts.values())
        assert sorted(s for r in results.values() for s in range(r.first_seq, r.next_seq)) == list(range(total))
        for i, result in results.items():
            assert result.next_seq == result.first_seq + len(drafts[i])
            assert [e.seq for e in result.events] == list(range(result.first_seq, result.next_seq))
            assert [(e.type, bytes(e.data)) for e in result.events] == [
                ("test/note", b'{"task":%d,"k":%d}' % (i, k)) for k in range(len(drafts[i]))
            ]

        # One storage append (one fsync, one transaction) per drained group: far fewer than the appends.
        assert 1 <= fsyncs <= tasks // 10, fsyncs

        # Every acknowledged event survived the power cut.
        survived = backend.reopen("s")
        acked = sorted((e for r in results.values() for e in r.events), key=lambda e: e.seq)
        assert wire(survived) == wire(acked)


async def test_failed_fsync_fails_its_whole_group_and_stops_the_actor(backend: Backend) -> None:
    faulty = FaultyLogStore(backend.store)
    async with open_session_store(faulty, registry(), now_ms=now_ms) as store:
        ref = await store.create(header("s"))
        with _released(faulty), trio.fail_after(BOUND):
            first = await ref.append([turn_start(1)])  # published and durable
            await ref.flush()  # served after the publication checkpoint: the actor is idle now
            await wait_all_tasks_blocked()  # parked on its mailbox
            faulty.hang("append")
            fsyncs_before = backend.durable_writes()
            async with trio.open_nursery() as nursery:
                calls = Calls(nursery)
                # Started together, they run in one scheduler batch: the first send wakes the
                # actor, the others are queued before it runs, so it drains all three at once.
                for name in ("a", "b", "c"):
                    calls.start(name, lambda name=name: ref.append([note(by=name), note(by=name)]))
                await wait_all_tasks_blocked()  # the group's append is held in storage
                # Queued behind the group while it is being written.
                await calls.start_parked("d", lambda: ref.append([note(by="d")]))
                await calls.start_parked("e", lambda: ref.snapshot(["subagent"]))
                backend.fail_durability()
                faulty.release()

            assert calls.results == {}
            for name in ("a", "b", "c"):
                assert isinstance(calls.errors[name], PersistenceFailed), calls.errors[name]
            for name in ("d", "e"):
                assert isinstance(calls.errors[name], ActorStopped), calls.errors[name]
            # The three requests were one group: one storage append, one (failed) fsync.
            assert backend.durable_writes() - fsyncs_before == 1
            assert faulty.calls["append"] == 2

            # The handle is dead, the actor stopped: every later ask fails at once.
            await ref.wait_finished()
            assert ref.stopped
            assert store.get("s") is None
            with pytest.raises(ActorStopped):
                await ref.append([note(by="late")])
            with pytest.raises(ActorStopped):
                await ref.snapshot(["subagent"])
            with pytest.raises(ActorStopped):
                await ref.flush()

        # Its lock is free: a new writer validates the log; the acknowledged prefix is intact.
        backend.crash()
        assert wire(backend.reopen("s")) == wire(first.events)


async def test_appends_pending_behind_a_dead_handle_fail_with_actor_stopped(backend: Backend) -> None:
    """An append drained in the same batch as a failed group, but behind a snapshot (so in a
    later group), is pending when the handle dies: it must fail with `ActorStopped`, and the
    dead handle must not be written to again."""
    inner = FaultyLogStore(backend.store)
    outer = FaultyLogStore(inner)  # outer holds an append, inner then refuses it unwritten
    async with open_session_store(outer, registry(), now_ms=now_ms) as store:
        ref = await store.create(header("s"))
        with _released(outer), trio.fail_after(BOUND):
            await ref.append([turn_start(1)])
            await ref.flush()  # after the publication checkpoint: the actor is idle
            outer.hang("append")
            inner.fail("append")
            async with trio.open_nursery() as nursery:
                calls = Calls(nursery)
                await calls.start_parked("held", lambda: ref.append([note(by="held")]))
                # Queued in this order while the actor is held: drained as one batch.
                await calls.start_parked("x", lambda: ref.append([note(by="x")]))
                await calls.start_parked("snap", lambda: ref.snapshot(["subagent"]))
                await calls.start_parked("y", lambda: ref.append([note(by="y")]))
                backend.fail_durability()
                outer.release()
            await ref.wait_finished()
            assert isinstance(calls.errors["held"], PersistenceFailed)  # refused, handle alive
            assert isinstance(calls.errors["x"], PersistenceFailed)  # its fsync failed: dead
            assert isinstance(calls.errors["y"], ActorStopped), repr(calls.errors["y"])
            assert inner.calls["append"] == 3  # publication, held, x; nothing on the dead handle


async def test_failed_write_fails_its_group_and_the_actor_carries_on(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        ref = await store.create(header("s"))
        with trio.fail_after(BOUND):
            first = await ref.append([turn_start(1)])
            backend.fail_write()
            with pytest.raises(PersistenceFailed):
                await ref.append([note(i=1)])
            assert not ref.stopped
            second = await ref.append([note(i=2)])
            assert second.first_seq == 1  # the failed write was cut back; no seq was used
        backend.crash()
        assert wire(backend.reopen("s")) == wire([*first.events, *second.events])


# --- per-request failures inside a group --------------------------------------------------------


async def _one_group(
    faulty: FaultyLogStore, ref: SessionRef, requests: Sequence[tuple[str, Callable[[], Awaitable[Any]]]]
) -> Calls:
    """Serve `requests` as one drained group, in this order, behind a held append."""
    # Served after anything the actor still does in a worker thread (a checkpoint write after
    # publication): from here on the actor is idle, parked on its mailbox.
    await ref.flush()
    faulty.hang("append")
    async with trio.open_nursery() as nursery:
        calls = Calls(nursery)
        await calls.start_parked("held", lambda: ref.append([note(held=True)]))
        for name, fn in requests:
            await calls.start_parked(name, fn)
        assert calls.finished == []
        faulty.release()
    assert "held" in calls.results
    return calls


async def test_stale_expected_seq_fails_only_its_own_request(backend: Backend) -> None:
    faulty = FaultyLogStore(backend.store)
    async with open_session_store(faulty, registry(), now_ms=now_ms) as store:
        ref = await store.create(header("s"))
        with _released(faulty), trio.fail_after(BOUND):
            await ref.append([turn_start(1)], expected_seq=0)
            appends_before = faulty.calls["append"]
            # After the held append (seq 1) the log is at 2.
            calls = await _one_group(
                faulty,
                ref,
                [
                    ("right", lambda: ref.append([note(i=1), note(i=2)], expected_seq=2)),
                    ("stale", lambda: ref.append([note(i=3)], expected_seq=2)),
                    ("older", lambda: ref.append([note(i=4)], expected_seq=0)),
                    ("free", lambda: ref.append([note(i=5)])),
                    ("next", lambda: ref.append([note(i=6)], expected_seq=5)),
                ],
            )
            assert calls.results["right"].first_seq == 2
            assert calls.results["free"].first_seq == 4
            assert calls.results["next"].first_seq == 5
            for name, expected in (("stale", 2), ("older", 0)):
                error = calls.errors[name]
                assert isinstance(error, SequenceConflict), error
                assert (error.expected, error.actual) == (expected, 4)
            # The held append, then the rest as one group.
            assert faulty.calls["append"] - appends_before == 2
            assert await ref.flush() == 6

        backend.crash()
        assert [bytes(e.data) for e in backend.reopen("s")[2:]] == [
            b'{"i":1}',
            b'{"i":2}',
            b'{"i":5}',
            b'{"i":6}',
        ]


def _draft(type: str, data: Any, **kw: Any) -> EventDraft:
    return EventDraft(type=type, data=data, **kw)


INVALID_DRAFTS: list[tuple[str, list[EventDraft], type[Exception]]] = [
    ("unknown type", [_draft("test/unknown", {"x": 1})], InvalidEvent),
    ("bad payload", [_draft("turn/start", {"turn": "one"})], InvalidEvent),
    ("missing payload key", [_draft("turn/start", {})], InvalidEvent),
    ("data not an object", [_draft("test/note", [1], ignorable=True)], InvalidEvent),
    ("negative time", [_draft("turn/start", {"turn": 1}, time=-1)], InvalidEvent),
    ("lone surrogate", [note(text="\ud800")], NonLosslessData),
    ("surface op on a non-surface type", [_draft("turn/start", {"turn": 1}, surface_op="append")], InvalidEvent),
    ("valid then invalid", [note(i=0), _draft("test/unknown", {})], InvalidEvent),
]


@pytest.mark.parametrize(
    ("drafts", "error"), [(d, e) for _, d, e in INVALID_DRAFTS], ids=[n for n, _, _ in INVALID_DRAFTS]
)
async def test_invalid_draft_fails_only_its_own_request(
    backend: Backend, drafts: list[EventDraft], error: type[Exception]
) -> None:
    faulty = FaultyLogStore(backend.store)
    async with open_session_store(faulty, registry(), now_ms=now_ms) as store:
        ref = await store.create(header("s"))
        with _released(faulty), trio.fail_after(BOUND):
            await ref.append([turn_start(1)])
            calls = await _one_group(
                faulty,
                ref,
                [
                    ("before", lambda: ref.append([note(i=1)])),
                    ("invalid", lambda: ref.append(drafts)),
                    ("after", lambda: ref.append([note(i=2), note(i=3)])),
                ],
            )
            assert type(calls.errors["invalid"]) is error, calls.errors["invalid"]
            assert set(calls.errors) == {"invalid"}
            assert calls.results["before"].first_seq == 2
            assert calls.results["after"].first_seq == 3
            assert await ref.flush() == 5
            assert not ref.stopped
        backend.crash()
        survived = backend.reopen("s")
        assert [e.seq for e in survived] == list(range(5))
        assert [bytes(e.data) for e in survived[2:]] == [b'{"i":1}', b'{"i":2}', b'{"i":3}']


async def test_empty_append_writes_nothing_and_reports_the_next_seq(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        ref = await store.create(header("s"))
        with trio.fail_after(BOUND):
            await ref.append([turn_start(1)])
            fsyncs = backend.durable_writes()
            result = await ref.append([])
            assert (result.first_seq, result.next_seq, result.events) == (1, 1, ())
            assert backend.durable_writes() == fsyncs


# --- live projections ---------------------------------------------------------------------------


class ApplyRaises:
    """A buggy unit: its apply raises on the first turn/start (units must not, but may)."""

    key = "buggy_apply"
    state_version = 1

    def initial(self, header: SessionHeader, inherited_event_count: Offset) -> Any:
        return 0

    def apply(self, state: Any, event: Event) -> Any:
        if event.type == "turn/start":
            raise ZeroDivisionError("buggy apply")
        return state + 1

    def view(self, state: Any) -> Any:
        return state


class InitialRaises:
    key = "buggy_initial"
    state_version = 1

    def initial(self, header: SessionHeader, inherited_event_count: Offset) -> Any:
        raise LookupError("buggy initial")

    def apply(self, state: Any, event: Event) -> Any:
        return state

    def view(self, state: Any) -> Any:
        return state


async def test_live_snapshot_reads_no_log_and_shows_the_identity(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(HostileView()), now_ms=now_ms) as store:
        ref = await store.create(header("s", origin="subagent"))
        with trio.fail_after(BOUND):
            assert await ref.snapshot(["subagent"]) == {"subagent": None}
            await ref.append([turn_start(1)])
            appended = await ref.append([descriptor_draft("worker"), note(i=1)])
            assert appended.first_seq == 1

            before = backend.io()
            snap = await ref.snapshot(["subagent"])
            assert backend.io()["read"] == before["read"]
            assert backend.io() == before  # no IO at all, not just no reads
            assert snap == {"subagent": {"mode": "continuable", "label": "worker", "seq": 1}}

            # The hostile view breaks only a read that names it.
            assert await ref.snapshot(["subagent", "subagent_timing"]) == {
                "subagent": {"mode": "continuable", "label": "worker", "seq": 1},
                "subagent_timing": {"settled_ms": 0, "active": {"since": T, "through": T}},
            }
            with pytest.raises(ProjectionBroken) as broken:
                await ref.snapshot(["hostile_view"])
            assert broken.value.key == "hostile_view"
            with pytest.raises(KeyError):
                await ref.snapshot(["no_such_unit"])
            # A snapshot failure is the asker's: the actor serves on.
            assert not ref.stopped
            assert (await ref.append([note(i=2)])).first_seq == 3

            # Last descriptor wins; a snapshot shows every event acknowledged before it.
            await ref.append([descriptor_draft("renamed")])
            assert await ref.snapshot(["subagent"]) == {
                "subagent": {"mode": "continuable", "label": "renamed", "seq": 4}
            }


async def test_a_unit_whose_apply_raises_breaks_only_its_own_key(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(ApplyRaises(), InitialRaises()), now_ms=now_ms) as store:
        ref = await store.create(header("s"))
        with trio.fail_after(BOUND):
            await ref.append([note(i=0)])
            assert await ref.snapshot(["buggy_apply"]) == {"buggy_apply": 1}
            await ref.append([turn_start(1), descriptor_draft("w")])  # breaks buggy_apply
            assert not ref.stopped

            with pytest.raises(ProjectionBroken) as broken:
                await ref.snapshot(["buggy_apply"])
            assert broken.value.key == "buggy_apply"
            assert isinstance(broken.value.cause, ZeroDivisionError)
            # Other keys are still folded and served; appends still work.
            assert await ref.snapshot(["subagent"]) == {"subagent": {"mode": "continuable", "label": "w", "seq": 2}}
            result = await ref.append([note(i=1), descriptor_draft("w2")])
            assert result.first_seq == 3
            assert await ref.snapshot(["subagent"]) == {"subagent": {"mode": "continuable", "label": "w2", "seq": 4}}
            with pytest.raises(ProjectionBroken):
                await ref.snapshot(["buggy_apply"])
            # A unit whose `initial` raised is broken from the start, and only it.
            with pytest.raises(ProjectionBroken) as broken:
                await ref.snapshot(["buggy_initial"])
            assert isinstance(broken.value.cause, LookupError)
            assert (await ref.flush()) == 5


async def test_snapshot_waits_for_appends_queued_before_it(backend: Backend) -> None:
    faulty = FaultyLogStore(backend.store)
    async with open_session_store(faulty, registry(), now_ms=now_ms) as store:
        ref = await store.create(header("s"))
        with _released(faulty), trio.fail_after(BOUND):
            await ref.append([turn_start(1)])
            calls = await _one_group(
                faulty,
                ref,
                [
                    ("describe", lambda: ref.append([descriptor_draft("late")])),
                    ("snap", lambda: ref.snapshot(["subagent"])),
                    ("flush", ref.flush),
                ],
            )
            assert calls.results["snap"] == {"subagent": {"mode": "continuable", "label": "late", "seq": 2}}
            assert calls.results["flush"] == 3


# --- backpressure, stopping, cancelled requesters -----------------------------------------------


async def test_a_full_mailbox_blocks_senders_until_storage_moves(backend: Backend) -> None:
    faulty = FaultyLogStore(backend.store)
    async with running_actor(faulty, "s", capacity=1) as (actor, ref):
        with _released(faulty), trio.fail_after(BOUND):
            await ref.append([turn_start(1)])
            await ref.flush()  # after the publication checkpoint: the actor is idle
            faulty.hang("append")
            async with trio.open_nursery() as nursery:
                calls = Calls(nursery)
                names = ["p", "q", "r", "s"]
                for name in names:
                    await calls.start_parked(name, lambda name=name: ref.append([note(by=name)]))
                # p is held in storage, q fills the one-slot mailbox, r and s wait to send.
                stats = actor.mailbox.receive.statistics()
                assert stats.current_buffer_used == 1
                assert stats.tasks_waiting_send == 2
                assert calls.finished == []
                faulty.release()
            assert calls.errors == {}
            assert [calls.results[n].first_seq for n in names] == [1, 2, 3, 4]
            assert calls.finished[0] == "p"
            assert actor.mailbox.receive.statistics().tasks_waiting_send == 0
    assert [bytes(e.data) for e in backend.reopen("s")[1:]] == [b'{"by":"%s"}' % n.encode() for n in names]


async def test_stopping_fails_queued_requests_after_the_inflight_append_finishes(backend: Backend) -> None:
    faulty = FaultyLogStore(backend.store)
    async with running_actor(faulty, "s", capacity=2) as (actor, ref):
        with _released(faulty), trio.fail_after(BOUND):
            await ref.append([turn_start(1)])
            await ref.flush()  # after the publication checkpoint: the actor is idle
            faulty.hang("append")
            async with trio.open_nursery() as nursery:
                calls = Calls(nursery)
                await calls.start_parked("inflight", lambda: ref.append([note(i=1)]))
                await calls.start_parked("queued", lambda: ref.append([note(i=2)]))
                await calls.start_parked("snap", lambda: ref.snapshot(["subagent"]))
                await calls.start_parked("blocked", lambda: ref.append([note(i=3)]))  # mailbox full

                actor.stop()
                await wait_all_tasks_blocked()
                # Queued and blocked requests fail at once, while the append is still held.
                assert sorted(calls.finished) == ["blocked", "queued", "snap"]
                for name in ("queued", "snap", "blocked"):
                    assert isinstance(calls.errors[name], ActorStopped), calls.errors[name]
                with pytest.raises(ActorStopped):
                    await ref.append([note(i=4)])
                # The actor does not finish while its storage call is running.
                assert not actor.finished.is_set()
                assert "inflight" not in calls.finished

                faulty.release()
                await ref.wait_finished()
            assert calls.results["inflight"].first_seq == 1
            assert ref.stopped
    # The lock is free and the log holds exactly what was acknowledged.
    backend.crash()
    assert [bytes(e.data) for e in backend.reopen("s")] == [b'{"turn":1}', b'{"i":1}']


async def test_stopping_while_the_inflight_append_fails(backend: Backend) -> None:
    faulty = FaultyLogStore(backend.store)
    async with running_actor(faulty, "s") as (actor, ref):
        with _released(faulty), trio.fail_after(BOUND):
            await ref.append([turn_start(1)])
            await ref.flush()  # after the publication checkpoint: the actor is idle
            faulty.hang("append")
            async with trio.open_nursery() as nursery:
                calls = Calls(nursery)
                await calls.start_parked("inflight", lambda: ref.append([note(i=1)]))
                await calls.start_parked("queued", lambda: ref.append([note(i=2)]))
                actor.stop()
                backend.fail_durability()
                faulty.release()
                await ref.wait_finished()
            assert isinstance(calls.errors["inflight"], PersistenceFailed)
            assert isinstance(calls.errors["queued"], ActorStopped)
    backend.crash()
    assert [bytes(e.data) for e in backend.reopen("s")] == [b'{"turn":1}']


async def test_cancelled_requesters_leave_the_actor_working_and_the_log_consistent(backend: Backend) -> None:
    faulty = FaultyLogStore(backend.store)
    async with open_session_store(faulty, registry(), now_ms=now_ms, mailbox_capacity=1) as store:
        ref = await store.create(header("s"))
        with _released(faulty), trio.fail_after(BOUND):
            await ref.append([turn_start(1)])
            await ref.flush()  # after the publication checkpoint: the actor is idle
            faulty.hang("append")
            async with trio.open_nursery() as nursery:
                calls = Calls(nursery)
                await calls.start_parked("inflight", lambda: ref.append([note(by="inflight")]))
                await calls.start_parked("queued", lambda: ref.append([note(by="queued")]))
                await calls.start_parked("sending", lambda: ref.append([note(by="sending")]))
                await calls.start_parked("kept", lambda: ref.append([note(by="kept")]))
                for name in ("inflight", "queued", "sending"):
                    calls.cancel(name)
                await wait_all_tasks_blocked()
                for name in ("inflight", "queued", "sending"):
                    assert calls.cancelled(name)
                assert "kept" not in calls.finished
                faulty.release()
            assert set(calls.results) == {"kept"}
            assert calls.errors == {}
            # The actor keeps working for everyone else.
            after = await ref.append([note(by="after")])
            assert after.next_seq == await ref.flush()
            assert not ref.stopped

        # Whatever was written, the log is contiguous and holds every acknowledged event once.
        backend.crash()
        survived = backend.reopen("s")
        assert [e.seq for e in survived] == list(range(len(survived)))
        writers = [bytes(e.data) for e in survived[1:]]
        assert writers.count(b'{"by":"kept"}') == 1
        assert writers[-1] == b'{"by":"after"}'
        assert wire(survived[after.first_seq :]) == wire(after.events)
        # A request that was never sent (blocked on the full mailbox when cancelled) is absent.
        assert b'{"by":"sending"}' not in writers


# --- one fold per group commit (issue 28 item 3) ------------------------------------------------


class RecordsRuns:
    """A unit with a batch `fold` that records the seqs of every run it is handed."""

    key = "records_runs"
    state_version = 1

    def __init__(self) -> None:
        self.runs: list[list[int]] = []

    def initial(self, header: SessionHeader, inherited_event_count: Offset) -> Any:
        return []

    def apply(self, state: Any, event: Event) -> Any:
        return [*state, event.seq]

    def fold(self, state: Any, events: Sequence[Event]) -> Any:
        self.runs.append([e.seq for e in events])
        for event in events:
            state = self.apply(state, event)
        return state

    def view(self, state: Any) -> Any:
        return state


async def test_a_group_commit_folds_its_events_once_in_seq_order_before_any_ack(backend: Backend) -> None:
    recorder = RecordsRuns()
    faulty = FaultyLogStore(backend.store)
    async with open_session_store(faulty, registry(recorder), now_ms=now_ms) as store:
        ref = await store.create(header("s"))
        with _released(faulty), trio.fail_after(BOUND):
            await ref.append([turn_start(1)])
            recorder.runs.clear()
            calls = await _one_group(
                faulty,
                ref,
                [
                    ("two", lambda: ref.append([note(i=1), note(i=2)])),
                    ("stale", lambda: ref.append([note(i=3)], expected_seq=0)),  # fails alone
                    ("empty", lambda: ref.append([])),
                    ("one", lambda: ref.append([descriptor_draft("w")])),
                    ("three", lambda: ref.append([note(i=4), note(i=5), note(i=6)])),
                ],
            )
            assert isinstance(calls.errors["stale"], SequenceConflict)
            # The held append was a group of its own (seq 1); the five requests queued behind it
            # were one group: one batch fold of its six events, in seq order.
            assert recorder.runs == [[1], [2, 3, 4, 5, 6, 7]]
            assert [calls.results[n].first_seq for n in ("two", "one", "three")] == [2, 4, 5]
            assert calls.results["empty"].events == ()
            # Every acknowledged event is in the cells, exactly as a fold one event at a time.
            reader = backend.store.open_read("s")
            try:
                every = backend.store.read(reader)
            finally:
                backend.store.close(reader)
            one_by_one = registry(RecordsRuns()).cells(header("s"), Offset(0))
            for event in every:
                one_by_one.fold([event])
            assert await ref.snapshot() == one_by_one.snapshot()
            assert (await ref.snapshot(["records_runs"]))["records_runs"] == list(range(8))


async def test_a_failed_group_commit_folds_nothing(backend: Backend) -> None:
    recorder = RecordsRuns()
    faulty = FaultyLogStore(backend.store)
    async with open_session_store(faulty, registry(recorder), now_ms=now_ms) as store:
        ref = await store.create(header("s"))
        with _released(faulty), trio.fail_after(BOUND):
            await ref.append([turn_start(1)])
            recorder.runs.clear()
            faulty.fail("append")
            with pytest.raises(PersistenceFailed):
                await ref.append([note(i=1), note(i=2)])
            assert recorder.runs == []
            assert (await ref.snapshot(["records_runs"]))["records_runs"] == [0]
            assert (await ref.append([note(i=3)])).first_seq == 1  # the actor carries on
            assert recorder.runs == [[1]]
