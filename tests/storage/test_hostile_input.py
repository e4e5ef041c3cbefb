"""Damage is reported, never raised (issue 13 item 2b), at the storage layer.

(a) Hostile lines in a log — nesting deeper than any decoder's recursion limit, numbers no
    type holds, invalid UTF-8, NUL bytes, a zstd frame that claims a hostile content size —
    make that session corrupt, located by seq or byte offset, in every reader: `read`,
    `open_write`, `stat` and `list()` (the damage scan). Siblings list as they are.
(b) A garbled index (`index.sqlite3`: bytes of the file, or values of its rows) is a cache
    miss: every operation answers what a store without an index answers, and the index says so
    in one warning line at most.
(c) A hypothesis fuzz test does both at random.
"""

from __future__ import annotations

import logging
import sqlite3
import struct
from collections.abc import Callable
from pathlib import Path

import hypothesis.strategies as st
import pytest
import zstandard
from clocks import T
from garble import garble
from hypothesis import HealthCheck, given, settings
from log_lines import header_line, read_all, zstd_frame
from subagents.storage import (
    Batch,
    CorruptLog,
    FileLogStore,
    LogInfo,
    Offset,
    SessionHeader,
    UnsupportedLog,
    make_event,
)
from subagents.storage.projection import CheckpointRow

INDEX = "index.sqlite3"


def line(data: bytes, *, seq: int = 0, type_: str = "turn/start", extra: bytes = b"") -> bytes:
    return b'{"seq":%d,"type":"%s","time":1%s,"data":%s}\n' % (seq, type_.encode(), extra, data)


GOOD = line(b'{"turn":1}')
DEEP_1K = b'{"turn":1,"x":' + b"[" * 1_000 + b"]" * 1_000 + b"}"
DEEP_100K = b'{"turn":1,"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"

# name: (the log's lines after the header, the seq the damage is at)
HOSTILE_LINES: dict[str, tuple[bytes, int]] = {
    "deep-1k-in-data": (GOOD + line(DEEP_1K, seq=1), 1),
    "deep-100k-in-data": (GOOD + line(DEEP_100K, seq=1), 1),
    "deep-100k-unclosed": (line(b'{"turn":1,"x":' + b"[" * 100_000 + b"}"), 0),
    "deep-in-an-ignorable-unknown-type": (line(DEEP_100K, type_="x/later", extra=b',"ignorable":true'), 0),
    "deep-descriptor": (line(b'{"x":' + b'{"y":' * 5_000 + b"1" + b"}" * 5_001, type_="subagent/descriptor"), 0),
    "deep-in-seq": (
        b'{"seq":' + b"[" * 100_000 + b"]" * 100_000 + b',"type":"turn/start","time":1,"data":{"turn":1}}\n',
        0,
    ),
    "huge-int": (GOOD + line(b'{"turn":1' + b"0" * 100_000 + b"}", seq=1), 1),
    "huge-seq": (b'{"seq":1' + b"0" * 5_000 + b',"type":"turn/start","time":1,"data":{"turn":1}}\n', 0),
    "huge-float": (line(b'{"turn":1e999999}'), 0),
    "nul-in-a-key": (line(b'{"turn":1,"\x00":1}'), 0),
    "nul-line": (GOOD + b"\x00" * 40 + b"\n", 1),
    "invalid-utf8": (line(b'{"turn":1,"\xff\xfe":1}'), 0),
    "lone-surrogate": (line(b'{"text":"\\ud800"}', type_="compaction/summary"), 0),
    "truncated-json": (line(b'{"turn":1')[:-3] + b"\n", 0),
    "two-values": (GOOD[:-1] + GOOD, 0),
}


def write_log(root: Path, sid: str, body: bytes, compression: str) -> None:
    folder = root / "sessions" / sid
    folder.mkdir(parents=True, exist_ok=True)
    if compression == "none":
        (folder / "session.jsonl").write_bytes(header_line(sid) + body)
    else:
        (folder / "session.jsonl.zst").write_bytes(zstd_frame(header_line(sid)) + zstd_frame(body))


def healthy(store: FileLogStore, sid: str, n: int = 3) -> None:
    handle = store.create(SessionHeader(id=sid, created_at=T + 1))  # type: ignore[arg-type]  # a plain str where the header takes a SessionId
    store.append(handle, [Batch(Offset(0), [make_event(i, "turn/start", T, {"turn": i}) for i in range(n)])])
    store.close(handle)


def open_and_close(store: FileLogStore, sid: str) -> None:
    store.close(store.open_write(sid))


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("case", list(HOSTILE_LINES))
def test_a_hostile_line_is_located_damage_in_every_reader(tmp_path: Path, case: str, compression: str) -> None:
    body, seq = HOSTILE_LINES[case]
    store = FileLogStore(str(tmp_path), compression=compression)  # type: ignore[arg-type]  # from the table
    healthy(store, "sibling")
    write_log(tmp_path, "bad", body, compression)
    for op in (read_all, open_and_close, open_and_close):  # twice: a refused open releases its lock
        with pytest.raises(CorruptLog) as info:
            op(store, "bad")
        err = info.value
        assert err.session_id == "bad" and err.seq == seq and err.offset is not None
        assert f"seq {seq}" in str(err) and f"byte offset {err.offset}" in str(err)
    info = store.stat("bad")
    assert info is not None and info.damage == "corrupt" and info.event_count == seq
    listed = {i.id: i for i in store.list()}
    assert listed["bad"].damage == "corrupt"
    assert listed["sibling"].damage is None and listed["sibling"].event_count == 3
    assert [e.seq for e in read_all(store, "sibling")] == [0, 1, 2]
    store.close_store()


def hostile_frame(claimed: int) -> bytes:
    """A checksummed frame whose header claims `claimed` bytes of content (it holds 8)."""
    real = zstd_frame(GOOD[:8])
    assert real[4] == 0x24  # single segment, checksum, one byte of content size
    return real[:4] + bytes([0xE4]) + struct.pack("<Q", claimed) + real[6:]


@pytest.mark.parametrize("claimed", [2**33, 2**50, 2**63])
def test_a_zstd_frame_that_claims_a_hostile_size_is_corruption_not_a_memory_error(tmp_path: Path, claimed: int) -> None:
    store = FileLogStore(str(tmp_path))
    healthy(store, "sibling")
    folder = tmp_path / "sessions" / "bad"
    folder.mkdir()
    head = zstd_frame(header_line("bad"))
    (folder / "session.jsonl.zst").write_bytes(head + hostile_frame(claimed) + zstd_frame(GOOD))
    for op in (read_all, open_and_close):
        with pytest.raises(CorruptLog) as info:
            op(store, "bad")
        assert info.value.offset == len(head)
    assert {i.id: i.damage for i in store.list()} == {"bad": "corrupt", "sibling": None}


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_a_deeply_nested_header_line_is_a_damaged_header(tmp_path: Path, depth: int) -> None:
    store = FileLogStore(str(tmp_path), compression="none")
    healthy(store, "sibling")
    folder = tmp_path / "sessions" / "bad"
    folder.mkdir()
    (folder / "session.jsonl").write_bytes(b'{"type":"session","x":' + b"[" * depth + b"]" * depth + b"}\n" + GOOD)
    with pytest.raises(CorruptLog) as info:
        store.open_read("bad")
    assert info.value.offset == 0
    with pytest.raises(CorruptLog):
        open_and_close(store, "bad")
    assert {i.id: (i.damage, i.header) for i in store.list()}["bad"] == ("corrupt", None)


# --- (b) a garbled index ----------------------------------------------------------------------------


def populate(root: Path) -> FileLogStore:
    store = FileLogStore(str(root), compression="none")
    for sid in ("a", "b", "c"):
        healthy(store, sid)
    write_log(root, "bad", HOSTILE_LINES["truncated-json"][0], "none")  # damage every build sees
    handle = store.open_write("a")
    assert store.write_checkpoint(handle, {"u": CheckpointRow(ver=1, seq=2, val={"k": [1]})})
    store.close(handle)
    assert [i.id for i in store.list()] == ["a", "b", "bad", "c"]
    store.close_store()
    return store


def reference(root: Path) -> list[LogInfo]:
    return FileLogStore(str(root), use_index=False).list()


def index_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.endswith("index") and r.levelno >= logging.WARNING]


def exercise(root: Path, want: list[LogInfo]) -> None:
    """Every storage entry point answers as a store without an index does."""
    store = FileLogStore(str(root), compression="none")
    try:
        for _ in range(2):
            assert store.list() == want
            for info in want:
                assert store.stat(info.id) == info
        for sid in ("a", "b", "c"):
            assert [e.seq for e in read_all(store, sid)] == [0, 1, 2]
            handle = store.open_write(sid)
            assert handle.next_seq == 3
            store.write_checkpoint(handle, {"u": CheckpointRow(ver=1, seq=2, val={"k": [1]})})  # fail-soft
            store.close(handle)
        rows = store.read_checkpoint_rows(["a", "b", "c", "bad"])
        for stored in (rows or {}).values():
            for row in stored:  # whatever survives is well typed
                assert type(row.seq) is int and type(row.log_offset) is int and type(row.key) is str
                _ = row.row  # decodes, or reads as UNREADABLE
        with pytest.raises(CorruptLog):
            open_and_close(store, "bad")
        assert store.list() == want
    finally:
        store.close_store()


GARBLED_ROWS: dict[str, str] = {
    "id-not-utf8": "UPDATE sessions SET id = CAST(x'ff61' AS TEXT) WHERE id = 'a'",
    "created-at-text": "UPDATE sessions SET created_at = 'yesterday' WHERE id = 'b'",
    "event-count-text": "UPDATE sessions SET event_count = '3' WHERE id = 'c'",
    "cwd-int": "UPDATE sessions SET cwd = 5 WHERE id = 'a'",
    "head-text": "UPDATE sessions SET head = 'x', anchor = 7 WHERE id = 'b'",
    "healthy-without-header": "UPDATE sessions SET has_header = 0 WHERE id = 'c'",
    "form-unknown": "UPDATE sessions SET form = 'bz2' WHERE id = 'a'",
    "every-text-not-utf8": "UPDATE sessions SET origin = CAST(x'c3' AS TEXT)",
    "checkpoint-seq-text": "UPDATE checkpoints SET seq = 'two'",
    "checkpoint-ver-float": "UPDATE checkpoints SET ver = 1.5",
    "checkpoint-lifecycle-garbage": "UPDATE checkpoints SET lifecycle = x'ff00ff'",
    "checkpoint-lifecycle-wrong-types": 'UPDATE checkpoints SET lifecycle = \'{"format":"1","created_at":[],'
    '"cwd":3,"is_seeded":0,"inherited_event_count":null}\'',
    "checkpoint-lifecycle-list": "UPDATE checkpoints SET lifecycle = '[1,2]'",
    "checkpoint-val-deep": "UPDATE checkpoints SET val = '" + "[" * 100_000 + "]" * 100_000 + "'",
    "checkpoint-key-not-utf8": "UPDATE checkpoints SET unit_key = CAST(x'ff' AS TEXT)",
    "checkpoint-session-not-utf8": "UPDATE checkpoints SET session_id = CAST(x'ff' AS TEXT)",
}


@pytest.mark.parametrize("case", list(GARBLED_ROWS))
def test_a_garbled_index_row_is_a_cache_miss(tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture) -> None:
    populate(tmp_path)
    want = reference(tmp_path)
    conn = sqlite3.connect(tmp_path / INDEX, isolation_level=None)
    conn.execute(GARBLED_ROWS[case])
    conn.close()
    with caplog.at_level(logging.DEBUG):
        exercise(tmp_path, want)
    assert len(index_warnings(caplog)) <= 1


GARBLED_FILES: dict[str, Callable[[bytes], bytes]] = {
    "not-a-database": lambda data: b"garbage, not a database " * 300,
    "header-zeroed": lambda data: b"\x00" * 100 + data[100:],
    "page-2-garbled": lambda data: data[:4096] + bytes(b ^ 0x5A for b in data[4096:8192]) + data[8192:],
    "every-page-after-1-garbled": lambda data: data[:4096] + bytes((b * 7 + 3) % 256 for b in data[4096:]),
    "truncated": lambda data: data[: len(data) // 2 + 17],
    "empty": lambda data: b"",
}


@pytest.mark.parametrize("case", list(GARBLED_FILES))
def test_a_garbled_index_file_is_a_cache_miss_with_one_warning_at_most(
    tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    populate(tmp_path)
    want = reference(tmp_path)
    path = tmp_path / INDEX
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    path.write_bytes(GARBLED_FILES[case](path.read_bytes()))
    with caplog.at_level(logging.DEBUG):
        exercise(tmp_path, want)
    assert len(index_warnings(caplog)) <= 1, index_warnings(caplog)


def test_an_index_that_fails_every_time_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A folder where the index should be: every use fails (a miss), and says so once."""
    populate(tmp_path)
    want = reference(tmp_path)
    (tmp_path / INDEX).unlink()
    for suffix in ("-wal", "-shm"):
        Path(str(tmp_path / INDEX) + suffix).unlink(missing_ok=True)
    (tmp_path / INDEX).mkdir()
    with caplog.at_level(logging.DEBUG):
        exercise(tmp_path, want)
    warnings = index_warnings(caplog)
    assert len(warnings) == 1 and "index" in warnings[0]
    assert sum("index" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG) >= 2  # the rest


# --- (c) fuzz: a garbled index and hostile lines at random ---------------------------------------


HOSTILE = st.sampled_from([body for body, _ in HOSTILE_LINES.values()])


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    garbles=st.lists(st.tuples(st.integers(0, 1 << 20), st.binary(min_size=1, max_size=8)), min_size=1, max_size=6),
    hostile=st.lists(st.tuples(HOSTILE, st.sampled_from(["none", "zstd"])), min_size=1, max_size=3),
)
def test_fuzz_a_garbled_index_and_hostile_logs(
    tmp_path_factory: pytest.TempPathFactory, garbles: list[tuple[int, bytes]], hostile: list[tuple[bytes, str]]
) -> None:
    root = tmp_path_factory.mktemp("fuzz")
    store = populate(root)
    for i, (body, compression) in enumerate(hostile):
        write_log(root, f"hostile-{i}", body, compression)
    store = FileLogStore(str(root), compression="none")
    store.list()  # the index learns the hostile logs too
    store.close_store()
    path = root / INDEX
    garble(path, garbles)
    want = reference(root)
    assert {i.id: i.damage for i in want} == {"a": None, "b": None, "c": None, "bad": "corrupt"} | {
        f"hostile-{i}": "corrupt" for i in range(len(hostile))
    }
    exercise(root, want)
    store = FileLogStore(str(root), compression="none")
    for i in range(len(hostile)):
        with pytest.raises((CorruptLog, UnsupportedLog)):
            read_all(store, f"hostile-{i}")
    store.close_store()


def test_payloads_are_checked_once_per_revision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read trusts the payload check of the scan whose row vouches for exactly its bytes; a
    log that changed since is checked again (and its damage found)."""
    from subagents.storage import framing

    checked: list[str] = []
    monkeypatch.setattr(
        framing,
        "_PAYLOAD_CHECKS",
        {
            t: (lambda data, t=t, check=check: (checked.append(t), check(data))[1])
            for t, check in framing._PAYLOAD_CHECKS.items()  # noqa: SLF001  # counting the checks
        },
    )
    write_log(tmp_path, "s", GOOD + line(b'{"turn":2}', seq=1), "none")
    store = FileLogStore(str(tmp_path), compression="none")
    assert read_all(store, "s") and len(checked) == 2  # no row yet: checked
    assert [i.damage for i in store.list()] == [None] and len(checked) == 4  # the scan checks
    checked.clear()
    assert len(read_all(store, "s")) == 2 and checked == []  # the row vouches for these bytes
    with (tmp_path / "sessions" / "s" / "session.jsonl").open("ab") as f:
        f.write(line(b'{"turn":"3"}', seq=2))  # grown since the row: checked, damage found
    with pytest.raises(CorruptLog) as info:
        read_all(store, "s")
    assert info.value.seq == 2 and checked
    store.close_store()


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("case", ["deep-100k-in-data", "huge-int", "invalid-utf8", "nul-line", "lone-surrogate"])
def test_a_hostile_line_appended_after_a_listing_is_found_by_the_incremental_scan(
    tmp_path: Path, case: str, compression: str
) -> None:
    store = FileLogStore(str(tmp_path), compression=compression)  # type: ignore[arg-type]  # from the table
    healthy(store, "s")
    assert [(i.damage, i.event_count) for i in store.list()] == [(None, 3)]
    body = HOSTILE_LINES[case][0].splitlines(keepends=True)[-1]  # the hostile line alone
    body = body.replace(b'"seq":1', b'"seq":3').replace(b'"seq":0', b'"seq":3')
    log = tmp_path / "sessions" / "s" / ("session.jsonl" if compression == "none" else "session.jsonl.zst")
    with log.open("ab") as f:  # grown in place: the index scans only the new bytes first
        f.write(body if compression == "none" else zstandard.ZstdCompressor(write_checksum=True).compress(body))
    for _ in range(2):
        ((info),) = store.list()
        assert (info.damage, info.event_count) == ("corrupt", 3)
        assert store.stat("s") == info
    with pytest.raises(CorruptLog) as exc:
        read_all(store, "s")
    assert exc.value.seq == 3
    store.close_store()
