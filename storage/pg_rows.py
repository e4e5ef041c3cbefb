"""Rows of the PostgreSQL store read back: line 1 of a `sessions` row, a listing row, a batch's lines.

Rows are written only by appends that validated every event, but a database can be edited by
hand: what is read is checked like a file's bytes, and damage is reported (a listing row's
`damage`) or raised (`CorruptLog`/`UnsupportedLog`, located by seq), never a foreign exception.
"""

from __future__ import annotations

from typing import Any, Final

from ._records import HeaderError, HeaderRecord
from .errors import CorruptLog, UnsupportedLog
from .framing import parse_header_line
from .values import LogInfo, Offset, Revision, SessionId, check_session_id
from .zstd_framing import FrameDamage, walk_frames

__all__ = ["SESSION_COLUMNS", "batch_lines", "header_record", "log_info"]

# What `log_info` reads, in this order.
SESSION_COLUMNS: Final = "id, header, event_count, byte_size, generation, last_time"


def header_record(sid: SessionId, header: bytes | memoryview) -> HeaderRecord:
    """Line 1 of a `sessions` row (stored with its newline), or the error it is."""
    line = bytes(header)
    if not line.endswith(b"\n"):
        raise CorruptLog(sid, "invalid header: the stored header line has no newline", offset=0)
    try:
        return parse_header_line(memoryview(line)[:-1], sid)
    except HeaderError as exc:
        raise exc.to_storage_error(sid) from None


def log_info(row: tuple[Any, ...]) -> LogInfo:
    """A listing row from the `SESSION_COLUMNS` of a `sessions` row; damage is reported. The
    revision: `size` is the plain form's bytes, `inode` the lifecycle's generation (`mtime_ns` 0:
    a row has no file). `last_time`: its last event's `time`, 0 when the row has none."""
    sid = check_session_id(row[0])
    header_line, count, size, generation = bytes(row[1]), row[2], row[3], row[4]
    last_time = row[5] if type(row[5]) is int and row[5] > 0 else 0
    last_time = last_time if count else 0
    revision = Revision(size=size, mtime_ns=0, inode=generation)
    try:
        record = header_record(sid, header_line)
    except (CorruptLog, UnsupportedLog):
        found: HeaderRecord | HeaderError | None
        try:
            found = parse_header_line(header_line.rstrip(b"\n"), sid)
        except HeaderError as exc:
            found = exc
        if isinstance(found, HeaderError):
            return LogInfo(
                id=sid,
                header=found.header,
                damage="unsupported" if found.unsupported else "corrupt",
                inherited_event_count=Offset(found.inherited_event_count),
                revision=revision,
                event_count=Offset(count),
                claimed=found.claimed,
                last_time=last_time,
            )
        return LogInfo(
            id=sid,
            header=found.header,
            damage="corrupt",
            inherited_event_count=found.inherited_event_count,
            revision=revision,
            event_count=Offset(count),
            last_time=last_time,
        )
    return LogInfo.healthy(sid, record.header, record.inherited_event_count, revision, count, last_time)


def batch_lines(sid: SessionId, first_seq: int, data: bytes, compressed: bool) -> bytes:
    """A batch row's JSON lines (its zstd frame decompressed and verified)."""
    if compressed:
        try:
            layout = walk_frames(data)
        except FrameDamage as exc:
            raise CorruptLog(sid, f"the batch at seq {first_seq}: {exc.reason}", seq=first_seq) from None
        if len(layout.contents) != 1 or layout.torn:
            raise CorruptLog(sid, f"the batch at seq {first_seq} is not one whole zstd frame", seq=first_seq)
        data = layout.contents[0]
    if not data.endswith(b"\n"):
        raise CorruptLog(sid, f"the batch at seq {first_seq} ends inside a line", seq=first_seq)
    return data
