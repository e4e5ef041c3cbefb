"""Session query (SPEC 5.1): the live-preferred corpus and observations, with their codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from clocks import ticking_ms
from descriptors import descriptor
from drafts import turn_start
from events import turn_end_event
from log_lines import header, persist_log
from registries import HostileView
from subagents.actors import Abort, EventDraft, open_session_store
from subagents.runtime.delegation.units import SUBAGENT_UNITS
from subagents.runtime.foundation.errors import SessionQueryError
from subagents.runtime.query import SessionQuery
from subagents.storage import (
    FileLogStore,
    PersistenceFailed,
    SessionHeader,
    make_event,
)
from subagents.storage.projection import ProjectionRegistry
from subagents.storage.testing import FaultyLogStore

now_ms = ticking_ms()


def persist(
    store: FileLogStore, sid: str, created_at: int, *, open_turn: bool = False, label: str | None = None
) -> None:
    events = []
    if label is not None:
        data = descriptor(label)
        events.append(make_event(0, "subagent/descriptor", 1, data))
    n = len(events)
    events.append(make_event(n, "turn/start", 2, {"turn": 1}))
    if not open_turn:
        events.append(turn_end_event(n + 1, 3, 1))
    persist_log(store, header(sid, created_at, origin="subagent", parent_session="p"), events)


async def test_the_corpus_is_live_preferred_and_newest_first(tmp_path: Path) -> None:
    base = FileLogStore(str(tmp_path))
    persist(base, "old", 10)
    persist(base, "b-tie", 20)
    persist(base, "a-tie", 20)
    (tmp_path / "sessions" / "broken").mkdir()
    (tmp_path / "sessions" / "broken" / "session.jsonl").write_bytes(b'{"type":"session","format":1,"id":"broken"}\n')
    async with open_session_store(base, ProjectionRegistry(SUBAGENT_UNITS), now_ms=now_ms) as sessions:
        live = await sessions.create(header("live", 30))
        await live.append([turn_start(1)])
        query = SessionQuery(base, sessions, ProjectionRegistry(SUBAGENT_UNITS))
        records = await query.list_sessions()
        assert [r.id for r in records] == ["live", "a-tie", "b-tie", "old", "broken"]
        by_id = {r.id: r for r in records}
        assert (by_id["live"].live, by_id["live"].persisted, by_id["live"].conflict) == (True, True, False)
        assert (by_id["old"].live, by_id["old"].persisted, by_id["old"].event_count) == (False, True, 2)
        assert by_id["broken"].damage == "corrupt" and by_id["broken"].header is None


async def test_a_differing_live_header_is_a_conflict_not_a_failure(tmp_path: Path) -> None:
    base = FileLogStore(str(tmp_path))
    persist(base, "s", 10)

    @attrs.define
    class FakeRef:
        session_id: str = "s"
        header: SessionHeader = header("s", 11)
        inherited_event_count: int = 0

    class FakeSessions:
        def list(self) -> list[FakeRef]:
            return [FakeRef()]

        def get(self, sid: str) -> None:
            return None

    query = SessionQuery(base, FakeSessions(), ProjectionRegistry([]))  # type: ignore[arg-type]  # a stand-in with just list() and get()
    (record,) = await query.list_sessions()
    assert record.conflict and record.live and record.header.created_at == 11  # type: ignore[union-attr]  # a live record always has a header


async def test_an_unreadable_root_and_an_abort_fail_the_listing(tmp_path: Path) -> None:
    faulty = FaultyLogStore(FileLogStore(str(tmp_path)))
    faulty.fail("list", PersistenceFailed("the disk is gone"))
    async with open_session_store(faulty, ProjectionRegistry([]), now_ms=now_ms) as sessions:
        query = SessionQuery(faulty, sessions, ProjectionRegistry([]))
        with pytest.raises(SessionQueryError) as info:
            await query.list_sessions()
        assert info.value.code == "QUERY_PERSISTENCE_FAILED"
        abort = Abort()
        abort.set()
        with pytest.raises(SessionQueryError) as info:
            await query.list_sessions(abort)
        assert info.value.code == "QUERY_ABORTED"


async def test_observations_live_and_prepared(tmp_path: Path) -> None:
    base = FileLogStore(str(tmp_path))
    persist(base, "cold", 10, open_turn=True, label="cold child")
    before = (tmp_path / "sessions" / "cold" / "session.jsonl.zst").read_bytes()
    faulty = FaultyLogStore(base)
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    async with open_session_store(faulty, registry, now_ms=now_ms) as sessions:
        live = await sessions.create(header("live", 20))
        data = descriptor("live child")
        await live.append([EventDraft(type="subagent/descriptor", data=data)])
        query = SessionQuery(faulty, sessions, registry)

        async with query.observe_session("live") as seen:
            assert seen.source == "live"
            assert seen.projections["subagent"] == {"mode": "continuable", "label": "live child", "seq": 0}
        assert seen.released

        async with query.observe_session("cold") as seen:
            assert seen.source == "prepared"
            assert seen.projections["subagent"] == {"mode": "continuable", "label": "cold child", "seq": 0}
            assert [e.type for e in seen.events] == ["subagent/descriptor", "turn/start", "turn/end"]  # closer
        reads = faulty.calls["read"]
        with pytest.raises(RuntimeError):
            async with query.observe_session("cold") as again:  # from the LRU: no read
                assert again.projections == seen.projections
                raise RuntimeError("the body fails")
        assert again.released
        assert faulty.calls["read"] == reads
        assert (tmp_path / "sessions" / "cold" / "session.jsonl.zst").read_bytes() == before  # never written


async def test_a_live_observation_holds_the_durable_events_only(tmp_path: Path) -> None:
    """Not published yet: live with no events (not "not found"); mid-turn: the open turn as it
    is, without the closers a cold reader adds to an interrupted log."""
    base = FileLogStore(str(tmp_path))
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    async with open_session_store(base, registry, now_ms=now_ms) as sessions:
        fresh = await sessions.create(header("fresh", 20))
        query = SessionQuery(base, sessions, registry)
        async with query.observe_session("fresh") as seen:
            assert (seen.source, seen.events, seen.header) == ("live", (), fresh.header)
        running = await sessions.create(header("running", 30))
        await running.append(
            [
                EventDraft(type="turn/start", data={"turn": 1}),
                EventDraft(type="step/start", data={"turn": 1, "step": 1}),
            ]
        )
        async with query.observe_session("running") as seen:
            assert seen.source == "live"
            assert [e.type for e in seen.events] == ["turn/start", "step/start"]
        await sessions.release("running")
        async with query.observe_session("running") as seen:  # released: a cold reader's view
            assert seen.source == "prepared"
            assert [e.type for e in seen.events] == ["turn/start", "step/start", "step/end", "turn/end"]


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("missing", "QUERY_SESSION_NOT_FOUND"),
        ("bad\x00id", "QUERY_SESSION_NOT_FOUND"),
        ("corrupt", "QUERY_CORRUPT_SESSION"),
        ("unsupported", "QUERY_UNSUPPORTED_SESSION"),
        ("read-fails", "QUERY_PERSISTENCE_FAILED"),
        ("hostile-view", "QUERY_CORRUPT_SESSION"),
        ("aborted", "QUERY_ABORTED"),
    ],
)
async def test_observation_errors_carry_their_codes(tmp_path: Path, case: str, code: str) -> None:
    base = FileLogStore(str(tmp_path), compression="none")
    persist(base, "s", 10)
    log = tmp_path / "sessions" / "s" / "session.jsonl"
    faulty = FaultyLogStore(base)
    units: list[Any] = list(SUBAGENT_UNITS)
    abort = None
    sid = "s"
    if case in ("missing", "bad\x00id"):
        sid = case
    elif case == "corrupt":
        log.write_bytes(log.read_bytes() + b"not json\n")
    elif case == "unsupported":
        log.write_bytes(log.read_bytes() + b'{"seq":2,"type":"future/thing","time":1,"data":{}}\n')
    elif case == "read-fails":
        faulty.fail("read", PersistenceFailed("an I/O error"))
    elif case == "hostile-view":
        units.append(HostileView())
    else:
        abort = Abort()
        abort.set()
    async with open_session_store(faulty, ProjectionRegistry(units), now_ms=now_ms) as sessions:
        query = SessionQuery(faulty, sessions, ProjectionRegistry(units))
        with pytest.raises(SessionQueryError) as info:
            async with query.observe_session(sid, abort):
                raise AssertionError("observed")
        assert info.value.code == code
        # Failures are never cached: once the cause is gone, the session is observed.
        if case == "read-fails":
            async with query.observe_session(sid) as seen:
                assert seen.source == "prepared"


async def test_the_observation_cache_is_bounded_by_memory_not_bytes_on_disk(tmp_path: Path) -> None:
    """A zstd log is several times smaller on disk than in memory: the LRU counts what the
    prepared observation holds (raw data plus a per-event overhead), so a bound cannot be
    overrun by a factor of the compression ratio."""
    base = FileLogStore(str(tmp_path))
    events = [make_event(i, "turn/start", 2, {"turn": i}) for i in range(2000)]
    persist_log(base, header("big", 1), events)
    on_disk = (tmp_path / "sessions" / "big" / "session.jsonl.zst").stat().st_size
    raw = sum(len(e.data) for e in events)
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    async with open_session_store(base, registry, now_ms=now_ms) as sessions:
        roomy = SessionQuery(base, sessions, registry, cache_bytes=64 << 20)
        async with roomy.observe_session("big"):
            pass
        assert roomy._cached >= raw + 100 * len(events) > 3 * on_disk  # noqa: SLF001 - the LRU's own count
        tight = SessionQuery(base, sessions, registry, cache_bytes=4 * on_disk)  # would fit by disk size
        async with tight.observe_session("big"):
            pass
        assert tight._cached == 0  # noqa: SLF001 - too big for the bound once counted in memory
