"""Hand-built session logs: header and event lines, files written beside the store, zstd frames
read independently of it, and reading a whole log back through a store."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zstandard
from clocks import T
from subagents.storage import Batch, Event, LogStore, Offset, SessionHeader, SessionId, encode_session_id
from subagents.storage._codec import encode_event
from subagents.storage._records import HeaderRecord, encode_header_line

_FILE_NAMES = {"none": "session.jsonl", "zstd": "session.jsonl.zst"}


def rel_folder(sid: str) -> str:
    """A session's folder relative to the store root (a `CrashFs` path)."""
    return f"sessions/{encode_session_id(sid)}"


def rel_log(sid: str, compression: str = "none") -> str:
    """A session's log file relative to the store root (a `CrashFs` path)."""
    return f"{rel_folder(sid)}/{_FILE_NAMES[compression]}"


def session_folder(root: Path, sid: str) -> Path:
    """The folder of a session's files under `root`."""
    return root / rel_folder(sid)


def log_file(root: Path, sid: str, compression: str = "none") -> Path:
    """The log file of a session under `root`."""
    return root / rel_log(sid, compression)


def header(sid: str = "s1", created_at: int = T, **changes: Any) -> SessionHeader:
    """A session header (a root session unless `changes` say otherwise)."""
    return SessionHeader(id=SessionId(sid), created_at=created_at, **changes)


def header_line(sid: str, created_at: int = T, k: int = 0) -> bytes:
    """The header line of a session `sid` that inherits `k` events (seeded when k > 0)."""
    return encode_header(header(sid, created_at, is_seeded=k > 0), k)


def encode_header(header: SessionHeader, k: int = 0) -> bytes:
    """The header line of `header`, for a session that inherits `k` events."""
    return encode_header_line(HeaderRecord(header=header, inherited_event_count=Offset(k)))


def json_line(seq: int, type_: str, data: Any, time: int = T, **extra: Any) -> bytes:
    """One event line written by hand (compact JSON, no checks), for logs the store must judge."""
    record = {"seq": seq, "type": type_, "time": time, "data": data, **extra}
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def new_log_file(root: Path, sid: str, compression: str) -> Path:
    """The log file of a new session folder under `root` (the folder is made, the file is not)."""
    session_folder(root, sid).mkdir(parents=True)
    return log_file(root, sid, compression)


def zstd_frame(data: bytes) -> bytes:
    """One zstd frame as the store writes them: checksummed, its content size recorded."""
    return zstandard.ZstdCompressor(write_checksum=True, write_content_size=True).compress(data)


def plain_bytes(path: Path) -> bytes:
    """A log file's plain form: a `.zst` log's frames decoded one after another (a frame that is
    not whole raises `zstandard.ZstdError`)."""
    data = path.read_bytes()
    if path.name.endswith(".zst"):
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
            return reader.read()
    return data


def plain_logs(root: Path) -> dict[str, bytes]:
    """Every log under `root` in its plain form, by folder name."""
    return {path.parent.name: plain_bytes(path) for path in sorted((root / "sessions").glob("*/session.jsonl*"))}


def plain_records(root: Path, sid: str) -> list[dict[str, Any]]:
    """The header record, then the events, of a plain (uncompressed) log, straight from its file."""
    return [json.loads(line) for line in log_file(root, sid).read_text(encoding="utf-8").splitlines()]


def zstd_frames(data: bytes) -> list[bytes]:
    """The decoded frames of a zstd log, decoded independently of the store: every frame whole
    and checksum-verified (a torn last frame fails the assertion), none ending inside a line."""
    frames = []
    while data:
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        frames.append(decompressor.decompress(data))
        assert decompressor.eof, "the log ends inside a zstd frame"
        data = decompressor.unused_data
    assert all(frame.endswith(b"\n") for frame in frames), "a frame ends inside a line"
    return frames


def wire(events: Sequence[Event]) -> list[bytes]:
    """The lines of `events` as the store writes them."""
    return [encode_event(event) for event in events]


def events_of(batches: Sequence[Batch]) -> list[Event]:
    """The events of `batches`, in order."""
    return [event for batch in batches for event in batch.events]


def persist_log(store: LogStore, header: SessionHeader, events: Sequence[Event], k: int = 0) -> None:
    """Publish a log in one go: create it (inheriting `k` events), append `events` as one batch,
    close it."""
    handle = store.create(header, inherited_event_count=Offset(k))
    store.append(handle, [Batch(Offset(0), list(events))])
    store.close(handle)


def read_all(store: LogStore, sid: str) -> list[Event]:
    """Every event of `sid`, read through one handle that is closed again."""
    handle = store.open_read(sid)
    try:
        return store.read(handle)
    finally:
        store.close(handle)


def memory_events(fs: Any, sid: str) -> list[tuple[str, Any]]:
    """Every event of `sid` in a `CrashFs` (plain form), as (type, decoded data) pairs."""
    import msgspec
    from subagents.storage.testing import MemoryLogStore

    return [(e.type, msgspec.json.decode(e.data)) for e in read_all(MemoryLogStore(fs=fs, compression="none"), sid)]
