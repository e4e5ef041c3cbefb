"""Listing children (SPEC 5.4): the rules test_listing.py leaves open, one table per rule.

Descriptors (last wins, malformed, unsupported version, inherited only), damaged child logs
(another format, an unknown event type), the lifecycle witness, grandchildren that are never
read, the cold reader's bound of four reads in flight, read-only listing, and cancellation by
`Abort` or by an enclosing cancel scope. Real clock throughout: reads run in worker threads.

Every test runs on files and on PostgreSQL (the `place` fixture; issue 18): a damaged log is
its plain bytes edited (a file rewritten, or its rows, tests/helpers/pg_damage.py); "no
checkpoint rung" is a file store without its index, or children written straight through the
store (no checkpoint rows); the read-only check compares the files, or every row.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pg_damage
import pytest
import trio
import trio.testing
from clocks import ticking_ms
from descriptors import descriptor
from events import seed_marker
from listing_rows import rows
from log_lines import header, persist_log
from places import Place
from subagents.actors import Abort, EventDraft
from subagents.runtime import Runtime
from subagents.runtime.foundation.errors import SubagentCancelled, SubagentError
from subagents.storage import FileLogStore, LogStore, make_event
from subagents.storage.testing import FaultyLogStore

now_ms = ticking_ms()


MALFORMED = {"version": 2, "mode": "continuable", "provider": "spawn"}  # a continuable child needs a label
VERSION_3 = {"version": 3, "mode": "continuable", "provider": "spawn", "label": "future"}


def child(
    store: LogStore,
    sid: str,
    created_at: int,
    parent: str = "p",
    *,
    descriptors: list[dict[str, Any]] = (),
    cwd: str | None = None,
    open_turn: bool = True,
) -> None:  # type: ignore[assignment]  # an empty tuple as the default list
    """A persisted child: its descriptors (in order), then a turn that is left open."""
    events = [make_event(i, "subagent/descriptor", i + 1, data) for i, data in enumerate(descriptors)]
    if open_turn:
        events.append(make_event(len(events), "turn/start", len(events) + 1, {"turn": 1}))
    persist_log(store, header(sid, created_at, origin="subagent", parent_session=parent, cwd=cwd), events)


def seeded_child(
    store: LogStore,
    sid: str,
    created_at: int,
    *,
    inherited: list[dict[str, Any]],
    own: list[dict[str, Any]],
    parent: str = "p",
) -> None:
    """A seeded child: inherited events (descriptors then a completed turn), the tagged marker,
    then its own descriptors and an open turn."""
    seed = [make_event(i, "subagent/descriptor", i + 1, data) for i, data in enumerate(inherited)]
    seed.append(make_event(len(seed), "turn/start", 50, {"turn": 1}))
    seed.append(make_event(len(seed), "turn/end", 51, {"turn": 1, "reason": {"kind": "completed"}}))
    k = len(seed)
    events = [*seed, seed_marker(k, 60)]
    events += [make_event(len(events), "subagent/descriptor", 61, data) for data in own]
    events.append(make_event(len(events), "turn/start", 70, {"turn": 2}))
    persist_log(store, header(sid, created_at, origin="subagent", parent_session=parent, is_seeded=True), events, k)


def log_path(root: Path, sid: str) -> Path:
    return root / "sessions" / sid / "session.jsonl"  # plain form; these ids encode to themselves


def row(
    sid: str, label: str | None, mode: str = "continuable", *, has_children: bool = False, activity: str = "inactive"
) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "child", "id": sid, "activity": activity, "has_children": has_children, "mode": mode}
    if label is not None:
        out["label"] = label
    return out


def diag(sid: str, reason: str) -> dict[str, Any]:
    return {"kind": "diagnostic", "id": sid, "reason": reason}


async def wait_for(predicate: Callable[[], bool]) -> None:
    """Wait, without sleeping, until every task is blocked and `predicate` holds (worker threads
    make progress meanwhile). The 60 s only guard against a hang: with two whole suites
    sharing two cores it took more than 10 s once."""
    with trio.fail_after(60):
        while True:
            await trio.testing.wait_all_tasks_blocked()
            if predicate():
                return


# --- descriptors --------------------------------------------------------------------------------

DESCRIPTOR_CASES = [
    pytest.param([descriptor("first"), descriptor("second")], row("c", "second"), id="last-valid-wins"),
    pytest.param([descriptor("first"), descriptor(None, "one-shot")], row("c", None, "one-shot"), id="last-wins-mode"),
    pytest.param([descriptor("first"), MALFORMED], diag("c", "corrupt"), id="malformed-last-clears"),
    pytest.param([MALFORMED, descriptor("again")], row("c", "again"), id="valid-after-malformed"),
    pytest.param([MALFORMED], diag("c", "corrupt"), id="malformed-cold"),
    pytest.param(
        [{"version": "2", "mode": "continuable", "provider": "spawn", "label": "x"}],
        diag("c", "corrupt"),
        id="version-not-int",
    ),
    pytest.param([VERSION_3], diag("c", "corrupt"), id="unsupported-version-cold"),
    pytest.param([descriptor("first"), VERSION_3], diag("c", "corrupt"), id="unsupported-version-last"),
    pytest.param([descriptor("elsewhere", provider="nope")], row("c", "elsewhere"), id="unregistered-provider"),
    pytest.param(
        [descriptor(None, "one-shot", provider="nope")], row("c", None, "one-shot"), id="unregistered-provider-one-shot"
    ),
]


@pytest.mark.parametrize(("descriptors", "expected"), DESCRIPTOR_CASES)
async def test_cold_descriptor_table(place: Place, descriptors: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    child(place.store(), "c", 1, descriptors=descriptors)
    async with place.open_runtime(now_ms=now_ms) as runtime:
        assert rows(await runtime.listing.list_children("p")) == [expected]


LIVE_CASES = [
    pytest.param([MALFORMED], None, id="malformed-omitted"),
    pytest.param([VERSION_3], None, id="unsupported-version-omitted"),
    pytest.param([descriptor("first"), MALFORMED], None, id="malformed-last-omitted"),
    pytest.param(
        [descriptor("first"), descriptor("second")], row("c", "second", activity="running"), id="last-valid-wins"
    ),
    pytest.param([MALFORMED, descriptor("again")], row("c", "again", activity="running"), id="valid-after-malformed"),
]


@pytest.mark.parametrize(("descriptors", "expected"), LIVE_CASES)
async def test_live_descriptor_table(
    place: Place, descriptors: list[dict[str, Any]], expected: dict[str, Any] | None
) -> None:
    async with place.open_runtime(now_ms=now_ms) as runtime:
        ref = await runtime.sessions.create(header("c", 1, origin="subagent", parent_session="p"))
        await ref.append([EventDraft(type="subagent/descriptor", data=data) for data in descriptors])
        assert rows(await runtime.listing.list_children("p")) == ([] if expected is None else [expected])


SEEDED_CASES = [
    pytest.param([descriptor("parent's")], [], diag("s", "corrupt"), id="inherited-only"),
    pytest.param([descriptor("parent's")], [descriptor("own")], row("s", "own"), id="own-after-inherited"),
    pytest.param([], [descriptor("own")], row("s", "own"), id="own-only"),
    pytest.param([descriptor("parent's")], [MALFORMED], diag("s", "corrupt"), id="own-malformed"),
    pytest.param([], [], diag("s", "corrupt"), id="none"),
]


@pytest.mark.parametrize(("inherited", "own", "expected"), SEEDED_CASES)
async def test_seeded_descriptor_table(
    place: Place, inherited: list[dict[str, Any]], own: list[dict[str, Any]], expected: dict[str, Any]
) -> None:
    seeded_child(place.store(), "s", 1, inherited=inherited, own=own)
    async with place.open_runtime(now_ms=now_ms) as runtime:
        assert rows(await runtime.listing.list_children("p")) == [expected]


# --- damaged child logs ---------------------------------------------------------------------------


def other_format(data: bytes) -> bytes:
    header, _, rest = data.partition(b"\n")
    assert b'"format":1' in header
    return header.replace(b'"format":1', b'"format":2') + b"\n" + rest


def unknown_event(data: bytes) -> bytes:
    seq = data.count(b"\n") - 1  # header line + one line per event
    line = json.dumps({"seq": seq, "type": "vendor/thing", "time": 99, "data": {}}, separators=(",", ":"))
    return data + line.encode() + b"\n"


def ignorable_event(data: bytes) -> bytes:
    seq = data.count(b"\n") - 1
    line = json.dumps(
        {"seq": seq, "type": "vendor/thing", "time": 99, "data": {}, "ignorable": True}, separators=(",", ":")
    )
    return data + line.encode() + b"\n"


def bad_json(data: bytes) -> bytes:
    return data + b"{not json}\n"


DAMAGE_CASES = [
    pytest.param(other_format, diag("c", "unsupported"), id="other-format"),
    pytest.param(unknown_event, diag("c", "unsupported"), id="unknown-event-type"),
    pytest.param(bad_json, diag("c", "corrupt"), id="invalid-json-line"),
    pytest.param(ignorable_event, row("c", "ok"), id="ignorable-unknown-event-is-fine"),
]


@pytest.mark.parametrize(("edit", "expected"), DAMAGE_CASES)
@pytest.mark.parametrize("listed_before", [False, True], ids=["fresh-index", "indexed-then-edited"])
async def test_damaged_child_table(
    place: Place, edit: Callable[[bytes], bytes], expected: dict[str, Any], listed_before: bool
) -> None:
    store = place.store(compression="none")
    child(store, "c", 1, descriptors=[descriptor("ok")])
    child(store, "sibling", 2, descriptors=[descriptor("fine")])
    if listed_before:
        store.list()  # the index (on PostgreSQL the store's own listing cache) knows the undamaged log
    place.rewrite("c", edit)  # files: a new inode, so the index rescans it
    # The index is a file every store reads; PostgreSQL's cache lives in the store that listed.
    reuse = {"log_store": store} if place.is_pg and listed_before else {}
    async with place.open_runtime(compression="none", now_ms=now_ms, **reuse) as runtime:
        assert rows(await runtime.listing.list_children("p")) == [expected, row("sibling", "fine")]
        descendants = rows(await runtime.listing.list_descendants("p"))
        assert descendants == [
            expected | {"parent_id": "p", "depth": 1},
            row("sibling", "fine") | {"parent_id": "p", "depth": 1},
        ]


# --- lifecycle witness ----------------------------------------------------------------------------


async def test_a_header_that_changes_between_corpus_and_read_is_corrupt(place: Place, tmp_path: Path) -> None:
    """The lifecycle witness: the corpus saw one header, the observation another (the log was
    replaced while the listing waited) → corrupt; the sibling is unaffected."""
    base = place.store(compression="none", use_index=False)
    child(base, "c", 1, descriptors=[descriptor("before")])
    child(base, "sibling", 2, descriptors=[descriptor("fine")])
    alt = FileLogStore(str(tmp_path / "alt"), compression="none", use_index=False)
    child(alt, "c", 1, descriptors=[descriptor("after")], cwd="/elsewhere")  # same id and created_at, another cwd
    alt.close_store()

    def replace() -> None:
        if place.url is not None:
            pg_damage.rewrite(place.url, "c", lambda _: log_path(tmp_path / "alt", "c").read_bytes())
        else:
            os.replace(log_path(tmp_path / "alt", "c"), log_path(place.root, "c"))

    faulty = FaultyLogStore(base)
    async with place.open_runtime(log_store=faulty, now_ms=now_ms) as runtime:
        result: list[Any] = []

        async def listing() -> None:
            result.extend(rows(await runtime.listing.list_children("p")))

        faulty.hang("stat", session_id="c")  # the observation's stat waits: the corpus is already taken
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(listing)
                await wait_for(lambda: faulty.calls["stat"] >= 1 and faulty.calls["list"] == 1)
                replace()
                faulty.release()
        finally:
            faulty.release()
        assert result == [diag("c", "corrupt"), row("sibling", "fine")]


# --- grandchildren and read counts ------------------------------------------------------------------


async def test_grandchildren_set_has_children_but_are_never_read(place: Place) -> None:
    base = place.store(use_index=False)  # no checkpoint rung: every cold child is observed
    child(base, "c1", 1, descriptors=[descriptor("one")])
    child(base, "c2", 2, descriptors=[descriptor("two")])
    child(base, "c3", 3, descriptors=[descriptor("three")])
    child(base, "g1", 4, parent="c1", descriptors=[descriptor("grand")])
    child(base, "g2", 5, parent="g1", descriptors=[descriptor("great")])
    child(base, "g3", 6, parent="c3", descriptors=[MALFORMED])  # a damaged-identity grandchild still counts
    faulty = FaultyLogStore(base)
    async with place.open_runtime(log_store=faulty, now_ms=now_ms) as runtime:
        assert rows(await runtime.listing.list_children("p")) == [
            row("c1", "one", has_children=True),
            row("c2", "two"),
            row("c3", "three", has_children=True),
        ]
        assert faulty.calls["open_read"] == 3  # the three direct children, once each; no grandchild
        assert faulty.calls["read"] == 3
        assert faulty.calls["list"] == 1

    faulty = FaultyLogStore(place.store(use_index=False))
    async with place.open_runtime(log_store=faulty, now_ms=now_ms) as runtime:  # a fresh observation cache
        descendants = rows(await runtime.listing.list_descendants("p"))
        assert [(r["id"], r["parent_id"], r["depth"]) for r in descendants] == [
            ("c1", "p", 1),
            ("g1", "c1", 2),
            ("g2", "g1", 3),
            ("c2", "p", 1),
            ("c3", "p", 1),
            ("g3", "c3", 2),
        ]
        assert descendants[1] == row("g1", "grand", has_children=True) | {"parent_id": "c1", "depth": 2}
        assert descendants[-1] == diag("g3", "corrupt") | {"parent_id": "c3", "depth": 2}
        assert faulty.calls["open_read"] == 6  # every descendant, once each
        assert faulty.calls["read"] == 6

    faulty = FaultyLogStore(place.store(use_index=False))
    async with place.open_runtime(log_store=faulty, now_ms=now_ms) as runtime:
        assert rows(await runtime.listing.list_children("c1")) == [row("g1", "grand", has_children=True)]
        # g1, and c1 itself: no checkpoint rung answers for its catalog, so its log is observed
        # (issue 28, "nothing hidden"); g2 (a grandchild of c1) is not read.
        assert faulty.calls["open_read"] == 2


# --- the cold reader's bound ---------------------------------------------------------------------


async def test_at_most_four_cold_reads_in_flight(place: Place) -> None:
    base = place.store(use_index=False)
    count = 9
    for i in range(count):
        child(
            base, f"c{i}", 100 - i if i % 2 else 10 + i, descriptors=[descriptor(f"child {i}")]
        )  # creation order != id order
    faulty = FaultyLogStore(base)
    async with place.open_runtime(log_store=faulty, now_ms=now_ms) as runtime:
        limiter = runtime.query.cold_reader.limiter
        result: list[Any] = []

        async def listing() -> None:
            result.extend(rows(await runtime.listing.list_children("p")))

        faulty.hang("read", times=None)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(listing)
                await wait_for(lambda: faulty.calls["read"] >= 4)
                await trio.testing.wait_all_tasks_blocked()
                assert limiter.borrowed_tokens == 4
                assert faulty.calls["read"] == 4
                assert faulty.calls["open_read"] == 4
                faulty.release()
        finally:
            faulty.release()
        assert limiter.borrowed_tokens == 0
        assert faulty.calls["read"] == count
        expected_order = sorted(range(count), key=lambda i: (100 - i if i % 2 else 10 + i, f"c{i}"))
        assert result == [row(f"c{i}", f"child {i}") for i in expected_order]


async def test_rows_keep_candidate_order_not_completion_order(place: Place) -> None:
    base = place.store(use_index=False)
    for i in range(8):
        child(base, f"c{i}", i + 1, descriptors=[descriptor(f"child {i}")])
    faulty = FaultyLogStore(base)
    # The first two candidates hold two read slots until every later one has finished through
    # the other two: completion order is the reverse of candidate order where it matters.
    faulty.hang("read", session_id="c0")
    faulty.hang("read", session_id="c1")
    result: list[dict[str, Any]] = []
    async with place.open_runtime(log_store=faulty, now_ms=now_ms) as runtime:

        async def listing() -> None:
            result.extend(rows(await runtime.listing.list_children("p")))

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(listing)
                await wait_for(lambda: faulty.calls["read"] >= 8)  # c2..c7 done, c0 and c1 held
                assert result == []
                faulty.release()
        finally:
            faulty.release()
    assert result == [row(f"c{i}", f"child {i}") for i in range(8)]


# --- listing never writes a log ------------------------------------------------------------------------


def digests(place: Place) -> dict[str, str]:
    """Every file of the sessions, or on PostgreSQL every session and batch row, by digest."""
    if place.url is not None:
        found = {}
        for table, key in (("sessions", "id"), ("batches", "session_id, first_seq")):
            for row in pg_damage.sql(place.url, f"SELECT {key}, t::text FROM {table} t ORDER BY {key}"):
                found[f"{table}/{row[:-1]}"] = hashlib.sha256(row[-1].encode()).hexdigest()
        return found
    root = place.root
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((root / "sessions").rglob("*"))
        if p.is_file()
    }


def checkpoint_rows(place: Place) -> list[tuple[Any, ...]]:
    if place.url is not None:
        return pg_damage.checkpoint_rows(place.url)
    path = place.root / "index.sqlite3"
    if not path.exists():
        return []
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT * FROM checkpoints ORDER BY session_id, unit_key").fetchall()


@pytest.mark.parametrize("compression", ["none", "zstd"])
async def test_listing_never_modifies_a_log(place: Place, compression: str) -> None:
    base = place.store(compression=compression)
    child(base, "interrupted", 1, descriptors=[descriptor("open turn")])  # turn/start without turn/end
    child(base, "no-turn", 2, descriptors=[descriptor("quiet")], open_turn=False)
    seeded_child(base, "seeded", 3, inherited=[descriptor("parent's")], own=[descriptor("own")])
    child(base, "g", 4, parent="interrupted", descriptors=[descriptor("grand")])
    base.list()  # the index exists before the listing
    before, rows_before = digests(place), checkpoint_rows(place)
    assert before
    faulty = FaultyLogStore(place.store(compression=compression))
    async with place.open_runtime(log_store=faulty, now_ms=now_ms) as runtime:
        for _ in range(2):
            assert rows(await runtime.listing.list_children("p")) == [
                row("interrupted", "open turn", has_children=True),
                row("no-turn", "quiet"),
                row("seeded", "own"),
            ]
            await runtime.listing.list_descendants("p")
        assert runtime.sessions.list() == []  # no actor was created
    assert faulty.calls["write_checkpoint"] == 0
    assert faulty.calls["append"] == 0 and faulty.calls["open_write"] == 0 and faulty.calls["create"] == 0
    assert digests(place) == before
    # The index is a cache: the first round wrote back what its observations proved (issue 20
    # item 1: one write per listing that observed), and the second answered from those rows.
    assert faulty.calls["write_observed"] == 2 and faulty.calls["read"] == 4
    assert rows_before == []
    assert {r[0] for r in checkpoint_rows(place)} == {"interrupted", "no-turn", "seeded", "g"}


# --- cancellation --------------------------------------------------------------------------------


async def hung_listing(place: Place, count: int = 6) -> FaultyLogStore:
    base = place.store(use_index=False)
    for i in range(count):
        child(base, f"c{i}", i + 1, descriptors=[descriptor(f"child {i}")])
    return FaultyLogStore(base)


LISTINGS: list[Any] = [
    pytest.param(lambda runtime, abort: runtime.listing.list_children("p", abort), id="children"),
    pytest.param(lambda runtime, abort: runtime.listing.list_descendants("p", abort), id="descendants"),
]


@pytest.mark.parametrize("call", LISTINGS)
@pytest.mark.parametrize("fail_after_abort", [False, True], ids=["hang", "read-fails-after-abort"])
async def test_an_abort_during_hung_reads_ends_in_cancelled(
    place: Place, call: Callable[[Runtime, Abort], Awaitable[list[Any]]], fail_after_abort: bool
) -> None:
    faulty = await hung_listing(place)
    async with place.open_runtime(log_store=faulty, now_ms=now_ms) as runtime:
        limiter = runtime.query.cold_reader.limiter
        abort = Abort()
        outcome: list[Any] = []

        async def listing() -> None:
            try:
                outcome.append(await call(runtime, abort))
            except BaseException as exc:
                outcome.append(exc)
                if not isinstance(exc, SubagentError):
                    raise

        faulty.hang("read", times=None)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(listing)
                await wait_for(lambda: faulty.calls["read"] >= 4)
                if fail_after_abort:
                    faulty.fail("open_read", times=None)  # reads not yet started fail once the abort lets them go
                abort.set()
        finally:
            faulty.release()
        assert len(outcome) == 1
        error = outcome[0]
        assert type(error) is SubagentCancelled, error
        assert (error.code, error.message) == ("SUBAGENT_CANCELLED", "subagent listing was cancelled")
        assert limiter.borrowed_tokens == 0
        assert faulty.calls["read"] == 4  # the waiting reads never started


@pytest.mark.parametrize("call", LISTINGS)
async def test_an_enclosing_cancel_scope_surfaces_as_plain_cancelled(
    place: Place, call: Callable[[Runtime, Abort | None], Awaitable[list[Any]]]
) -> None:
    faulty = await hung_listing(place)
    async with place.open_runtime(log_store=faulty, now_ms=now_ms) as runtime:
        limiter = runtime.query.cold_reader.limiter
        scope = trio.CancelScope()
        seen: list[BaseException] = []
        returned: list[Any] = []

        async def listing() -> None:
            with scope:
                try:
                    returned.append(await call(runtime, Abort()))
                except BaseException as exc:
                    seen.append(exc)
                    raise

        faulty.hang("read", times=None)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(listing)
                await wait_for(lambda: faulty.calls["read"] >= 4)
                scope.cancel()
        finally:
            faulty.release()
        assert returned == []
        assert scope.cancelled_caught is True
        assert limiter.borrowed_tokens == 0
        assert faulty.calls["read"] == 4
        assert len(seen) == 1
        assert type(seen[0]) is trio.Cancelled, repr(seen[0])  # SPEC 4: re-raised unchanged, never a group
