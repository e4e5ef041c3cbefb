"""Hand-built session logs: header lines, zstd frames read independently of the store, and
reading a whole log back through a store."""

from __future__ import annotations

from collections.abc import Sequence

import zstandard
from clocks import T

from subagents.storage import Batch, Event, LogStore, Offset, SessionHeader, SessionId
from subagents.storage import HeaderRecord, encode_header_line


def header_line(sid: str, created_at: int = T, k: int = 0) -> bytes:
    """The header line of a session `sid` that inherits `k` events (seeded when k > 0)."""
    header = SessionHeader(id=SessionId(sid), created_at=created_at, is_seeded=k > 0)
    return encode_header_line(HeaderRecord(header=header, inherited_event_count=Offset(k)))


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


def events_of(batches: Sequence[Batch]) -> list[Event]:
    """The events of `batches`, in order."""
    return [event for batch in batches for event in batch.events]


def read_all(store: LogStore, sid: str) -> list[Event]:
    """Every event of `sid`, read through one handle that is closed again."""
    handle = store.open_read(sid)
    try:
        return store.read(handle)
    finally:
        store.close(handle)
