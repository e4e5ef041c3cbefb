"""The rows of the logs a store writes follow its appends in memory (issue 20 item 3): a listing
finds each such log at the revision its writer left it and neither opens nor scans it; a change
by anyone else is still a new revision, scanned as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from clocks import T
from events import turn_end_event, turn_start_event
from log_lines import header
from subagents.storage import Batch, FileLogStore, Offset, OsFs, make_event

SID = "s1"


class CountingFs(OsFs):
    """Counts the opens of log files (what a scan of a log needs)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.log_opens = 0

    def open(self, path: str, mode: Any) -> Any:
        if path.endswith((".jsonl", ".zst")):
            self.log_opens += 1
        return super().open(path, mode)


def note(seq: int) -> Any:
    return make_event(seq, "test/note", T + seq, {"n": seq}, ignorable=True)


def counts(store: FileLogStore) -> dict[str, int]:
    return {info.id: info.event_count for info in store.list()}


@pytest.mark.parametrize("watch", [False, True], ids=["stat-pass", "watched"])
def test_a_listing_follows_this_store_s_appends_without_opening_the_log(tmp_path: Path, watch: bool) -> None:
    fs = CountingFs(str(tmp_path))
    store = FileLogStore(fs=fs, watch=watch)
    handle = store.create(header(SID))
    store.append(handle, [Batch(Offset(0), [turn_start_event(0, T), turn_end_event(1, T)])])
    assert counts(store) == {SID: 2}  # the first listing scans the new log
    for seq in range(2, 6):
        fs.log_opens = 0
        store.append(handle, [Batch(Offset(seq), [note(seq)])])
        assert counts(store) == {SID: seq + 1}  # the kept revision changed with the append
        assert fs.log_opens == 0  # ... so the log was neither opened nor scanned
    store.close(handle)
    store.close_store()


def test_the_kept_row_is_right_after_a_resume(tmp_path: Path) -> None:
    fs = CountingFs(str(tmp_path))
    store = FileLogStore(fs=fs, watch=False)
    handle = store.create(header(SID))
    store.append(handle, [Batch(Offset(0), [turn_start_event(0, T)])])
    assert counts(store) == {SID: 1}
    store.close(handle)
    handle = store.open_write(SID)  # a resume in the same process
    assert handle.next_seq == 1
    fs.log_opens = 0
    store.append(handle, [Batch(Offset(1), [note(1), note(2)])])
    assert counts(store) == {SID: 3}
    assert fs.log_opens == 0
    store.close(handle)
    # A new store (a new process) reads the log itself and agrees.
    assert counts(FileLogStore(str(tmp_path), watch=False)) == {SID: 3}
    store.close_store()


@pytest.mark.parametrize("watch", [False, True], ids=["stat-pass", "watched"])
def test_an_append_by_another_process_is_not_answered_from_the_kept_row(tmp_path: Path, watch: bool) -> None:
    fs = CountingFs(str(tmp_path))
    ours = FileLogStore(fs=fs, watch=watch)
    handle = ours.create(header(SID))
    ours.append(handle, [Batch(Offset(0), [turn_start_event(0, T)])])
    assert counts(ours) == {SID: 1}
    assert counts(ours) == {SID: 1}  # a second listing (a watched store sets its watch up here)
    ours.close(handle)  # the lock is free: another process may write now

    other = FileLogStore(str(tmp_path))
    theirs = other.open_write(SID)
    other.append(theirs, [Batch(Offset(1), [note(1), note(2)])])
    other.close(theirs)
    other.close_store()

    fs.log_opens = 0
    assert counts(ours) == {SID: 3}  # another revision: scanned, not answered from our row
    assert fs.log_opens >= 1
    ours.close_store()
