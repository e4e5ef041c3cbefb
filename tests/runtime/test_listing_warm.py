"""A warm listing reuses what has not changed (rows, candidates, the corpus, the store's answer):
each test changes one thing between listings and checks that the next listing shows it, against
a fresh service over the same sessions (which reuses nothing). On files and on PostgreSQL (the
`place` fixture; issue 18); closing the store a runtime made is checked on each store's terms
(inotify watches, connections)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from clocks import ticking_ms
from drafts import descriptor_draft, turn_start
from log_lines import header
from open_fds import inotify_fds
from places import Place
from subagents.actors import SessionStore, open_session_store
from subagents.runtime.delegation import listing_rows
from subagents.runtime.delegation.listing import ListingService
from subagents.runtime.delegation.units import SUBAGENT_UNITS
from subagents.runtime.query import SessionQuery
from subagents.storage import FileLogStore, LogStore
from subagents.storage.projection import ProjectionRegistry

now_ms = ticking_ms()


class Listings:
    """One long-lived service (warm) and a check against a fresh one (cold) every time."""

    def __init__(self, base: LogStore, sessions: SessionStore, registry: ProjectionRegistry) -> None:
        self.base, self.sessions, self.registry = base, sessions, registry
        self.warm = self._service()

    def _service(self) -> ListingService:
        query = SessionQuery(self.base, self.sessions, self.registry)
        return ListingService(registry=self.registry, sessions=self.sessions, query=query)

    async def children(self, parent: str = "p") -> list[dict[str, Any]]:
        got = [row.to_json() for row in await self.warm.list_children(parent)]
        assert got == [row.to_json() for row in await self._service().list_children(parent)]
        descendants = [row.to_json() for row in await self.warm.list_descendants(parent)]
        assert descendants == [row.to_json() for row in await self._service().list_descendants(parent)]
        return got

    async def create(self, sid: str, parent: str = "p", label: str | None = None) -> None:
        ref = await self.sessions.create(header(sid, now_ms(), origin="subagent", parent_session=parent))
        await ref.append([descriptor_draft(label if label is not None else sid)])


@pytest.fixture
async def listings(place: Place) -> Any:
    base = place.store()  # closed by `place`
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    async with open_session_store(base, registry, now_ms=now_ms) as sessions:
        yield Listings(base, sessions, registry)


async def test_each_change_shows_in_the_next_warm_listing(listings: Listings) -> None:
    for i in range(3):
        await listings.create(f"c{i}")
    first = await listings.children()
    assert [(r["id"], r["activity"], r["label"]) for r in first] == [(f"c{i}", "running", f"c{i}") for i in range(3)]
    assert await listings.children() == first

    await listings.create("c3")  # a new child
    assert [r["id"] for r in await listings.children()] == ["c0", "c1", "c2", "c3"]

    await listings.create("g0", parent="c1")  # a grandchild: c1 has children now
    assert {r["id"]: r["has_children"] for r in await listings.children()} == {
        "c0": False,
        "c1": True,
        "c2": False,
        "c3": False,
    }

    ref = listings.sessions.get("c2")
    assert ref is not None
    await ref.append([descriptor_draft("renamed")])  # the last descriptor wins
    assert {r["id"]: r["label"] for r in await listings.children()}["c2"] == "renamed"

    await listings.sessions.release("c0")  # no longer live: read from its log (or checkpoint)
    assert {r["id"]: r["activity"] for r in await listings.children()}["c0"] == "inactive"

    await listings.sessions.open("c0")  # live again
    assert {r["id"]: r["activity"] for r in await listings.children()}["c0"] == "running"


async def test_rows_are_reused_only_for_the_same_child_in_the_same_state(listings: Listings) -> None:
    await listings.create("c0")
    await listings.create("c1")
    first = await listings.warm.list_children("p")
    again = await listings.warm.list_children("p")
    assert again == first and all(a is b for a, b in zip(again, first, strict=True))
    await listings.sessions.release("c1")
    after = await listings.warm.list_children("p")
    assert after[0] is first[0] and after[1] is not first[1] and after[1].activity == "inactive"


async def test_the_row_memory_is_bounded(listings: Listings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listing_rows, "_ROW_CACHE", 4)
    for i in range(10):
        await listings.create(f"c{i}")
    for _ in range(2):
        assert [r["id"] for r in await listings.children()] == [f"c{i}" for i in range(10)]
        assert len(listings.warm._rows_made._made) <= 4


async def test_candidates_are_kept_per_parent_and_for_a_bounded_number_of_parents(
    listings: Listings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listing_rows.CorpusShape, "_PARENTS_KEPT", 2)
    for parent in ("p", "q", "r"):
        await listings.create(f"{parent}-child", parent=parent)
    for _ in range(2):
        for parent in ("p", "q", "r", "unknown"):
            got = await listings.children(parent)
            assert [r["id"] for r in got] == ([] if parent == "unknown" else [f"{parent}-child"])
            assert len(listings.warm._shape._children) <= 2


async def test_live_actors_swapped_between_listings_are_noticed(
    listings: Listings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As many live actors as before and the very same store infos, but not the same actors."""
    await listings.create("c0")
    await listings.create("c1")
    await listings.sessions.release("c1")
    assert [(r["id"], r["activity"]) for r in await listings.children()] == [("c0", "running"), ("c1", "inactive")]
    infos = listings.base.list()  # the objects the warm corpus was made from (nothing changed since)
    await listings.sessions.release("c0")
    await listings.sessions.open("c1")
    monkeypatch.setattr(listings.base, "list", lambda: list(infos))  # hold the logs' side still
    assert [(r["id"], r["activity"]) for r in await listings.children()] == [("c0", "inactive"), ("c1", "running")]


async def test_open_runtime_closes_the_store_it_made_and_not_one_passed_in(tmp_path: Path) -> None:
    from subagents.runtime import open_runtime

    before = inotify_fds()
    async with open_runtime(tmp_path / "own") as rt:
        ref = await rt.sessions.create(header("s", 1))
        await ref.append([turn_start(1)])
        await rt.query.list_sessions()
        await rt.query.list_sessions()  # the store's second listing sets the watches up
        assert inotify_fds() == before + 1
    assert inotify_fds() == before

    mine = FileLogStore(str(tmp_path / "mine"))
    async with open_runtime(tmp_path / "mine", log_store=mine) as rt:
        ref = await rt.sessions.create(header("s", 1))
        await ref.append([turn_start(1)])
        await rt.query.list_sessions()
        await rt.query.list_sessions()
    assert mine.watching and [i.id for i in mine.list()] == ["s"]  # still the caller's, still open
    mine.close_store()
    assert inotify_fds() == before


@pytest.mark.pg
async def test_open_runtime_closes_the_pg_store_it_made_and_not_one_passed_in(
    tmp_path: Path, pg_url: str, pg_store_factory: Any
) -> None:
    from subagents.runtime import open_runtime

    async with open_runtime(tmp_path, store=pg_url) as rt:
        made = rt.log_store
        ref = await rt.sessions.create(header("s", 1))
        await ref.append([turn_start(1)])
        await rt.query.list_sessions()
        assert made.owner_backend_pid is not None  # the write lock's connection
    assert made.owner_backend_pid is None and made.pool._idle == [] and made.pool._closed

    mine = pg_store_factory()
    async with open_runtime(tmp_path, log_store=mine) as rt:
        ref = await rt.sessions.create(header("t", 1))
        await ref.append([turn_start(1)])
        await rt.query.list_sessions()
    assert not mine.pool._closed and [i.id for i in mine.list()] == ["s", "t"]  # still the caller's, still open


def test_an_identity_of_another_shape_gets_a_row_that_is_not_kept() -> None:
    """Only a tampered checkpoint row can hold such an identity; it must not fail the listing."""
    from subagents.runtime.query import SessionRecord

    record = SessionRecord(
        id="c",
        header=None,
        live=False,
        persisted=True,
        damage=None,  # type: ignore[arg-type]  # a plain str id
        inherited_event_count=0,
        revision=None,
        event_count=1,
    )
    made = listing_rows.RowCache()
    row = made.child(record, {"mode": "continuable", "label": ["not", "a", "str"]}, False, None)
    assert row.label == ["not", "a", "str"] and made._made == {}
    assert made.child(record, {"mode": "continuable", "label": "ok"}, False, None) is made.child(
        record, {"mode": "continuable", "label": "ok"}, False, None
    )
