"""The two file forms of format 1 behind one interface: parse a whole log, frame new bytes.

`PlainForm` is newline-delimited JSON; `ZstdForm` is one checksummed zstd frame for the header
line and one per durable append. Both parse into the same `ParsedLog`: the header record, every
event of the complete prefix, where that prefix ends in the file, and — for a torn zstd frame —
the recovered lines a writer must re-frame before it appends.
"""

from __future__ import annotations

import bisect
from typing import Generic, Literal, TypeVar

import attrs

from ._codec import Event
from ._records import HeaderError, HeaderRecord
from .errors import CorruptLog
from .framing import PlainLayout, check_seed_marker, decode_event_lines, parse_header_line, plain_layout, read_header
from .values import AbortPoll, SessionId
from .zstd_framing import (
    FrameDamage,
    ZstdLayout,
    compress_frame,
    frame_end,
    walk_frames,
)

__all__ = ["FORMS", "Compression", "LogForm", "ParsedLog", "PlainForm", "TailScan", "ZstdForm"]

Compression = Literal["none", "zstd"]


@attrs.frozen
class TailScan:
    """The events in a run of bytes that starts at a record (plain) or frame (zstd) boundary."""

    events: list[Event]
    complete_end: int  # relative to the scanned bytes
    recovered_events: int = 0  # of `events`, those from a torn zstd frame's lines
    recovered: bytes = b""


@attrs.frozen
class ParsedLog:
    record: HeaderRecord
    events: list[Event]
    complete_end: int  # just after the last complete record (plain) or frame (zstd)
    size: int
    header_end: int  # just after the header line (plain) or header frame (zstd)
    recovered: bytes = b""  # lines of a torn zstd frame; part of `events`, to be re-framed

    @property
    def torn(self) -> bool:
        return self.complete_end < self.size


KnownHead = tuple[bytes, HeaderRecord]  # a header record's raw bytes and the record parsed from them
L = TypeVar("L", PlainLayout, ZstdLayout)  # where a whole log's parts lie, as each form finds them


class LogForm:
    """A file form of format 1. Both forms parse a whole log alike (`parse`); each says how its
    bytes split into a layout, how it reads line 1 and how it decodes the events."""

    compression: Compression
    file_name: str

    def parse(
        self,
        sid: SessionId,
        data: bytes,
        *,
        poll: AbortPoll | None,
        known: KnownHead | None = None,
        payloads: bool = True,
    ) -> ParsedLog:
        """The whole log. `known`: the raw bytes of its header record as a reader already
        parsed them, and that record; when `data` starts with them, line 1 is not parsed again.
        `payloads=False`: the payloads were validated before (see `decode_event_lines`)."""
        raise NotImplementedError

    def scan_tail(self, sid: SessionId, data: bytes, *, first_seq: int, poll: AbortPoll | None = None) -> TailScan:
        """The events after a boundary a previous scan stopped at (offsets relative to `data`)."""
        raise NotImplementedError

    def header_span(self, data: bytes) -> int:
        """How many raw bytes of `data` hold the header record (0 if it is not whole)."""
        raise NotImplementedError

    def head_bytes(self, header_line: bytes) -> bytes:
        """The header record as stored: the line (plain) or its frame (zstd)."""
        raise NotImplementedError

    def append_bytes(self, payload: bytes) -> bytes:
        """A durable append's lines as stored: the lines (plain) or one frame of them (zstd)."""
        raise NotImplementedError

    def header_of(self, sid: SessionId, data: bytes) -> HeaderRecord | HeaderError | None:
        """Line 1 parsed on its own (for listing damaged logs), its error, or None."""
        raise NotImplementedError


class _LaidOut(LogForm, Generic[L]):
    """A form whose logs split into parts as layouts of type `L`: `parse` from its three steps."""

    def parse(
        self,
        sid: SessionId,
        data: bytes,
        *,
        poll: AbortPoll | None,
        known: KnownHead | None = None,
        payloads: bool = True,
    ) -> ParsedLog:
        """See `LogForm.parse`."""
        layout = self._layout(sid, data)
        if known is not None and data.startswith(known[0]) and layout.header_end == len(known[0]):
            record = known[1]  # the very bytes a reader parsed a moment ago
        else:
            record = self._read_header(sid, data, layout)
        events = self._events(sid, data, layout, poll=poll, payloads=payloads)
        check_seed_marker(sid, events, record.inherited_event_count)
        return ParsedLog(
            record=record,
            events=events,
            complete_end=layout.complete_end,
            size=layout.size,
            header_end=layout.header_end,
            recovered=layout.recovered,
        )

    # What `parse` asks of a form: where a whole log's parts lie (`CorruptLog` when the header
    # record is not whole), line 1 parsed, and the events after it.

    def _layout(self, sid: SessionId, data: bytes) -> L:
        raise NotImplementedError

    def _read_header(self, sid: SessionId, data: bytes, layout: L) -> HeaderRecord:
        raise NotImplementedError

    def _events(self, sid: SessionId, data: bytes, layout: L, *, poll: AbortPoll | None, payloads: bool) -> list[Event]:
        raise NotImplementedError


def _header(sid: SessionId, line: bytes | memoryview) -> HeaderRecord | HeaderError:
    try:
        return parse_header_line(line, sid)
    except HeaderError as exc:
        return exc


class PlainForm(_LaidOut[PlainLayout]):
    compression: Compression = "none"
    file_name = "session.jsonl"

    def _layout(self, sid: SessionId, data: bytes) -> PlainLayout:
        return plain_layout(sid, data)

    def _read_header(self, sid: SessionId, data: bytes, layout: PlainLayout) -> HeaderRecord:
        return read_header(sid, data, layout)

    def _events(
        self, sid: SessionId, data: bytes, layout: PlainLayout, *, poll: AbortPoll | None, payloads: bool
    ) -> list[Event]:
        return decode_event_lines(sid, data, layout.header_end, layout.complete_end, poll=poll, payloads=payloads)

    def scan_tail(self, sid: SessionId, data: bytes, *, first_seq: int, poll: AbortPoll | None = None) -> TailScan:
        end = data.rfind(b"\n") + 1
        events = decode_event_lines(sid, data, 0, end, first_seq=first_seq, poll=poll)
        return TailScan(events=events, complete_end=end)

    def header_span(self, data: bytes) -> int:
        return data.find(b"\n") + 1

    def head_bytes(self, header_line: bytes) -> bytes:
        return header_line

    def append_bytes(self, payload: bytes) -> bytes:
        return payload

    def header_of(self, sid: SessionId, data: bytes) -> HeaderRecord | HeaderError | None:
        nl = data.find(b"\n")
        return None if nl < 0 else _header(sid, memoryview(data)[:nl])


class ZstdForm(_LaidOut[ZstdLayout]):
    compression: Compression = "zstd"
    file_name = "session.jsonl.zst"

    def _layout(self, sid: SessionId, data: bytes) -> ZstdLayout:
        layout = _walk(sid, data)
        if not layout.frames:
            raise CorruptLog(sid, "the header frame is incomplete", offset=0)
        return layout

    def _read_header(self, sid: SessionId, data: bytes, layout: ZstdLayout) -> HeaderRecord:
        head = bytes(layout.content(0))  # a copy: the record must not pin the whole log's buffer
        if head.find(b"\n") != len(head) - 1:
            raise CorruptLog(sid, "the header frame must hold exactly the header line", offset=0)
        try:
            return parse_header_line(memoryview(head)[:-1], sid)
        except HeaderError as exc:
            raise exc.to_storage_error(sid) from None

    def _events(
        self, sid: SessionId, data: bytes, layout: ZstdLayout, *, poll: AbortPoll | None, payloads: bool
    ) -> list[Event]:
        return _decode_frames(sid, layout, 1, first_seq=0, poll=poll, payloads=payloads)

    def scan_tail(self, sid: SessionId, data: bytes, *, first_seq: int, poll: AbortPoll | None = None) -> TailScan:
        layout = _walk(sid, data)
        events = _decode_frames(sid, layout, 0, first_seq=first_seq, poll=poll)
        return TailScan(
            events=events,
            complete_end=layout.complete_end,
            recovered_events=layout.recovered.count(b"\n"),
            recovered=layout.recovered,
        )

    def header_span(self, data: bytes) -> int:
        return _first_frame_end(data)

    def head_bytes(self, header_line: bytes) -> bytes:
        return compress_frame(header_line)

    def append_bytes(self, payload: bytes) -> bytes:
        return compress_frame(payload)

    def header_of(self, sid: SessionId, data: bytes) -> HeaderRecord | HeaderError | None:
        try:
            layout = walk_frames(data[: _first_frame_end(data)])
        except FrameDamage:
            return None
        if not layout.frames:
            return None
        head = bytes(layout.content(0))
        if not head.endswith(b"\n"):
            return None
        return _header(sid, memoryview(head)[:-1])


def _walk(sid: SessionId, data: bytes) -> ZstdLayout:
    try:
        return walk_frames(data)
    except FrameDamage as exc:
        raise CorruptLog(sid, exc.reason, offset=exc.offset) from None


def _decode_frames(
    sid: SessionId,
    layout: ZstdLayout,
    first: int,
    *,
    first_seq: int,
    poll: AbortPoll | None,
    payloads: bool = True,
) -> list[Event]:
    """The events of frames `first..` and of the recovered lines, numbered from `first_seq`,
    decoded from the layout's one buffer in place (no join: a whole log is held once)."""
    body, starts = layout.body, layout.starts
    for index in range(first, len(layout.frames)):
        end = starts[index + 1]
        if end == starts[index] or body[end - 1] != 0x0A:
            raise CorruptLog(sid, "a frame ends inside a line", offset=layout.frames[index][0])
    try:
        return decode_event_lines(
            sid, body, starts[first], len(body), first_seq=first_seq, poll=poll, payloads=payloads
        )
    except CorruptLog as exc:
        # Offsets inside decompressed content mean nothing to a reader of the file: name the
        # frame that holds the damaged line instead (keeping the error's type: InvalidPayload).
        frame = bisect.bisect_right(starts, exc.offset or 0) - 1
        offset = layout.frames[frame][0] if frame < len(layout.frames) else layout.complete_end
        raise type(exc)(sid, exc.reason, seq=exc.seq, offset=offset) from None


def _first_frame_end(data: bytes) -> int:
    try:
        end = frame_end(memoryview(data), 0)
    except FrameDamage:
        return 0
    return end if end is not None else 0


FORMS: dict[Compression, LogForm] = {"none": PlainForm(), "zstd": ZstdForm()}
