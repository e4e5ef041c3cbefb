"""Listing children (SPEC 5.4): the ladder, the four row states, diagnostics, cancellation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clocks import ticking_ms
from descriptors import descriptor
from drafts import descriptor_draft, turn_start
from listing_rows import rows
from log_lines import header, persist_log
from places import Place
from subagents.actors import Abort, open_session_store
from subagents.runtime.delegation.listing import ListingService, walk_descendants
from subagents.runtime.delegation.units import SUBAGENT_UNITS
from subagents.runtime.foundation.errors import ListingParentNotFound, SubagentError
from subagents.runtime.query import SessionQuery
from subagents.storage import FileLogStore, LogStore, PersistenceFailed, make_event
from subagents.storage.projection import ProjectionRegistry
from subagents.storage.testing import FaultyLogStore

now_ms = ticking_ms()


@pytest.fixture(params=["file", pytest.param("pg", marks=pytest.mark.pg)])
def base_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The listing's log store: files, or PostgreSQL as a parameter (issue 18)."""
    if request.param == "pg":
        yield request.getfixturevalue("pg_store_factory")()
        return
    store = FileLogStore(str(tmp_path))
    yield store
    store.close_store()


def child(
    store: LogStore,
    sid: str,
    created_at: int,
    parent: str = "p",
    *,
    data: dict[str, Any] | None = None,
    origin: str | None = "subagent",
) -> None:
    events = [make_event(0, "subagent/descriptor", 1, data)] if data is not None else []
    events.append(make_event(len(events), "turn/start", 2, {"turn": 1}))
    persist_log(store, header(sid, created_at, origin=origin, parent_session=parent), events)


async def test_children_rows_in_order_with_their_states(base_store: Any) -> None:
    base = base_store
    child(base, "c-late", 30, data=descriptor("late"))
    child(base, "c-b", 20, data=descriptor("b"))
    child(base, "c-a", 20, data=descriptor("a"))
    child(base, "one-shot", 25, data=descriptor(None, "one-shot"))
    child(base, "no-descriptor", 26)
    child(base, "ordinary-fork", 27, origin=None)
    child(base, "other-parent", 28, parent="q", data=descriptor("x"))
    child(base, "grandchild", 29, parent="c-a", data=descriptor("g"))
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    async with open_session_store(base, registry, now_ms=now_ms) as sessions:
        live = await sessions.create(header("c-live", 40, origin="subagent", parent_session="p"))
        window = await sessions.create(header("c-window", 41, origin="subagent", parent_session="p"))
        await live.append([descriptor_draft("live one")])
        await window.append([turn_start(1)])  # no descriptor yet
        query = SessionQuery(base, sessions, registry)
        service = ListingService(registry=registry, sessions=sessions, query=query)
        result = rows(await service.list_children("p"))
        assert result == [
            {
                "kind": "child",
                "id": "c-a",
                "activity": "inactive",
                "has_children": True,
                "mode": "continuable",
                "label": "a",
            },
            {
                "kind": "child",
                "id": "c-b",
                "activity": "inactive",
                "has_children": False,
                "mode": "continuable",
                "label": "b",
            },
            {"kind": "child", "id": "one-shot", "activity": "inactive", "has_children": False, "mode": "one-shot"},
            {"kind": "diagnostic", "id": "no-descriptor", "reason": "corrupt"},
            {
                "kind": "child",
                "id": "c-late",
                "activity": "inactive",
                "has_children": False,
                "mode": "continuable",
                "label": "late",
            },
            {
                "kind": "child",
                "id": "c-live",
                "activity": "running",
                "has_children": False,
                "mode": "continuable",
                "label": "live one",
            },
        ]  # c-window (live, no identity yet) is omitted; forks and strangers are not candidates
        assert await service.list_children("unknown-parent") == []
        descendants = rows(await service.list_descendants("p"))
        assert [(r["id"], r["parent_id"], r["depth"]) for r in descendants][:2] == [
            ("c-a", "p", 1),
            ("grandchild", "c-a", 2),
        ]


async def test_a_failed_read_is_unavailable_and_a_bug_fails_the_listing(place: Place) -> None:
    base = place.store(use_index=False)  # no checkpoint rung: every child observed
    child(base, "c1", 1, data=descriptor("one"))
    child(base, "c2", 2, data=descriptor("two"))
    faulty = FaultyLogStore(base)
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    async with open_session_store(faulty, registry, now_ms=now_ms) as sessions:
        service = ListingService(registry=registry, sessions=sessions, query=SessionQuery(faulty, sessions, registry))
        faulty.fail("read", PersistenceFailed("an I/O error"), session_id="c1")
        assert rows(await service.list_children("p")) == [
            {"kind": "diagnostic", "id": "c1", "reason": "unavailable"},
            {
                "kind": "child",
                "id": "c2",
                "activity": "inactive",
                "has_children": False,
                "mode": "continuable",
                "label": "two",
            },
        ]
        assert [r["id"] for r in rows(await service.list_children("p"))] == ["c1", "c2"]  # retried: listed
        faulty.fail("read", TypeError("a bug"), session_id="c2")
        service = ListingService(registry=registry, sessions=sessions, query=SessionQuery(faulty, sessions, registry))
        with pytest.raises(TypeError):
            await service.list_children("p")


async def test_cold_identities_come_from_checkpoints_without_reading_logs(place: Place) -> None:
    base = place.store()
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    async with open_session_store(base, registry, now_ms=now_ms) as sessions:
        for i in range(6):
            ref = await sessions.create(header(f"c{i}", i + 1, origin="subagent", parent_session="p"))
            await ref.append([descriptor_draft(f"child {i}")])
        for i in range(6):
            await sessions.release(f"c{i}")  # persisted, with checkpoint rows
    faulty = FaultyLogStore(place.store())
    async with open_session_store(faulty, registry, now_ms=now_ms) as sessions:
        service = ListingService(registry=registry, sessions=sessions, query=SessionQuery(faulty, sessions, registry))
        result = rows(await service.list_children("p"))
        assert [r["label"] for r in result] == [f"child {i}" for i in range(6)]
        assert faulty.calls["read"] == 0 and faulty.calls["open_read"] == 0


@pytest.mark.parametrize(
    ("missing", "code"),
    [
        ("registry", "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE"),
        ("sessions", "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE"),
        ("query", "SUBAGENT_CONTROL_QUERY_UNAVAILABLE"),
    ],
)
async def test_service_checks(base_store: Any, missing: str, code: str) -> None:
    base = base_store
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    async with open_session_store(base, registry, now_ms=now_ms) as sessions:
        parts: dict[str, Any] = {
            "registry": registry,
            "sessions": sessions,
            "query": SessionQuery(base, sessions, registry),
        }
        parts[missing] = None
        with pytest.raises(SubagentError) as info:
            await ListingService(**parts).list_children("p")
        assert info.value.code == code


async def test_an_abort_ends_in_cancelled_with_no_rows(base_store: Any) -> None:
    base = base_store
    child(base, "c1", 1, data=descriptor("one"))
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    async with open_session_store(base, registry, now_ms=now_ms) as sessions:
        service = ListingService(registry=registry, sessions=sessions, query=SessionQuery(base, sessions, registry))
        abort = Abort()
        abort.set()
        with pytest.raises(SubagentError) as info:
            await service.list_children("p", abort)
        assert (info.value.code, info.value.message) == ("SUBAGENT_CANCELLED", "subagent listing was cancelled")


async def test_a_required_parent_the_corpus_has_no_record_of_is_a_typed_error(base_store: Any) -> None:
    """`require_parent=True` (the CLI's): an unknown parent is `ListingParentNotFound`, where the
    default lists it as no children; a known parent without children lists as no rows."""
    base = base_store
    child(base, "c1", 1, data=descriptor("one"))
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    async with open_session_store(base, registry, now_ms=now_ms) as sessions:
        service = ListingService(registry=registry, sessions=sessions, query=SessionQuery(base, sessions, registry))
        for listing in (service.list_children, service.list_descendants):
            assert await listing("nobody") == []
            with pytest.raises(ListingParentNotFound) as info:
                await listing("nobody", require_parent=True)
            assert info.value.code == "SUBAGENT_LISTING_PARENT_NOT_FOUND"
            assert await listing("c1", require_parent=True) == []


def test_the_walk_is_iterative_and_never_loops() -> None:
    from subagents.runtime.query import SessionRecord

    def rec(sid: str, parent: str | None, created: int) -> SessionRecord:
        return SessionRecord(
            id=sid,
            header=header(sid, created, origin="subagent", parent_session=parent),
            live=False,
            persisted=True,
            damage=None,
            inherited_event_count=0,
            revision=None,
            event_count=1,
        )

    chain = [rec("n0", "n9999", 0)] + [
        rec(f"n{i}", f"n{i - 1}", i) for i in range(1, 10_000)
    ]  # the root names its own descendant
    placed = walk_descendants(chain, "n0")
    assert len(placed) == 9_999
    assert placed[-1][1:] == ("n9998", 9_999)


async def test_the_checkpoint_query_takes_the_index_slot_of_the_session_query(place: Place) -> None:
    """SPEC 3.3: the index is used from Trio through one worker slot; the listing's checkpoint
    query shares the session query's, so it waits while another index call holds it."""
    import trio
    import trio.testing

    base = place.store()
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    async with open_session_store(base, registry, now_ms=now_ms) as sessions:
        ref = await sessions.create(header("c0", 1, origin="subagent", parent_session="p"))
        await ref.append([descriptor_draft("child")])
        await sessions.release("c0")  # persisted, with checkpoint rows
        query = SessionQuery(base, sessions, registry)
        service = ListingService(registry=registry, sessions=sessions, query=query)
        (record,) = [r for r in await query.list_sessions() if r.id == "c0"]
        found: list[Any] = []

        async def ask() -> None:
            found.append(await service._checkpoint_identities([record]))

        async with trio.open_nursery() as nursery:
            await query.index_limiter.acquire_on_behalf_of("test")
            nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            assert query.index_limiter.statistics().tasks_waiting == 1 and found == []  # for the slot
            query.index_limiter.release_on_behalf_of("test")
    # (the identity, and whether its row covers the log whole)
    assert found == [{"c0": ({"mode": "continuable", "label": "child", "seq": 0}, True)}]


async def test_the_registry_checks_fresh_ids_through_the_same_index_slot(place: Place) -> None:
    import trio
    import trio.testing

    async with place.open_runtime(model=None) as rt:
        limiter = rt.query.index_limiter
        got: list[str] = []

        async def new_id() -> None:
            got.append(await rt.agents.new_id())

        async with trio.open_nursery() as nursery:
            await limiter.acquire_on_behalf_of("test")
            nursery.start_soon(new_id)
            await trio.testing.wait_all_tasks_blocked()
            assert limiter.statistics().tasks_waiting == 1 and got == []
            limiter.release_on_behalf_of("test")
        assert len(got) == 1
