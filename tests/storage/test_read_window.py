"""`FileLogStore.read_window` (the web console's paged session page, issue 31): a window of a
long log read from where it lies, found by counting line ends, in both file forms and whatever
the batching; None (read as before) for seqs the log does not hold and for bytes that do not
split as expected."""

from __future__ import annotations

from pathlib import Path

import pytest
from log_lines import header
from subagents.storage import Batch, FileLogStore, Offset, make_event

EVENTS = 120


def _store(tmp_path: Path, compression: str, batch: int) -> FileLogStore:
    store = FileLogStore(str(tmp_path), compression=compression)
    handle = store.create(header("long"))
    try:
        for first in range(0, EVENTS, batch):
            events = [
                make_event(s, "x/note", 1000 + s, {"n": s}, ignorable=True)
                for s in range(first, min(first + batch, EVENTS))
            ]
            store.append(handle, [Batch(Offset(first), events)])
    finally:
        store.close(handle)
    return store


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("batch", [1, 7])
@pytest.mark.parametrize(("start", "stop"), [(0, 1), (0, EVENTS), (13, 40), (100, EVENTS), (EVENTS - 1, EVENTS)])
def test_a_window_is_the_events_a_whole_read_gives(
    tmp_path: Path, compression: str, batch: int, start: int, stop: int
) -> None:
    store = _store(tmp_path, compression, batch)
    try:
        handle = store.open_read("long")
        try:
            assert store.read_window(handle, start, stop) == store.read(handle)[start:stop]
        finally:
            store.close(handle)
    finally:
        store.close_store()


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_seqs_past_the_log_are_no_window(tmp_path: Path, compression: str) -> None:
    store = _store(tmp_path, compression, 7)
    try:
        handle = store.open_read("long")
        try:
            assert store.read_window(handle, 100, EVENTS + 1) is None
            assert store.read_window(handle, EVENTS, EVENTS + 5) is None
        finally:
            store.close(handle)
    finally:
        store.close_store()


def test_a_window_over_damaged_lines_is_none(tmp_path: Path) -> None:
    """A line in the window that is no record: no window (a whole read reports the damage)."""
    store = _store(tmp_path, "none", 7)
    try:
        [log] = (tmp_path / "sessions" / "long").glob("session.jsonl")
        lines = log.read_bytes().split(b"\n")
        lines[51] = b'{"seq": 50, "type": garbled'  # line 1 is the header: seq 50 is line 52
        log.write_bytes(b"\n".join(lines))
        handle = store.open_read("long")
        try:
            assert store.read_window(handle, 40, 60) is None
            assert [e.seq for e in store.read_window(handle, 60, 70) or []] == list(range(60, 70))
        finally:
            store.close(handle)
    finally:
        store.close_store()
