"""The listing's fast paths give exactly what the plain ones give (SPEC 3.5, 4, 5.1, 5.4).

- The subagent units' `types` and batch `fold` against the plain left fold of `apply`, from any
  reachable state (checkpoints included) and from states of another shape.
- The cold reader's shared hops: each read once, results aligned, a hung read holds up only
  itself, a hop cancelled in another call's read hands it back, an abort ends waiting reads.
- The session query: stats of concurrent observations share index hops, and the corpus reuses
  its records only while nothing they were made from changed.

Real worker threads: real clock, no sleeping. The reader and query tests run on files and on
PostgreSQL (the `place` fixture; issue 18).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import trio
import trio.testing
from clocks import T, ticking_ms
from descriptors import descriptor
from drafts import turn_start
from hypothesis import given, settings
from hypothesis import strategies as st
from log_lines import header
from places import Place
from subagents.actors import Abort, EventDraft, ReadAborted, cold_reader, open_session_store
from subagents.actors.cold_reader import ColdRead, ColdReader
from subagents.actors.store_reader import StoreReader
from subagents.runtime.delegation.units import IDENTITY_UNIT, SUBAGENT_UNITS, TIMING_UNIT
from subagents.runtime.query import SessionQuery
from subagents.storage import Batch, Event, LogStore, Offset, make_event
from subagents.storage.projection import CheckpointRow, ProjectionRegistry
from subagents.storage.testing import FaultyLogStore
from trio_util import AsyncValue

HEADER = header("child", T, origin="subagent", parent_session="p")
now_ms = ticking_ms()


def descriptor_data(kind: str) -> dict[str, Any]:
    if kind == "malformed":
        return {"version": 2, "mode": "continuable", "provider": "spawn"}  # no label
    if kind == "future":
        return {"version": 3, "mode": "one-shot", "provider": "spawn"}
    return descriptor(kind)


def build(kinds: list[tuple[str, int]]) -> list[Event]:
    """Events from (kind, time) pairs; times need not grow (units must not assume they do)."""
    out: list[Event] = []
    for seq, (kind, time) in enumerate(kinds):
        if kind.startswith("descriptor:"):
            out.append(make_event(seq, "subagent/descriptor", time, descriptor_data(kind.split(":", 1)[1])))
        elif kind == "turn/start":
            out.append(make_event(seq, kind, time, {"turn": 1}))
        elif kind == "turn/end":
            out.append(make_event(seq, kind, time, {"turn": 1, "reason": {"kind": "completed"}}))
        else:
            out.append(make_event(seq, "step/start", time, {"turn": 1, "step": 1}))
    return out


KINDS = [
    "turn/start",
    "turn/end",
    "step",
    "step",
    "descriptor:a",
    "descriptor:b",
    "descriptor:malformed",
    "descriptor:future",
]
logs = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 50)), max_size=40).map(build)


def plain(unit: Any, state: Any, events: list[Event]) -> Any:
    for event in events:
        state = unit.apply(state, event)
    return state


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(logs, st.lists(st.integers(0, 40), max_size=3).map(sorted), st.integers(0, 3))
def test_unit_fast_folds_equal_the_plain_fold(events: list[Event], cuts: list[int], k: int) -> None:
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    expected = {unit.key: plain(unit, unit.initial(HEADER, k), events) for unit in SUBAGENT_UNITS}
    # Folded in runs, resumed from checkpoint rows (through JSON) at every cut.
    cells = registry.cells(HEADER, k)
    start = 0
    for cut in [*cuts, len(events)]:
        cut = min(cut, len(events))
        if start < cut:
            assert cells.fold(events[start:cut]) == len(SUBAGENT_UNITS) * (cut - start)
        rows = {
            key: CheckpointRow(ver=row.ver, seq=row.seq, val=json.loads(json.dumps(row.val)))
            for key, row in cells.checkpoint().items()
        }
        cells = registry.cells(HEADER, k, rows)
        start = max(start, cut)
    assert {key: row.val for key, row in cells.checkpoint().items()} == (expected if events else {})
    assert TIMING_UNIT.fold(TIMING_UNIT.initial(HEADER, k), events) == expected["subagent_timing"]


@pytest.mark.parametrize(
    "state",
    [
        {"settled_ms": 1, "descriptor_seen": 1},  # an int for a bool
        {"settled_ms": 1, "descriptor_seen": True, "extra": 2},
        {"settled_ms": 1, "descriptor_seen": True, "active": {"since": 1}},
        {"settled_ms": 1, "descriptor_seen": False, "active": {"since": 1, "through": 2}},  # no apply makes it
        {"settled_ms": 1, "descriptor_seen": True, "active": None},
    ],
)
def test_timing_fold_of_a_state_of_another_shape_is_the_plain_fold(state: dict[str, Any]) -> None:
    events = build([("step", 3), ("turn/end", 4), ("turn/start", 5), ("step", 6), ("descriptor:a", 7), ("step", 9)])
    for n in range(len(events) + 1):
        try:
            want: Any = plain(TIMING_UNIT, state, events[:n])
        except Exception as exc:  # noqa: BLE001 - a state `apply` cannot take: the fold must fail alike
            want = type(exc)
        try:
            got: Any = TIMING_UNIT.fold(state, events[:n])
        except Exception as exc:  # noqa: BLE001
            got = type(exc)
        assert got == want


def test_identity_declares_the_only_type_it_reads() -> None:
    assert IDENTITY_UNIT.types == frozenset({"subagent/descriptor"})
    other = build([("turn/start", 1), ("step", 2), ("turn/end", 3)])
    state = IDENTITY_UNIT.initial(HEADER, 0)
    assert all(IDENTITY_UNIT.apply(state, e) is state for e in other)


# --- the cold reader's shared hops -------------------------------------------------------------


def persist(store: LogStore, n: int) -> list[str]:
    ids = [f"s{i:03d}" for i in range(n)]
    for i, sid in enumerate(ids):
        handle = store.create(header(sid, i + 1))
        events = [make_event(0, "turn/start", 1, {"turn": 1}), make_event(1, "step/start", 2, {"turn": 1, "step": 1})]
        store.append(handle, [Batch(Offset(0), events)])
        store.close(handle)
    return ids


class CountingReader(ColdReader):
    hops = 0

    async def _hop(self, first: Any) -> None:
        self.hops += 1
        await super()._hop(first)


async def read_each(
    reader: ColdReader, ids: list[str], abort: Abort | None, out: dict[str, Any], done: AsyncValue[int] | None = None
) -> None:
    async def one(sid: str) -> None:
        (out[sid],) = await reader.read_many([sid], abort, registry=ProjectionRegistry(SUBAGENT_UNITS))
        if done is not None:
            done.value += 1

    async with trio.open_nursery() as nursery:
        for sid in ids:
            nursery.start_soon(one, sid)


async def test_observations_under_one_abort_share_hops_and_read_each_log_once(place: Place) -> None:
    base = place.store()
    ids = persist(base, 60)
    faulty = FaultyLogStore(base)
    reader = CountingReader(faulty)
    out: dict[str, Any] = {}
    await read_each(reader, ids, Abort(), out)
    assert faulty.calls["read"] == len(ids)  # never twice
    assert reader.hops < len(ids)  # hops were shared
    for sid in ids:
        got = out[sid]
        assert isinstance(got, ColdRead) and got.session_id == sid
        want = reader._read(sid, ProjectionRegistry(SUBAGENT_UNITS))  # noqa: SLF001 - the plain read, for comparison
        assert got.events == want.events and got.closers == want.closers == 2  # step/end, turn/end
        assert got.cells is not None and want.cells is not None
        assert got.cells.snapshot() == want.cells.snapshot()
    assert reader.limiter.borrowed_tokens == 0 and reader._groups == {}  # noqa: SLF001 - nothing left behind


async def test_a_hung_read_holds_up_no_other_read(place: Place) -> None:
    """Every other read is read, and handed over as soon as it is — except to the call whose
    hop holds the hung read (a listing waits for the hung read anyway)."""
    base = place.store()
    ids = persist(base, 12)
    faulty = FaultyLogStore(base)
    faulty.hang("read", session_id=ids[0])
    reader = ColdReader(faulty)
    out: dict[str, Any] = {}
    try:
        async with trio.open_nursery() as nursery:
            done: AsyncValue[int] = AsyncValue(0)
            nursery.start_soon(read_each, reader, ids, Abort(), out, done)
            with trio.fail_after(60):  # a hang guard only: the others are read while ids[0] hangs
                await done.wait_value(lambda n: n >= len(ids) - 2)
                await trio.to_thread.run_sync(faulty.wait_calls, "read", len(ids))
            assert ids[0] not in out and faulty.calls["read"] == len(ids)
            faulty.release()
    finally:
        faulty.release()
    assert all(isinstance(out[sid], ColdRead) for sid in ids)


class GatedStore(FaultyLogStore):
    """Holds each read at a gate of its session until the test opens it (polling the
    checkpoint, so a cancelled read ends); counts the reads that reached their gate."""

    def __init__(self, inner: Any, gated: list[str]) -> None:
        super().__init__(inner)
        self.gates = {sid: threading.Event() for sid in gated}
        self.entered = {sid: threading.Event() for sid in gated}
        self.reads = 0

    def read(self, handle: Any, *args: Any, poll: Any = None, **kwargs: Any) -> Any:
        self._gate(handle, poll)
        return super().read(handle, *args, poll=poll, **kwargs)

    def read_chunks(self, handle: Any, *, poll: Any = None, **kwargs: Any) -> Any:
        chunks = super().read_chunks(handle, poll=poll, **kwargs)

        def gated() -> Any:  # the cold reader streams: gated where the stream starts
            self._gate(handle, poll)
            yield from chunks

        return gated()

    def _gate(self, handle: Any, poll: Any) -> None:
        self.reads += 1
        sid = handle.session_id
        if sid in self.gates:
            self.entered[sid].set()
            while not self.gates[sid].wait(0.002):
                poll()


async def test_a_hop_cancelled_in_another_calls_read_hands_it_back(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cold_reader, "STALL_SECONDS", 600.0)  # no stall: only the hop reads
    base = place.store()
    ids = persist(base, 2)
    store = GatedStore(base, gated=ids)
    reader = ColdReader(store)
    abort = Abort()
    results: dict[str, Any] = {}
    first_scope = trio.CancelScope()

    async def first() -> None:
        with first_scope:
            (results["first"],) = await reader.read_many([ids[0]], abort)

    async def second() -> None:
        (results["second"],) = await reader.read_many([ids[1]], abort)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)  # its hop holds ids[0] at the gate
        await trio.to_thread.run_sync(store.entered[ids[0]].wait)
        nursery.start_soon(second)  # queued behind the first call's hop
        await trio.testing.wait_all_tasks_blocked()
        store.gates[ids[0]].set()  # the hop goes on with the queued ids[1]: held at its gate
        await trio.to_thread.run_sync(store.entered[ids[1]].wait)
        assert store.reads == 2 and "second" not in results
        first_scope.cancel()  # that hop gives up in the middle of the second call's read...
        await trio.testing.wait_all_tasks_blocked()
        store.entered[ids[1]].clear()
        await trio.to_thread.run_sync(store.entered[ids[1]].wait)
        store.gates[ids[1]].set()
    assert first_scope.cancelled_caught and "first" not in results  # cancelled: its hop was still at work
    assert isinstance(results["second"], ColdRead) and results["second"].session_id == ids[1]
    assert store.reads == 3  # ...which the second call then read itself
    assert reader.limiter.borrowed_tokens == 0


async def test_an_abort_ends_reads_waiting_behind_a_hop(place: Place) -> None:
    base = place.store()
    ids = persist(base, 6)
    faulty = FaultyLogStore(base)
    faulty.hang("read", times=None)
    reader = ColdReader(faulty)
    abort = Abort()
    outcomes: list[BaseException] = []

    async def one(sid: str) -> None:
        try:
            await reader.read_many([sid], abort)
        except ReadAborted as exc:
            outcomes.append(exc)

    try:
        with trio.fail_after(20):  # a safety net only
            async with trio.open_nursery() as nursery:
                for sid in ids:
                    nursery.start_soon(one, sid)
                await trio.to_thread.run_sync(faulty.wait_calls, "read", 1)
                abort.set()
    finally:
        faulty.release()
    assert len(outcomes) == len(ids)
    assert faulty.calls["read"] < len(ids)  # the waiting reads never started
    assert reader.limiter.borrowed_tokens == 0


# --- the session query ------------------------------------------------------------------------------


class StatCountingReader(StoreReader):
    batches = 0

    def _stat_batch(self, batch: Any) -> None:
        self.batches += 1
        super()._stat_batch(batch)


async def test_concurrent_observations_share_stat_hops_and_see_what_sequential_ones_see(place: Place) -> None:
    base = place.store(compression="none")
    ids = persist(base, 40)
    place.overwrite(ids[3], lambda data: b"junk\n")  # corrupt (on PostgreSQL: a header row that is no JSON)
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    async with open_session_store(base, registry, now_ms=now_ms) as sessions:
        reader = StatCountingReader(base)
        query = SessionQuery(base, sessions, registry, cache_bytes=0, reader=reader)
        abort = Abort()
        together: dict[str, Any] = {}

        async def observe(sid: str) -> None:
            try:
                async with query.observe_session(sid, abort) as seen:
                    together[sid] = (seen.header, seen.events, seen.projections)
            except Exception as exc:  # noqa: BLE001 - compared below
                together[sid] = (type(exc).__name__, getattr(exc, "code", None))

        async with trio.open_nursery() as nursery:
            for sid in [*ids, "missing"]:
                nursery.start_soon(observe, sid)
        assert reader.batches < len(ids)
        alone = SessionQuery(base, sessions, registry, cache_bytes=0)
        for sid in [*ids, "missing"]:
            try:
                async with alone.observe_session(sid) as seen:
                    want: Any = (seen.header, seen.events, seen.projections)
            except Exception as exc:  # noqa: BLE001
                want = (type(exc).__name__, getattr(exc, "code", None))
            assert together[sid] == want
        assert together[ids[3]] == ("QueryCorruptSession", "QUERY_CORRUPT_SESSION")
        assert together["missing"] == ("QuerySessionNotFound", "QUERY_SESSION_NOT_FOUND")


async def test_the_corpus_reuses_records_only_while_nothing_changed(place: Place) -> None:
    base = place.store()
    persist(base, 3)
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    async with open_session_store(base, registry, now_ms=now_ms) as sessions:
        query = SessionQuery(base, sessions, registry)

        async def check() -> list[Any]:
            got = await query.list_sessions()
            fresh = await SessionQuery(base, sessions, registry).list_sessions()
            assert got == fresh
            return got

        first = await check()
        again = await check()
        assert again == first and all(a is b for a, b in zip(again, first, strict=True)) and again is not first
        live = await sessions.create(header("s001-live", 10))
        await check()  # live only: not persisted yet
        await live.append([turn_start(1)])
        grown = await check()  # published: live and persisted
        assert [r.id for r in grown][0] == "s001-live" and grown[0].live and grown[0].persisted
        ref = await sessions.open("s000")  # a persisted one goes live
        after = await check()
        assert {r.id: r.live for r in after}["s000"] is True
        await ref.append([EventDraft(type="step/start", data={"turn": 1, "step": 1})])
        appended = await check()  # its log grew: a new revision and count
        assert {r.id: r.event_count for r in appended}["s000"] == 3
        await sessions.release("s000")
        released = await check()
        assert {r.id: r.live for r in released}["s000"] is False
