"""The header record (line 1 of a log), read and written through one strict cattrs converter.

Strict means: an int is an int (not `"5"`, `true` or `5.9`), a str is a str, a bool is a bool,
unknown keys are refused. Another `format` is reported as unsupported, naming both versions,
but the rest of the record is still parsed so listings can show what the header says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, cast

import attrs
import cattrs
import msgspec

from .errors import CorruptLog, UnsupportedLog
from .values import FORMAT_VERSION, HeaderClaim, Offset, SessionHeader, SessionId

__all__ = ["HeaderRecord", "decode_header_line", "encode_header_line"]


@attrs.frozen(kw_only=True)
class HeaderRecord:
    """Line 1 as stored: the logical header plus the exact inherited cut."""

    header: SessionHeader
    inherited_event_count: Offset


@attrs.frozen(kw_only=True)
class _Wire:
    type: Literal["session"]
    format: int
    id: str
    created_at: int
    is_seeded: bool
    inherited_event_count: int
    delegation_depth: int
    cwd: str | None = None
    parent_session: str | None = None
    origin: Literal["subagent"] | None = None
    agent_preset: str | None = None


def _strict(kind: type) -> Callable[[object, object], object]:
    def hook(value: object, _type: object) -> object:
        if type(value) is not kind:
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    return hook


_converter = cattrs.Converter(forbid_extra_keys=True, omit_if_default=True)
for _kind in (int, str, bool):
    _converter.register_structure_hook(_kind, _strict(_kind))


class HeaderError(Exception):
    """Line 1 is not a format-1 header record; `unsupported` tells another format from damage."""

    def __init__(
        self, reason: str, *, unsupported: bool, header: SessionHeader | None, inherited_event_count: int = 0
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.unsupported = unsupported
        self.header = header
        # With `header`: the seed cut line 1 states (listings keep it consistent with is_seeded).
        self.inherited_event_count = inherited_event_count
        # Without `header` but with a JSON object on line 1: what it says of its lineage.
        self.claimed: HeaderClaim | None = None

    def to_storage_error(self, session_id: str) -> CorruptLog | UnsupportedLog:
        if self.unsupported:
            return UnsupportedLog(session_id, self.reason)
        return CorruptLog(session_id, f"invalid header: {self.reason}", offset=0)


def decode_header_line(line: bytes | memoryview, expected_id: str) -> HeaderRecord:
    """Parse line 1 (without its newline). Raises `HeaderError`."""
    try:
        raw = msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        raise HeaderError(f"not JSON ({exc})", unsupported=False, header=None) from None
    if type(raw) is not dict:
        raise HeaderError("not a JSON object", unsupported=False, header=None)
    raw = cast("dict[str, object]", raw)  # a JSON object: its keys are strings
    try:
        return _decode_object(raw, expected_id)
    except HeaderError as exc:
        if exc.header is None:
            exc.claimed = HeaderClaim.of(raw)
        raise


def _decode_object(raw: dict[str, object], expected_id: str) -> HeaderRecord:
    fmt = raw.get("format")
    if type(fmt) is int and fmt != FORMAT_VERSION:
        # Another format is unsupported whatever else its header holds; the rest is parsed only
        # so that listings can still show what it says.
        header: SessionHeader | None = None
        k = 0
        try:
            record = _parse(raw, expected_id)
            header, k = record.header, record.inherited_event_count
        except HeaderError as exc:
            header = exc.header
        raise HeaderError(
            f"the log uses format {fmt}, but this build reads only format {FORMAT_VERSION}",
            unsupported=True,
            header=header,
            inherited_event_count=k,
        )
    return _parse(raw, expected_id)


def _parse(raw: dict[str, object], expected_id: str) -> HeaderRecord:
    nulls = sorted(key for key, value in raw.items() if value is None)
    if nulls:
        # Absent optional keys are omitted on disk; `null` is a wrong type like any other.
        raise HeaderError(f"keys {nulls} are null (omit an absent key)", unsupported=False, header=None)
    try:
        wire = _converter.structure(raw, _Wire)
    except (cattrs.BaseValidationError, TypeError, ValueError) as exc:
        reason = "; ".join(cattrs.transform_error(exc)) if isinstance(exc, cattrs.BaseValidationError) else str(exc)
        raise HeaderError(reason, unsupported=False, header=None) from None
    try:
        header = SessionHeader(
            format=wire.format,
            id=SessionId(wire.id),
            created_at=wire.created_at,
            is_seeded=wire.is_seeded,
            delegation_depth=wire.delegation_depth,
            cwd=wire.cwd,
            parent_session=SessionId(wire.parent_session) if wire.parent_session is not None else None,
            origin=wire.origin,
            agent_preset=wire.agent_preset,
        )
    except (TypeError, ValueError) as exc:
        raise HeaderError(str(exc), unsupported=False, header=None) from None
    if not 0 <= wire.inherited_event_count < 2**63:
        raise HeaderError("inherited_event_count is out of range", unsupported=False, header=None)
    if wire.is_seeded != (wire.inherited_event_count > 0):
        raise HeaderError(
            "is_seeded must be true exactly when inherited_event_count > 0",
            unsupported=False,
            header=None,
        )
    if wire.id != expected_id:
        raise HeaderError(
            f"header id {wire.id!r} does not match its folder ({expected_id!r})",
            unsupported=False,
            header=None,
        )
    return HeaderRecord(header=header, inherited_event_count=Offset(wire.inherited_event_count))


def encode_header_line(record: HeaderRecord) -> bytes:
    """Line 1, newline included, keys in the documented order, absent optionals omitted."""
    h = record.header
    wire = _Wire(
        type="session",
        format=h.format,
        id=h.id,
        created_at=h.created_at,
        is_seeded=h.is_seeded,
        inherited_event_count=record.inherited_event_count,
        delegation_depth=h.delegation_depth,
        cwd=h.cwd,
        parent_session=h.parent_session,
        origin=h.origin,
        agent_preset=h.agent_preset,
    )
    return msgspec.json.encode(_converter.unstructure(wire)) + b"\n"
