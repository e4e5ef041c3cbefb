"""One verdict everywhere (issue 13 item 2): listing, `show` and a cold resume agree on a child
whose log holds a payload of a known type that fails validation (SPEC 3.2: the session is
corrupt). Logs are written by hand, plain and zstd, so nothing but the readers judges them.

The three verdicts: `ListingService.list_children` (the observation rung: stat, then the cold
reader), `SessionQuery.observe_session` (what `subagents show` reads, then `transcript` decodes
every payload it shows) and `SessionStore.open` (a cold resume: `open_write` and the fold). Each
case is a table row; a healthy control proves the table can tell the two outcomes apart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from clocks import T, ticking_ms
from descriptors import descriptor
from log_lines import encode_header, header, new_log_file, zstd_frame
from subagents.runtime.app import open_runtime
from subagents.runtime.foundation.errors import SessionQueryError
from subagents.runtime.hosts.transcript import transcript
from subagents.storage import CorruptLog, InvalidPayload, StorageError
from subagents.storage.index_rows import COLUMNS as _COLUMNS  # forging an older build's row
from subagents.storage.index_rows import ROW_WIDTH as _ROW_WIDTH
from subagents.storage.index_rows import row_crc as _crc

now_ms = ticking_ms()


def _text(mid: str, role: str, text: str, source: dict[str, Any]) -> dict[str, Any]:
    return {"id": mid, "role": role, "content": [{"type": "text", "text": text}], "source": source}


def _user(message: dict[str, Any]) -> dict[str, Any]:
    return {"type": "user/message", "data": {"turn": 1, "step": 1, "message": message}, "surface_op": "append"}


def _result(content: list[dict[str, Any]]) -> dict[str, Any]:
    message = {"id": "r", "role": "user", "content": content, "source": {"kind": "tool", "call_id": "c1"}}
    return {"type": "tool/result", "data": {"turn": 1, "step": 1, "message": message}, "surface_op": "append"}


_BLOCK = {"type": "tool-result", "call_id": "c1", "content": [{"type": "text", "text": "x"}], "is_error": False}
_ASSISTANT = {"turn": 1, "step": 1, "message": _text("a", "assistant", "done", {"kind": "model"}), "finish": "stop"}

# What follows the descriptor (seq 0) and `turn/start` (seq 1): (events, the seq of the bad one).
CASES: dict[str, tuple[list[dict[str, Any]], int | None]] = {
    "healthy": (
        [
            _user(_text("u", "user", "hi", {"kind": "user"})),
            _result([_BLOCK]),
            {"type": "assistant/message", "data": _ASSISTANT, "surface_op": "append"},
        ],
        None,
    ),
    "user-message-without-id": ([_user({"role": "user", "content": [], "source": {"kind": "user"}})], 2),
    "turn-start-turn-is-a-str": ([{"type": "turn/start", "data": {"turn": "2"}}], 2),
    "turn-end-turn-is-a-float": ([{"type": "turn/end", "data": {"turn": 1.0, "reason": {"kind": "completed"}}}], 2),
    "tool-result-with-two-blocks": ([_result([_BLOCK, _BLOCK])], 2),
    "assistant-message-bad-finish": (
        [{"type": "assistant/message", "data": {**_ASSISTANT, "finish": "done"}, "surface_op": "append"}],
        2,
    ),
    # `show` never decodes step/start: before the fix it showed this log while resume refused it.
    "step-start-unknown-key": ([{"type": "step/start", "data": {"turn": 1, "step": 1, "extra": 1}}], 2),
    "catalog-bad-mode": (
        [
            {
                "type": "subagent/catalog",
                "data": {"version": 1, "child_id": "g", "child_created_at": 1, "mode": "forever"},
            }
        ],
        2,
    ),
}


def _lines(events: list[dict[str, Any]]) -> list[bytes]:
    out = []
    head = [{"type": "subagent/descriptor", "data": descriptor("kid")}, {"type": "turn/start", "data": {"turn": 1}}]
    for seq, event in enumerate(head + events):
        out.append(json.dumps({"seq": seq, "time": T + seq, **event}, separators=(",", ":")).encode() + b"\n")
    return out


def write_child(root: Path, sid: str, events: list[dict[str, Any]], compression: str) -> None:
    session_header = header(sid, T, origin="subagent", parent_session="p", delegation_depth=1)
    head = encode_header(session_header)
    log = new_log_file(root, sid, compression)
    lines = _lines(events)
    if compression == "none":
        log.write_bytes(head + b"".join(lines))
    else:
        log.write_bytes(zstd_frame(head) + zstd_frame(b"".join(lines[:2])) + zstd_frame(b"".join(lines[2:])))


async def verdicts(root: Path, sid: str) -> tuple[str, str, str, list[Exception]]:
    """(listing, show, resume): "ok" or "corrupt" (anything else is named as it is)."""
    errors: list[Exception] = []
    async with open_runtime(root, now_ms=now_ms) as runtime:
        rows = [r.to_json() for r in await runtime.listing.list_children("p")]
        assert [r["id"] for r in rows] == [sid, "sibling"]  # a healthy sibling always lists
        assert rows[1]["kind"] == "child"
        listing = rows[0].get("reason", "ok") if rows[0]["kind"] == "diagnostic" else "ok"
        try:
            async with runtime.query.observe_session(sid) as observation:
                transcript(observation.events, session_id=sid)  # decodes every payload it shows
            show = "ok"
        except SessionQueryError as exc:
            errors.append(exc)
            show = "corrupt" if exc.code == "QUERY_CORRUPT_SESSION" else exc.code
        except InvalidPayload as exc:  # transcript's own decode (the old, late verdict)
            errors.append(exc)
            show = "corrupt (late)"
        try:
            await runtime.sessions.open(sid)
            await runtime.sessions.release(sid)
            resume = "ok"
        except StorageError as exc:
            errors.append(exc)
            resume = "corrupt" if isinstance(exc, CorruptLog) else exc.code
    return listing, show, resume, errors


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("case", list(CASES))
async def test_listing_show_and_resume_give_one_verdict(tmp_path: Path, case: str, compression: str) -> None:
    events, bad_seq = CASES[case]
    write_child(tmp_path, "kid", events, compression)
    write_child(tmp_path, "sibling", CASES["healthy"][0], compression)
    listing, show, resume, errors = await verdicts(tmp_path, "kid")
    want = "ok" if bad_seq is None else "corrupt"
    assert (listing, show, resume) == (want, want, want)
    if bad_seq is not None:
        resume_error = errors[-1]  # names the event, and where it is in the file
        assert isinstance(resume_error, InvalidPayload) and resume_error.seq == bad_seq
        assert f"seq {bad_seq}" in str(resume_error) and resume_error.offset is not None


async def test_a_stale_index_row_cannot_call_an_invalid_payload_healthy(tmp_path: Path) -> None:
    """The index trusts rows at the same revision: a row written by an older build (which did not
    validate payloads) would call this log healthy in `sessions`. Such rows go with the schema
    version. (Listing, show and resume would still refuse it: each of them reads the log, and
    every read validates payloads.)"""
    import sqlite3

    write_child(tmp_path, "kid", CASES["user-message-without-id"][0], "none")
    write_child(tmp_path, "sibling", CASES["healthy"][0], "none")
    async with open_runtime(tmp_path, now_ms=now_ms) as runtime:
        await runtime.listing.list_children("p")
    conn = sqlite3.connect(tmp_path / "index.sqlite3", isolation_level=None)
    assert conn.execute("SELECT damage FROM sessions WHERE id = 'kid'").fetchone() == ("corrupt",)
    # What an older build recorded: the same revision, no damage (a checksum that matches), and
    # its schema version.
    (values,) = conn.execute(f"SELECT {_COLUMNS} FROM sessions WHERE id = 'kid'").fetchall()
    values = (*values[:14], None, values[15], 3, values[2], 3, *values[19:-1])  # damage, counts, scan_end; no crc
    conn.execute("DELETE FROM sessions WHERE id = 'kid'")
    conn.execute(f"INSERT INTO sessions ({_COLUMNS}) VALUES ({', '.join('?' * _ROW_WIDTH)})", (*values, _crc(values)))
    conn.execute("PRAGMA user_version = 3")
    conn.close()
    async with open_runtime(tmp_path, now_ms=now_ms) as runtime:  # `subagents sessions`
        damage = {r.id: r.damage for r in await runtime.query.list_sessions()}
    assert damage == {"kid": "corrupt", "sibling": None}
    listing, show, resume, _ = await verdicts(tmp_path, "kid")
    assert (listing, show, resume) == ("corrupt", "corrupt", "corrupt")
