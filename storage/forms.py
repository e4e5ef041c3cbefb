"""The two file forms of format 1 behind one interface: parse a whole log, stream one, frame
new bytes.

`PlainForm` is newline-delimited JSON; `ZstdForm` is one checksummed zstd frame for the header
line and one per durable append. Both parse into the same `ParsedLog`: the header record, every
event of the complete prefix, where that prefix ends in the file, and — for a torn zstd frame —
the recovered lines a writer must re-frame before it appends.

Both also `stream` a log: the same events, validated by the same rules (framing, envelopes, seq
continuity, known types, payloads, the seed marker, the torn tail), yielded a chunk at a time —
about `STREAM_BYTES` (zstd) or `CHUNK_BYTES` (plain) of plain bytes — while the file is read
through a bounded window, so a reader holds one chunk's plain bytes and a read-ahead, never the
file (issue 28: a 500 MB zstd log). Each chunk's events reference that chunk's own bytes
(`msgspec.Raw`), so keeping every chunk holds the plain form once, with no growth slack. Damage
raises the error `parse` would raise for it once the stream reaches it, after the earlier chunks
were yielded: a consumer folding chunks must discard what it folded then. (A log damaged in
several places may name another of them than `parse`, which walks every frame before it decodes
a line.)
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import Generic, Literal, TypeVar

import attrs

from ._codec import Event
from ._records import HeaderError, HeaderRecord
from .errors import CorruptLog
from .framing import (
    CHUNK_BYTES,
    PlainLayout,
    check_seed_marker,
    decode_event_lines,
    is_seed_marker,
    parse_header_line,
    plain_layout,
    read_header,
)
from .values import AbortPoll, SessionHeader, SessionId
from .zstd_framing import (
    FrameDamage,
    FrameWalk,
    ZstdLayout,
    compress_frame,
    frame_end,
    walk_frames,
)

__all__ = [
    "FORMS",
    "STREAM_BYTES",
    "Compression",
    "LogForm",
    "ParsedLog",
    "PlainForm",
    "ReadAt",
    "TailScan",
    "ZstdForm",
]

ReadAt = Callable[[int, int], bytes]  # (offset, length) -> the file's bytes there (all of them)
# Plain bytes per streamed chunk of a zstd log, and its walk's read-ahead: a streaming reader
# holds a few times this (a chunk, its events, the next one being joined, the window), not the
# log. A plain log streams in the chunks its decoder polls between (`CHUNK_BYTES`).
STREAM_BYTES = 1 << 18

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

    def stream(
        self,
        sid: SessionId,
        read: ReadAt,
        size: int,
        *,
        header: SessionHeader,
        start: int = 0,
        poll: AbortPoll | None = None,
        known: KnownHead | None = None,
        payloads: bool = True,
    ) -> Iterator[list[Event]]:
        """The events from seq `start` of the log's first `size` bytes, read through `read`, in
        chunks (non-empty lists; see the module docstring): what `parse` returns, validated
        alike. `header`: the logical header the caller expects (a handle's); another one is
        corruption (the log changed since). `known` and `payloads` as for `parse`."""
        return self._chunks(sid, read, size, header, start, poll, known, payloads)

    def _chunks(
        self,
        sid: SessionId,
        read: ReadAt,
        size: int,
        header: SessionHeader,
        start: int,
        poll: AbortPoll | None,
        known: KnownHead | None,
        payloads: bool,
    ) -> Iterator[list[Event]]:
        raise NotImplementedError

    def window(self, read: ReadAt, size: int, start: int, stop: int) -> tuple[int, int, int] | None:
        """Where the events `[start, stop)` of the log's first `size` bytes lie, found by counting
        line ends — no event decoded, a zstd frame only decompressed: `(offset, first_seq, end)`,
        the record boundary at or before seq `start`, the seq of the event there, and the record
        boundary at or after the end of seq `stop - 1` (`0 <= start < stop`). None when the log
        holds no such seqs or its bytes do not split as expected (the caller reads as before;
        `scan_tail` of those bytes checks every seq, so a wrong count is never served)."""
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

    def _chunks(
        self,
        sid: SessionId,
        read: ReadAt,
        size: int,
        header: SessionHeader,
        start: int,
        poll: AbortPoll | None,
        known: KnownHead | None,
        payloads: bool,
    ) -> Iterator[list[Event]]:
        held = b""  # the file's bytes from `base` on, read and not yet decoded
        while (nl := held.find(b"\n")) < 0:  # line 1, however long
            if len(held) >= size:
                raise CorruptLog(sid, "the header line is incomplete", offset=0)
            held += read(len(held), min(max(CHUNK_BYTES, len(held)), size - len(held)))
        if known is not None and nl + 1 == len(known[0]) and held.startswith(known[0]):
            record = known[1]  # the very bytes a reader parsed a moment ago
        else:
            try:
                record = parse_header_line(memoryview(held)[:nl], sid)
            except HeaderError as exc:
                raise exc.to_storage_error(sid) from None
        _check_header(sid, record, header)
        cut_at = _Cut(sid, record.inherited_event_count, start)
        base, seq, length = nl + 1, 0, CHUNK_BYTES
        del held
        while base < size:
            # Each chunk is read afresh from the record boundary it starts at: what the last
            # read held past its last newline is read again (a line's worth) rather than joined.
            held = read(base, min(length, size - base))
            cut = held.rfind(b"\n") + 1
            if not cut:
                if base + len(held) >= size:
                    break  # a torn tail: an incomplete last line, or NUL padding
                length = 2 * len(held)  # a line longer than a chunk: held whole (doubling: linear)
                continue
            # The chunk's events reference its buffer: a short incomplete last line may stay in
            # it (copying the lines out would copy every byte), a long one does not.
            chunk = held if len(held) - cut <= len(held) >> 4 else held[:cut]
            del held
            if poll is not None and seq:
                poll()
            events = _decoded(sid, chunk, cut, base, seq, poll, payloads)
            base, seq, length = base + cut, seq + len(events), CHUNK_BYTES
            del chunk
            events = cut_at.take(events)
            if events:
                yield events
            del events
        cut_at.end()

    def window(self, read: ReadAt, size: int, start: int, stop: int) -> tuple[int, int, int] | None:
        # Line 1 is the header: seq s starts after line end number s + 1 and ends with number s + 2.
        wanted, found = [start + 1, stop + 1], list[int]()
        base, seen = 0, 0  # line ends before `base`
        while base < size:
            held = read(base, min(CHUNK_BYTES, size - base))
            if not held:
                return None  # cut shorter meanwhile: the caller reads as before
            ends = held.count(b"\n")
            while wanted and seen + ends >= wanted[0]:  # the wanted line end is in this chunk
                at = -1
                for _ in range(wanted.pop(0) - seen):
                    at = held.index(b"\n", at + 1)
                found.append(base + at + 1)
            if not wanted:
                return found[0], start, found[1]
            seen, base = seen + ends, base + len(held)
        return None

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
        # A copy: the record must not pin the whole log's buffer.
        return _header_frame(sid, bytes(layout.content(0)))

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

    def _chunks(
        self,
        sid: SessionId,
        read: ReadAt,
        size: int,
        header: SessionHeader,
        start: int,
        poll: AbortPoll | None,
        known: KnownHead | None,
        payloads: bool,
    ) -> Iterator[list[Event]]:
        walk = FrameWalk(read, size, ahead=STREAM_BYTES)
        frames = iter(walk)
        try:
            head = next(frames, None)
        except FrameDamage as exc:
            raise CorruptLog(sid, exc.reason, offset=exc.offset) from None
        if head is None:
            raise CorruptLog(sid, "the header frame is incomplete", offset=0)
        if known is not None and head.end == len(known[0]) and head.raw == known[0]:  # pyright: ignore[reportUnnecessaryComparison]  # a memoryview equals the bytes it holds
            record = known[1]  # the very bytes a reader parsed a moment ago
        else:
            record = _header_frame(sid, head.content)
        _check_header(sid, record, header)
        del head
        cut_at = _Cut(sid, record.inherited_event_count, start)
        seq, held, offsets, content_bytes = 0, list[bytes](), list[int](), 0
        try:
            for frame_start, _, _, content in frames:  # one pass per frame: a log may hold one per event
                if not content or content[-1] != 0x0A:
                    raise CorruptLog(sid, "a frame ends inside a line", offset=frame_start)
                held.append(content)
                offsets.append(frame_start)
                content_bytes += len(content)
                del content
                if content_bytes >= STREAM_BYTES:
                    if poll is not None and seq:
                        poll()
                    events = _decoded_frames(sid, held, offsets, walk.complete_end, seq, poll, payloads)
                    seq += len(events)
                    held, offsets, content_bytes = [], [], 0
                    events = cut_at.take(events)
                    if events:
                        yield events
                    del events
        except FrameDamage as exc:
            raise CorruptLog(sid, exc.reason, offset=exc.offset) from None
        if walk.recovered:
            held.append(walk.recovered)  # the complete lines of a torn last frame (unverified)
        if held:
            if poll is not None and seq:
                poll()
            events = _decoded_frames(sid, held, offsets, walk.complete_end, seq, poll, payloads)
            events = cut_at.take(events)
            if events:
                yield events
            del events
        cut_at.end()

    def window(self, read: ReadAt, size: int, start: int, stop: int) -> tuple[int, int, int] | None:
        frames = iter(FrameWalk(read, size, ahead=STREAM_BYTES))
        first, begin = 0, None  # the seq of the frame's first event; where the window begins
        try:
            if next(frames, None) is None:  # the header frame: no event
                return None
            for frame_start, frame_end, _, content in frames:
                count = content.count(b"\n")
                if begin is None and first + count > start:
                    begin = (frame_start, first)
                first += count
                if begin is not None and first >= stop:
                    return begin[0], begin[1], frame_end
        except FrameDamage:
            return None
        return None

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


def _header_frame(sid: SessionId, head: bytes) -> HeaderRecord:
    if head.find(b"\n") != len(head) - 1:
        raise CorruptLog(sid, "the header frame must hold exactly the header line", offset=0)
    try:
        return parse_header_line(memoryview(head)[:-1], sid)
    except HeaderError as exc:
        raise exc.to_storage_error(sid) from None


def _check_header(sid: SessionId, record: HeaderRecord, header: SessionHeader) -> None:
    if record.header != header:
        raise CorruptLog(sid, "the log's header changed since the handle was opened", offset=0)


def _decoded(
    sid: SessionId, chunk: bytes, end: int, base: int, first_seq: int, poll: AbortPoll | None, payloads: bool
) -> list[Event]:
    """The complete lines of `chunk[:end]` (the file's bytes from `base`), damage located in the
    file."""
    try:
        return decode_event_lines(sid, chunk, 0, end, first_seq=first_seq, poll=poll, payloads=payloads)
    except CorruptLog as exc:
        offset = None if exc.offset is None else base + exc.offset
        raise type(exc)(sid, exc.reason, seq=exc.seq, offset=offset) from None


def _decoded_frames(
    sid: SessionId,
    contents: list[bytes],
    offsets: list[int],
    complete_end: int,
    first_seq: int,
    poll: AbortPoll | None,
    payloads: bool,
) -> list[Event]:
    """The lines of consecutive frames' `contents` (the frames at `offsets`; a last content
    without an offset is a torn frame's recovered lines), decoded from one buffer of their own."""
    chunk = contents[0] if len(contents) == 1 else b"".join(contents)
    starts = [0]
    for content in contents:
        starts.append(starts[-1] + len(content))
    contents.clear()  # the chunk holds them now
    try:
        return decode_event_lines(sid, chunk, 0, len(chunk), first_seq=first_seq, poll=poll, payloads=payloads)
    except CorruptLog as exc:
        # Name the frame that holds the damaged line, as `_decode_frames` does.
        frame = bisect.bisect_right(starts, exc.offset or 0) - 1
        offset = offsets[frame] if frame < len(offsets) else complete_end
        raise type(exc)(sid, exc.reason, seq=exc.seq, offset=offset) from None


@attrs.define
class _Cut:
    """A stream's events from seq `start` on, the seed marker checked a chunk at a time as
    `check_seed_marker` checks a whole log (`k`: the record's inherited event count)."""

    sid: SessionId
    k: int
    start: int
    seen: int = 0

    def take(self, events: list[Event]) -> list[Event]:
        k, seen = self.k, self.seen
        if k and seen <= k < seen + len(events) and not is_seed_marker(events[k - seen]):
            raise CorruptLog(self.sid, f"seq {k} must be the tagged session/end-seed marker", seq=k)
        self.seen = seen + len(events)
        return events if self.start <= seen else events[self.start - seen :]

    def end(self) -> None:
        k = self.k
        if k and self.seen <= k:
            raise CorruptLog(self.sid, f"seeded log ends before its end-seed marker at seq {k}", seq=min(k, self.seen))


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
