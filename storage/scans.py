"""Scanning one log into its index row: the whole log, or only what it gained since a row.

Pure but for `still_holds`, which reads a row's head and anchor through the `File` seam: the
catalog (catalog.py) decides which scan a log needs and hands over its bytes. A scan never
raises for damage: a damaged log becomes a row whose `damage` says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs
import msgspec

from ._codec import Event
from ._records import HeaderError, HeaderRecord
from .errors import CorruptLog, UnsupportedLog
from .forms import LogForm
from .fs import File
from .index_rows import IndexRow
from .projection import Lifecycle, ObservedCheckpoint, ProjectionRegistry
from .values import LogInfo, Offset, Revision, SessionId
from .zstd_framing import FrameDamage, walk_frames

__all__ = [
    "ANCHOR",
    "damaged_info",
    "scan_line_one",
    "fold_whole",
    "good_time",
    "may_have_grown",
    "scan_growth",
    "scan_whole",
    "still_holds",
]

ANCHOR = 32  # bytes before scan_end a row keeps to recognise its log
_encode = msgspec.json.encode


def may_have_grown(row: IndexRow, form: LogForm, revision: Revision) -> bool:
    """Whether the log at `revision` may be the row's log grown by appends (then a tail scan
    from the row's `scan_end` may do; `still_holds` and the scan decide)."""
    return (
        row.info.damage is None
        and row.form == form.compression
        and row.revision.inode == revision.inode
        and row.revision.size < revision.size
        # the seed marker must lie in what was scanned: the tail scan does not check it
        and row.scan_events > row.info.inherited_event_count
    )


def still_holds(file: File, row: IndexRow) -> bool:
    """Whether the file still starts with the row's head and holds its anchor before scan_end."""
    if not row.head or not row.anchor:
        return False
    return (
        file.pread(0, len(row.head)) == row.head
        and file.pread(row.scan_end - len(row.anchor), len(row.anchor)) == row.anchor
    )


def scan_line_one(file: File, sid: SessionId, form: LogForm, revision: Revision) -> LogInfo | None:
    """A log's answer from its line 1 alone (`checked` False: its damage and event count are not
    known) when that line is a valid header and the file is still at `revision`; else None
    (damage to judge, or a log changing under us: read it whole). Reads 4 KB, more only for a
    longer line 1 (at most 1 MB)."""
    size, want = file.size(), 4096
    while True:
        head = file.pread(0, min(want, size))
        found = form.header_of(sid, head)
        if found is not None or len(head) >= size or want >= 1 << 20:
            break
        want *= 8
    if not isinstance(found, HeaderRecord) or file.revision() != revision:
        return None
    return LogInfo(
        id=sid,
        header=found.header,
        damage=None,
        inherited_event_count=found.inherited_event_count,
        revision=revision,
        event_count=Offset(0),
        checked=False,
    )


def scan_whole(
    sid: SessionId, form: LogForm, revision: Revision, data: bytes, projections: ProjectionRegistry | None = None
) -> tuple[IndexRow, ObservedCheckpoint | None]:
    """The row of the whole log `data` (at `revision`): always authoritative. With
    `projections`, also the checkpoint rows its events prove (`fold_whole`): the events this
    scan decoded to validate the log are folded while they are at hand, so a listing that needs
    them finds them in the index and never decodes the same bytes again."""
    try:
        parsed = form.parse(sid, data, poll=None)
    except (CorruptLog, UnsupportedLog) as exc:
        damage: Literal["corrupt", "unsupported"] = "unsupported" if isinstance(exc, UnsupportedLog) else "corrupt"
        count = exc.seq or 0
        info = damaged_info(sid, form.header_of(sid, data), damage, revision, count, good_time(form, data, count))
        return IndexRow(info=info, form=form.compression, scan_end=0, scan_events=0), None
    recovered = parsed.recovered.count(b"\n")
    record = parsed.record
    events = parsed.events
    last_time = events[-1].time if events else 0
    info = LogInfo.healthy(sid, record.header, record.inherited_event_count, revision, len(events), last_time)
    end = parsed.complete_end
    row = IndexRow(
        info=info,
        form=form.compression,
        scan_end=end,
        scan_events=len(parsed.events) - recovered,
        head=data[: parsed.header_end],
        anchor=data[max(0, end - ANCHOR) : end],
    )
    # Recovered lines of a torn frame are re-framed by the next writer: rows over them wait
    # for that (as a reader's rows do: `Catalog.observed_end`).
    proved = fold_whole(projections, info, parsed.events) if projections is not None and not recovered else None
    return row, proved


def fold_whole(projections: ProjectionRegistry, info: LogInfo, events: Sequence[Event]) -> ObservedCheckpoint | None:
    """The checkpoint rows of every unit folded over all of a healthy log's `events` (its
    durable events: a log holds no in-memory closers), at its last event — the rows a reader's
    observation of the same revision proves. None for a log without events. A unit whose state
    is not JSON (a unit bug) gets no row; a unit that raises breaks only its own cell."""
    header = info.header
    if header is None or not events:
        return None
    cells = projections.cells(header, info.inherited_event_count)
    cells.fold(events)
    last = info.event_count - 1
    rows: list[tuple[str, int, bytes]] = []
    for key, row in cells.checkpoint().items():
        if row.seq != last:
            continue
        try:
            rows.append((key, row.ver, _encode(row.val)))
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
            continue
    if not rows:
        return None
    return ObservedCheckpoint(
        session_id=info.id,
        lifecycle=Lifecycle.of(header, info.inherited_event_count),
        revision=info.revision,
        event_count=info.event_count,
        rows=tuple(rows),
    )


def scan_growth(sid: SessionId, form: LogForm, row: IndexRow, revision: Revision, tail: bytes) -> IndexRow | None:
    """The row after scanning only what was appended since `row`, or None to rescan whole."""
    header = row.info.header
    if header is None:  # a damaged log's row (`may_have_grown` says no to those): rescanned whole
        return None
    try:
        scan = form.scan_tail(sid, tail, first_seq=row.scan_events)
    except (CorruptLog, UnsupportedLog):
        return None  # the tail may not start where the row thinks: let a full scan decide
    count = row.scan_events + len(scan.events)
    # No new complete event (only a torn tail's worth): the row's last event is still the last.
    last_time = scan.events[-1].time if scan.events else row.info.last_time
    info = LogInfo.healthy(sid, header, row.info.inherited_event_count, revision, count, last_time)
    return attrs.evolve(  # the same log further on: its form and head stay
        row,
        info=info,
        scan_end=row.scan_end + scan.complete_end,
        scan_events=count - scan.recovered_events,
        anchor=(row.anchor + tail[: scan.complete_end])[-ANCHOR:],
    )


def damaged_info(
    sid: SessionId,
    record: HeaderRecord | HeaderError | None,
    damage: Literal["corrupt", "unsupported"],
    revision: Revision,
    event_count: int,
    last_time: int = 0,
) -> LogInfo:
    """The listing row of a damaged log: what its line 1 still says (`record`), the damage, and
    the `time` of the last event before it (`good_time`; 0 when unknown)."""
    header = record.header if record is not None else None
    k = record.inherited_event_count if record is not None else 0
    return LogInfo(
        id=sid,
        header=header,
        damage=damage,
        inherited_event_count=Offset(k),
        revision=revision,
        event_count=Offset(event_count),
        # A line 1 that is a JSON object but no valid header still says whose child it is.
        claimed=record.claimed if isinstance(record, HeaderError) and header is None else None,
        last_time=last_time if event_count else 0,
    )


class _Timed(msgspec.Struct):
    time: int


_decode_timed = msgspec.json.Decoder(_Timed).decode


def good_time(form: LogForm, data: bytes, count: int) -> int:
    """The `time` of event `count - 1` of a damaged log held whole in `data`: the last event the
    failed parse validated before the damage at seq `count` (one line each, after line 1). From
    the bytes the scan holds, never another read of the log; a zstd log's frames are walked
    again (only a damaged log's, once: its row is then in the index). 0 when unknown (no such
    event, or damaged zstd frames: nothing before the damage was decoded)."""
    if count <= 0:
        return 0
    if form.compression == "zstd":
        try:
            lines: bytes | bytearray = walk_frames(data).body
        except FrameDamage:
            return 0
    else:
        lines = data
    start = 0
    for _ in range(count):
        start = lines.find(b"\n", start) + 1
        if not start:
            return 0
    end = lines.find(b"\n", start)
    if end < 0:
        return 0
    try:
        time = _decode_timed(memoryview(lines)[start:end]).time
    except (msgspec.MsgspecError, ValueError, TypeError, RecursionError):
        return 0
    return time if 0 <= time < 2**63 else 0
