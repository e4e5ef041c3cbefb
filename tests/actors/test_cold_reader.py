"""The cold reader (SPEC 4): bounded, aligned, failures as values, aborts and cancels cleanly.

Real threads (the reads run in worker threads), so the real clock; waits are on events."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from subagents.actors import Abort, ColdRead, ColdReader, ReadAborted
from subagents.storage import (
    Batch,
    CorruptLog,
    FileLogStore,
    SessionHeader,
    SessionNotFound,
    make_event,
)
from subagents.storage.testing import FaultyLogStore


def publish(store: FileLogStore, sid: str, *, open_turn: bool = False) -> None:
    handle = store.create(SessionHeader(id=sid, created_at=1))
    events = [make_event(0, "turn/start", 5, {"turn": 1}), make_event(1, "step/start", 6, {"turn": 1, "step": 1})]
    if not open_turn:
        events += [
            make_event(2, "step/end", 7, {"turn": 1, "step": 1}),
            make_event(3, "turn/end", 8, {"turn": 1, "reason": {"kind": "completed"}}),
        ]
    store.append(handle, [Batch(0, events)])
    store.close(handle)


@pytest.fixture
def faulty(tmp_path: Path) -> FaultyLogStore:
    base = FileLogStore(str(tmp_path))
    for i in range(8):
        publish(base, f"s{i}", open_turn=(i == 2))
    return FaultyLogStore(base)


async def test_results_follow_the_ids_and_failures_are_values(faulty: FaultyLogStore, tmp_path: Path) -> None:
    log = tmp_path / "sessions" / "s3" / "session.jsonl.zst"
    log.write_bytes(log.read_bytes()[:-30] + b"junk-junk-junk-junk-junk-junk!")
    before = (tmp_path / "sessions" / "s2" / "session.jsonl.zst").read_bytes()
    results = await ColdReader(faulty).read_many(["s2", "missing", "s3", "s0"])
    assert [type(r) for r in results] == [ColdRead, SessionNotFound, CorruptLog, ColdRead]
    interrupted = results[0]
    assert isinstance(interrupted, ColdRead)
    assert interrupted.closers == 2  # step/end + turn/end, in memory only
    assert [e.type for e in interrupted.events][-2:] == ["step/end", "turn/end"]
    assert (tmp_path / "sessions" / "s2" / "session.jsonl.zst").read_bytes() == before  # never written
    assert results[3].closers == 0  # type: ignore[union-attr]  # entry 3 is a ColdRead (asserted above)


async def test_a_bug_fails_the_call_bare(faulty: FaultyLogStore) -> None:
    class Bug(Exception):
        pass

    faulty.fail("read", Bug("not a storage error"), session_id="s1")
    with pytest.raises(Bug):
        await ColdReader(faulty).read_many(["s0", "s1", "s4"])


async def test_at_most_four_reads_are_in_flight(faulty: FaultyLogStore) -> None:
    faulty.hang("read", times=None)
    reader = ColdReader(faulty)
    async with trio.open_nursery() as nursery:
        done = trio.Event()

        async def read_all() -> None:
            await reader.read_many([f"s{i}" for i in range(8)])
            done.set()

        nursery.start_soon(read_all)
        await trio.testing.wait_all_tasks_blocked()
        # Four reads hold a slot (their threads are in storage or about to be); four wait.
        assert reader.limiter.borrowed_tokens == 4
        assert reader.limiter.statistics().tasks_waiting == 4
        assert faulty.calls["read"] <= 4
        faulty.release()
        await done.wait()
    assert faulty.calls["read"] == 8


async def test_an_abort_set_before_reads_nothing(faulty: FaultyLogStore) -> None:
    abort = Abort()
    abort.set()
    with pytest.raises(ReadAborted) as info:
        await ColdReader(faulty).read_many(["s0"], abort)
    assert info.value.code == "ACTOR_READ_ABORTED"
    assert faulty.calls["open_read"] == 0


async def test_an_abort_during_hung_reads_ends_them(faulty: FaultyLogStore) -> None:
    faulty.hang("read", times=None)
    abort = Abort()
    reader = ColdReader(faulty)
    with trio.fail_after(30):  # a safety net only: the abort is what ends the reads
        async with trio.open_nursery() as nursery:

            async def abort_when_blocked() -> None:
                await trio.testing.wait_all_tasks_blocked()
                abort.set()

            nursery.start_soon(abort_when_blocked)
            with pytest.raises(ReadAborted):
                await reader.read_many([f"s{i}" for i in range(8)], abort)
    assert reader.limiter.borrowed_tokens == 0  # every slot released
    faulty.release()


async def test_an_enclosing_cancel_passes_through_bare(faulty: FaultyLogStore) -> None:
    faulty.hang("read", times=None)
    reader = ColdReader(faulty)
    seen: list[BaseException] = []
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def cancel_when_blocked() -> None:
                await trio.testing.wait_all_tasks_blocked()
                scope.cancel()

            nursery.start_soon(cancel_when_blocked)
            try:
                await reader.read_many(["s0", "s1", "s2"])
            except BaseException as exc:
                seen.append(exc)
                raise
    assert scope.cancelled_caught
    assert len(seen) == 1 and type(seen[0]) is trio.Cancelled  # not an ExceptionGroup
    assert reader.limiter.borrowed_tokens == 0
    faulty.release()
