"""The cold reader (SPEC 4): bounded, aligned, failures as values, aborts and cancels cleanly.

Real threads (the reads run in worker threads), so the real clock; waits are on events."""

from __future__ import annotations

import random
import tracemalloc
from pathlib import Path
from typing import Any

import attrs
import msgspec
import pytest
import trio
import trio.testing
from subagents.actors import Abort, ColdRead, ColdReader, ReadAborted
from subagents.storage import (
    Batch,
    CorruptLog,
    Event,
    FileLogStore,
    Offset,
    ProjectionRegistry,
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


@attrs.define
class _Count:
    """Counts events, and turn ends apart."""

    key: str = "count"
    state_version: int = 1
    view: Any = staticmethod(lambda state: state)

    def initial(self, header: SessionHeader, inherited_event_count: int) -> list[int]:
        return [0, 0]

    def apply(self, state: list[int], event: Event) -> list[int]:
        return [state[0] + 1, state[1] + (event.type == "turn/end")]


def publish_long(store: FileLogStore, sid: str, turns: int) -> tuple[int, int]:
    """`turns` turns of 60 text events each (about 1.5 KB apiece), the last one left open in a
    step; in appends of 256 events (a frame each). Returns (events, plain bytes of their lines)."""
    rng = random.Random(5)
    drafts: list[Event] = []
    for n in range(1, turns + 1):
        seq = len(drafts)
        drafts += [
            make_event(seq, "turn/start", 5, {"turn": n}),
            make_event(seq + 1, "step/start", 6, {"turn": n, "step": 1}),
        ]
        for _ in range(60):
            text = "".join(rng.choices("abcdefghij klmnopqrstuvwxyz", k=1500))
            drafts.append(make_event(len(drafts), "compaction/summary", 7, {"text": text}))
        if n < turns:
            drafts += [
                make_event(len(drafts), "step/end", 8, {"turn": n, "step": 1}),
                make_event(len(drafts) + 1, "turn/end", 9, {"turn": n, "reason": {"kind": "completed"}}),
            ]
    handle = store.create(SessionHeader(id=sid, created_at=1))
    for i in range(0, len(drafts), 256):  # a zstd frame each
        store.append(handle, [Batch(Offset(i), drafts[i : i + 256])])
    store.close(handle)
    return len(drafts), sum(len(msgspec.json.encode(e)) + 1 for e in drafts)


async def test_a_read_that_keeps_no_events_folds_and_closes_as_a_whole_read(tmp_path: Path) -> None:
    store = FileLogStore(str(tmp_path))
    count, plain = publish_long(store, "long", 40)
    assert plain > 3_000_000  # several chunks
    registry = ProjectionRegistry([_Count()])
    reader = ColdReader(store)
    (whole,) = await reader.read_many(["long"], registry=registry)
    (folded,) = await reader.read_many(["long"], registry=registry, keep_events=False)
    assert isinstance(whole, ColdRead) and isinstance(folded, ColdRead)
    assert len(whole.events) == count + 2 and whole.logged == folded.logged == count
    assert whole.closers == folded.closers == 2  # step/end and turn/end of the open turn
    assert folded.events == whole.events[-2:]
    assert whole.cells is not None and folded.cells is not None
    assert folded.cells.snapshot() == whole.cells.snapshot() == {"count": [count + 2, 40]}


async def test_a_read_that_keeps_no_events_holds_about_one_chunk(tmp_path: Path) -> None:
    """Folding a log of several MB without keeping its events peaks at a small fraction of
    its plain size (a whole read holds every event and the plain bytes: above 1x)."""
    store = FileLogStore(str(tmp_path))
    _, plain = publish_long(store, "long", 100)
    assert plain > 9_000_000
    registry = ProjectionRegistry([_Count()])
    reader = ColdReader(store)
    tracemalloc.start()
    try:
        (folded,) = await reader.read_many(["long"], registry=registry, keep_events=False)
        retained, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(folded, ColdRead) and folded.closers == 2
    assert (peak - retained) / plain < 0.25, (peak, retained, plain)
