"""One pass per byte on a cold store (issue 28 item 1): a store whose index is gone scans each log
whole to rebuild it, and that scan also folds the events it decoded into the projection units
and writes their checkpoint rows in the same index transaction; a listing then answers its
children from those rows and never decodes their bytes a second time.

Logs are written by hand (the storage layer directly, no runtime), so no checkpoint rows exist
until something writes them, and `index.sqlite3` is deleted before each cold run. Bytes read are
counted through the `Fs` seam (never timed).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from clocks import ticking_ms
from descriptors import descriptor
from events import assistant_event, seed_marker
from listing_rows import rows
from log_lines import header, persist_log, plain_bytes
from subagents.runtime import SUBAGENT_UNITS, ChildRow, open_runtime
from subagents.runtime.hosts.cli import main
from subagents.storage import FileLogStore, LogStore, OsFs, ProjectionRegistry, make_event
from subagents.storage.testing import FaultyLogStore

now_ms = ticking_ms()
TURNS = 40  # turns per child: a log of some KB, so that a second read could not hide in a header's bytes
UNITS = ProjectionRegistry(SUBAGENT_UNITS)
KEYS = [unit.key for unit in SUBAGENT_UNITS]


class CountingFs(OsFs):
    """The real file system, counting the bytes read from each log file."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.read: Counter[str] = Counter()

    def open(self, path: str, mode: Any) -> Any:
        file = super().open(path, mode)
        read = self.read

        class Counted:
            def __getattr__(self, name: str) -> Any:
                return getattr(file, name)

            def pread(self, offset: int, size: int) -> bytes:
                data = file.pread(offset, size)
                if "/session.jsonl" in path:
                    read[path.split("/")[1]] += len(data)
                return data

        return Counted()


@pytest.fixture(params=["none", "zstd"])
def form(request: pytest.FixtureRequest) -> str:
    return request.param


def turns(start: int, n: int) -> list[Any]:
    """`n` completed turns from seq `start`, three events each."""
    out = []
    for t in range(n):
        seq = start + 3 * t
        out.append(make_event(seq, "turn/start", seq + 2, {"turn": t + 1}))
        out.append(assistant_event(seq + 1, seq + 3, turn=t + 1, text="x" * 80))
        out.append(make_event(seq + 2, "turn/end", seq + 4, {"turn": t + 1, "reason": {"kind": "completed"}}))
    return out


def child(store: LogStore, sid: str, parent: str, created_at: int, label: str) -> None:
    events = [make_event(0, "subagent/descriptor", 1, descriptor(label)), *turns(1, TURNS)]
    persist_log(store, header(sid, created_at, origin="subagent", parent_session=parent), events)


def seeded_child(store: LogStore, sid: str, parent: str, created_at: int, label: str) -> None:
    """A fork: its parent's events (an inherited descriptor included), the marker, then its own."""
    seed = [make_event(0, "subagent/descriptor", 1, descriptor("parent's")), *turns(1, 3)]
    own = [make_event(11, "subagent/descriptor", 12, descriptor(label)), *turns(12, TURNS)]
    events = [*seed, seed_marker(10, 11), *own]
    persist_log(store, header(sid, created_at, origin="subagent", parent_session=parent, is_seeded=True), events, 10)


def build(root: Path, form: str) -> dict[str, str]:
    """Parent "p" with four children (one seeded), and an unrelated root "q" with one child:
    id → label of p's children."""
    store = FileLogStore(str(root), compression=form)
    try:
        persist_log(store, header("p", 1), [make_event(0, "turn/start", 2, {"turn": 1})])
        persist_log(store, header("q", 2), [make_event(0, "turn/start", 2, {"turn": 1})])
        labels = {f"c{i}": f"child {i}" for i in range(4)}
        for i, (sid, label) in enumerate(labels.items()):
            (seeded_child if i == 2 else child)(store, sid, "p", 10 + i, label)
        child(store, "qc", "q", 20, "q's")
    finally:
        store.close_store()
    drop_index(root)
    return labels


def drop_index(root: Path) -> None:
    for name in os.listdir(root):
        if name.startswith("index.sqlite3"):
            os.remove(root / name)


def log_size(root: Path, sid: str) -> int:
    (name,) = [n for n in os.listdir(root / "sessions" / sid) if n.startswith("session.jsonl")]
    return (root / "sessions" / sid / name).stat().st_size


def expected(labels: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {
            "kind": "child",
            "id": sid,
            "activity": "inactive",
            "has_children": False,
            "mode": "continuable",
            "label": label,
        }
        for sid, label in labels.items()
    ]


async def children_of_p(root: Path, fs: OsFs, projections: ProjectionRegistry | None) -> tuple[list[Any], Any]:
    """One listing of "p" in a fresh runtime (as a new process would): rows and the store's calls."""
    store = FileLogStore(fs=fs, projections=projections)
    faulty = FaultyLogStore(store)
    try:
        async with open_runtime(root, log_store=faulty, now_ms=now_ms) as runtime:
            found = rows(await runtime.listing.list_children("p"))
    finally:
        store.close_store()
    return found, faulty.calls


def stored_rows(root: Path, ids: list[str]) -> dict[str, list[tuple[str, int, int, Any, int]]]:
    store = FileLogStore(str(root))
    try:
        found = store.read_checkpoint_rows(ids, KEYS) or {}
    finally:
        store.close_store()
    return {sid: sorted((r.key, r.ver, r.seq, r.value(), r.log_offset) for r in rs) for sid, rs in found.items()}


async def test_a_cold_listing_reads_each_childs_bytes_once(tmp_path: Path, form: str) -> None:
    labels = build(tmp_path, form)
    fs = CountingFs(str(tmp_path))
    found, calls = await children_of_p(tmp_path, fs, UNITS)
    assert found == expected(labels)
    # The rebuild's scan is the only read of each child's log: no observation read it again.
    assert calls["read"] == 0 and calls["open_read"] == 0
    for sid in labels:
        size = log_size(tmp_path, sid)
        assert size > 4 * 1024 if form == "none" else size > 1024
        assert fs.read[sid] == size


async def test_without_the_units_the_listing_reads_each_child_twice(tmp_path: Path, form: str) -> None:
    """The contrast that shows the counting seam sees a second read (a store not given the
    runtime's units scans for the index only, and the listing observes every child)."""
    labels = build(tmp_path, form)
    fs = CountingFs(str(tmp_path))
    found, calls = await children_of_p(tmp_path, fs, None)
    assert found == expected(labels)
    assert calls["read"] == len(labels) + 1  # and the parent, for its catalog
    for sid in labels:
        assert fs.read[sid] >= 2 * log_size(tmp_path, sid)


async def test_the_rows_a_rebuild_writes_answer_the_next_listing(tmp_path: Path, form: str) -> None:
    labels = build(tmp_path, form)
    await children_of_p(tmp_path, OsFs(str(tmp_path)), UNITS)
    fs = CountingFs(str(tmp_path))
    found, calls = await children_of_p(tmp_path, fs, UNITS)  # the index is there now
    assert found == expected(labels)
    assert calls["read"] == 0 and calls["open_read"] == 0 and calls["write_observed"] == 0
    assert all(fs.read[sid] == 0 for sid in labels)  # not even a row's head: every revision matched


async def test_a_rebuild_proves_the_rows_an_observation_proves(tmp_path: Path, form: str) -> None:
    """The rows written by the rebuild's fold are those a listing's observation writes back for
    the same logs (every unit, the same seq, value and log offset)."""
    labels = build(tmp_path, form)
    ids = [*labels, "qc", "p", "q"]
    await children_of_p(tmp_path, OsFs(str(tmp_path)), None)  # observed and written back
    observed = stored_rows(tmp_path, list(labels))
    assert all(observed[sid] for sid in labels)
    drop_index(tmp_path)
    await children_of_p(tmp_path, OsFs(str(tmp_path)), UNITS)
    rebuilt = stored_rows(tmp_path, ids)
    assert {sid: rebuilt[sid] for sid in labels} == observed
    assert rebuilt["qc"] and rebuilt["p"] and rebuilt["q"]  # every healthy log scanned whole has them


def test_a_sessions_listing_on_a_cold_store_leaves_the_rows_behind(
    tmp_path: Path, form: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The read-only commands open the store with the runtime's units: `sessions` (which
    observes no child) rebuilds the index, and the children's rows come with it."""
    labels = build(tmp_path, form)
    assert main(["sessions", "--json", "--root", str(tmp_path)]) == 0
    capsys.readouterr()
    found = stored_rows(tmp_path, list(labels))
    for sid in labels:
        keys = {key for key, *_ in found[sid]}
        assert {"subagent", "subagent_catalog", "subagent_flags"} <= keys


# --- a rebuild reads only what the command needs ---------------------------------------------------


def noisy_child(store: LogStore, sid: str, parent: str, created_at: int) -> None:
    """A child whose log does not compress away (so its first line is a small part of it in
    either form)."""
    noise = random.Random(sid)
    events = [make_event(0, "subagent/descriptor", 1, descriptor(sid))]
    for t in range(TURNS):
        seq = 1 + 3 * t
        text = "".join(noise.choice("0123456789abcdef") for _ in range(500))
        events.append(make_event(seq, "turn/start", seq + 2, {"turn": t + 1}))
        events.append(assistant_event(seq + 1, seq + 3, turn=t + 1, text=text))
        events.append(make_event(seq + 2, "turn/end", seq + 4, {"turn": t + 1, "reason": {"kind": "completed"}}))
    persist_log(store, header(sid, created_at, origin="subagent", parent_session=parent), events)


def build_with_others(root: Path, form: str) -> dict[str, str]:
    """`build`'s store, and three more children of "q" (an unrelated subtree)."""
    labels = build(root, form)
    store = FileLogStore(str(root), compression=form)
    try:
        for i in range(3):
            noisy_child(store, f"qn{i}", "q", 30 + i)
    finally:
        store.close_store()
    drop_index(root)
    return labels


async def test_a_cold_children_listing_reads_only_line_1_of_unrelated_logs(tmp_path: Path, form: str) -> None:
    labels = build_with_others(tmp_path, form)
    fs = CountingFs(str(tmp_path))
    store = FileLogStore(fs=fs, projections=UNITS, focus="p")
    try:
        async with open_runtime(tmp_path, log_store=store, now_ms=now_ms) as runtime:
            assert rows(await runtime.listing.list_children("p")) == expected(labels)
            unrelated = {info.id: info for info in store.list() if info.id in ("q", "qc", "qn0", "qn1", "qn2")}
    finally:
        store.close_store()
    for sid in [*labels, "p"]:
        # The children (and p): read whole once, after the head read that found whom line 1 names.
        size = log_size(tmp_path, sid)
        assert size <= fs.read[sid] <= size + 4096
    for i in range(3):
        sid = f"qn{i}"
        assert log_size(tmp_path, sid) > 8192
        assert 0 < fs.read[sid] <= 4096  # its line 1, no more
    assert all(not info.checked and info.header is not None for info in unrelated.values())
    # Never an index row (a later command reads them whole): no rows of theirs were written.
    found = stored_rows(tmp_path, ["q", "qc", "qn0", *labels])
    assert found["q"] == found["qc"] == found["qn0"] == []
    assert all(found[sid] for sid in labels)


async def test_a_focused_store_still_reads_a_stat_whole(tmp_path: Path, form: str) -> None:
    build_with_others(tmp_path, form)
    store = FileLogStore(str(tmp_path), projections=UNITS, focus="p")
    try:
        (listed,) = [info for info in store.list() if info.id == "qn1"]
        assert not listed.checked and listed.event_count == 0
        now = store.stat("qn1")
        assert now is not None and now.checked and now.damage is None and now.event_count == 1 + 3 * TURNS
        (again,) = [info for info in store.list() if info.id == "qn1"]
        assert again == now  # its row now answers
    finally:
        store.close_store()


def damage_after_line_1(root: Path, sid: str) -> None:
    (name,) = [n for n in os.listdir(root / "sessions" / sid) if n.startswith("session.jsonl")]
    path = root / "sessions" / sid / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_children_on_a_cold_store_with_damage_here_and_there(
    tmp_path: Path, form: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI's `children P` opens its store focused on P: a damaged child of P is still its
    diagnostic row; a damaged log of another subtree is not judged by it (nor made a row), and
    the next `sessions` reads it whole and reports it."""
    labels = build_with_others(tmp_path, form)
    damage_after_line_1(tmp_path, "c1")
    damage_after_line_1(tmp_path, "qn1")
    assert main(["children", "p", "--json", "--root", str(tmp_path)]) == 0
    listed = json.loads(capsys.readouterr().out)
    want = expected(labels)
    want[1] = {"kind": "diagnostic", "id": "c1", "reason": "corrupt"}
    # Issue 29: the CLI's rows carry each log's last event's time (read here from its file).
    for row in want:
        if row["kind"] == "child":
            (path,) = (tmp_path / "sessions" / row["id"]).glob("session.jsonl*")
            row["last_event"] = json.loads(plain_bytes(path).splitlines()[-1])["time"]
    assert listed == want
    # Only what the command needed has an index row: not the logs line 1 placed elsewhere.
    assert {"p", *labels} <= index_ids(tmp_path)
    assert not index_ids(tmp_path) & {"q", "qc", "qn0", "qn1", "qn2"}
    assert main(["sessions", "--json", "--root", str(tmp_path)]) == 0
    sessions = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert sessions["qn1"]["damage"] == "corrupt" and sessions["c1"]["damage"] == "corrupt"
    assert sessions["qn0"].get("damage") is None
    assert {"q", "qc", "qn0", "qn1", "qn2"} <= index_ids(tmp_path)


def garble_line_1(root: Path, sid: str) -> None:
    (name,) = [n for n in os.listdir(root / "sessions" / sid) if n.startswith("session.jsonl")]
    path = root / "sessions" / sid / name
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))


def build_tree_with_others(root: Path, form: str) -> None:
    """`build_with_others`' store, plus a grandchild "g" under p's child c1 and one "qg" under q's."""
    build_with_others(root, form)
    store = FileLogStore(str(root), compression=form)
    try:
        noisy_child(store, "g", "c1", 40)
        noisy_child(store, "qg", "qc", 41)
    finally:
        store.close_store()
    drop_index(root)


async def test_a_cold_descendants_listing_reads_only_line_1_outside_the_tree(tmp_path: Path, form: str) -> None:
    """A store focused on p's subtree reads whole p, its children and grandchild (the tree line 1
    names), and only line 1 of q's subtree; the walk lists the grandchild."""
    build_tree_with_others(tmp_path, form)
    fs = CountingFs(str(tmp_path))
    store = FileLogStore(fs=fs, projections=UNITS, focus="p", subtree=True)
    try:
        async with open_runtime(tmp_path, log_store=store, now_ms=now_ms) as runtime:
            listed = await runtime.listing.list_descendants("p")
    finally:
        store.close_store()
    assert [(row.id, row.depth) for row in listed] == [("c0", 1), ("c1", 1), ("g", 2), ("c2", 1), ("c3", 1)]
    assert all(isinstance(row, ChildRow) for row in listed)
    for sid in ["p", "c0", "c1", "c2", "c3", "g"]:
        size = log_size(tmp_path, sid)
        assert size <= fs.read[sid] <= size + 4096
    for sid in ["qn0", "qn1", "qn2", "qg"]:
        assert log_size(tmp_path, sid) > 8192
        assert 0 < fs.read[sid] <= 4096  # its line 1, no more


def test_descendants_on_a_cold_store_with_damage_here_and_there(
    tmp_path: Path, form: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI's `children P --descendants` opens its store focused on P's subtree: a damaged
    grandchild is its diagnostic row, a log whose line 1 is garbled is read whole (a damaged
    log's claim still places it), and a damaged log of another subtree is neither judged nor
    made a row; the next `sessions` reads it whole and reports it."""
    build_tree_with_others(tmp_path, form)
    damage_after_line_1(tmp_path, "g")
    damage_after_line_1(tmp_path, "qg")
    garble_line_1(tmp_path, "qn2")
    assert main(["children", "p", "--descendants", "--json", "--root", str(tmp_path)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(row["id"], row["kind"], row["depth"]) for row in listed] == [
        ("c0", "child", 1),
        ("c1", "child", 1),
        ("g", "diagnostic", 2),
        ("c2", "child", 1),
        ("c3", "child", 1),
    ]
    assert listed[2]["reason"] == "corrupt"
    assert {"p", "c0", "c1", "c2", "c3", "g"} <= index_ids(tmp_path)
    assert not index_ids(tmp_path) & {"q", "qc", "qn0", "qn1", "qg"}
    assert "qn2" in index_ids(tmp_path)  # its line 1 placed it nowhere: read whole, judged
    assert main(["sessions", "--json", "--root", str(tmp_path)]) == 0
    sessions = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert sessions["qg"]["damage"] == "corrupt" and sessions["g"]["damage"] == "corrupt"
    assert {"q", "qc", "qn0", "qn1", "qn2", "qg"} <= index_ids(tmp_path)


def index_ids(root: Path) -> set[str]:
    """The ids the index holds a session row for (read with sqlite3 itself)."""
    with contextlib.closing(sqlite3.connect(root / "index.sqlite3")) as db:
        return {sid for (sid,) in db.execute("SELECT id FROM sessions")}


async def test_open_runtime_gives_its_file_store_the_units(
    tmp_path: Path, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime opened on a folder (chat, run, serve) rebuilds a lost index in one pass too:
    its listing of a cold parent reads no child's log a second time."""
    labels = build(tmp_path, form)
    reads: Counter[str] = Counter()
    for name in ("read", "read_chunks"):
        real = getattr(FileLogStore, name, None)
        if real is None:
            continue

        def counting(self: Any, handle: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            reads[handle.session_id] += 1
            return _real(self, handle, *args, **kwargs)

        monkeypatch.setattr(FileLogStore, name, counting)
    async with open_runtime(tmp_path, now_ms=now_ms, compression=form) as runtime:
        found = rows(await runtime.listing.list_children("p"))
    assert found == expected(labels)
    assert [sid for sid in labels if reads[sid]] == []
