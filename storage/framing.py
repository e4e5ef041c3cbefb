"""The plain form of a log, as bytes: where records end, what is torn, and decoding them.

A plain log is line 1 (the header record) followed by one event record per line. Everything
after the last newline is a torn tail (an incomplete line, or NUL padding a crash left behind);
readers return every complete record before it, and a writer cuts it before appending. A file
without a complete header line is corrupt: publication is atomic, so a torn header cannot come
from a crash.

`decode_event_lines` decodes complete lines in chunks of at most `CHUNK_BYTES`, calling the
caller's `poll` between chunks (the actors pass `trio.from_thread.check_cancelled`), and
checks what the envelope codec cannot see line by line: seq continuity, known types, the payload
of every known type (docs/format.md, "Payloads": a payload that fails validation makes its
session corrupt — for every reader alike, so listing, `show` and resume give one verdict) and
the seed marker. The payload check runs in the same per-event loop as the seq check, one C
decode of the raw data per event, each result dropped at once (so it costs no cyclic-GC work).
Any failure to decode a line — a msgspec error, invalid UTF-8, nesting deeper than the decoder's
recursion limit, a hostile length — is damage located by seq and byte offset, never a foreign
exception.
"""

from __future__ import annotations

import enum
import re
from typing import ClassVar, NoReturn

import attrs
import msgspec

from ._codec import DECODE_ERRORS, PAYLOAD_DECODERS, Event, check_payload, decode_event, decode_events
from ._records import HeaderError, HeaderRecord, decode_header_line
from .errors import CorruptLog, UnsupportedEvent
from .values import AbortPoll

__all__ = [
    "CHUNK_BYTES",
    "PlainLayout",
    "check_seed_marker",
    "decode_event_lines",
    "is_seed_marker",
    "plain_layout",
    "parse_header_line",
    "read_header",
]

CHUNK_BYTES = 1 << 20
_BAD_LINE_START = re.compile(rb"\n[^{]")
_PAYLOAD_CHECKS = {t: decoder.decode for t, decoder in PAYLOAD_DECODERS.items()}  # bound once
_NO_PAYLOAD_CHECKS: dict[str, None] = dict.fromkeys(PAYLOAD_DECODERS)  # known types, vouched for
# One str object per known type, shared by every decoded event of that type: the decoder makes a
# new ~60-byte str per event, a fifth of a typical event's plain size held for as long as the
# events are (a 500 MB log: 1.7 M of them).
_SHARED_TYPES: dict[str, str] = {t: t for t in PAYLOAD_DECODERS}
_force_setattr = msgspec.structs.force_setattr


class _Unknown(enum.Enum):
    """The answer of the checks table for a type it has no entry for."""

    TYPE = 0


@attrs.frozen
class PlainLayout:
    header_end: int  # just after line 1's newline
    complete_end: int  # just after the last newline; bytes beyond it are a torn tail
    size: int
    recovered: ClassVar[bytes] = b""  # only a torn zstd frame has lines to recover

    @property
    def torn(self) -> bool:
        return self.complete_end < self.size


def plain_layout(session_id: str, data: bytes) -> PlainLayout:
    header_end = data.find(b"\n") + 1
    if header_end == 0:
        raise CorruptLog(session_id, "the header line is incomplete", offset=0)
    complete_end = data.rfind(b"\n") + 1
    return PlainLayout(header_end=header_end, complete_end=complete_end, size=len(data))


def read_header(session_id: str, data: bytes, layout: PlainLayout) -> HeaderRecord:
    try:
        return parse_header_line(memoryview(data)[: layout.header_end - 1], session_id)
    except HeaderError as exc:
        raise exc.to_storage_error(session_id) from None


def parse_header_line(line: bytes | memoryview, session_id: str) -> HeaderRecord:
    """`decode_header_line`, with hostile bytes (nesting past the recursion limit, a hostile
    length) reported as a damaged header (`HeaderError`) like any other."""
    try:
        return decode_header_line(line, session_id)
    except HeaderError:
        raise
    except DECODE_ERRORS as exc:
        raise HeaderError(f"not JSON a reader accepts ({type(exc).__name__})", unsupported=False, header=None) from None


def decode_event_lines(
    session_id: str,
    raw: bytes | bytearray,
    start: int,
    end: int,
    *,
    first_seq: int = 0,
    poll: AbortPoll | None = None,
    out: list[Event] | None = None,
    payloads: bool = True,
) -> list[Event]:
    """Decode the complete lines in `raw[start:end]` as events numbered from `first_seq`.
    `payloads=False` skips the payload check (and only that): for bytes whose payloads were
    validated before — by the scan the index vouches for, or by their writer."""
    view = memoryview(raw)
    checks = _PAYLOAD_CHECKS if payloads else _NO_PAYLOAD_CHECKS
    events: list[Event] = [] if out is None else out
    pos = start
    expected = first_seq
    while pos < end:
        if poll is not None and pos > start:
            poll()
        stop = end if end - pos <= CHUNK_BYTES else raw.rfind(b"\n", pos, pos + CHUNK_BYTES) + 1
        if stop <= pos:  # one line longer than a chunk: take it whole
            stop = raw.find(b"\n", pos + CHUNK_BYTES, end) + 1
        chunk_first = expected
        chunk = view[pos:stop]
        try:
            # decode_lines splits `{..}{..}` into two values and skips blank lines, so the fast
            # path also needs every line to start with "{" and exactly one value per line;
            # anything else is located line by line. UTF-8: decode_events checks every byte but
            # the raw `data` values; with the payload checks, each known type's strict decode
            # (no unknown field, no raw value inside) checks all of its data, and an ignorable
            # unknown type's data is checked below — one pass over those bytes, not two.
            decoded = decode_events(chunk, utf8=not payloads)
        except DECODE_ERRORS:
            decoded = None  # not raised: the per-line pass below locates the damage and raises it
        if (
            decoded is None
            or raw[pos] != 0x7B
            or _BAD_LINE_START.search(raw, pos, stop) is not None
            or len(decoded) != raw.count(b"\n", pos, stop)
        ):
            _locate_damage(session_id, raw, pos, stop, chunk_first, payloads)
        assert decoded is not None  # _locate_damage never returns
        for event in decoded:
            if event.seq != expected:
                _locate_damage(session_id, raw, pos, stop, chunk_first, payloads)
            kind = event.type
            shared = _SHARED_TYPES.get(kind)
            if shared is not None:
                _force_setattr(event, "type", shared)  # the same value: only the copy goes
            check = checks.get(kind, _Unknown.TYPE)
            if check is _Unknown.TYPE:
                if event.ignorable is not True:
                    _refuse_unknown(session_id, event)
                if payloads:
                    try:
                        str(memoryview(event.data), "utf-8")
                    except UnicodeDecodeError:
                        _locate_damage(session_id, raw, pos, stop, chunk_first, payloads)
            elif check is not None:
                try:
                    check(event.data)  # the payload: validated, then dropped
                except DECODE_ERRORS:
                    _locate_damage(session_id, raw, pos, stop, chunk_first, payloads)
            expected += 1
        events.extend(decoded)
        pos = stop
    return events


def _locate_damage(
    session_id: str, raw: bytes | bytearray, pos: int, stop: int, expected: int, payloads: bool
) -> NoReturn:
    """Decode `raw[pos:stop]` line by line and raise for the first damaged line."""
    first, start = expected, pos
    while pos < stop:
        nl = raw.index(b"\n", pos, stop)
        line = bytes(raw[pos:nl])  # a bytearray slice is a bytearray (bytes(bytes) is no copy)
        try:
            if not line.startswith(b"{"):
                raise ValueError("a record line must start with '{'")
            line.decode("utf-8")
            event = decode_event(line)
        except DECODE_ERRORS as exc:
            what = "an empty line" if not line.strip() else f"an invalid record ({str(exc) or type(exc).__name__})"
            raise CorruptLog(session_id, f"expected seq {expected}, found {what}", seq=expected, offset=pos) from None
        if event.seq != expected:
            raise CorruptLog(session_id, f"expected seq {expected}, found seq {event.seq}", seq=expected, offset=pos)
        if event.type not in PAYLOAD_DECODERS and event.ignorable is not True:
            _refuse_unknown(session_id, event)
        if payloads:
            check_payload(event, session_id=session_id, offset=pos)
        expected += 1
        pos = nl + 1
    # Every line decodes alone although the chunk did not (a transient MemoryError, say):
    # still damage to report at the chunk, never a traceback.
    raise CorruptLog(session_id, "the records could not be decoded together", seq=first, offset=start)


def _refuse_unknown(session_id: str, event: Event) -> NoReturn:
    raise UnsupportedEvent(
        session_id,
        f"event type {event.type!r} at seq {event.seq} is unknown and not ignorable",
        seq=event.seq,
    )


def check_seed_marker(session_id: str, events: list[Event], inherited_event_count: int) -> None:
    """A seeded log holds `session/end-seed {"inherited": true}` at seq K (docs/format.md,
    "Seeding")."""
    k = inherited_event_count
    if k == 0:
        return
    if len(events) <= k:
        raise CorruptLog(session_id, f"seeded log ends before its end-seed marker at seq {k}", seq=min(k, len(events)))
    if not is_seed_marker(events[k]):
        raise CorruptLog(session_id, f"seq {k} must be the tagged session/end-seed marker", seq=k)


def is_seed_marker(event: Event) -> bool:
    """`session/end-seed {"inherited": true}`, the cut between inherited and own events."""
    if event.type != "session/end-seed":
        return False
    try:
        return msgspec.json.decode(event.data) == {"inherited": True}
    except DECODE_ERRORS:
        return False  # undecodable data is not the marker; the seed check then reports the seq
