"""The index's tables and rows: the SQL schema, and what SQLite stores for an `IndexRow` or a
checkpoint row and back (index.py reads and writes them).

Pure: no connection, no file. Every stored row carries a checksum of its values as SQLite
returns them (`row_crc`), and a row read back has every field's type checked (`row_from_sql`,
`stored_lifecycle`): a garbled row, or one this build did not write, raises `ValueError` and is
treated as a miss (rescanned), never handed on wrongly typed.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any, cast

import attrs
import msgspec

from .projection import CheckpointRow, Lifecycle
from .values import HeaderClaim, LogInfo, Offset, Revision, SessionHeader, SessionId

__all__ = [
    "CHECKPOINT_COLUMNS",
    "COLUMNS",
    "ROW_WIDTH",
    "SCHEMA_SQL",
    "SCHEMA_VERSION",
    "UNREADABLE",
    "IndexRow",
    "StoredCheckpoint",
    "row_crc",
    "row_from_sql",
    "row_to_sql",
    "same_lifecycle",
    "stored_lifecycle",
]

_json = msgspec.json
# 3: the `claim` of a damaged header (docs/design.md, "Listing": candidates). 4: rows record
# payload damage too (issue 13: every read validates known payloads; rows of an older build may
# call such a log healthy, so they are dropped with the schema), and every row carries a
# checksum. 5: `last_time`, the last event's time (listings show it: issue 29); rows of an older
# build lack it, so they are dropped with the schema.
SCHEMA_VERSION = 5
_UNREADABLE: Any = object()  # a stored checkpoint value that does not decode
UNREADABLE = _UNREADABLE

SCHEMA_SQL = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    form TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    has_header INTEGER NOT NULL,
    format INTEGER,
    created_at INTEGER,
    is_seeded INTEGER,
    delegation_depth INTEGER,
    cwd TEXT,
    parent_session TEXT,
    origin TEXT,
    agent_preset TEXT,
    damage TEXT,
    inherited_event_count INTEGER NOT NULL,
    event_count INTEGER NOT NULL,
    scan_end INTEGER NOT NULL,
    scan_events INTEGER NOT NULL,
    head BLOB NOT NULL,
    anchor BLOB NOT NULL,
    claim TEXT,
    last_time INTEGER NOT NULL,
    crc INTEGER NOT NULL
);
CREATE TABLE checkpoints (
    session_id TEXT NOT NULL,
    unit_key TEXT NOT NULL,
    ver INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    val BLOB NOT NULL,
    log_offset INTEGER NOT NULL,
    lifecycle BLOB NOT NULL,
    crc INTEGER NOT NULL,
    PRIMARY KEY (session_id, unit_key)
);
"""

COLUMNS = (
    "id, form, size, mtime_ns, inode, has_header, format, created_at, is_seeded, delegation_depth, "
    "cwd, parent_session, origin, agent_preset, damage, inherited_event_count, event_count, "
    "scan_end, scan_events, head, anchor, claim, last_time, crc"
)
ROW_WIDTH = COLUMNS.count(",") + 1
CHECKPOINT_COLUMNS = "session_id, unit_key, ver, seq, val, log_offset, lifecycle, crc"


def row_crc(values: tuple[object, ...]) -> int:
    """A checksum of a row's values as SQLite stores and returns them: a garbled value that still
    has its column's type (a flipped byte in a text) makes its row a miss, not a wrong answer."""
    parts: list[str] = []
    blobs: list[bytes] = []
    for value in values:
        if value is None:
            parts.append("\x00")
        elif type(value) is bytes:
            parts.append("\x01")
            blobs.append(value)
        else:
            parts.append(str(value))
    crc = zlib.crc32("\x1f".join(parts).encode("utf-8", "surrogatepass"))
    for blob in blobs:
        crc = zlib.crc32(blob, crc)
    return crc


@attrs.frozen(kw_only=True)
class StoredCheckpoint:
    """One stored checkpoint row. Its value stays JSON until `row` or `value()` is read: a
    listing decodes only the rows of the unit it needs."""

    key: str
    ver: int
    seq: int
    val_json: bytes | str = attrs.field(repr=False)  # the value, still JSON
    log_offset: int  # a record boundary just after `seq`
    lifecycle: Lifecycle

    @functools.cached_property
    def row(self) -> CheckpointRow:
        val = self.value()
        if val is _UNREADABLE:
            # Not a value this build wrote: a version no unit has (every state_version is
            # >= 0), so every reader ignores the row, as if it were not there.
            return CheckpointRow(ver=-1, seq=self.seq, val=None)
        return CheckpointRow(ver=self.ver, seq=self.seq, val=val)

    def value(self) -> Any:
        """The decoded value (a fresh one on every call), or `UNREADABLE`."""
        try:
            return _json.decode(self.val_json)
        except (msgspec.MsgspecError, ValueError, TypeError, RecursionError, MemoryError):
            return _UNREADABLE  # garbled (or hostile: deeply nested) bytes


@attrs.frozen(kw_only=True)
class IndexRow:
    """What a scan of one log at one revision found."""

    info: LogInfo
    form: str
    scan_end: int  # bytes of complete records (plain) or frames (zstd) the scan covered
    scan_events: int  # events in those bytes (a torn frame's recovered lines excluded)
    # What a log that only grew must still hold: its first bytes and the bytes just before
    # `scan_end`. A file rewritten in place (same inode, larger) fails this and is rescanned.
    head: bytes = b""
    anchor: bytes = b""

    @property
    def id(self) -> SessionId:
        return self.info.id

    @property
    def revision(self) -> Revision:
        return self.info.revision


def _trusted_header(row: tuple[Any, ...]) -> SessionHeader:
    """A header the index wrote from a validated one: rebuilt without re-running validators
    (a listing of a thousand sessions must not pay for a thousand validations). `row_from_sql`
    has checked every field's type first."""
    header = object.__new__(SessionHeader)
    for name, value in (
        ("id", row[0]),
        ("format", row[6]),
        ("created_at", row[7]),
        ("is_seeded", bool(row[8])),
        ("delegation_depth", row[9]),
        ("cwd", row[10]),
        ("parent_session", row[11]),
        ("origin", row[12]),
        ("agent_preset", row[13]),
    ):
        object.__setattr__(header, name, value)
    return header


# size, mtime_ns, inode, inherited, event_count, scan_end, scan_events, last_time
_COUNTS = (2, 3, 4, 15, 16, 17, 18, 22)
_OPTIONAL_TEXT = (10, 11, 12, 13)  # cwd, parent_session, origin, agent_preset


def row_from_sql(row: tuple[Any, ...]) -> IndexRow:
    """A row as SQLite returns it (untyped columns, so every field's type is checked: a row
    this build did not write, or a garbled one, raises ValueError and is rescanned)."""
    if len(row) != ROW_WIDTH or row_crc(row[:-1]) != row[-1]:
        raise ValueError("the row's checksum does not match: garbled")
    damage = row[14]
    if damage not in (None, "corrupt", "unsupported"):
        raise ValueError(f"unknown damage {damage!r}")
    if type(row[0]) is not str or row[1] not in ("none", "zstd") or row[5] not in (0, 1):
        raise ValueError("not a row this build wrote")
    if (
        any(type(row[i]) is not int or row[i] < 0 for i in _COUNTS)
        or type(row[19]) is not bytes
        or type(row[20]) is not bytes
    ):
        raise ValueError("not a row this build wrote")
    if row[5]:
        if any(type(row[i]) is not int or row[i] < 0 for i in (6, 7, 9)) or row[8] not in (0, 1):
            raise ValueError("not a header this build wrote")
        if any(row[i] is not None and type(row[i]) is not str for i in _OPTIONAL_TEXT):
            raise ValueError("not a header this build wrote")
    elif damage is None:
        raise ValueError("a healthy log has a header")
    info = LogInfo(
        id=SessionId(row[0]),
        header=_trusted_header(row) if row[5] else None,
        damage=damage,
        inherited_event_count=Offset(row[15]),
        revision=Revision(size=row[2], mtime_ns=row[3], inode=row[4]),
        event_count=Offset(row[16]),
        claimed=_claim_from_sql(row[21]),
        last_time=row[22],
    )
    return IndexRow(
        info=info,
        form=row[1],
        scan_end=row[17],
        scan_events=row[18],
        head=row[19],
        anchor=row[20],
    )


def row_to_sql(row: IndexRow) -> tuple[object, ...]:
    values = _row_values(row)
    return (*values, row_crc(values))


def _row_values(row: IndexRow) -> tuple[object, ...]:
    info = row.info
    h = info.header
    rev = info.revision
    return (
        info.id,
        row.form,
        rev.size,
        rev.mtime_ns,
        rev.inode,
        1 if h is not None else 0,
        h.format if h else None,
        h.created_at if h else None,
        int(h.is_seeded) if h else None,
        h.delegation_depth if h else None,
        h.cwd if h else None,
        h.parent_session if h else None,
        h.origin if h else None,
        h.agent_preset if h else None,
        info.damage,
        info.inherited_event_count,
        info.event_count,
        row.scan_end,
        row.scan_events,
        row.head,
        row.anchor,
        None if info.claimed is None else _json.encode(list(info.claimed)).decode(),
        info.last_time,
    )


def _claim_from_sql(value: object) -> HeaderClaim | None:
    """A stored claim (JSON `[origin, parent_session, created_at]`); another shape raises
    ValueError, so the row is rescanned."""
    if value is None:
        return None
    try:
        origin, parent, created = _json.decode(str(value))
    except (msgspec.DecodeError, TypeError, ValueError):
        raise ValueError("unreadable claim") from None
    if not (origin is None or type(origin) is str) or not (parent is None or type(parent) is str):
        raise ValueError("unreadable claim")
    if not (created is None or type(created) is int):
        raise ValueError("unreadable claim")
    return HeaderClaim(origin=origin, parent_session=parent, created_at=created)


_LIFECYCLE_TYPES = {
    "format": (int,),
    "created_at": (int,),
    "cwd": (str, type(None)),
    "is_seeded": (bool,),
    "inherited_event_count": (int,),
}


def same_lifecycle(stored: Any, lifecycle: Lifecycle) -> bool:
    """Whether a stored lifecycle record (bytes or str, as SQLite returns it) is `lifecycle`."""
    try:
        return stored_lifecycle(_json.decode(stored)) == lifecycle
    except Exception:  # a garbled record (or not a text at all): not this lifecycle
        return False


def stored_lifecycle(value: object) -> Lifecycle:
    """A stored lifecycle record, its fields' types checked (a garbled one raises ValueError)."""
    if type(value) is not dict:
        raise ValueError("a lifecycle record is an object")
    # A dict msgspec decoded: str keys; a missing or unknown field raises TypeError here, and each
    # field's type is checked below.
    lifecycle = Lifecycle(**cast("dict[str, Any]", value))
    for name, want in _LIFECYCLE_TYPES.items():
        if type(getattr(lifecycle, name)) not in want:
            raise ValueError(f"lifecycle field {name} has the wrong type")
    return lifecycle
