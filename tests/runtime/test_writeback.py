"""Observations feed the checkpoint rung (issue 20 item 1; SPEC 5.4, 5.7): a listing that observes
a cold child in full writes the checkpoint rows it proved for that log revision, once, in one
write after its rows are built, never when it was aborted or cancelled, never for a child it
judged damaged; the next listing answers from those rows without reading a log. A log that
changed since (appended) is observed again. Both stores: the file store's index and the
PostgreSQL checkpoints table. A store the listing may not write still lists.

Children are written by hand (the storage layer directly, no runtime), so no checkpoint rows
exist until a listing writes them.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import trio
import trio.testing
from clocks import ticking_ms
from descriptors import descriptor
from events import seed_marker
from listing_rows import rows
from log_lines import header, persist_log
from subagents.actors import Abort
from subagents.runtime.app import open_runtime
from subagents.runtime.delegation.units import SUBAGENT_UNITS
from subagents.runtime.foundation.errors import SubagentCancelled
from subagents.storage import Batch, FileLogStore, LogStore, Offset, ProjectionRegistry, make_event
from subagents.storage.index import SessionIndex
from subagents.storage.testing import FaultyLogStore

now_ms = ticking_ms()
MALFORMED = {"version": 2, "mode": "continuable", "provider": "spawn"}  # a continuable child needs a label
IDENTITY = "subagent"
Factory = Callable[[], LogStore]


@pytest.fixture(params=["file", "file-zstd", pytest.param("pg", marks=pytest.mark.pg)])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Stores over one root (or database): each call is another store on the same data, as a
    new process would open it."""
    kind, _, form = request.param.partition("-")
    if kind == "pg":
        yield request.getfixturevalue("pg_store_factory")
        return
    opened: list[FileLogStore] = []

    def make() -> LogStore:
        store = FileLogStore(str(tmp_path), compression="zstd" if form else "none")
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close_store()


def child(store: LogStore, sid: str, created_at: int, *, label: str | None = None, data: Any = None) -> None:
    """A persisted child of "p": its descriptor, then a completed turn."""
    events = [
        make_event(0, "subagent/descriptor", 1, data if data is not None else descriptor(label)),
        make_event(1, "turn/start", 2, {"turn": 1}),
        make_event(2, "turn/end", 3, {"turn": 1, "reason": {"kind": "completed"}}),
    ]
    persist_log(store, header(sid, created_at, origin="subagent", parent_session="p"), events)


def parent(store: LogStore) -> None:
    """The parent "p" (the CLI lists only a session it finds)."""
    persist_log(store, header("p", 1), [make_event(0, "turn/start", 2, {"turn": 1})])


def inherited_only(store: LogStore, sid: str, created_at: int) -> None:
    """A seeded child whose only descriptor is its parent's (inherited): no own identity."""
    seed = [
        make_event(0, "subagent/descriptor", 1, descriptor("parent's")),
        make_event(1, "turn/start", 2, {"turn": 1}),
        make_event(2, "turn/end", 3, {"turn": 1, "reason": {"kind": "completed"}}),
    ]
    events = [*seed, seed_marker(3, 4), make_event(4, "turn/start", 5, {"turn": 2})]
    persist_log(store, header(sid, created_at, origin="subagent", parent_session="p", is_seeded=True), events, 3)


def append_descriptor(store: LogStore, sid: str, label: str) -> None:
    """Append a new descriptor to a child's log by hand (its identity changes: last wins)."""
    handle = store.open_write(sid)
    try:
        store.append(
            handle, [Batch(handle.next_seq, [make_event(handle.next_seq, "subagent/descriptor", 9, descriptor(label))])]
        )
    finally:
        store.close(handle)


def row(sid: str, label: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "child", "id": sid, "activity": "inactive", "has_children": False}
    out["mode"] = "continuable"
    if label is not None:
        out["label"] = label
    return out


def diag(sid: str, reason: str = "corrupt") -> dict[str, Any]:
    return {"kind": "diagnostic", "id": sid, "reason": reason}


def identity_rows(store: LogStore, ids: list[str]) -> dict[str, tuple[int, dict[str, Any]]]:
    """The identity checkpoint rows stored for `ids`: id -> (seq, value)."""
    found = store.read_checkpoint_rows(ids, [IDENTITY]) or {}
    return {sid: (r.seq, r.value()) for sid, stored in found.items() for r in stored}


async def list_once(root: Path, store: LogStore, *, descendants: bool = False) -> tuple[list[dict[str, Any]], Any]:
    """One listing of "p" in a fresh runtime over `store` (as a new process would): its rows and
    the store's call counts."""
    faulty = FaultyLogStore(store)
    async with open_runtime(root, log_store=faulty, now_ms=now_ms) as runtime:
        listing = runtime.listing.list_descendants if descendants else runtime.listing.list_children
        found = rows(await listing("p"))
    return found, faulty.calls


# --- once per revision, and the next listing reads no log -------------------------------------


async def test_the_second_listing_answers_from_the_rows_the_first_wrote(tmp_path: Path, make_store: Factory) -> None:
    store = make_store()
    for i in range(5):
        child(store, f"c{i}", 10 + i, label=f"child {i}")
    expected = [row(f"c{i}", f"child {i}") for i in range(5)]
    assert identity_rows(store, [f"c{i}" for i in range(5)]) == {}  # written by hand: no rows

    first, calls = await list_once(tmp_path, make_store())
    assert first == expected
    assert calls["read"] == 5  # every child observed in full
    assert calls["write_observed"] == 1  # one batched write
    written = identity_rows(store, [f"c{i}" for i in range(5)])
    assert written == {
        f"c{i}": (2, {"identity": {"mode": "continuable", "label": f"child {i}", "seq": 0}}) for i in range(5)
    }

    second, calls = await list_once(tmp_path, make_store())
    assert second == expected
    assert calls["read"] == 0 and calls["open_read"] == 0  # no log read in full: the checkpoint rung
    assert calls["write_observed"] == 0  # nothing proved anew: nothing written
    assert identity_rows(store, [f"c{i}" for i in range(5)]) == written


async def test_descendants_write_back_too(tmp_path: Path, make_store: Factory) -> None:
    store = make_store()
    child(store, "c0", 10, label="zero")
    persist_log(
        store,
        header("g0", 11, origin="subagent", parent_session="c0"),
        [make_event(0, "subagent/descriptor", 1, descriptor("grand"))],
    )
    first, calls = await list_once(tmp_path, make_store(), descendants=True)
    assert [(r["id"], r.get("label")) for r in first] == [("c0", "zero"), ("g0", "grand")]
    assert calls["read"] == 2 and calls["write_observed"] == 1
    second, calls = await list_once(tmp_path, make_store(), descendants=True)
    assert second == first and calls["read"] == 0 and calls["write_observed"] == 0


# --- a changed revision is observed again -----------------------------------------------------


async def test_an_appended_log_is_observed_again_and_its_new_revision_written(
    tmp_path: Path, make_store: Factory
) -> None:
    store = make_store()
    child(store, "c0", 10, label="one")
    child(store, "c1", 11, label="steady")
    first, _ = await list_once(tmp_path, make_store())
    assert first == [row("c0", "one"), row("c1", "steady")]

    append_descriptor(store, "c0", "two")  # a new revision of c0, no checkpoint written with it
    second, calls = await list_once(tmp_path, make_store())
    assert second == [row("c0", "two"), row("c1", "steady")]  # never the identity of the old revision
    assert calls["read"] == 1  # c0 only: c1's rows still cover its log whole
    assert calls["write_observed"] == 1
    assert identity_rows(store, ["c0"])["c0"] == (3, {"identity": {"mode": "continuable", "label": "two", "seq": 3}})

    third, calls = await list_once(tmp_path, make_store())
    assert third == second and calls["read"] == 0 and calls["write_observed"] == 0


async def test_rows_a_writer_left_behind_an_append_do_not_answer(tmp_path: Path, make_store: Factory) -> None:
    """Checkpoint rows that lag their log (a writer checkpointed, then appended a new descriptor
    and ended without checkpointing again) answer for a revision that is gone: observed."""
    store = make_store()
    child(store, "c0", 10, label="one")
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    handle = store.open_write("c0")
    try:
        cells = registry.cells(handle.header, handle.inherited_event_count)
        cells.fold(store.read(handle))
        assert store.write_checkpoint(handle, cells.checkpoint())
        events = [make_event(3, "subagent/descriptor", 9, descriptor("two"))]
        store.append(handle, [Batch(Offset(3), events)])
    finally:
        store.close(handle)
    assert identity_rows(store, ["c0"])["c0"][0] == 2  # the rows stop before the new descriptor

    found, calls = await list_once(tmp_path, make_store())
    assert found == [row("c0", "two")]
    assert calls["read"] == 1 and calls["write_observed"] == 1
    assert identity_rows(store, ["c0"])["c0"][0] == 3


def edit_in_place(log: Path, old: bytes, new: bytes) -> None:
    """Replace `old` by `new` (as long) in a log written in place: the same inode, size and
    event count, as an editor that writes in place (or `Place.overwrite`) leaves it. Its mtime
    is moved on too: an edit within the clock tick of the write before it is a revision no
    stat can tell apart (the index's premise), not what these tests are about."""
    assert len(old) == len(new)
    text = log.read_bytes()
    assert text.count(old) == 1
    before = log.stat()
    log.write_bytes(text.replace(old, new))
    after = log.stat()
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    os.utime(log, ns=(after.st_atime_ns, max(after.st_mtime_ns, before.st_mtime_ns + 1_000_000)))


async def test_a_log_edited_in_place_is_listed_with_its_new_identity(tmp_path: Path) -> None:
    """A log edited in place (same inode, header and event count) keeps no checkpoint rows a
    listing's observation wrote for its old content: the next listing observes it again (review
    of issue 20 item 1: its rows once answered with the identity of a revision that is gone)."""
    store = FileLogStore(str(tmp_path), compression="none")
    child(store, "c0", 10, label="one")
    first, calls = await list_once(tmp_path, FileLogStore(str(tmp_path), compression="none"))
    assert first == [row("c0", "one")] and calls["write_observed"] == 1

    edit_in_place(tmp_path / "sessions" / "c0" / "session.jsonl", b'"one"', b'"two"')
    second, calls = await list_once(tmp_path, FileLogStore(str(tmp_path), compression="none"))
    assert second == [row("c0", "two")], (second, dict(calls))
    assert calls["read"] == 1 and calls["write_observed"] == 1  # observed, and its new rows written
    third, calls = await list_once(tmp_path, FileLogStore(str(tmp_path), compression="none"))
    assert third == second and calls["read"] == 0  # the new revision's rows answer
    store.close_store()


async def test_an_edit_seen_first_by_a_store_that_never_knew_the_log(tmp_path: Path) -> None:
    """A long-lived store that loaded the index before the log had a row (it finds the log new,
    so it has no row of its own to compare): its rescan still forgets rows written for another
    revision, so a later store that trusts the row it saves never answers from them."""
    early = FileLogStore(str(tmp_path), compression="none")
    parent(early)
    assert [info.id for info in early.list()] == ["p"]  # the index loaded, no c0 yet
    writer = FileLogStore(str(tmp_path), compression="none")
    child(writer, "c0", 10, label="one")  # by another store: `early` keeps no row of it
    writer.close_store()
    first, _ = await list_once(tmp_path, FileLogStore(str(tmp_path), compression="none"))
    assert first == [row("c0", "one")] and identity_rows(early, ["c0"])

    edit_in_place(tmp_path / "sessions" / "c0" / "session.jsonl", b'"one"', b'"two"')
    assert sorted(info.id for info in early.list()) == ["c0", "p"]  # saves c0's row at the new revision
    assert identity_rows(early, ["c0"]) == {}
    second, _ = await list_once(tmp_path, FileLogStore(str(tmp_path), compression="none"))
    assert second == [row("c0", "two")]
    early.close_store()


async def test_rows_an_index_write_could_not_forget_never_answer(tmp_path: Path) -> None:
    """The rescan of an edited log could not write the index (busy, read-only): the stale rows
    are still stored, and this process ignores them (the log is observed) until a later write
    forgets them; then its new rows are written back."""
    store = FileLogStore(str(tmp_path), compression="none")
    child(store, "c0", 10, label="one")
    await list_once(tmp_path, FileLogStore(str(tmp_path), compression="none"))
    edit_in_place(tmp_path / "sessions" / "c0" / "session.jsonl", b'"one"', b'"two"')

    lister = FileLogStore(str(tmp_path), compression="none")
    index = lister._catalog.index
    assert index is not None
    save, failing = index.save, [True]

    def flaky_save(*args: Any, **kwargs: Any) -> bool:
        return False if failing else save(*args, **kwargs)

    index.save = flaky_save  # type: ignore[method-assign]  # a seam on this instance only
    second, calls = await list_once(tmp_path, lister)
    assert second == [row("c0", "two")] and calls["read"] == 1
    stale = identity_rows(FileLogStore(str(tmp_path), compression="none"), ["c0"])
    assert stale["c0"][1]["identity"]["label"] == "one"  # still stored...
    assert identity_rows(lister, ["c0"]) == {}  # ...and never read here

    failing.clear()
    third, calls = await list_once(tmp_path, lister)
    assert third == [row("c0", "two")] and calls["read"] == 1 and calls["write_observed"] == 1
    fresh = identity_rows(FileLogStore(str(tmp_path), compression="none"), ["c0"])
    assert fresh["c0"][1]["identity"]["label"] == "two"  # forgotten, then the new rows written
    fourth, calls = await list_once(tmp_path, lister)
    assert fourth == third and calls["read"] == 0
    store.close_store()


async def test_no_write_back_for_a_log_edited_between_its_observation_and_the_write(tmp_path: Path) -> None:
    """A listing observed a log; before its write-back the log is edited in place and another
    process's listing rescans it (and saves its row at the new revision). The write-back is
    dropped: its rows would answer for a revision that is gone."""
    store = FileLogStore(str(tmp_path), compression="none")
    child(store, "c0", 10, label="one")
    faulty = FaultyLogStore(FileLogStore(str(tmp_path), compression="none"))
    async with open_runtime(tmp_path, log_store=faulty, now_ms=now_ms) as runtime:
        service = runtime.listing
        inner = service._children

        async def then_edit(parent_id: str, proved: list[Any]) -> list[Any]:
            found = await inner(parent_id, proved)
            assert len(proved) == 1  # proved, not yet written
            edit_in_place(tmp_path / "sessions" / "c0" / "session.jsonl", b'"one"', b'"two"')
            other = FileLogStore(str(tmp_path), compression="none")
            assert [info.id for info in other.list()] == ["c0"]  # rescanned: its row saved
            other.close_store()
            return found

        service._children = then_edit  # type: ignore[method-assign]  # a seam on this instance only
        first = rows(await service.list_children("p"))
    assert first == [row("c0", "one")]  # what it read
    assert faulty.calls["write_observed"] == 1 and identity_rows(store, ["c0"]) == {}  # not written
    second, _ = await list_once(tmp_path, FileLogStore(str(tmp_path), compression="none"))
    assert second == [row("c0", "two")]
    store.close_store()


# --- never for a damaged child ------------------------------------------------------------------


async def test_no_rows_for_a_child_the_listing_judged_damaged(tmp_path: Path, make_store: Factory) -> None:
    store = make_store()
    child(store, "good", 10, label="fine")
    child(store, "malformed", 11, data=MALFORMED)  # observed, no identity: corrupt
    inherited_only(store, "inherited", 12)  # observed, only its parent's identity: corrupt
    ids = ["good", "malformed", "inherited"]
    expected = [row("good", "fine"), diag("malformed"), diag("inherited")]

    first, calls = await list_once(tmp_path, make_store())
    assert first == expected
    assert calls["write_observed"] == 1
    assert set(identity_rows(store, ids)) == {"good"}
    found = store.read_checkpoint_rows(ids) or {}
    assert not found.get("malformed") and not found.get("inherited")  # no row of any unit

    second, calls = await list_once(tmp_path, make_store())
    assert second == expected
    assert calls["read"] == 2  # the damaged ones are observed again (never answered from rows)
    assert calls["write_observed"] == 0  # and nothing is written for them


async def test_no_rows_for_a_damaged_log(tmp_path: Path) -> None:
    store = FileLogStore(str(tmp_path), compression="none")
    child(store, "good", 10, label="fine")
    child(store, "torn", 11, label="was fine")
    log = tmp_path / "sessions" / "torn" / "session.jsonl"
    log.write_bytes(log.read_bytes() + b'{"seq": 3, "type": "turn/start", "time": 4, "data": {"turn": 2}} garbage\n')
    first, calls = await list_once(tmp_path, FileLogStore(str(tmp_path), compression="none"))
    assert first == [row("good", "fine"), diag("torn")]
    assert calls["write_observed"] == 1
    assert set(identity_rows(store, ["good", "torn"])) == {"good"}
    store.close_store()


# --- never on an aborted or cancelled listing -------------------------------------------------


async def test_an_aborted_listing_writes_nothing_and_the_next_writes_once(tmp_path: Path, make_store: Factory) -> None:
    store = make_store()
    for i in range(4):
        child(store, f"c{i}", 10 + i, label=f"child {i}")
    ids = [f"c{i}" for i in range(4)]
    faulty = FaultyLogStore(make_store())
    faulty.hang("read", session_id="c3")  # three children observed, the fourth held
    abort = Abort()
    async with open_runtime(tmp_path, log_store=faulty, now_ms=now_ms) as runtime:
        outcome: list[BaseException] = []

        async def listing() -> None:
            try:
                await runtime.listing.list_children("p", abort)
            except SubagentCancelled as exc:
                outcome.append(exc)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(listing)
                await trio.to_thread.run_sync(faulty.wait_calls, "read", 4)
                abort.set()
        finally:
            faulty.release()
    assert len(outcome) == 1  # CANCELLED, no rows
    assert faulty.calls["write_observed"] == 0
    assert identity_rows(store, ids) == {}  # three children were proved: none written

    found, calls = await list_once(tmp_path, make_store())
    assert found == [row(f"c{i}", f"child {i}") for i in range(4)]
    assert calls["write_observed"] == 1 and set(identity_rows(store, ids)) == set(ids)


async def test_a_cancelled_listing_writes_nothing(tmp_path: Path, make_store: Factory) -> None:
    store = make_store()
    for i in range(3):
        child(store, f"c{i}", 10 + i, label=f"child {i}")
    faulty = FaultyLogStore(make_store())
    faulty.hang("read", session_id="c2")
    async with open_runtime(tmp_path, log_store=faulty, now_ms=now_ms) as runtime:
        with trio.CancelScope() as scope:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(runtime.listing.list_children, "p")
                    await trio.to_thread.run_sync(faulty.wait_calls, "read", 3)
                    scope.cancel()
            finally:
                faulty.release()
        assert scope.cancelled_caught
    assert faulty.calls["write_observed"] == 0
    assert identity_rows(store, ["c0", "c1", "c2"]) == {}

    _, calls = await list_once(tmp_path, make_store())  # the same listing, not cancelled
    assert calls["write_observed"] == 1 and set(identity_rows(store, ["c0", "c1", "c2"])) == {"c0", "c1", "c2"}


async def test_an_abort_set_as_the_rows_are_done_writes_nothing(tmp_path: Path, make_store: Factory) -> None:
    """The abort is looked at once more after the rows are built: set then, the listing is
    CANCELLED and its write-back never happens."""
    store = make_store()
    child(store, "c0", 10, label="zero")
    faulty = FaultyLogStore(make_store())
    abort = Abort()
    async with open_runtime(tmp_path, log_store=faulty, now_ms=now_ms) as runtime:
        service = runtime.listing
        inner = service._children

        async def then_abort(parent_id: str, proved: list[Any]) -> list[Any]:
            found = await inner(parent_id, proved)
            assert len(proved) == 1  # proved, not yet written
            abort.set()
            return found

        service._children = then_abort  # type: ignore[method-assign]  # a seam on this instance only
        with pytest.raises(SubagentCancelled):
            await service.list_children("p", abort)
    assert faulty.calls["write_observed"] == 0 and identity_rows(store, ["c0"]) == {}


# --- a store the listing may not write ----------------------------------------------------------


class _ReadOnlyIndex(SessionIndex):
    """The index as a process without write rights sees it: every write fails (SQLite's own
    `query_only`: "attempt to write a readonly database")."""

    def _connect(self) -> sqlite3.Connection:
        conn = super()._connect()
        conn.execute("PRAGMA query_only=1")
        return conn


async def test_a_read_only_index_still_lists_silently(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    setup = FileLogStore(str(tmp_path), compression="none")
    for i in range(3):
        child(setup, f"c{i}", 10 + i, label=f"child {i}")
    setup.list()  # the index exists (built by an earlier command)
    setup.close_store()
    store = FileLogStore(str(tmp_path), compression="none")
    store._catalog.index = _ReadOnlyIndex(str(tmp_path / "index.sqlite3"))
    expected = [row(f"c{i}", f"child {i}") for i in range(3)]
    with caplog.at_level(logging.INFO, logger="subagents"):
        for _ in range(2):
            found, calls = await list_once(tmp_path, store)
            assert found == expected
            assert calls["write_observed"] == 1  # tried, and skipped
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # silently
    assert identity_rows(FileLogStore(str(tmp_path)), ["c0", "c1", "c2"]) == {}
    store.close_store()


@pytest.mark.slow  # starts a CLI process
def test_children_on_a_root_the_command_may_not_write(tmp_path: Path) -> None:
    """`subagents children` on a root this process may not write (a read-only mount; a
    read-only folder for a user that is not root): the rows, exit 0, nothing on stderr, and
    the index untouched."""
    from cli_process import CLI, clean_env

    root = tmp_path / "root"
    store = FileLogStore(str(root), compression="none")
    parent(store)
    for i in range(3):
        child(store, f"c{i}", 10 + i, label=f"child {i}")
    store.list()  # the index exists, without checkpoint rows
    store.close_store()
    before = {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}
    command = [*CLI, "children", "p", "--json", "--root", str(root)]
    if os.getuid() == 0:
        # Root writes through any mode bits: the root is mounted read-only (in a mount namespace
        # of the command's own).
        command = ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(root), *command]
    else:
        for path in [root, *root.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=clean_env(), timeout=120, check=False)
    finally:
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # the skipped write-back is silent
    assert _listed(result.stdout) == [row(f"c{i}", f"child {i}") for i in range(3)]
    assert {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()} == before
    assert identity_rows(FileLogStore(str(root)), ["c0", "c1", "c2"]) == {}


# --- two processes at once ----------------------------------------------------------------------


@pytest.mark.slow  # starts CLI processes
def test_concurrent_listings_in_two_processes_keep_the_index_whole(tmp_path: Path) -> None:
    from cli_process import CLI, clean_env

    store = FileLogStore(str(tmp_path), compression="none")
    parent(store)
    count = 40
    for i in range(count):
        child(store, f"c{i:02d}", 10 + i, label=f"child {i}")
    store.close_store()
    command = [*CLI, "children", "p", "--json", "--root", str(tmp_path)]
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
        for _ in range(2)
    ]
    expected = [row(f"c{i:02d}", f"child {i}") for i in range(count)]
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        assert _listed(out) == expected
    with sqlite3.connect(tmp_path / "index.sqlite3") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        stored = conn.execute("SELECT session_id, unit_key, seq FROM checkpoints").fetchall()
    # Every child's rows, one whole set each (every unit of the runtime at the log's last seq),
    # and the parent's: since issue 28 a cold parent without rows is read for its catalog and its
    # rows written back like its children's.
    units = {key for sid, key, _ in stored if sid == "c00"}
    assert {IDENTITY, "subagent_catalog"} <= units
    assert sorted(r for r in stored if r[0] == "p") == sorted(("p", key, 0) for key in units)
    assert sorted(r for r in stored if r[0] != "p") == sorted(
        (f"c{i:02d}", key, 2) for i in range(count) for key in units
    )

    async def third() -> None:
        found, calls = await list_once(tmp_path, FileLogStore(str(tmp_path), compression="none"))
        assert found == expected and calls["read"] == 0

    trio.run(third)


@pytest.mark.pg
async def test_a_database_role_without_write_rights_still_lists(
    tmp_path: Path, pg_store_factory: Factory, pg_url: str
) -> None:
    import psycopg
    from subagents.storage import PostgresLogStore

    store = pg_store_factory()
    for i in range(3):
        child(store, f"c{i}", 10 + i, label=f"child {i}")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'wb_reader') THEN "
            "CREATE ROLE wb_reader LOGIN; END IF; END $$"
        )
        conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO wb_reader")
        conn.execute("REVOKE INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public FROM wb_reader")
    parts = urlsplit(pg_url)
    reader_url = urlunsplit(parts._replace(netloc="wb_reader@" + parts.netloc.rpartition("@")[2]))
    with psycopg.connect(reader_url) as conn:  # the role is what the store connects as, and may not write
        assert conn.execute("SELECT current_user").fetchone() == ("wb_reader",)
        assert conn.execute("SELECT has_table_privilege('checkpoints', 'INSERT')").fetchone() == (False,)
    reader = PostgresLogStore(reader_url)
    try:
        expected = [row(f"c{i}", f"child {i}") for i in range(3)]
        for _ in range(2):
            found, calls = await list_once(tmp_path, reader)
            assert found == expected
            assert calls["write_observed"] == 1  # tried, and skipped
    finally:
        reader.close_store()
    assert identity_rows(store, ["c0", "c1", "c2"]) == {}


def _listed(out: str) -> list[dict[str, Any]]:
    """The rows `children --json` printed, each without `last_event` (issue 29: its last event's
    time; tests/runtime/test_listing_liveness.py checks it), which must be an int."""
    rows = json.loads(out)
    assert all(type(r.pop("last_event")) is int for r in rows if r["kind"] == "child")
    return rows
