"""Change notification for followed logs (storage/log_watch.py): the fd is readable after an
append by another store (another process's writer), a publication or a folder that appears
later; it vouches for nothing once events were lost; where inotify cannot vouch, none is given.
"""

from __future__ import annotations

import os
import select
import struct
from pathlib import Path

from subagents.storage import Batch, FileLogStore, LogWatch, SessionHeader, SessionId, make_event
from subagents.storage.testing import MemoryLogStore
from subagents.storage.watch import IN_IGNORED, IN_Q_OVERFLOW, Libc


def _readable(watch: LogWatch) -> bool:
    return bool(select.select([watch.fileno()], [], [], 0)[0])


def _write(store: FileLogStore, sid: str, n: int = 1) -> None:
    handle = store.create(SessionHeader(id=SessionId(sid), created_at=1))
    try:
        store.append(
            handle, [Batch(handle.next_seq, [make_event(i, "compaction/summary", 1, {"text": "x"}) for i in range(n)])]
        )
    finally:
        store.close(handle)


def test_an_append_by_another_store_makes_the_watch_readable(tmp_path: Path) -> None:
    writer = FileLogStore(str(tmp_path), compression="none")
    _write(writer, "a")
    reader = FileLogStore(str(tmp_path), compression="none")
    watch = reader.log_watch()
    assert watch is not None and watch.vouches
    with watch:
        watch.follow(["a", "not-yet"])  # a folder not made yet is no error
        assert not _readable(watch) and not watch.clear()
        handle = writer.open_write("a")
        writer.append(
            handle, [Batch(handle.next_seq, [make_event(handle.next_seq, "compaction/summary", 1, {"text": "x"})])]
        )
        writer.close(handle)
        assert _readable(watch) and watch.clear()
        assert not _readable(watch) and not watch.clear()
        # The later session is watched once `follow` names it again with its folder there.
        _write(writer, "not-yet")
        assert not watch.clear()
        watch.follow(["a", "not-yet"])
        handle = writer.open_write("not-yet")
        writer.append(
            handle, [Batch(handle.next_seq, [make_event(handle.next_seq, "compaction/summary", 1, {"text": "x"})])]
        )
        writer.close(handle)
        assert watch.clear()
        # A session no longer followed raises nothing.
        watch.follow(["not-yet"])
        watch.clear()
        handle = writer.open_write("a")
        writer.append(
            handle, [Batch(handle.next_seq, [make_event(handle.next_seq, "compaction/summary", 1, {"text": "x"})])]
        )
        writer.close(handle)
        assert not watch.clear()
    assert not watch.vouches and not watch.clear()


def test_an_overflowed_queue_stops_it_vouching_and_a_removed_folder_is_watched_again(tmp_path: Path) -> None:
    # The kernel's events, written by hand into a pipe the watch reads.
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        watch = LogWatch(Libc.__new__(Libc), read_fd, str(tmp_path), lambda sid: f"sessions/{sid}")
        watch._wds = {"a": 5, "b": 6}
        os.write(write_fd, struct.pack("iIII", 5, IN_IGNORED, 0, 0))
        assert watch.clear() and watch.vouches
        assert watch._wds == {"b": 6}  # `follow` adds a's successor folder
        os.write(write_fd, struct.pack("iIII", -1, IN_Q_OVERFLOW, 0, 0))
        assert watch.clear() and not watch.vouches
    finally:
        os.close(write_fd)


def test_no_watch_where_inotify_cannot_vouch(tmp_path: Path) -> None:
    assert MemoryLogStore().log_watch() is None  # an in-memory folder
    assert LogWatch.open(str(tmp_path), lambda sid: sid, local=frozenset()) is None  # not a local file system
