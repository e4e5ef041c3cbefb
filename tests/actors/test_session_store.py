"""The session store (SPEC 4): create, open, fork, get/list, release, and leaving its block.

The single-writer lock is observed from outside, as another process would: a second store over
the same data (`backend.another()`: a `MemoryLogStore` over the same `CrashFs`, or a second
PostgreSQL store on the same database) sees the locks, so its `open_write` (or its `create` of
an unpublished id) raises `AlreadyOwned` while the store holds a session and succeeds once the
session is released. Every test runs on both (tests/helpers/backends.py; a failed fsync is, on
PostgreSQL, an append whose connection the server cut twice) except the torn tail on disk, which
has no PostgreSQL form (an append is one transaction) and runs on memory only. Storage runs in worker threads, so these tests use
the real clock and wait on results and `wait_all_tasks_blocked`, never on sleeps;
`trio.fail_after(BOUND)` is only a safety net.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from backends import Backend
from clocks import T, fixed_ms
from drafts import descriptor_draft, note, turn_start
from log_lines import header, rel_log, wire
from registries import subagent_registry as registry
from subagents.actors import ActorStopped, SessionRef, open_session_store
from subagents.runtime.delegation.units import is_own_identity
from subagents.storage import (
    AlreadyOwned,
    Event,
    Offset,
    PersistenceFailed,
    SessionAlreadyExists,
    SessionHeader,
    SessionNotFound,
    make_event,
)
from subagents.storage.testing import CrashFs, FaultyLogStore, MemoryLogStore
from trio.testing import wait_all_tasks_blocked

BOUND = 10  # seconds; a safety net only
now_ms = fixed_ms()


def read_log(fs: CrashFs, sid: str) -> tuple[SessionHeader, Offset, list[Event]]:
    """Header, inherited count and events of a published log, read by another store."""
    other = MemoryLogStore(fs=fs)
    handle = other.open_read(sid)
    try:
        return handle.header, handle.inherited_event_count, other.read(handle)
    finally:
        other.close(handle)


# --- create, get, list, release -----------------------------------------------------------------


async def test_create_get_list_and_release_frees_the_lock(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        with trio.fail_after(BOUND):
            a = await store.create(header("a"))
            b = await store.create(header("b"))
            assert store.get("a") is a
            assert store.get("b") is b
            assert store.get("nobody") is None
            assert {ref.session_id for ref in store.list()} == {"a", "b"}
            assert a.header == header("a")
            assert a.inherited_event_count == 0

            await a.append([turn_start(1)])
            backend.assert_owned("a")
            with pytest.raises(AlreadyOwned):  # b is unpublished, but claimed all the same
                backend.another().create(header("b"))

            await store.release("a")
            assert a.stopped
            assert store.get("a") is None
            assert store.list() == [b]
            with pytest.raises(ActorStopped):
                await a.append([turn_start(2)])
            with backend.claimed("a") as handle:
                assert handle.next_seq == 1

            await store.release("b")
            assert store.list() == []
            other = backend.another()
            other.close(other.create(header("b")))  # an unpublished session is reusable

            await store.release("nobody")  # releasing an unknown id is a no-op


async def test_release_serves_the_appends_already_queued_then_refuses(backend: Backend) -> None:
    faulty = FaultyLogStore(backend.store)
    async with open_session_store(faulty, registry(), now_ms=now_ms) as store:
        ref = await store.create(header("s"))
        try:
            with trio.fail_after(BOUND):
                await ref.append([turn_start(1)])
                faulty.hang("append")
                results: dict[str, Any] = {}

                async def append(name: str) -> None:
                    results[name] = await ref.append([note(by=name)])

                async def release() -> None:
                    await store.release("s")
                    results["released"] = True

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(append, "inflight")
                    await wait_all_tasks_blocked()
                    nursery.start_soon(append, "queued")
                    await wait_all_tasks_blocked()
                    nursery.start_soon(release)
                    await wait_all_tasks_blocked()
                    assert results == {}  # release waits for the held append
                    backend.assert_owned("s")
                    faulty.release()
                assert results["inflight"].first_seq == 1
                assert results["queued"].first_seq == 2
                assert ref.stopped
                with pytest.raises(ActorStopped):
                    await ref.append([note(by="late")])
        finally:
            faulty.release()
    backend.crash()
    with backend.claimed("s"):
        pass
    _, _, events = backend.read_log("s")
    assert [bytes(e.data) for e in events] == [b'{"turn":1}', b'{"by":"inflight"}', b'{"by":"queued"}']


async def test_create_of_a_live_or_persisted_id_raises_session_already_exists(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        with trio.fail_after(BOUND):
            live = await store.create(header("live"))
            with pytest.raises(SessionAlreadyExists):
                await store.create(header("live"))
            assert store.get("live") is live
            assert (await live.append([turn_start(1)])).first_seq == 0  # untouched

            persisted = await store.create(header("persisted"))
            await persisted.append([turn_start(1)])
            await store.release("persisted")
            with pytest.raises(SessionAlreadyExists):
                await store.create(header("persisted"))
            assert store.get("persisted") is None

            unpublished = await store.create(header("unpublished"))
            await store.release("unpublished")
            assert unpublished.stopped
            again = await store.create(header("unpublished"))  # nothing was written: reusable
            assert (await again.append([turn_start(1)])).first_seq == 0


async def test_is_own_seq_counts_only_durable_own_events(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        ref = await store.create(header("s"))
        assert not ref.is_own_seq(0)
        await ref.append([turn_start(1), note(i=1)])
        assert [ref.is_own_seq(s) for s in (-1, 0, 1, 2)] == [False, True, True, False]


# --- open -------------------------------------------------------------------------------------


async def test_open_of_a_persisted_session_folds_its_events(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        ref = await store.create(header("child", origin="subagent"))
        await ref.append([turn_start(1, time=T), descriptor_draft("worker", time=T + 10)])
        await ref.append([note(i=1, time=T + 30)])

    # A new process: a new store over the same data.
    async with open_session_store(backend.another(), registry(), now_ms=now_ms) as store:
        with trio.fail_after(BOUND):
            ref = await store.open("child")
            assert store.get("child") is ref
            assert ref.header == header("child", origin="subagent")
            backend.assert_owned("child")

            before = backend.io()
            snap = await ref.snapshot(["subagent", "subagent_timing"])
            assert backend.io() == before  # the cells were folded at open: no log read now
            assert snap == {
                "subagent": {"mode": "continuable", "label": "worker", "seq": 1},
                "subagent_timing": {"settled_ms": 0, "active": {"since": T, "through": T + 30}},
            }
            assert ref.is_own_seq(2) and not ref.is_own_seq(3)
            assert (await ref.append([note(i=2)])).first_seq == 3

            # Already live: the live ref, not a second actor.
            assert await store.open("child") is ref
            assert store.list() == [ref]


async def test_open_cuts_a_torn_tail_before_appending() -> None:
    fs = CrashFs()
    mem = MemoryLogStore(fs=fs, compression="none")
    async with open_session_store(mem, registry(), now_ms=now_ms) as store:
        ref = await store.create(header("t"))
        await ref.append([turn_start(1), note(i=1)])
    path = rel_log("t")
    fs.write_bytes(path, fs.read_bytes(path) + b'{"seq":2,"type":"test/no')

    async with open_session_store(mem, registry(), now_ms=now_ms) as store:
        with trio.fail_after(BOUND):
            ref = await store.open("t")
            assert await ref.flush() == 2
            assert (await ref.append([note(i=2)])).first_seq == 2
    _, _, events = read_log(fs, "t")
    assert [e.seq for e in events] == [0, 1, 2]
    assert bytes(events[2].data) == b'{"i":2}'


async def test_open_refuses_unknown_and_foreign_owned_sessions(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        ref = await store.create(header("s"))
        await ref.append([turn_start(1)])
        await store.release("s")
        with trio.fail_after(BOUND):
            with pytest.raises(SessionNotFound):
                await store.open("nobody")
            with backend.claimed("s"):
                with pytest.raises(AlreadyOwned):
                    await store.open("s")
                assert store.get("s") is None
                assert store.list() == []
            reopened = await store.open("s")
            assert (await reopened.append([turn_start(2)])).first_seq == 1


async def test_open_after_a_dead_handle_revalidates_the_log(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        with trio.fail_after(BOUND):
            dead = await store.create(header("s"))
            await dead.append([turn_start(1)])
            backend.fail_durability()
            with pytest.raises(PersistenceFailed):
                await dead.append([note(i=1)])
            await dead.wait_finished()
            assert store.get("s") is None

            ref = await store.open("s")
            assert ref is not dead
            assert store.get("s") is ref
            # The failed group may or may not have reached the disk; the log stays contiguous.
            next_seq = await ref.flush()
            assert next_seq in (1, 2)
            assert (await ref.append([note(i=2)])).first_seq == next_seq
    backend.crash()
    _, _, events = backend.read_log("s")
    assert [e.seq for e in events] == list(range(next_seq + 1))
    assert bytes(events[-1].data) == b'{"i":2}'


# --- fork and seeded sessions -------------------------------------------------------------------


async def _parent(store: Any) -> tuple[SessionRef, list[Event]]:
    parent = await store.create(header("p", origin="subagent"))
    result = await parent.append(
        [
            descriptor_draft("parent", time=T + 1),
            turn_start(1, time=T + 2),
            note(i=2, time=T + 3),
            note(i=3, time=T + 4),
            note(i=4, time=T + 5),
        ]
    )
    return parent, list(result.events)


async def test_fork_copies_the_prefix_then_the_marker_then_its_own_events(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        with trio.fail_after(BOUND):
            parent, parent_events = await _parent(store)
            child_header = header("c", is_seeded=True, parent_session="p", origin="subagent")
            child = await store.fork(parent, Offset(3), child_header)
            assert store.get("c") is child
            assert child.inherited_event_count == 3
            assert child.header == child_header

            # Lazy like create: not published (nor listed) until its first append.
            assert "c" not in backend.listed()
            assert backend.store.stat("c") is None
            assert not child.is_own_seq(3)

            first = await child.append([turn_start(1, time=T + 100)])
            assert first.first_seq == 4
            # The identity is the inherited one: not the child's own.
            identity = (await child.snapshot(["subagent"]))["subagent"]
            assert identity == {"mode": "continuable", "label": "parent", "seq": 0}
            assert not is_own_identity(identity, child.inherited_event_count)

            own = await child.append([descriptor_draft("child", time=T + 101)])
            assert own.first_seq == 5
            identity = (await child.snapshot(["subagent"]))["subagent"]
            assert identity == {"mode": "continuable", "label": "child", "seq": 5}
            assert is_own_identity(identity, child.inherited_event_count)
            assert [child.is_own_seq(s) for s in (2, 3, 4, 5, 6)] == [False, True, True, True, False]

            info = backend.listed()["c"]
            assert (info.damage, info.inherited_event_count, info.event_count) == (None, 3, 6)

            # The parent is untouched and still live.
            assert (await parent.append([note(i=5)])).first_seq == 5

    backend.crash()
    log_header, k, events = backend.read_log("c")
    assert (log_header, k) == (child_header, 3)
    assert [e.seq for e in events] == list(range(6))
    assert wire(events[:3]) == wire(parent_events[:3])
    marker = events[3]
    assert (marker.type, bytes(marker.data), marker.time) == ("session/end-seed", b'{"inherited":true}', T + 3)
    assert wire(events[4:]) == wire([*first.events, *own.events])


async def test_fork_with_prefix_zero_is_an_unseeded_session(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        with trio.fail_after(BOUND):
            parent, _ = await _parent(store)
            child = await store.fork(parent, Offset(0), header("z", parent_session="p"))
            assert child.inherited_event_count == 0
            assert not child.header.is_seeded
            assert (await child.append([turn_start(1)])).first_seq == 0
            assert child.is_own_seq(0)
    log_header, k, events = backend.read_log("z")
    assert (log_header.is_seeded, k) == (False, 0)
    assert [e.type for e in events] == ["turn/start"]


async def test_fork_beyond_the_durable_events_is_refused(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        with trio.fail_after(BOUND):
            parent, _ = await _parent(store)
            with pytest.raises(ValueError):
                await store.fork(parent, Offset(6), header("c", is_seeded=True))
            assert store.get("c") is None
            child = await store.fork(parent, Offset(5), header("c", is_seeded=True))
            assert (await child.append([note(i=0)])).first_seq == 6


async def test_seeded_create_publishes_its_seed_with_the_first_append_even_after_a_failure(backend: Backend) -> None:
    faulty = FaultyLogStore(backend.store)
    inherited = [
        make_event(0, "turn/start", T + 1, {"turn": 1}),
        make_event(1, "test/note", T + 7, {"x": 1}, ignorable=True),
    ]
    async with open_session_store(faulty, registry(), now_ms=now_ms) as store:
        with trio.fail_after(BOUND):
            ref = await store.create(header("seeded", is_seeded=True), inherited=inherited)
            assert ref.inherited_event_count == 2
            assert "seeded" not in backend.listed()

            faulty.fail("append")  # refused before anything is written; the handle lives
            with pytest.raises(PersistenceFailed):
                await ref.append([note(i=0)])
            assert "seeded" not in backend.listed()
            assert not ref.stopped

            result = await ref.append([note(i=1)])
            assert result.first_seq == 3
            assert backend.listed()["seeded"].inherited_event_count == 2
    backend.crash()
    _, k, events = backend.read_log("seeded")
    assert k == 2
    assert wire(events[:2]) == wire(inherited)
    assert (events[2].type, bytes(events[2].data), events[2].time) == ("session/end-seed", b'{"inherited":true}', T + 7)
    assert [bytes(e.data) for e in events[3:]] == [b'{"i":1}']


# --- leaving the block --------------------------------------------------------------------------


async def test_leaving_the_block_releases_every_session(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        with trio.fail_after(BOUND):
            refs = [await store.create(header(sid)) for sid in ("a", "b", "unpublished")]
            for ref in refs[:2]:
                await ref.append([turn_start(1)])
            for sid in ("a", "b"):
                backend.assert_owned(sid)
    assert all(ref.stopped for ref in refs)
    with pytest.raises(ActorStopped):
        await refs[0].append([turn_start(2)])
    backend.crash()
    for sid in ("a", "b"):
        with backend.claimed(sid) as handle:
            assert handle.next_seq == 1
    other = backend.another()
    other.close(other.create(header("unpublished")))


class Boom(Exception):
    pass


async def test_an_error_in_the_block_releases_every_session_and_propagates_unchanged(backend: Backend) -> None:
    refs: list[SessionRef] = []
    caught: Exception | None = None
    try:
        async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
            for sid in ("a", "b"):
                ref = await store.create(header(sid))
                await ref.append([turn_start(1)])
                refs.append(ref)
            raise Boom("the body failed")
    except Exception as exc:
        caught = exc
    assert all(ref.stopped for ref in refs)
    for sid in ("a", "b"):
        with backend.claimed(sid):
            pass
    # SPEC 4: public APIs never leak an ExceptionGroup; the body's own error comes out as is.
    assert type(caught) is Boom, repr(caught)
