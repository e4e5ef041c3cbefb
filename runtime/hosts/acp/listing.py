"""`session/list`: the root sessions newest first, a page at a time (SPEC §8; the schema's
`cursor` in, `nextCursor` out), each with its title and last activity.

Pure: the listing's rows in, a page out. The order is by creation (newest first, then id), so a
cursor — the last row's creation time and id, opaque to the client — names a fixed place in it:
sessions created or changed meanwhile neither repeat nor shift a later page.
"""

from __future__ import annotations

import base64
import binascii
import datetime
from collections.abc import Sequence
from typing import Any

import attrs
import msgspec
from subagents.storage import Event, decode_payload

from ...foundation.errors import AcpRequestError
from .rpc import INVALID_PARAMS
from .updates import message_text

__all__ = ["PAGE_SIZE", "Row", "iso_time", "page", "title_of"]

PAGE_SIZE = 20  # sessions per page: each one's log is read for its title
TITLE_WIDTH = 80


@attrs.frozen
class Row:
    created_at: int
    session_id: str
    cwd: str


def page(rows: Sequence[Row], cursor: str | None, size: int = PAGE_SIZE) -> tuple[list[Row], str | None]:
    """The page of `rows` after `cursor` (from the start when None), and the cursor of the next
    page (None on the last). A cursor this agent did not make is a -32602."""
    ordered = sorted(rows, key=_key)
    if cursor is not None:
        after = _key(_decode(cursor))
        ordered = [row for row in ordered if _key(row) > after]
    chosen = ordered[:size]
    return chosen, _encode(chosen[-1]) if len(ordered) > size else None


def title_of(events: Sequence[Event], session_id: str) -> str | None:
    """The session's first text from the person (not a notice, not another agent's message),
    on one line and cut to TITLE_WIDTH; None before there is one."""
    for event in events:
        if event.type != "user/message":
            continue
        message = msgspec.to_builtins(decode_payload(event, session_id=session_id))["message"]
        if message["source"]["kind"] != "user":
            continue
        line = " ".join(message_text(message).split())
        if line:
            return line if len(line) <= TITLE_WIDTH else line[: TITLE_WIDTH - 1] + "…"
    return None


def iso_time(epoch_ms: int) -> str:
    """`epoch_ms` as ISO 8601 in UTC, e.g. `2026-12-01T18:15:00.123Z`."""
    moment = datetime.datetime.fromtimestamp(epoch_ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _key(row: Row | tuple[int, str]) -> tuple[int, str]:
    created_at, sid = (row.created_at, row.session_id) if isinstance(row, Row) else row
    return (-created_at, sid)


def _encode(row: Row) -> str:
    raw = msgspec.json.encode([row.created_at, row.session_id])
    return base64.urlsafe_b64encode(raw).decode("ascii")


def _decode(cursor: str) -> tuple[int, str]:
    try:
        value: Any = msgspec.json.decode(base64.urlsafe_b64decode(cursor.encode("ascii")))
    except (binascii.Error, ValueError, msgspec.DecodeError):
        value = None
    if isinstance(value, list) and len(value) == 2 and type(value[0]) is int and isinstance(value[1], str):
        return value[0], value[1]
    raise AcpRequestError(INVALID_PARAMS, f"Invalid params: {cursor!r} is not a cursor this agent gave")
