"""The file store's read path (issue 20 item 4): `open_read` walks to the session's folder once,
reuses the header an index row parsed only for the very same head bytes, and keeps every error
of the path steps it replaced."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from clocks import T
from events import turn_end_event, turn_start_event
from log_lines import header, log_file, persist_log, read_all, session_folder
from subagents.storage import FileLogStore, OsFs, SessionNotFound, UnsafePath, framing
from subagents.storage import file_store as file_store_module

SID = "s1"


def _store_with_log(root: Path, compression: str = "zstd", created_at: int = T) -> FileLogStore:
    store = FileLogStore(str(root), compression=compression)  # type: ignore[arg-type]  # a literal checked by the store
    persist_log(store, header(SID, created_at), [turn_start_event(0, T), turn_end_event(1, T)])
    return store


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_open_read_walks_to_the_folder_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compression: str) -> None:
    store = _store_with_log(tmp_path, compression)
    opened: list[object] = []
    real_open = os.open

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    handle = store.open_read(SID)
    store.close(handle)
    # The root, sessions/, the session's folder, then the log: four opens (each step used to
    # walk from the root again: ten).
    assert len(opened) == 4, opened
    assert handle.header == header(SID)


def test_an_fs_that_intercepts_opens_still_sees_every_open(tmp_path: Path) -> None:
    _store_with_log(tmp_path)

    class Counting(OsFs):
        def __init__(self, root: str) -> None:
            super().__init__(root)
            self.paths: list[str] = []

        def open(self, path: str, mode: Any) -> Any:
            self.paths.append(path)
            return super().open(path, mode)

    fs = Counting(str(tmp_path))
    store = FileLogStore(fs=fs)
    assert read_all(store, SID) == [turn_start_event(0, T), turn_end_event(1, T)]
    assert [p for p in fs.paths if p.endswith(".zst")] == ["sessions/s1/session.jsonl.zst"] * 2


def test_a_listed_log_is_opened_without_parsing_its_header_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store_with_log(tmp_path)
    store.list()  # the scan parses line 1 and keeps its bytes in the row
    parsed: list[str] = []
    real = framing.decode_header_line

    def counting(line: Any, session_id: str) -> Any:
        parsed.append(session_id)
        return real(line, session_id)

    monkeypatch.setattr(framing, "decode_header_line", counting)
    monkeypatch.setattr(file_store_module, "_read_header_only", _fail_if_called)
    handle = store.open_read(SID)
    assert (handle.header, handle.inherited_event_count) == (header(SID), 0)
    assert store.read(handle) == [turn_start_event(0, T), turn_end_event(1, T)]
    store.close(handle)
    assert parsed == []


def _fail_if_called(*args: Any) -> Any:
    raise AssertionError("line 1 was parsed again")


def test_a_log_whose_head_changed_since_its_row_is_parsed_afresh(tmp_path: Path) -> None:
    """The row's record answers only for the very bytes it was parsed from: a log replaced
    behind the store's back (another header) is read as it is now."""
    store = _store_with_log(tmp_path, created_at=T)
    store.list()
    other = tmp_path / "other"
    _store_with_log(other, created_at=T + 5).close_store()
    log_file(tmp_path, SID, "zstd").write_bytes(log_file(other, SID, "zstd").read_bytes())
    handle = store.open_read(SID)
    assert handle.header == header(SID, T + 5)
    store.close(handle)


def test_the_folder_walk_keeps_the_errors_of_the_path_steps(tmp_path: Path) -> None:
    store = _store_with_log(tmp_path)
    with pytest.raises(SessionNotFound):
        store.open_read("nobody")
    folder = session_folder(tmp_path, SID)
    moved = tmp_path / "elsewhere"
    folder.rename(moved)
    folder.symlink_to(moved)  # a planted link where the folder was: refused, never followed
    with pytest.raises(UnsafePath):
        store.open_read(SID)
