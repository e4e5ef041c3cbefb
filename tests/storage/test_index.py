"""The derived index behind `list()` and `stat()` (SPEC 3.3, the index paragraph).

Every listing here is checked against a full scan of the same logs by a store without an index
(`use_index=False`), and against explicit expectations, so a wrong index and a wrong scan cannot
agree by accident. Logs are changed through the store where a writer would change them and by
hand (bytes written in place, so the inode stays) where the test plays a crash, a rollback or a
user. IO is counted through subclasses of the real `Fs` implementations that wrap every opened
file: `opened` lists the paths opened, `read` the bytes each `pread` returned.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard
from clocks import T
from events import seed_marker
from log_lines import header, header_line, persist_log, rel_log
from subagents.storage import (
    Batch,
    FileLogStore,
    LogInfo,
    Offset,
    OsFs,
    make_event,
)
from subagents.storage._codec import encode_event
from subagents.storage.file_store import _LOG_NAMES
from subagents.storage.forms import Compression
from subagents.storage.index import SCHEMA_VERSION
from subagents.storage.testing import CrashFs, MemoryLogStore

FORMS: tuple[Compression, ...] = ("none", "zstd")
T0 = T + 1
INDEX = "index.sqlite3"
LOG_SUFFIXES = tuple(_LOG_NAMES.values())


# --- counting file systems ------------------------------------------------------------------------


class CountingFile:
    """An opened file that reports the bytes every `pread` returned to its file system."""

    def __init__(self, inner: Any, fs: Counting, path: str) -> None:
        self._inner = inner
        self._fs = fs
        self._path = path

    def pread(self, offset: int, size: int) -> bytes:
        data = self._inner.pread(offset, size)
        self._fs.read[self._path] += len(data)
        self._fs.read_from[self._path].append(offset)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Counting:
    """Mixin over a real `Fs`: records every open and every byte read, per path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opened: list[str] = []
        self.read: Counter[str] = Counter()
        self.read_from: defaultdict[str, list[int]] = defaultdict(list)

    def open(self, path: str, mode: Any) -> Any:
        file = super().open(path, mode)  # type: ignore[misc]  # OsFs.open returns the File it opened
        self.opened.append(path)
        return CountingFile(file, self, path)

    def reset(self) -> None:
        self.opened.clear()
        self.read.clear()
        self.read_from.clear()

    def logs_opened(self) -> list[str]:
        return [path for path in self.opened if path.endswith(LOG_SUFFIXES)]


class CountingOsFs(Counting, OsFs):
    pass


class CountingCrashFs(Counting, CrashFs):
    pass


# --- hand-written bytes -----------------------------------------------------------------------------


def event(seq: int, turn: int = 1, pad: str = "") -> Any:
    """A valid event; with `pad`, one whose size the caller chooses (a summary text)."""
    if pad:
        return make_event(seq, "compaction/summary", T0 + seq, {"text": f"{turn} {pad}"})
    return make_event(seq, "turn/start", T0 + seq, {"turn": turn})


def line(seq: int, turn: int = 1, pad: str = "") -> bytes:
    return encode_event(event(seq, turn, pad))


def lines(start: int, stop: int, turn: int = 1) -> bytes:
    return b"".join(line(seq, turn) for seq in range(start, stop))


def noise(n: int, salt: str = "") -> str:
    """`n` characters that do not compress well (so a frame's size follows its content's)."""
    out = ""
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(f"{salt}{counter}".encode()).hexdigest()
        counter += 1
    return out[:n]


def padded_line(seq: int, size: int, turn: int = 1) -> bytes:
    """One valid event line of exactly `size` bytes."""
    base = len(line(seq, turn, pad="x")) - 1
    out = line(seq, turn, pad="x" * (size - base))
    assert len(out) == size, (seq, size)
    return out


def frame(content: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True).compress(content)


def frame_of_size(seq: int, size: int, count: int = 1, *, unlike: bytes = b"") -> bytes:
    """One frame of valid lines `seq..seq+count-1`, exactly `size` bytes long, other than `unlike`.

    Frame sizes depend on how the content compresses, so candidates are tried until one fits:
    the turn numbers vary in value and width, then the first event becomes a summary whose text
    grows.
    """

    def rest(turn: int) -> bytes:
        return b"".join(line(s, turn=turn) for s in range(seq + 1, seq + count))

    def candidates() -> Iterator[bytes]:
        for width in range(1, 19):
            for j in range(1, 300):
                digits = str(j) + hashlib.sha256(str(j).encode()).hexdigest().translate(_DIGITS)
                turn = max(1, int(digits[:width]))
                yield line(seq, turn=turn) + rest(turn)
                yield line(seq, turn=turn) + rest(1)
        for n in range(1, 8 * size):
            yield line(seq, pad=noise(n)) + rest(1)

    for content in candidates():
        found = frame(content)
        if len(found) == size and found != unlike:
            return found
    raise AssertionError(f"no frame of {size} bytes for seq {seq}")


_DIGITS = str.maketrans("abcdef", "123456")


def framed(compression: Compression, chunk: bytes) -> bytes:
    """`chunk` (whole lines) as the bytes one append adds in the given form."""
    return chunk if compression == "none" else frame(chunk)


def same_head_size(compression: Compression, created_at: int) -> bool:
    """Whether a header with `created_at` takes as many bytes as the usual one."""
    return len(framed(compression, header_line("s", created_at))) == len(framed(compression, header_line("s")))


def log_bytes(compression: Compression, head: bytes, *chunks: bytes) -> bytes:
    return b"".join(framed(compression, part) for part in (head, *chunks))


def garbage_record(compression: Compression) -> bytes:
    return framed(compression, b"not json at all\n")


# --- stores and roots -------------------------------------------------------------------------------


class Disk:
    """Back-door access to one root's bytes (a real folder or a `CrashFs`), inode kept."""

    def __init__(self, root: Path | None = None, crash_fs: CrashFs | None = None) -> None:
        self.root = root
        self.crash_fs = crash_fs

    def read(self, rel: str) -> bytes:
        if self.crash_fs is not None:
            return self.crash_fs.read_bytes(rel)
        assert self.root is not None
        return (self.root / rel).read_bytes()

    def put(self, rel: str, data: bytes) -> None:
        """Replace the file's content in place (same inode)."""
        if self.crash_fs is not None:
            self.crash_fs.write_bytes(rel, data)
            return
        assert self.root is not None
        with open(self.root / rel, "r+b") as f:
            f.truncate(0)
            f.write(data)

    def add(self, rel: str, data: bytes) -> None:
        self.put(rel, self.read(rel) + data)

    def cut(self, rel: str, size: int, then: bytes = b"") -> None:
        """Truncate to `size` and write `then` after it, as a rolled-back writer and its retry would."""
        self.put(rel, self.read(rel)[:size] + then)

    def size(self, rel: str) -> int:
        return len(self.read(rel))

    def reference(self) -> list[LogInfo]:
        """A full scan without any index: what every listing must say."""
        if self.crash_fs is not None:
            return FileLogStore(fs=self.crash_fs, use_index=False).list()
        return FileLogStore(str(self.root), use_index=False).list()


@pytest.fixture
def closing() -> Iterator[Callable[[FileLogStore], FileLogStore]]:
    """Registers stores whose index connection is released at teardown."""
    stores: list[FileLogStore] = []

    def register(store: FileLogStore) -> FileLogStore:
        stores.append(store)
        return store

    yield register
    for store in stores:
        store.close_store()


def publish(store: FileLogStore, sid: str, count: int, created_at: int = T) -> None:
    persist_log(store, header(sid, created_at), [event(seq) for seq in range(count)])


def append(store: FileLogStore, sid: str, count: int) -> int:
    """Open for writing (which repairs a torn tail), append `count` events; returns the new count."""
    handle = store.open_write(sid)
    try:
        first = handle.next_seq
        return store.append(handle, [Batch(first, [event(seq) for seq in range(first, first + count)])])
    finally:
        store.close(handle)


def append_elsewhere(store: FileLogStore, sid: str, count: int) -> int:
    """`append` through another store over the same files, as another process writes: the
    listing store then meets the grown log (its own appends keep its row in step instead, so
    it never scans them: test_written_rows.py)."""
    writer = type(store)(fs=store.fs, compression=store.compression)
    try:
        return append(writer, sid, count)
    finally:
        writer.close_store()


def by_id(infos: list[LogInfo]) -> dict[str, LogInfo]:
    return {info.id: info for info in infos}


def index_db(root: Path) -> sqlite3.Connection:
    return sqlite3.connect(root / INDEX, isolation_level=None)


def index_ids(root: Path) -> set[str]:
    conn = index_db(root)
    try:
        return {row[0] for row in conn.execute("SELECT id FROM sessions")}
    finally:
        conn.close()


def plant_checkpoint(root: Path, sid: str, unit: str = "unit") -> None:
    conn = index_db(root)
    try:
        conn.execute(
            "INSERT INTO checkpoints (session_id, unit_key, ver, seq, val, log_offset, lifecycle, crc) "
            "VALUES (?, ?, 1, 0, ?, 0, ?, 0)",
            (sid, unit, b"{}", b"[]"),
        )
    finally:
        conn.close()


def checkpoint_ids(root: Path) -> set[str]:
    conn = index_db(root)
    try:
        return {row[0] for row in conn.execute("SELECT session_id FROM checkpoints")}
    finally:
        conn.close()


def integrity(root: Path) -> list[tuple[Any, ...]]:
    conn = index_db(root)
    try:
        return conn.execute("PRAGMA integrity_check").fetchall()
    finally:
        conn.close()


def user_version(root: Path) -> int:
    conn = index_db(root)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


Expected = tuple[int, str | None, int, int] | None  # (event_count, damage, created_at, format)


def healthy(count: int) -> Expected:
    return (count, None, T, 1)


def expect(infos: dict[str, LogInfo | None], table: dict[str, Expected]) -> None:
    """`table`: id → what its row says, or None for "not listed"."""
    got: dict[str, Expected] = {}
    for sid in table:
        info = infos.get(sid)
        if info is None:
            got[sid] = None
        else:
            assert info.header is not None, sid
            got[sid] = (info.event_count, info.damage, info.header.created_at, info.header.format)
    assert got == table


# --- new, changed, deleted and damaged logs, through a warm and a cold index ------------------------


@pytest.mark.parametrize("via", ["list", "stat"])
@pytest.mark.parametrize("temperature", ["warm", "cold"])
@pytest.mark.parametrize("compression", FORMS)
def test_changes_are_noticed_through_warm_and_cold_index(
    tmp_path: Path, compression: Compression, temperature: str, via: str, closing: Callable[..., FileLogStore]
) -> None:
    disk = Disk(tmp_path)
    writer = FileLogStore(str(tmp_path), compression=compression, use_index=False)
    warm = closing(FileLogStore(str(tmp_path), compression=compression))
    ids = ["a", "b", "c", "d"]

    def observe() -> dict[str, LogInfo | None]:
        store = warm if temperature == "warm" else closing(FileLogStore(str(tmp_path)))
        if via == "list":
            listed = store.list()
            assert [info.id for info in listed] == sorted(info.id for info in listed)
            return dict(by_id(listed))
        return {sid: store.stat(sid) for sid in ids}

    def check(table: dict[str, Expected]) -> None:
        seen = observe()
        reference = by_id(disk.reference())
        assert {sid: info for sid, info in seen.items() if info is not None} == reference
        expect(seen, table)
        # The observer saved what it found: a cold store now answers from rows alone.
        fs = CountingOsFs(str(tmp_path))
        fresh = closing(FileLogStore(fs=fs))
        assert by_id(fresh.list()) == reference
        assert fs.logs_opened() == []
        for sid in ids:
            assert fresh.stat(sid) == reference.get(sid)
        assert fs.logs_opened() == []
        # Rows are kept exactly for the listed logs: vanished ones lost theirs.
        assert index_ids(tmp_path) == set(reference)

    for sid, count in (("a", 2), ("b", 3), ("c", 1)):
        publish(writer, sid, count)
    check({"a": healthy(2), "b": healthy(3), "c": healthy(1), "d": None})

    # New.
    publish(writer, "d", 4)
    check({"a": healthy(2), "b": healthy(3), "c": healthy(1), "d": healthy(4)})

    # Appended (twice, in two durable appends).
    append(writer, "a", 2)
    append(writer, "a", 1)
    check({"a": healthy(5), "b": healthy(3), "c": healthy(1), "d": healthy(4)})

    # Deleted: b's whole folder.
    shutil.rmtree(tmp_path / "sessions" / "b")
    check({"a": healthy(5), "b": None, "c": healthy(1), "d": healthy(4)})

    # Damaged: a complete record that is not JSON after a's events; d's header names format 2.
    a_log, d_log = rel_log("a", compression), rel_log("d", compression)
    a_healthy = disk.size(a_log)
    disk.add(a_log, garbage_record(compression))
    d_old = disk.read(d_log)
    d_head = framed(compression, header_line("d"))
    assert d_old.startswith(d_head)
    d_new_head = framed(compression, header_line("d").replace(b'"format":1', b'"format":2', 1))
    disk.put(d_log, d_new_head + d_old[len(d_head) :])
    a_damaged, d_damaged = (5, "corrupt", T, 1), (0, "unsupported", T, 2)
    check({"a": a_damaged, "b": None, "c": healthy(1), "d": d_damaged})

    # Healthy again: the damage is cut away, then the log grows; d is restored.
    disk.cut(a_log, a_healthy)
    disk.put(d_log, d_old)
    check({"a": healthy(5), "b": None, "c": healthy(1), "d": healthy(4)})
    append(writer, "a", 3)
    check({"a": healthy(8), "b": None, "c": healthy(1), "d": healthy(4)})


@pytest.mark.parametrize("via", ["list", "stat"])
@pytest.mark.parametrize("compression", FORMS)
def test_a_vanished_log_loses_its_rows_even_when_its_folder_stays(
    tmp_path: Path, compression: Compression, via: str, closing: Callable[..., FileLogStore]
) -> None:
    """A log removed from a folder that stays (an unpublished session again) has vanished too."""
    store = closing(FileLogStore(str(tmp_path), compression=compression))
    publish(store, "a", 2)
    publish(store, "c", 1)
    assert [info.id for info in store.list()] == ["a", "c"]
    plant_checkpoint(tmp_path, "a")
    plant_checkpoint(tmp_path, "c")
    os.unlink(tmp_path / rel_log("c", compression))
    assert (tmp_path / "sessions" / "c" / "lock").exists()
    if via == "list":
        assert [info.id for info in store.list()] == ["a"]
    else:
        assert store.stat("c") is None
    assert index_ids(tmp_path) == {"a"}
    assert checkpoint_ids(tmp_path) == {"a"}


# --- a replaced log ---------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", ["warm", "cold"])
@pytest.mark.parametrize("compression", FORMS)
def test_a_log_replaced_by_another_file_is_rescanned_whole_and_forgets_checkpoints(
    tmp_path: Path, compression: Compression, temperature: str, closing: Callable[..., FileLogStore]
) -> None:
    fs = CountingOsFs(str(tmp_path))
    first = closing(FileLogStore(fs=fs, compression=compression))
    publish(first, "s", 3)
    publish(first, "t", 2)
    assert [(i.id, i.event_count) for i in first.list()] == [("s", 3), ("t", 2)]
    plant_checkpoint(tmp_path, "s", "alpha")
    plant_checkpoint(tmp_path, "s", "beta")
    plant_checkpoint(tmp_path, "t", "alpha")

    # A different valid log whose prefix has the same length (tempting an incremental scan),
    # published beside the old one and renamed over it: a new inode, guaranteed.
    path = tmp_path / rel_log("s", compression)
    old_inode = path.stat().st_ino
    new_created = T + 1
    replacement = log_bytes(compression, header_line("s", new_created), lines(0, 3), lines(3, 6, turn=2))
    assert same_head_size(compression, new_created)
    temp = path.parent / "replacement.tmp"
    temp.write_bytes(replacement)
    os.replace(temp, path)
    assert path.stat().st_ino != old_inode

    observer = first if temperature == "warm" else closing(FileLogStore(fs=fs))
    fs.reset()
    infos = by_id(observer.list())
    assert infos == by_id(Disk(tmp_path).reference())
    s = infos["s"]
    assert s.header == header("s", new_created)
    assert (s.event_count, s.damage, s.revision.inode) == (6, None, path.stat().st_ino)
    assert fs.logs_opened() == [rel_log("s", compression)]
    assert fs.read_from[rel_log("s", compression)][0] == 0
    assert fs.read[rel_log("s", compression)] >= len(replacement)
    assert checkpoint_ids(tmp_path) == {"t"}


@pytest.mark.parametrize("temperature", ["warm", "cold"])
@pytest.mark.parametrize("compression", FORMS)
def test_a_log_rewritten_in_place_is_listed_from_its_own_bytes(
    tmp_path: Path, compression: Compression, temperature: str, closing: Callable[..., FileLogStore]
) -> None:
    """Same inode, more bytes, but not the same log: its header must come from its own bytes.

    A different valid log is written over the old file by hand (the inode stays). It has a
    header of the same length and more events of the same sizes, so the bytes after the old
    row's scan end start a record whose seq continues the old count. Deleting a log and
    publishing the id again lands here too whenever the file system hands the new file the
    freed inode (ext4 often does at once).
    """
    store = closing(FileLogStore(str(tmp_path), compression=compression))
    publish(store, "s", 3)
    assert [(i.id, i.event_count) for i in store.list()] == [("s", 3)]
    path = tmp_path / rel_log("s", compression)
    inode = path.stat().st_ino
    new_created = T + 1
    assert same_head_size(compression, new_created)
    rewritten = log_bytes(compression, header_line("s", new_created), lines(0, 3), lines(3, 6))
    Disk(tmp_path).put(rel_log("s", compression), rewritten)
    assert path.stat().st_ino == inode
    observer = store if temperature == "warm" else closing(FileLogStore(str(tmp_path)))
    infos = observer.list()
    assert infos == Disk(tmp_path).reference()
    assert [(i.header, i.event_count, i.damage) for i in infos] == [(header("s", new_created), 6, None)]
    assert observer.stat("s") == infos[0]


# --- a listing opens only logs whose revision changed -----------------------------------------------


@pytest.mark.parametrize("kind", ["file", "memory"])
@pytest.mark.parametrize("compression", FORMS)
def test_listing_opens_only_changed_logs_and_reads_only_new_bytes(
    tmp_path: Path, compression: Compression, kind: str, closing: Callable[..., FileLogStore]
) -> None:
    fs: CountingOsFs | CountingCrashFs
    if kind == "file":
        fs = CountingOsFs(str(tmp_path))
        store = closing(FileLogStore(fs=fs, compression=compression))
        disk = Disk(tmp_path)
    else:
        fs = CountingCrashFs()
        store = closing(MemoryLogStore(fs=fs, compression=compression))
        disk = Disk(crash_fs=fs)
    for sid, count in (("a", 2), ("b", 3), ("c", 4)):
        publish(store, sid, count)

    fs.reset()
    first = store.list()
    assert sorted(fs.logs_opened()) == sorted(rel_log(sid, compression) for sid in "abc")

    fs.reset()
    opens = fs.counts["open"] if isinstance(fs, CrashFs) else None
    assert store.list() == first
    assert store.stat("a") == first[0]
    assert fs.logs_opened() == [] and sum(fs.read.values()) == 0
    if isinstance(fs, CrashFs):
        assert fs.counts["open"] == opens

    b_log = rel_log("b", compression)
    before = disk.size(b_log)
    append_elsewhere(store, "b", 2)
    after = disk.size(b_log)
    fs.reset()
    opens = fs.counts["open"] if isinstance(fs, CrashFs) else None
    third = store.list()
    assert fs.logs_opened() == [b_log]
    if isinstance(fs, CrashFs):
        assert fs.counts["open"] == opens + 1
    # The appended bytes, read from where the indexed ones end, and besides only what proves
    # the file is still the same log (its header record and the 32-byte anchor before the
    # indexed end): never the events already indexed.
    head = len(framed(compression, header_line("b")))
    assert before in fs.read_from[b_log]
    assert after - before <= fs.read[b_log] <= after - before + head + 32
    assert fs.read[b_log] < after
    assert third == disk.reference()
    assert [(i.id, i.event_count) for i in third] == [("a", 2), ("b", 5), ("c", 4)]

    fs.reset()
    assert store.list() == third
    assert store.stat("b") == third[1]
    assert fs.logs_opened() == []

    if kind == "file":
        cold_fs = CountingOsFs(str(tmp_path))
        cold = closing(FileLogStore(fs=cold_fs))
        assert cold.list() == third
        assert cold_fs.logs_opened() == []


# --- incremental scans agree with full scans ----------------------------------------------------------


def _store_and_disk(
    kind: str, tmp_path: Path, compression: Compression
) -> tuple[FileLogStore, Disk, CountingOsFs | CountingCrashFs]:
    fs: CountingOsFs | CountingCrashFs
    if kind == "file":
        fs = CountingOsFs(str(tmp_path))
        return FileLogStore(fs=fs, compression=compression), Disk(tmp_path), fs
    fs = CountingCrashFs()
    return MemoryLogStore(fs=fs, compression=compression), Disk(crash_fs=fs), fs


def big_torn_frame(first: int, count: int) -> tuple[bytes, int]:
    """A frame of `count` long lines from seq `first`, cut inside its last block.

    Returns the torn bytes and how many lines its complete blocks hold (the recovered events).
    """
    content = b"".join(line(seq, pad=noise(200, str(seq))) for seq in range(first, first + count))
    whole = frame(content)
    torn = whole[: len(whole) - 1000]
    partial = zstandard.ZstdDecompressor().decompressobj().decompress(torn)
    recovered = partial[: partial.rfind(b"\n") + 1].count(b"\n")
    assert 0 < recovered < count  # the frame spans several blocks and the cut keeps some
    return torn, recovered


@pytest.mark.parametrize("kind", ["file", "memory"])
@pytest.mark.parametrize("compression", FORMS)
def test_incremental_scans_agree_with_full_scans_across_torn_tails(
    tmp_path: Path, compression: Compression, kind: str, closing: Callable[..., FileLogStore]
) -> None:
    store, disk, fs = _store_and_disk(kind, tmp_path, compression)
    closing(store)
    log = rel_log("s", compression)
    publish(store, "s", 2)
    publish(store, "other", 1)

    def listing(count: int, incremental: bool = False) -> None:
        size = disk.size(log)
        fs.reset()
        infos = store.list()
        read = fs.read[log]
        assert infos == disk.reference()
        assert [(i.id, i.event_count, i.damage) for i in infos] == [("other", 1, None), ("s", count, None)]
        if incremental:
            assert 0 < read < size

    listing(2)
    count = 2
    for extra in (1, 2, 3):  # several durable appends (by another writer), listing between them
        count = append_elsewhere(store, "s", extra)
        listing(count, incremental=True)
    assert count == 8

    # A torn tail: an incomplete line, or a frame cut short whose complete blocks hold lines.
    if compression == "none":
        disk.add(log, line(count)[:25])
        listing(count, incremental=True)
        disk.add(log, b"\x00" * 300)  # then NUL padding a crash can leave
        listing(count)
        count = append(store, "s", 2)  # the writer cuts the tail, then appends
        listing(count)
        disk.add(log, line(count)[:-1])  # a whole line but its newline
        listing(count)
        disk.add(log, b"\n")  # completed: now an event
        count += 1
        listing(count, incremental=True)
    else:
        torn, recovered = big_torn_frame(count, 3000)
        disk.add(log, torn)
        listing(count + recovered, incremental=True)
        count = append(store, "s", 2)  # the writer re-frames the recovered lines, then appends
        assert count == 8 + recovered + 2
        listing(count)
        disk.add(log, frame(line(count))[:-7])  # a small frame cut short: nothing to recover
        listing(count)
        disk.add(log, b"\x00" * 300)
        listing(count)
        count = append(store, "s", 1)
        listing(count)
    count = append_elsewhere(store, "s", 4)
    listing(count, incremental=True)


@pytest.mark.parametrize("kind", ["file", "memory"])
@pytest.mark.parametrize("compression", FORMS)
def test_listing_during_a_rollback_stays_correct(
    tmp_path: Path, compression: Compression, kind: str, closing: Callable[..., FileLogStore]
) -> None:
    """Bytes beyond the acknowledged end are listed, then cut and replaced by other bytes.

    A writer whose write failed truncates back and its next append writes something else; a
    listing in between saw the dropped bytes. Each replacement below is built so that a scan
    starting where the earlier listing stopped would go wrong: mid-record, at a record boundary
    whose seq does not continue, or over a prefix of the same size.
    """
    store, disk, _fs = _store_and_disk(kind, tmp_path, compression)
    closing(store)
    log = rel_log("s", compression)
    publish(store, "s", 3)
    n = 3
    acked = disk.size(log)

    def listing(count: int) -> None:
        infos = store.list()
        assert infos == disk.reference()
        assert [(i.id, i.event_count, i.damage, i.header) for i in infos] == [("s", count, None, header("s"))]
        assert store.stat("s") == infos[0]

    listing(n)
    # Unacknowledged records after the end (two events, one append's worth).
    dropped = framed(compression, line(n) + line(n + 1))
    disk.add(log, dropped)
    listing(n + 2)

    # Replaced by other content of the same size.
    if compression == "none":
        same = line(n, turn=7) + line(n + 1, turn=8)
    else:
        same = frame_of_size(n, len(dropped), count=2, unlike=dropped)
    assert len(same) == len(dropped) and same != dropped
    disk.cut(log, acked, same)
    listing(n + 2)
    dropped = same

    # Replaced by a record ending exactly where the listed ones ended, then one more: the bytes
    # after the old scan end start a record, but with seq n+1 where n+2 would continue.
    if compression == "none":
        one = padded_line(n, len(dropped))
    else:
        one = frame_of_size(n, len(dropped))
    assert len(one) == len(dropped)
    disk.cut(log, acked, one + framed(compression, line(n + 1)))
    listing(n + 2)
    dropped = one + framed(compression, line(n + 1))

    # Replaced by fewer events in more bytes: the old scan end falls inside a record.
    longer = framed(compression, line(n, pad=noise(len(dropped) + 40)))
    assert len(longer) > len(dropped)
    disk.cut(log, acked, longer)
    listing(n + 1)

    # Replaced by more events in more bytes.
    more = framed(compression, lines(n, n + 4, turn=3))
    disk.cut(log, acked, more + framed(compression, line(n + 4)))
    listing(n + 5)

    # Cut to a torn record; the writer repairs it and appends.
    disk.cut(log, acked, framed(compression, line(n))[:-5])
    listing(n)
    count = append(store, "s", 3)
    assert count == n + 3
    listing(n + 3)


def test_a_seeded_log_whose_listed_marker_is_replaced_is_reported_corrupt(
    tmp_path: Path, closing: Callable[..., FileLogStore]
) -> None:
    """The seed marker is checked by an incremental scan too (zstd: it can lie after the scan end).

    A listing saw a seeded zstd log whose seed and end-seed marker sit in a torn frame: the
    frame's complete blocks are recovered, so the log is healthy with the marker at seq K, but
    the scan end stays before the torn frame. The torn frame is then replaced by more bytes of
    complete frames in which seq K is a plain event. A full scan reports the log corrupt at
    seq K; so must the listing.
    """
    store = closing(FileLogStore(str(tmp_path), compression="zstd"))
    k = 2
    log = tmp_path / rel_log("s", "zstd")
    log.parent.mkdir(parents=True)
    head = frame(header_line("s", k=k))
    marker = encode_event(seed_marker(k, T0 + k))
    content = b"".join(line(seq, pad=noise(200, str(seq))) for seq in range(k)) + marker
    content += b"".join(line(seq, pad=noise(200, str(seq))) for seq in range(k + 1, k + 3000))
    whole = frame(content)
    torn = whole[: len(whole) - 1000]
    partial = zstandard.ZstdDecompressor().decompressobj().decompress(torn)
    recovered = partial[: partial.rfind(b"\n") + 1].count(b"\n")
    assert k < recovered < 3000 - 1
    log.write_bytes(head + torn)
    first = store.list()
    assert first == Disk(tmp_path).reference()
    assert (first[0].damage, first[0].inherited_event_count, first[0].event_count) == (None, k, recovered)

    replaced = frame(lines(0, k + 1))
    replaced += frame(b"".join(line(seq, pad=noise(200, str(seq))) for seq in range(k + 1, k + 3100)))
    assert len(head) + len(replaced) > len(head) + len(torn)  # it grew: the scan may continue
    with open(log, "r+b") as f:
        f.truncate(len(head))
        f.seek(len(head))
        f.write(replaced)
    reference = Disk(tmp_path).reference()
    assert (reference[0].damage, reference[0].event_count) == ("corrupt", k)
    assert store.list() == reference
    assert closing(FileLogStore(str(tmp_path))).list() == reference


# --- the index is a cache ---------------------------------------------------------------------------


def _populate(store: FileLogStore) -> list[LogInfo]:
    publish(store, "a", 2)
    publish(store, "b", 3)
    append(store, "b", 1)
    listed = store.list()
    assert [(i.id, i.event_count) for i in listed] == [("a", 2), ("b", 4)]
    return listed


@pytest.mark.parametrize("open_meanwhile", [False, True])
@pytest.mark.parametrize("compression", FORMS)
def test_deleting_the_index_loses_nothing(
    tmp_path: Path, compression: Compression, open_meanwhile: bool, closing: Callable[..., FileLogStore]
) -> None:
    first = closing(FileLogStore(str(tmp_path), compression=compression))
    listed = _populate(first)
    assert (tmp_path / INDEX).exists()
    plant_checkpoint(tmp_path, "a")
    if not open_meanwhile:
        first.close_store()
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / (INDEX + suffix)).unlink(missing_ok=True)

    second = closing(FileLogStore(str(tmp_path), compression=compression))
    assert second.list() == listed
    assert second.stat("b") == listed[1]
    assert index_ids(tmp_path) == {"a", "b"}
    assert integrity(tmp_path) == [("ok",)]
    # The first store, whose index files were deleted under it, still lists right.
    append(second, "a", 1)
    assert [(i.id, i.event_count) for i in first.list()] == [("a", 3), ("b", 4)]


@pytest.mark.parametrize("open_meanwhile", [False, True])
@pytest.mark.parametrize("compression", FORMS)
def test_a_corrupt_index_is_rebuilt_without_an_error(
    tmp_path: Path, compression: Compression, open_meanwhile: bool, closing: Callable[..., FileLogStore]
) -> None:
    first = closing(FileLogStore(str(tmp_path), compression=compression))
    listed = _populate(first)
    if not open_meanwhile:
        first.close_store()
    (tmp_path / INDEX).write_bytes(b"this is not a database, it is garbage " * 200)

    append(first, "a", 1)
    expected = Disk(tmp_path).reference()
    assert [(i.id, i.event_count) for i in expected] == [("a", 3), ("b", 4)]
    store = first if open_meanwhile else closing(FileLogStore(str(tmp_path)))
    assert store.list() == expected
    assert store.stat("a") == expected[0]
    append(first, "b", 2)
    expected = Disk(tmp_path).reference()
    assert store.list() == expected
    store.close_store()
    # Rebuilt: a valid database of this build's schema holding the rows.
    assert integrity(tmp_path) == [("ok",)]
    assert user_version(tmp_path) == SCHEMA_VERSION
    fresh_fs = CountingOsFs(str(tmp_path))
    fresh = closing(FileLogStore(fs=fresh_fs))
    assert fresh.list() == expected
    assert fresh_fs.logs_opened() == []
    assert [(i.id, i.event_count) for i in listed] == [("a", 2), ("b", 4)]


@pytest.mark.parametrize("compression", FORMS)
def test_a_user_version_mismatch_drops_and_rebuilds(
    tmp_path: Path, compression: Compression, closing: Callable[..., FileLogStore]
) -> None:
    first = closing(FileLogStore(str(tmp_path), compression=compression))
    listed = _populate(first)
    plant_checkpoint(tmp_path, "a")
    first.close_store()
    conn = index_db(tmp_path)
    # Another build's schema: a table of the same name with other columns, and its own rows.
    conn.execute("DROP TABLE sessions")
    conn.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, other BLOB)")
    conn.execute("INSERT INTO sessions VALUES ('a', x'00')")
    conn.execute("INSERT INTO sessions VALUES ('ghost', x'00')")
    conn.execute("PRAGMA user_version=999")
    conn.close()

    fs = CountingOsFs(str(tmp_path))
    second = closing(FileLogStore(fs=fs, compression=compression))
    assert second.list() == listed
    assert sorted(fs.logs_opened()) == [rel_log("a", compression), rel_log("b", compression)]
    assert user_version(tmp_path) == SCHEMA_VERSION
    assert index_ids(tmp_path) == {"a", "b"}
    assert checkpoint_ids(tmp_path) == set()
    conn = index_db(tmp_path)
    columns = [row[1] for row in conn.execute("PRAGMA table_info(sessions)")]
    conn.close()
    assert "scan_end" in columns and "other" not in columns
    cold_fs = CountingOsFs(str(tmp_path))
    assert closing(FileLogStore(fs=cold_fs)).list() == listed
    assert cold_fs.logs_opened() == []


def test_an_index_of_schema_4_is_rebuilt_with_each_last_events_time(
    tmp_path: Path, closing: Callable[..., FileLogStore]
) -> None:
    """Schema 5 adds the last event's time; a schema 4 index (rows without it) is dropped and
    rebuilt, so no row lists 0 for a log with events; a garbled `last_time` is a miss."""
    first = closing(FileLogStore(str(tmp_path)))
    persist_log(first, header("a"), [make_event(0, "turn/start", T + 70, {"turn": 1})])
    persist_log(first, header("b"), [make_event(0, "turn/start", T + 90, {"turn": 1})])
    assert sorted((i.id, i.last_time) for i in first.list()) == [("a", T + 70), ("b", T + 90)]
    first.close_store()
    conn = index_db(tmp_path)
    conn.execute("ALTER TABLE sessions DROP COLUMN last_time")
    conn.execute("PRAGMA user_version=4")
    conn.close()
    fs = CountingOsFs(str(tmp_path))
    second = closing(FileLogStore(fs=fs))
    assert sorted((i.id, i.last_time) for i in second.list()) == [("a", T + 70), ("b", T + 90)]
    assert sorted(fs.logs_opened()) == [rel_log("a", "zstd"), rel_log("b", "zstd")]
    assert user_version(tmp_path) == SCHEMA_VERSION == 5
    second.close_store()
    conn = index_db(tmp_path)
    conn.execute("UPDATE sessions SET last_time = 1 WHERE id = 'a'")  # its checksum no longer holds
    conn.close()
    fs = CountingOsFs(str(tmp_path))
    assert sorted((i.id, i.last_time) for i in closing(FileLogStore(fs=fs)).list()) == [("a", T + 70), ("b", T + 90)]
    assert fs.logs_opened() == [rel_log("a", "zstd")]


def _outside_database(path: Path) -> bytes:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE precious (x)")
    conn.execute("INSERT INTO precious VALUES ('keep me')")
    conn.close()
    return path.read_bytes()


@pytest.mark.parametrize("planted", [INDEX, INDEX + "-wal"])
@pytest.mark.parametrize("compression", FORMS)
def test_a_planted_symlink_at_the_index_is_not_followed(
    tmp_path: Path, compression: Compression, planted: str, closing: Callable[..., FileLogStore]
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    target = tmp_path / "outside.db"
    before = _outside_database(target)  # a valid database: sqlite would happily write into it
    os.symlink(target, root / planted)
    outside = sorted(os.listdir(tmp_path))

    store = closing(FileLogStore(str(root), compression=compression))
    publish(store, "a", 2)
    listed = store.list()
    assert listed == Disk(root).reference()
    assert [(i.id, i.event_count) for i in listed] == [("a", 2)]
    append(store, "a", 1)
    listed = store.list()
    assert listed == Disk(root).reference()
    assert [(i.id, i.event_count) for i in listed] == [("a", 3)]
    assert store.stat("a") == listed[0]
    store.close_store()
    cold = closing(FileLogStore(str(root)))
    assert cold.list() == Disk(root).reference()
    cold.close_store()

    assert target.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == outside  # no outside.db-wal / -shm either
    conn = sqlite3.connect(target)
    assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("precious",)]
    conn.close()
    if planted == INDEX:
        assert (root / INDEX).is_symlink()


@pytest.mark.parametrize("broken", [INDEX, INDEX + "-wal"])
@pytest.mark.parametrize("compression", FORMS)
def test_an_index_that_cannot_be_used_is_a_cache_miss(
    tmp_path: Path, compression: Compression, broken: str, closing: Callable[..., FileLogStore]
) -> None:
    (tmp_path / broken).mkdir()
    (tmp_path / broken / "keep").write_bytes(b"x")
    store = closing(FileLogStore(str(tmp_path), compression=compression))
    publish(store, "a", 2)
    publish(store, "b", 1)
    for extra in (0, 1, 2):
        if extra:
            append(store, "b", extra)
        listed = store.list()
        assert listed == Disk(tmp_path).reference()
        assert [(i.id, i.event_count) for i in listed] == [("a", 2), ("b", 1 + extra * (extra + 1) // 2)]
        assert store.stat("b") == listed[1]
        cold = closing(FileLogStore(str(tmp_path)))
        assert cold.list() == listed
        assert cold.stat("a") == listed[0]
    assert (tmp_path / broken / "keep").read_bytes() == b"x"


@pytest.mark.slow
def test_a_locked_index_is_a_cache_miss_and_is_not_deleted(
    tmp_path: Path, closing: Callable[..., FileLogStore]
) -> None:
    """Another connection holds the index's lock (longer than the store's busy timeout).

    "database is locked" is a cache miss: the listing is computed from the logs, and the index
    (a healthy database someone else has open) is left where it is, rows and all.
    """
    store = closing(FileLogStore(str(tmp_path), compression="zstd"))
    listed = _populate(store)
    store.close_store()
    inode = (tmp_path / INDEX).stat().st_ino
    holder = index_db(tmp_path)
    try:
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("COMMIT")  # exclusive locking mode keeps the lock after the transaction
        other = closing(FileLogStore(str(tmp_path)))
        assert other.list() == listed
        other.close_store()
        assert (tmp_path / INDEX).stat().st_ino == inode
        assert {row[0] for row in holder.execute("SELECT id FROM sessions")} == {"a", "b"}
    finally:
        holder.close()
    assert index_ids(tmp_path) == {"a", "b"}
    assert integrity(tmp_path) == [("ok",)]


def test_no_sessions_folder_no_index(tmp_path: Path, closing: Callable[..., FileLogStore]) -> None:
    store = closing(FileLogStore(str(tmp_path)))
    assert store.list() == []
    assert store.stat("nobody") is None
    assert store.list() == []
    assert os.listdir(tmp_path) == []
    memory = MemoryLogStore()
    assert memory.list() == []
    assert memory.stat("nobody") is None

    publish(store, "a", 1)
    assert store.stat("nobody") is None
    assert store.stat("a") == Disk(tmp_path).reference()[0]
    assert store.stat("nobody") is None
    assert [i.id for i in store.list()] == ["a"]
    assert index_ids(tmp_path) == {"a"}


# --- concurrency ---------------------------------------------------------------------------------

ROUNDS = 25
FIRST_OPENS = 30  # races of processes opening a root that has no index yet


def _check_listing(infos: list[LogInfo], seen: dict[str, int], own: str | None, own_count: int) -> None:
    for info in infos:
        assert info.damage is None, info
        assert info.event_count >= seen.get(info.id, 0), (info, seen)
        seen[info.id] = info.event_count
    if own is not None:
        assert seen[own] == own_count


def _remove_index(root: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        (root / (INDEX + suffix)).unlink(missing_ok=True)


def _rebuilds(messages: list[str]) -> list[str]:
    """A healthy index shared by several stores is never taken for an unusable one (and deleted)."""
    return [m for m in messages if "rebuilding" in m]


@pytest.mark.parametrize("compression", FORMS)
def test_two_stores_in_threads_do_not_corrupt_the_index(
    tmp_path: Path,
    compression: Compression,
    closing: Callable[..., FileLogStore],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="subagents.storage")
    publish(FileLogStore(str(tmp_path), compression=compression, use_index=False), "seed", 2)
    errors: list[BaseException] = []

    # Two stores open the index (which does not exist yet) at once, then append and list at once.
    barrier = threading.Barrier(2, timeout=60)

    def worker(name: str, other: str) -> None:
        handle = None
        store = None
        try:
            store = closing(FileLogStore(str(tmp_path), compression=compression))
            seen: dict[str, int] = {}
            for i in range(ROUNDS):
                barrier.wait()
                if handle is None:
                    handle = store.create(header(name))
                store.append(handle, [Batch(Offset(i), [event(i)])])
                if i % 6 == 5:  # a new session now and then, published while the other lists
                    publish(store, f"{name}-{i}", 1 + i % 3)
                _check_listing(store.list(), seen, name, i + 1)
                mine = store.stat(name)
                assert mine is not None and mine.event_count == i + 1
                theirs = store.stat(other)
                if theirs is not None:
                    assert theirs.damage is None and theirs.event_count >= seen.get(other, 0)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            if handle is not None and store is not None:
                store.close(handle)

    threads = [
        threading.Thread(target=worker, args=("left", "right")),
        threading.Thread(target=worker, args=("right", "left")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []

    assert integrity(tmp_path) == [("ok",)]
    reference = Disk(tmp_path).reference()
    counts = {i.id: i.event_count for i in reference}
    assert counts["left"] == counts["right"] == ROUNDS
    assert len(counts) == 3 + 2 * (ROUNDS // 6)
    assert closing(FileLogStore(str(tmp_path))).list() == reference
    conn = index_db(tmp_path)
    rows = dict(conn.execute("SELECT id, event_count FROM sessions").fetchall())
    conn.close()
    assert rows == counts
    assert _rebuilds([r.getMessage() for r in caplog.records]) == []


CHILD = textwrap.dedent(
    """
    import sys

    from subagents.storage import Batch, FileLogStore, SessionHeader, make_event

    root, sid, compression = sys.argv[1], sys.argv[2], sys.argv[3]
    print("ready", flush=True)
    for command in sys.stdin:
        what, _, arg = command.strip().partition(" ")
        if what == "list":  # open the index (which may not exist yet), list, let go of it
            store = FileLogStore(root, compression=compression)
            assert [(i.id, i.event_count) for i in store.list()] == [("seed", 2)]
            store.close_store()
            print("listed", flush=True)
            continue
        assert what == "run", command
        rounds = int(arg)
        store = FileLogStore(root, compression=compression)
        handle = store.create(SessionHeader(id=sid, created_at=1_789_000_000_000))
        seen = {}
        for i in range(rounds):
            event = make_event(i, "turn/start", 1_789_000_000_001 + i, {"turn": 1})
            store.append(handle, [Batch(i, [event])])
            for info in store.list():
                assert info.damage is None, info
                assert info.event_count >= seen.get(info.id, 0), (info, seen)
                seen[info.id] = info.event_count
            assert seen[sid] == i + 1, seen
            assert store.stat(sid).event_count == i + 1
        store.close(handle)
        store.close_store()
        print("done", rounds, flush=True)
        break
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("compression", FORMS)
def test_processes_do_not_corrupt_the_index(
    tmp_path: Path,
    compression: Compression,
    closing: Callable[..., FileLogStore],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="subagents.storage")
    root = tmp_path / "root"
    publish(FileLogStore(str(root), compression=compression, use_index=False), "seed", 2)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    children = ("p1", "p2", "p3")
    # stderr goes to files: a chatty child can never block on a full pipe nobody reads.
    errs = {sid: tmp_path / f"{sid}.stderr" for sid in children}
    procs = []
    for sid in children:
        with open(errs[sid], "wb") as err:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(script), str(root), sid, compression],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                )
            )

    def stderr() -> str:
        return "".join(f"--- {sid}\n{path.read_text()}" for sid, path in errs.items())

    def tell(command: str) -> None:
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(command + "\n")
            proc.stdin.flush()

    def hear(answer: str) -> None:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline() == answer + "\n", stderr()

    try:
        hear("ready")
        # Every child and the parent open a root without an index at once, FIRST_OPENS times.
        for _ in range(FIRST_OPENS):
            tell("list")
            first = FileLogStore(str(root), compression=compression)
            assert [(i.id, i.event_count) for i in first.list()] == [("seed", 2)]
            first.close_store()
            hear("listed")
            _remove_index(root)
        # Then they append and list while the parent lists too, for as long as they run.
        tell(f"run {ROUNDS}")
        parent = closing(FileLogStore(str(root), compression=compression))
        seen: dict[str, int] = {}
        deadline = time.monotonic() + 60
        while any(proc.poll() is None for proc in procs):
            assert time.monotonic() < deadline, "the children did not finish"
            _check_listing(parent.list(), seen, None, 0)
        outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for proc, out in zip(procs, outputs):
        assert (proc.returncode, out) == (0, f"done {ROUNDS}\n"), stderr()
    messages = stderr().splitlines() + [r.getMessage() for r in caplog.records]
    assert _rebuilds(messages) == []

    assert integrity(root) == [("ok",)]
    assert user_version(root) == SCHEMA_VERSION
    reference = Disk(root).reference()
    assert [(i.id, i.event_count, i.damage) for i in reference] == [
        *((sid, ROUNDS, None) for sid in children),
        ("seed", 2, None),
    ]
    assert closing(FileLogStore(str(root))).list() == reference
    assert parent.list() == reference


def test_a_root_that_is_not_a_folder_fails_list_and_stat_with_a_clear_error(tmp_path: Path) -> None:
    from subagents.storage import PersistenceFailed, UnsafePath

    root = tmp_path / "a-file"
    root.write_text("{}")
    store = FileLogStore(str(root), use_index=False)
    for call in (store.list, lambda: store.stat("s")):
        with pytest.raises(PersistenceFailed, match="the store root is not a folder"):
            call()
    sessions_file = tmp_path / "root"
    sessions_file.mkdir()
    (sessions_file / "sessions").write_text("x")
    with pytest.raises(UnsafePath, match="sessions/ is not a folder"):
        FileLogStore(str(sessions_file), use_index=False).list()


@pytest.mark.parametrize("compression", FORMS)
def test_a_seeded_log_of_another_format_lists_its_seed_cut(tmp_path: Path, compression: Compression) -> None:
    """Damaged rows keep line 1's seed cut, so `inherited_event_count` agrees with `is_seeded`
    for an unsupported log as for a corrupt one."""
    sessions = tmp_path / "sessions"
    for sid, fmt, tail in (("other-format", 2, b""), ("corrupt", 1, b"GARBAGE\n")):
        folder = sessions / sid
        folder.mkdir(parents=True)
        head = header_line(sid, k=2).replace(b'"format":1', f'"format":{fmt}'.encode(), 1)
        name = _LOG_NAMES[compression]
        (folder / name).write_bytes(log_bytes(compression, head, line(0) + tail))
    for store in (FileLogStore(str(tmp_path)), FileLogStore(str(tmp_path), use_index=False)):
        rows = {info.id: info for info in store.list()}
        store.close_store()
        assert rows["other-format"].damage == "unsupported"
        for info in rows.values():
            assert info.header is not None and info.header.is_seeded
            assert info.inherited_event_count == 2


@pytest.mark.parametrize("compression", FORMS)
def test_a_read_reuses_the_header_open_read_parsed_only_while_its_bytes_are_the_same(
    tmp_path: Path, compression: Compression
) -> None:
    """`read` skips parsing line 1 again when the log still starts with the bytes `open_read`
    parsed; a log whose header was replaced in between is refused, not read with the old one."""
    from subagents.storage import CorruptLog

    folder = tmp_path / "sessions" / "s"
    folder.mkdir(parents=True)
    path = folder / _LOG_NAMES[compression]
    path.write_bytes(log_bytes(compression, header_line("s"), lines(0, 3)))
    store = FileLogStore(str(tmp_path), use_index=False)
    handle = store.open_read("s")
    assert [e.seq for e in store.read(handle)] == [0, 1, 2]
    store.close(handle)
    handle = store.open_read("s")
    path.write_bytes(log_bytes(compression, header_line("s", created_at=T + 5), lines(0, 3)))
    with pytest.raises(CorruptLog, match="header changed"):
        store.read(handle)
    store.close(handle)
