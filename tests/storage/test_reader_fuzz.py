"""The plain reader against hand-written, damaged logs (SPEC 3.3), with independent expectations.

Every log here is written byte by byte under `<tmp>/sessions/<folder>/session.jsonl` and read
back with a `FileLogStore`. What a reader must make of it comes from `model_log` below: a small,
deliberately naive model of format 1 written from the spec with the stdlib `json` module (strict
UTF-8, no NaN), its own copy of the vocabulary and the envelope rules, and its own line split.
It never calls the code under test, so a disagreement is a finding, not a tautology.

For every case `check_case` compares all the ways a log is looked at — `open_read`+`read`,
`stat`, `open_write` (twice, so a failed open releases its lock) and the first uses of the events
(`decode_payload`, `interrupted_closers`) — and insists that nothing but a `StorageError`
escapes. Fuzz tests collect every disagreement of a family and report them together, grouped.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from clocks import T
from fuzz_report import report
from subagents.storage import (
    Batch,
    CorruptLog,
    FileLogStore,
    InvalidPayload,
    SessionHeader,
    SessionNotFound,
    StorageError,
    UnsupportedEvent,
    UnsupportedLog,
    decode_payload,
    interrupted_closers,
    make_event,
)
from subagents.storage.framing import CHUNK_BYTES
from vocabulary import SURFACE, VOCABULARY

# --- an independent model of format 1 -----------------------------------------------------------

SOURCE_SEQS_ALLOWED = frozenset({"user/message", "tool/result"})
ENVELOPE_KEYS = frozenset({"seq", "type", "time", "data", "ignorable", "surface_op", "source_event_seqs"})
ENVELOPE_REQUIRED = frozenset({"seq", "type", "time", "data"})
HEADER_REQUIRED = frozenset(
    {"type", "format", "id", "created_at", "is_seeded", "inherited_event_count", "delegation_depth"}
)
HEADER_OPTIONAL = frozenset({"cwd", "parent_session", "origin", "agent_preset"})

_INVALID = object()


def strict_json(raw: bytes) -> Any:
    """RFC 8259 JSON or `_INVALID`: UTF-8 only, no NaN/Infinity, no BOM."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return _INVALID

    def no_constants(name: str) -> Any:
        raise ValueError(name)

    try:
        return json.loads(text, parse_constant=no_constants)
    except ValueError:  # JSONDecodeError included
        return _INVALID


def is_int(v: object) -> bool:
    return type(v) is int


def valid_id(v: object) -> bool:
    if type(v) is not str or not v:
        return False
    try:
        size = len(v.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return size <= 80 and all(unicodedata.category(c) != "Cc" for c in v)


def jline(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"


@dataclass
class HeaderModel:
    kind: str  # "ok" | "corrupt" | "unsupported"
    header: SessionHeader | None = None  # what a reader returns (ok) or a listing shows (damaged)
    k: int = 0
    fmt: int | None = None


def _format1_rules(d: dict[str, Any], folder_id: str) -> tuple[SessionHeader, int] | None:
    """The format-1 header rules except the format value; None when any rule fails."""
    keys = set(d)
    if not HEADER_REQUIRED <= keys or not keys <= HEADER_REQUIRED | HEADER_OPTIONAL:
        return None
    if d["type"] != "session" or not is_int(d["format"]) or not valid_id(d["id"]):
        return None
    if not (is_int(d["created_at"]) and d["created_at"] >= 0):
        return None
    if type(d["is_seeded"]) is not bool:
        return None
    for name in ("inherited_event_count", "delegation_depth"):
        if not (is_int(d[name]) and d[name] >= 0):
            return None
    if any(v is None for v in d.values()):  # absent optional keys are omitted, never null
        return None
    cwd = d.get("cwd")
    if cwd is not None and not (type(cwd) is str and cwd.startswith("/")):
        return None
    parent = d.get("parent_session")
    if parent is not None and not valid_id(parent):
        return None
    if d.get("origin") not in (None, "subagent"):
        return None
    preset = d.get("agent_preset")
    if preset is not None and type(preset) is not str:
        return None
    if d["is_seeded"] != (d["inherited_event_count"] > 0):
        return None
    if d["id"] != folder_id:
        return None
    header = SessionHeader(
        format=d["format"],
        id=d["id"],
        created_at=d["created_at"],
        is_seeded=d["is_seeded"],
        delegation_depth=d["delegation_depth"],
        cwd=cwd,
        parent_session=parent,
        origin=d.get("origin"),
        agent_preset=preset,
    )
    return header, d["inherited_event_count"]


def header_model(line: bytes, folder_id: str) -> HeaderModel:
    d = strict_json(line)
    if type(d) is not dict:
        return HeaderModel("corrupt")
    fmt = d.get("format")
    parsed = _format1_rules(d, folder_id)
    if is_int(fmt) and fmt != 1:
        return HeaderModel("unsupported", header=parsed[0] if parsed else None, fmt=fmt)
    if parsed is None:
        return HeaderModel("corrupt")
    return HeaderModel("ok", header=parsed[0], k=parsed[1])


def envelope_model(line: bytes) -> dict[str, Any] | None:
    """The envelope as a dict, or None if it is not a valid record."""
    d = strict_json(line)
    if type(d) is not dict:
        return None
    if not ENVELOPE_REQUIRED <= set(d) or not set(d) <= ENVELOPE_KEYS:
        return None
    seq, kind, time, data = d["seq"], d["type"], d["time"], d["data"]
    if not (is_int(seq) and seq >= 0 and is_int(time) and time >= 0):
        return None
    if type(kind) is not str or type(data) is not dict:
        return None
    if any(v is None for v in d.values()):  # absent optional keys are omitted, never null
        return None
    if d.get("ignorable") not in (None, True):
        return None
    op = d.get("surface_op")
    if kind not in VOCABULARY:
        return d  # a later format's type: the surface and source rules are for this format's own
    if kind in SURFACE:
        if op is None:
            return None
        if op != "append":
            if type(op) is not dict or set(op) != {"op", "start_seq", "end_seq"} or op["op"] != "replace":
                return None
            a, b = op["start_seq"], op["end_seq"]
            if not (is_int(a) and is_int(b) and 0 <= a <= b < seq):
                return None
    elif op is not None:
        return None
    seqs = d.get("source_event_seqs")
    if seqs is not None:
        if kind not in SOURCE_SEQS_ALLOWED or type(seqs) is not list or not seqs:
            return None
        if not all(is_int(s) for s in seqs):
            return None
        if any(b <= a for a, b in zip(seqs, seqs[1:])) or seqs[0] < 0 or seqs[-1] >= seq:
            return None
    return d


# --- payloads: SPEC 3.2, written out independently of storage/events.py -------------------------

_I64, _U64 = -(2**63), 2**64 - 1  # what a typed int field takes (msgspec: int64 or uint64)


def _int(v: object) -> bool:
    return is_int(v) and _I64 <= v <= _U64  # type: ignore[operator]  # is_int narrows to int at run time only


def _str(v: object) -> bool:
    return type(v) is str


def _attempt(v: object) -> bool:
    return _int(v) and v >= 2  # type: ignore[operator]  # _int proved it an int


def _bool(v: object) -> bool:
    return type(v) is bool


def _one_of(*values: object) -> Callable[[object], bool]:
    return lambda v: type(v) in (str, int, bool) and any(v == x and type(v) is type(x) for x in values)


def _obj(required: dict[str, Any], optional: dict[str, Any] | None = None) -> Callable[[object], bool]:
    """An object with exactly these keys (the optional ones may be absent, never null)."""
    optional = optional or {}

    def check(v: object) -> bool:
        if type(v) is not dict or not set(required) <= set(v) or not set(v) <= set(required) | set(optional):
            return False
        return all((required | optional)[k](x) for k, x in v.items())

    return check


def _list_of(item: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: type(v) is list and all(item(x) for x in v)


def _tagged(tag: str, variants: dict[str, Callable[[object], bool]]) -> Callable[[object], bool]:
    def check(v: object) -> bool:
        if type(v) is not dict or tag not in v or v[tag] not in variants:
            return False
        rest = {k: x for k, x in v.items() if k != tag}
        return variants[v[tag]](rest)

    return check


def _block(v: object) -> bool:
    return _tagged(
        "type",
        {
            "text": _obj({"text": _str}),
            "tool-call": _obj({"id": _str, "name": _str, "arguments": _str}),
            "tool-result": _obj({"call_id": _str, "content": _list_of(_block), "is_error": lambda x: type(x) is bool}),
        },
    )(v)


_SOURCE = _tagged(
    "kind",
    {
        "user": _obj({}),
        "model": _obj({}),
        "compaction": _obj({}),
        "tool": _obj({"call_id": _str}),
        "subagent-settled": _obj({"sender_session_id": _str}),
        "agent-message": _obj({"sender_session_id": _str}),
    },
)
_MESSAGE = _obj(
    {"id": _str, "role": _one_of("system", "user", "assistant"), "content": _list_of(_block), "source": _SOURCE}
)
_TURN_STEP = {"turn": _int, "step": _int}


def _tool_result(v: object) -> bool:
    if not _obj(
        _TURN_STEP | {"message": _MESSAGE}, {"error": _obj({"name": _str, "code": _str}), "in_doubt": _one_of(True)}
    )(v):
        return False
    m = v["message"]  # type: ignore[index]  # the _obj check above proved v a dict
    content, source = m["content"], m["source"]
    return (
        m["role"] == "user"
        and source["kind"] == "tool"
        and len(content) == 1
        and content[0]["type"] == "tool-result"
        and content[0]["call_id"] == source["call_id"]
    )


PAYLOADS: dict[str, Callable[[object], bool]] = {
    "system/message": _obj(_TURN_STEP | {"message": _MESSAGE}),
    "user/message": _obj(_TURN_STEP | {"message": _MESSAGE}),
    "assistant/message": _obj(
        _TURN_STEP | {"message": _MESSAGE, "finish": _one_of("stop", "tool-calls", "max-tokens", "error", "aborted")},
        {
            "usage": _obj({"input_tokens": _int, "output_tokens": _int}),
            "interrupted": _one_of(True),
            "attempt": _attempt,
        },
    ),
    "tool/result": _tool_result,
    "turn/start": _obj({"turn": _int}, {"trigger": _obj({"kind": _one_of("message", "notice", "resume")})}),
    "turn/end": _obj(
        {
            "turn": _int,
            "reason": _obj(
                {"kind": _str},  # SPEC §8: any kind is read; one a reader does not know means "error"
                {"cause": _one_of("user", "parent", "disposed"), "message": _str},
            ),
        }
    ),
    "turn/continue": _obj({"turn": _int, "step": _int, "attempt": _attempt, "lost_model_call": _bool}),
    "step/start": _obj(_TURN_STEP),
    "step/end": _obj(_TURN_STEP),
    "tool/call": _obj(_TURN_STEP | {"call_id": _str, "name": _str, "arguments": _str}),
    "session/end-seed": _obj({}, {"inherited": _one_of(True)}),
    "subagent/descriptor": lambda v: type(v) is dict,  # its own domain judges the rest
    "subagent/catalog": _obj(
        {"version": _one_of(1), "child_id": _str, "child_created_at": _int, "mode": _one_of("one-shot", "continuable")},
        {"label": _str, "call_id": _str},
    ),
    "subagent/settled": _obj(
        {"child_id": _str, "reason_kind": _str}, {"closing_text": _str, "reason_message": _str, "run_key": _str}
    ),
    "session/model": _obj({"model": _str}, {"base_url": _str}),
    "session/stopped": _obj({"by": _str, "tree": _bool}),
    "compaction/start": _obj({"turn": _int}),
    "compaction/summary": _obj({"text": _str}),
    "compaction/end": _obj({"start_seq": _int, "end_seq": _int}),
}
assert set(PAYLOADS) == VOCABULARY


ANY_OR = "any-or"  # a seed-marker error may name the line's offset or no offset (SPEC: seq or offset)


@dataclass
class Expect:
    kind: str  # "ok" | "corrupt" | "unsupported-format" | "unsupported-event"
    header: HeaderModel
    events: list[dict[str, Any]] = field(default_factory=list)  # the complete, valid prefix
    seq: int | None = None
    offset: int | None = None
    offset_rule: str = "exact"
    complete_end: int = 0
    payload: bool = False  # corrupt because a known type's payload fails validation

    @property
    def damaged(self) -> bool:
        return self.kind != "ok"

    @property
    def header_damaged(self) -> bool:
        return self.header.kind != "ok"


def model_log(data: bytes, folder_id: str) -> Expect:
    """What format 1 says a reader makes of `data` (the bytes of session.jsonl)."""
    nl = data.find(b"\n")
    if nl < 0:
        return Expect("corrupt", HeaderModel("corrupt"), offset=0)
    head = header_model(data[:nl], folder_id)
    if head.kind == "corrupt":
        return Expect("corrupt", head, offset=0)
    if head.kind == "unsupported":
        return Expect("unsupported-format", head)
    complete_end = data.rfind(b"\n") + 1
    events: list[dict[str, Any]] = []
    starts: list[int] = []
    pos = nl + 1
    while pos < complete_end:
        stop = data.index(b"\n", pos)
        # A record line starts with "{" (writers emit no leading whitespace; this is what lets
        # the reader tell one value per line from blank lines and `{..}{..}` cheaply).
        record = envelope_model(data[pos:stop]) if data[pos:stop].startswith(b"{") else None
        seq = len(events)
        if record is None or record["seq"] != seq:
            return Expect("corrupt", head, events, seq=seq, offset=pos, complete_end=complete_end)
        if record["type"] not in VOCABULARY and record.get("ignorable") is not True:
            return Expect("unsupported-event", head, events, seq=seq, complete_end=complete_end)
        if record["type"] in VOCABULARY and not PAYLOADS[record["type"]](record["data"]):
            # SPEC 3.2: the session is corrupt, for every reader alike (issue 13 item 2).
            return Expect("corrupt", head, events, seq=seq, offset=pos, complete_end=complete_end, payload=True)
        events.append(record)
        starts.append(pos)
        pos = stop + 1
    k = head.k
    if k:
        if len(events) <= k:
            return Expect("corrupt", head, events, seq=len(events), offset=None, complete_end=complete_end)
        marker = events[k]
        if marker["type"] != "session/end-seed" or marker["data"] != {"inherited": True}:
            return Expect(
                "corrupt", head, events, seq=k, offset=starts[k], offset_rule=ANY_OR, complete_end=complete_end
            )
    return Expect("ok", head, events, complete_end=complete_end)


def event_dict(event: Any) -> dict[str, Any]:
    """A read `Event` in the model's terms: data decoded with the stdlib, absent optionals dropped."""
    raw = bytes(event.data)
    data = strict_json(raw)
    out: dict[str, Any] = {
        "seq": event.seq,
        "type": event.type,
        "time": event.time,
        "data": data if data is not _INVALID else ("<not RFC 8259 JSON>", raw),
    }
    if _present(event.ignorable):
        out["ignorable"] = event.ignorable
    op = event.surface_op
    if _present(op):
        out["surface_op"] = (
            op
            if isinstance(op, str)
            else {
                "op": op.op,
                "start_seq": op.start_seq,
                "end_seq": op.end_seq,
            }
        )
    if _present(event.source_event_seqs):
        out["source_event_seqs"] = list(event.source_event_seqs)
    return out


def _present(value: object) -> bool:
    """An optional envelope field that is set (absent ones read as None or msgspec.UNSET)."""
    return value is not None and value is not msgspec.UNSET


# --- hand-written logs --------------------------------------------------------------------------

SID = "fuzz.session-1"
FOLDER = "fuzz.session-1"  # kept as is by the id encoding


def header_dict(sid: str = SID, **changes: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "type": "session",
        "format": 1,
        "id": sid,
        "created_at": T,
        "is_seeded": False,
        "inherited_event_count": 0,
        "delegation_depth": 0,
    }
    d.update(changes)
    return {k: v for k, v in d.items() if v is not _DROP}


_DROP = object()


def header_value(sid: str = SID, **changes: Any) -> SessionHeader:
    return SessionHeader(id=sid, created_at=T, **changes)


def text_message(mid: str, role: str, text: str, source: dict[str, Any]) -> dict[str, Any]:
    return {"id": mid, "role": role, "content": [{"type": "text", "text": text}], "source": source}


# A small turn that exercises every envelope feature. No "J" or "*" anywhere: one flipped bit
# turns them into a newline, which would split a line instead of damaging it.
EVENTS: list[dict[str, Any]] = [
    {"seq": 0, "type": "turn/start", "time": T + 1, "data": {"turn": 1, "trigger": {"kind": "message"}}},
    {"seq": 1, "type": "step/start", "time": T + 2, "data": {"turn": 1, "step": 1}},
    {
        "seq": 2,
        "type": "user/message",
        "time": T + 3,
        "data": {"turn": 1, "step": 1, "message": text_message("u-1", "user", "read it", {"kind": "user"})},
        "surface_op": "append",
    },
    {
        "seq": 3,
        "type": "assistant/message",
        "time": T + 4,
        "data": {
            "turn": 1,
            "step": 1,
            "message": {
                "id": "a-1",
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "looking"},
                    {"type": "tool-call", "id": "call-7", "name": "read", "arguments": '{"path":"/tmp/x"}'},
                ],
                "source": {"kind": "model"},
            },
            "finish": "tool-calls",
            "usage": {"input_tokens": 12, "output_tokens": 3},
        },
        "surface_op": "append",
    },
    {
        "seq": 4,
        "type": "tool/call",
        "time": T + 5,
        "data": {"turn": 1, "step": 1, "call_id": "call-7", "name": "read", "arguments": '{"path":"/tmp/x"}'},
    },
    {
        "seq": 5,
        "type": "tool/result",
        "time": T + 6,
        "data": {
            "turn": 1,
            "step": 1,
            "message": {
                "id": "r-1",
                "role": "user",
                "content": [
                    {
                        "type": "tool-result",
                        "call_id": "call-7",
                        "content": [{"type": "text", "text": "x"}],
                        "is_error": False,
                    }
                ],
                "source": {"kind": "tool", "call_id": "call-7"},
            },
        },
        "surface_op": "append",
        "source_event_seqs": [4],
    },
    {
        "seq": 6,
        "type": "user/message",
        "time": T + 7,
        "data": {"turn": 1, "step": 1, "message": text_message("c-1", "user", "summary", {"kind": "compaction"})},
        "surface_op": {"op": "replace", "start_seq": 2, "end_seq": 3},
        "source_event_seqs": [2, 3],
    },
]

NEXT_EVENT = {"seq": None, "type": "compaction/summary", "time": T + 99, "data": {"text": "after the cut"}}


def log_bytes(header: dict[str, Any] | bytes, events: list[dict[str, Any] | bytes]) -> bytes:
    head = header if isinstance(header, bytes) else jline(header)
    return head + b"".join(e if isinstance(e, bytes) else jline(e) for e in events)


def _event(seq: int, type_: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"seq": seq, "type": type_, "time": T, "data": data}


def seeded_events(k: int) -> list[dict[str, Any]]:
    """K inherited events, the tagged marker at seq K, then two own events."""
    inherited = [
        {"seq": i, "type": "compaction/summary", "time": T + i, "data": {"text": f"inherited {i}"}} for i in range(k)
    ]
    marker = {"seq": k, "type": "session/end-seed", "time": T + k, "data": {"inherited": True}}
    own = [
        {"seq": k + 1, "type": "turn/start", "time": T + k + 1, "data": {"turn": 1}},
        {"seq": k + 2, "type": "turn/end", "time": T + k + 2, "data": {"turn": 1, "reason": {"kind": "completed"}}},
    ]
    return inherited + [marker] + own


def log_path(root: Path, folder: str = FOLDER) -> Path:
    return root / "sessions" / folder / "session.jsonl"


def write_log(root: Path, data: bytes, folder: str = FOLDER) -> Path:
    path = log_path(root, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A new file rather than an overwrite: ext4 flushes a file truncated to zero on close
    # (auto_da_alloc), which would make thousands of cases crawl.
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    return path


# --- comparing the store with the model ---------------------------------------------------------


def error_problems(exc: BaseException, exp: Expect, sid: str, op: str) -> list[str]:
    """Why `exc` is not the error the model expects (empty when it is)."""
    if not isinstance(exc, StorageError):
        return [f"{op}: {type(exc).__module__}.{type(exc).__qualname__} escaped: {exc}"]
    p: list[str] = []
    want = {"corrupt": CorruptLog, "unsupported-format": UnsupportedLog, "unsupported-event": UnsupportedEvent}[
        exp.kind
    ]
    if exp.payload:
        want = InvalidPayload
    if type(exc) is not want:
        return [f"{op}: expected {want.__name__} ({exp.kind}), got {type(exc).__name__}: {exc}"]
    if getattr(exc, "session_id", None) != sid or repr(sid) not in str(exc):
        p.append(f"{op}: the error does not name session {sid!r}: {exc}")
    if exp.kind == "corrupt":
        if exc.code != ("STORAGE_INVALID_PAYLOAD" if exp.payload else "STORAGE_CORRUPT_LOG"):
            p.append(f"{op}: code {exc.code}")
        if exc.seq != exp.seq:
            p.append(f"{op}: seq {exc.seq}, expected {exp.seq}: {exc}")
        offset_ok = exc.offset in (None, exp.offset) if exp.offset_rule == ANY_OR else exc.offset == exp.offset
        if not offset_ok:
            p.append(f"{op}: offset {exc.offset}, expected {exp.offset}: {exc}")
        if exp.seq is not None and f"seq {exp.seq}" not in str(exc):
            p.append(f"{op}: message does not say seq {exp.seq}: {exc}")
        if exc.offset is not None and f"byte offset {exc.offset}" not in str(exc):
            p.append(f"{op}: message does not say byte offset {exc.offset}: {exc}")
    elif exp.kind == "unsupported-format":
        if exc.code != "STORAGE_UNSUPPORTED_FORMAT":
            p.append(f"{op}: code {exc.code}")
        if f"format {exp.header.fmt}" not in str(exc) or "format 1" not in str(exc):
            p.append(f"{op}: message does not name formats {exp.header.fmt} and 1: {exc}")
    else:
        if exc.code != "STORAGE_UNSUPPORTED_EVENT" or exc.seq != exp.seq:
            p.append(f"{op}: expected STORAGE_UNSUPPORTED_EVENT at seq {exp.seq}, got {exc.code} seq {exc.seq}")
    return p


def run(op: str, problems: list[str], fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return fn(), None
    except StorageError as exc:
        return None, exc
    except Exception as exc:  # noqa: BLE001 - a foreign exception is exactly what we look for
        problems.append(f"{op}: {type(exc).__module__}.{type(exc).__qualname__} escaped: {exc!r}")
        return None, exc


def check_case(root: Path, data: bytes, sid: str = SID, folder: str = FOLDER) -> list[str]:
    """Write `data` as the session's log and compare every way of reading it with the model."""
    path = write_log(root, data, folder)
    exp = model_log(data, sid)
    store = FileLogStore(str(root))
    p: list[str] = []

    # open_read + read
    handle, exc = run("open_read", p, lambda: store.open_read(sid))
    if exp.header_damaged:
        if exc is None:
            p.append(f"open_read: succeeded, expected {exp.kind}")
        else:
            p += error_problems(exc, exp, sid, "open_read")
    elif exc is not None:
        p.append(f"open_read: raised {type(exc).__name__}: {exc}; the header is valid")
    else:
        if handle.header != exp.header.header or handle.inherited_event_count != exp.header.k:
            p.append(f"open_read: header {handle.header} / {handle.inherited_event_count}, expected {exp.header}")
        events, exc = run("read", p, lambda: store.read(handle))
        # The stream: the same events, or the same error, whatever the damage.
        streamed, stream_exc = run("read_chunks", p, lambda: [e for c in store.read_chunks(handle) for e in c])
        if (type(stream_exc), str(stream_exc), streamed) != (type(exc), str(exc), events):
            p.append(f"read_chunks: {streamed!r} / {stream_exc!r}, read gave {events!r} / {exc!r}")
        if exp.damaged:
            if exc is None:
                p.append(f"read: succeeded with {len(events)} events, expected {exp.kind} at seq {exp.seq}")
            else:
                p += error_problems(exc, exp, sid, "read")
        elif exc is not None:
            p.append(f"read: raised {type(exc).__name__}: {exc}; expected {len(exp.events)} events")
        else:
            got = [event_dict(e) for e in events]
            if got != exp.events:
                p.append(f"read: events differ from the model:\n  got      {got}\n  expected {exp.events}")
            # First uses of the events: typed errors only.
            for event in events:
                if event.type in VOCABULARY:
                    run(f"decode_payload(seq {event.seq})", p, lambda e=event: decode_payload(e, session_id=sid))
            run("interrupted_closers", p, lambda: interrupted_closers(events, session_id=sid))

    # stat (the listing row)
    info, exc = run("stat", p, lambda: store.stat(sid))
    if exc is not None:
        p.append(f"stat: raised {type(exc).__name__}: {exc}")
    elif info is None:
        p.append("stat: no row for a published session")
    else:
        want_damage = {"ok": None, "corrupt": "corrupt"}.get(exp.kind, "unsupported")
        want_count = len(exp.events) if exp.kind == "ok" else (exp.seq or 0)
        want_k = exp.header.k if exp.header.kind == "ok" else 0
        row = (info.id, info.damage, info.header, info.event_count, info.inherited_event_count)
        want = (sid, want_damage, exp.header.header, want_count, want_k)
        if row != want:
            p.append(f"stat: (id, damage, header, event_count, inherited) = {row}, expected {want}")
        if info.revision.size != len(data):
            p.append(f"stat: revision size {info.revision.size}, file has {len(data)} bytes")

    # open_write: a damaged log refuses (twice: a refused open releases its lock); a healthy one
    # cuts its torn tail.
    for attempt in (1, 2) if exp.damaged else (1,):
        wh, exc = run(f"open_write#{attempt}", p, lambda: store.open_write(sid))
        if exp.damaged:
            if exc is None:
                store.close(wh)
                p.append(f"open_write#{attempt}: succeeded, expected {exp.kind}")
            else:
                p += error_problems(exc, exp, sid, f"open_write#{attempt}")
            if path.read_bytes() != data:
                p.append(f"open_write#{attempt}: changed a damaged log")
        elif exc is not None:
            p.append(f"open_write: raised {type(exc).__name__}: {exc}")
        else:
            try:
                if wh.next_seq != len(exp.events):
                    p.append(f"open_write: next_seq {wh.next_seq}, expected {len(exp.events)}")
                if path.read_bytes() != data[: exp.complete_end]:
                    p.append(f"open_write: file is {path.stat().st_size} bytes, expected {exp.complete_end}")
            finally:
                store.close(wh)
    return p


# --- truncation at every byte -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seeded", [False, True], ids=["unseeded", "seeded-k2"])
def test_truncation_at_every_byte(tmp_path: Path, seeded: bool) -> None:
    k = 2 if seeded else 0
    header = header_dict(is_seeded=seeded, inherited_event_count=k)
    events = seeded_events(k) if seeded else EVENTS[:5]
    head = jline(header)
    lines = [jline(e) for e in events]
    full = head + b"".join(lines)
    ends = [len(head)]
    for line in lines:
        ends.append(ends[-1] + len(line))
    full_store = FileLogStore(str(tmp_path))
    write_log(tmp_path, full)
    reader = full_store.open_read(SID)  # opened on the whole log, re-reads the cut file

    failures: dict[str, list[str]] = {}
    for cut in range(len(full) + 1):
        data = full[:cut]
        write_log(tmp_path, data)
        store = FileLogStore(str(tmp_path))
        p: list[str] = []
        complete = sum(1 for end in ends[1:] if end <= cut)
        if cut < len(head):
            for op, fn in (
                ("open_read", lambda: store.open_read(SID)),
                ("read", lambda: store.read(reader)),
                ("open_write", lambda: store.open_write(SID)),
            ):
                _, exc = run(op, p, fn)
                if not (isinstance(exc, CorruptLog) and exc.code == "STORAGE_CORRUPT_LOG" and exc.offset == 0):
                    p.append(f"{op}: expected CorruptLog at offset 0, got {exc!r}")
            rows = store.list()
            if [(r.id, r.damage, r.header, r.event_count) for r in rows] != [(SID, "corrupt", None, 0)]:
                p.append(f"list: {rows}")
        elif k and complete <= k:
            # A seeded log always holds its seed and marker (published in one piece): a cut
            # before the marker is damage, not a torn tail.
            for op, fn in (("read", lambda: store.read(reader)), ("open_write", lambda: store.open_write(SID))):
                _, exc = run(op, p, fn)
                if not (type(exc) is CorruptLog and exc.seq == complete):
                    p.append(f"{op}: expected CorruptLog at seq {complete}, got {exc!r}")
            rows = store.list()
            want_row = [(SID, "corrupt", header_value(is_seeded=True), complete)]
            if [(r.id, r.damage, r.header, r.event_count) for r in rows] != want_row:
                p.append(f"list: {rows}")
        else:
            got, exc = run("read", p, lambda: store.read(reader))
            if exc is not None or [event_dict(e) for e in got] != events[:complete]:
                p.append(f"read: {exc!r} / {got}")
            rows = store.list()
            want_row = [(SID, None, header_value(is_seeded=seeded), complete, k)]
            if [(r.id, r.damage, r.header, r.event_count, r.inherited_event_count) for r in rows] != want_row:
                p.append(f"list: {rows}")
            wh, exc = run("open_write", p, lambda: store.open_write(SID))
            if exc is not None:
                p.append(f"open_write: {exc!r}")
            else:
                try:
                    end = ends[complete]
                    if wh.next_seq != complete or os.path.getsize(log_path(tmp_path)) != end:
                        p.append(f"open_write: next_seq {wh.next_seq}, size {os.path.getsize(log_path(tmp_path))}")
                    nxt = dict(NEXT_EVENT, seq=complete)
                    event = make_event(nxt["seq"], nxt["type"], nxt["time"], nxt["data"])
                    _, exc = run("append", p, lambda: store.append(wh, [Batch(complete, [event])]))
                finally:
                    store.close(wh)
                after = FileLogStore(str(tmp_path))
                h = after.open_read(SID)
                back = [event_dict(e) for e in after.read(h)]
                if back != events[:complete] + [nxt]:
                    p.append(f"after append: {back}")
                if log_path(tmp_path).read_bytes() != full[:end] + jline(nxt):
                    p.append("after append: the file is not the cut log plus the new line")
        if p:
            failures[f"cut {cut}"] = p
    assert not failures, report(failures, len(full) + 1)


# --- bit flips ----------------------------------------------------------------------------------

FLIP_LINES = [0, 3, 5, 6]  # turn/start, assistant tool call, tool result with sources, last line


@pytest.mark.slow
@pytest.mark.parametrize("line_index", FLIP_LINES, ids=[EVENTS[i]["type"] + f"@{i}" for i in FLIP_LINES])
def test_bit_flips_in_an_event_line(tmp_path: Path, line_index: int) -> None:
    """Every byte of the line, newline included, with one bit flipped; the bit rotates with the
    offset so every bit position is exercised along the line."""
    base = log_bytes(header_dict(), EVENTS)
    assert model_log(base, SID).kind == "ok"
    start = len(jline(header_dict())) + sum(len(jline(e)) for e in EVENTS[:line_index])
    end = start + len(jline(EVENTS[line_index]))
    failures: dict[str, list[str]] = {}
    total = 0
    outcomes: collections.Counter[str] = collections.Counter()
    for offset in range(start, end):
        bit = offset % 8
        data = bytearray(base)
        data[offset] ^= 1 << bit
        total += 1
        outcomes[model_log(bytes(data), SID).kind] += 1
        problems = check_case(tmp_path, bytes(data))
        if problems:
            failures[f"byte {offset} ({chr(base[offset])!r}) bit {bit}"] = problems
    # The family is worth running only if it reaches every outcome a flip can have.
    assert outcomes["corrupt"] and outcomes["ok"], outcomes
    assert not failures, report(failures, total)


@pytest.mark.slow
def test_bit_flips_in_the_header_line(tmp_path: Path) -> None:
    header = header_dict(cwd="/work/p", parent_session="parent-1", origin="subagent", agent_preset="coder")
    base = log_bytes(header, EVENTS[:3])
    end = len(jline(header))
    failures: dict[str, list[str]] = {}
    outcomes: collections.Counter[str] = collections.Counter()
    for offset in range(end):
        for bit in range(8):  # the header is short and decides everything: every bit
            data = bytearray(base)
            data[offset] ^= 1 << bit
            outcomes[model_log(bytes(data), SID).kind] += 1
            problems = check_case(tmp_path, bytes(data))
            if problems:
                failures[f"byte {offset} ({chr(base[offset])!r}) bit {bit}"] = problems
    assert outcomes["corrupt"] and outcomes["ok"] and outcomes["unsupported-format"], outcomes
    assert not failures, report(failures, end * 8)


# --- junk lines ---------------------------------------------------------------------------------

VALID = [jline(e) for e in EVENTS]


def _inserted(index: int, junk: bytes) -> bytes:
    return log_bytes(header_dict(), [*VALID[:index], junk, *VALID[index:]])


def _joined(index: int, sep: bytes = b"") -> list[bytes]:
    """Lines with records `index` and `index + 1` on one line."""
    return [*VALID[:index], VALID[index][:-1] + sep + VALID[index + 1], *VALID[index + 2 :]]


JUNK_LINES = {
    "garbage": b"garbage\n",
    "empty": b"\n",
    "spaces": b"     \n",
    "tab": b"\t\n",
    "cr-only": b"\r\n",
    "nul-line": b"\x00\x00\x00\n",
    "empty-object": b"{}\n",
    "null": b"null\n",
    "array": b"[]\n",
    "bom-record": b"\xef\xbb\xbf" + VALID[0],
    "header-again": jline(header_dict()),
    "half-record": VALID[1][: len(VALID[1]) // 2] + b"\n",
    "trailing-junk": VALID[1][:-1] + b" x\n",
}


def junk_cases() -> dict[str, bytes]:
    cases: dict[str, bytes] = {}
    for name, junk in JUNK_LINES.items():
        for index in (0, 3, len(VALID)):
            cases[f"{name}@{index}"] = _inserted(index, junk)
    head = jline(header_dict())
    cases["crlf-everywhere"] = (head + b"".join(VALID)).replace(b"\n", b"\r\n")
    cases["crlf-on-one-line"] = log_bytes(header_dict(), [*VALID[:2], VALID[2][:-1] + b"\r\n", *VALID[3:]])
    cases["leading-spaces"] = log_bytes(header_dict(), [*VALID[:2], b"  " + VALID[2], *VALID[3:]])
    cases["two-records-one-line@0"] = log_bytes(header_dict(), _joined(0))
    cases["two-records-one-line@5"] = log_bytes(header_dict(), _joined(5))
    cases["two-records-one-line-space@2"] = log_bytes(header_dict(), _joined(2, b" "))
    # A record too many on one line and a blank line elsewhere: the line count still matches.
    cases["two-records-one-line-then-empty@0"] = log_bytes(header_dict(), [*_joined(0)[:1], b"\n", *_joined(0)[1:]])
    cases["two-records-one-line-then-empty@2"] = log_bytes(header_dict(), [*_joined(2)[:3], b"\n", *_joined(2)[3:]])
    cases["two-records-one-line-empty-at-end"] = log_bytes(header_dict(), [*_joined(1), b"\n"])
    cases["duplicate-line@3"] = log_bytes(header_dict(), [*VALID[:4], VALID[3], *VALID[4:]])
    cases["missing-line@3"] = log_bytes(header_dict(), [*VALID[:3], *VALID[4:]])
    return cases


JUNK_CASES = junk_cases()


@pytest.mark.parametrize("name", list(JUNK_CASES))
def test_junk_lines(tmp_path: Path, name: str) -> None:
    problems = check_case(tmp_path, JUNK_CASES[name])
    assert not problems, "\n".join(problems)


def test_junk_expectations_are_the_ones_the_spec_gives() -> None:
    """Pin the model on a few junk cases, so a model bug cannot excuse a reader bug."""
    head_len = len(jline(header_dict()))
    at3 = head_len + sum(len(v) for v in VALID[:3])
    empty = model_log(JUNK_CASES["empty@3"], SID)
    assert (empty.kind, empty.seq, empty.offset) == ("corrupt", 3, at3)
    two = model_log(JUNK_CASES["two-records-one-line-then-empty@2"], SID)
    assert (two.kind, two.seq, two.offset) == ("corrupt", 2, head_len + len(VALID[0]) + len(VALID[1]))
    assert model_log(JUNK_CASES["crlf-everywhere"], SID).kind == "ok"
    assert len(model_log(JUNK_CASES["crlf-everywhere"], SID).events) == len(EVENTS)
    dup = model_log(JUNK_CASES["duplicate-line@3"], SID)
    assert (dup.kind, dup.seq, dup.offset) == ("corrupt", 4, at3 + len(VALID[3]))


# --- envelope and seq damage, spelled out -------------------------------------------------------


def _with(index: int, **changes: Any) -> dict[str, Any]:
    e = dict(EVENTS[index])
    e.update(changes)
    return {k: v for k, v in e.items() if v is not _DROP}


HEAD_LEN = len(jline(header_dict()))


def _offset_of(index: int, lines: list[bytes] = VALID) -> int:
    return HEAD_LEN + sum(len(line) for line in lines[:index])


ENVELOPE_DAMAGE = {
    # name: (line 3 replaced by this record, expected kind)
    "seq-as-string": _with(3, seq="3"),
    "seq-as-bool": _with(3, seq=True),
    "seq-as-float": _with(3, seq=3.0),
    "time-as-fraction": _with(3, time=5.9),
    "time-negative": _with(3, time=-1),
    "unknown-envelope-key": _with(3, extra=1),
    "missing-data": _with(3, data=_DROP),
    "data-array": _with(3, data=[]),
    "data-string": _with(3, data="x"),
    "ignorable-false": _with(3, ignorable=False),
    "ignorable-null": _with(3, ignorable=None),
    "surface-op-null-on-log-only-type": _with(4, seq=3, surface_op=None),
    "source-seqs-null": _with(2, seq=3, source_event_seqs=None),
    "surface-op-missing": _with(3, surface_op=_DROP),
    "surface-op-on-log-only-type": _with(4, seq=3, surface_op="append"),
    "surface-op-unknown-word": _with(3, surface_op="prepend"),
    "replace-range-reaching-itself": _with(3, surface_op={"op": "replace", "start_seq": 1, "end_seq": 3}),
    "replace-range-descending": _with(3, surface_op={"op": "replace", "start_seq": 2, "end_seq": 1}),
    "source-seqs-on-assistant": _with(3, source_event_seqs=[1]),
    "source-seqs-empty": _with(2, seq=3, source_event_seqs=[]),
    "source-seqs-not-ascending": _with(2, seq=3, source_event_seqs=[2, 1]),
    "source-seqs-reaching-itself": _with(2, seq=3, source_event_seqs=[3]),
}


@pytest.mark.parametrize("name", list(ENVELOPE_DAMAGE))
def test_envelope_damage_is_corruption_at_its_line(tmp_path: Path, name: str) -> None:
    lines = [*VALID[:3], jline(ENVELOPE_DAMAGE[name]), *VALID[4:]]
    data = log_bytes(header_dict(), lines)
    exp = model_log(data, SID)
    assert (exp.kind, exp.seq, exp.offset) == ("corrupt", 3, _offset_of(3))
    assert check_case(tmp_path, data) == []


@pytest.mark.parametrize(
    ("name", "lines", "seq", "line"),
    [
        ("gap", [*VALID[:3], *VALID[4:]], 3, 3),
        ("duplicate", [*VALID[:3], VALID[2], *VALID[3:]], 3, 3),
        ("starts-at-1", VALID[1:], 0, 0),
        ("goes-back", [*VALID[:5], VALID[0]], 5, 5),
    ],
)
def test_seq_damage(tmp_path: Path, name: str, lines: list[bytes], seq: int, line: int) -> None:
    data = log_bytes(header_dict(), lines)
    write_log(tmp_path, data)
    store = FileLogStore(str(tmp_path))
    handle = store.open_read(SID)
    with pytest.raises(CorruptLog) as info:
        store.read(handle)
    exc = info.value
    assert (type(exc), exc.code, exc.session_id, exc.seq, exc.offset) == (
        CorruptLog,
        "STORAGE_CORRUPT_LOG",
        SID,
        seq,
        _offset_of(line, lines),
    )
    assert f"seq {seq}" in str(exc) and repr(SID) in str(exc)
    assert check_case(tmp_path, data) == []


def test_unknown_type_without_ignorable_is_unsupported(tmp_path: Path) -> None:
    unknown = {"seq": 3, "type": "team/task", "time": T, "data": {"x": 1}}
    data = log_bytes(header_dict(), [*VALID[:3], jline(unknown)])
    write_log(tmp_path, data)
    store = FileLogStore(str(tmp_path))
    with pytest.raises(UnsupportedLog) as info:
        store.read(store.open_read(SID))
    assert (info.value.code, info.value.seq, info.value.session_id) == ("STORAGE_UNSUPPORTED_EVENT", 3, SID)
    assert "team/task" in str(info.value)
    (row,) = store.list()
    assert (row.damage, row.event_count, row.header) == ("unsupported", 3, header_value())
    assert check_case(tmp_path, data) == []


@pytest.mark.parametrize(
    "extra",
    [
        {"surface_op": "append"},
        {"surface_op": {"op": "replace", "start_seq": 0, "end_seq": 1}},
        {"source_event_seqs": [0, 2]},
    ],
)
@pytest.mark.parametrize("ignorable", [False, True])
def test_a_later_format_type_is_judged_by_ignorable_alone(
    tmp_path: Path, extra: dict[str, Any], ignorable: bool
) -> None:
    """SPEC 3.2: an unknown type without `ignorable` is unsupported — also when it carries
    fields this format gives only its own types; with `ignorable` it reads fine."""
    unknown = {"seq": 3, "type": "future/message", "time": T, "data": {}, **extra}
    if ignorable:
        unknown["ignorable"] = True
    data = log_bytes(header_dict(), [*VALID[:3], jline(unknown)])
    write_log(tmp_path, data)
    store = FileLogStore(str(tmp_path), use_index=False)
    (row,) = store.list()
    if ignorable:
        assert row.damage is None and row.event_count == 4
        assert event_dict(store.read(store.open_read(SID))[3]) == unknown
    else:
        assert (row.damage, row.event_count) == ("unsupported", 3)
    assert check_case(tmp_path, data) == []


def test_unknown_type_with_ignorable_reads_fine(tmp_path: Path) -> None:
    unknown = {"seq": 3, "type": "team/task", "time": T, "data": {"x": [1, {"y": None}]}, "ignorable": True}
    data = log_bytes(header_dict(), [*VALID[:3], jline(unknown), jline(_with(4, seq=4))])
    write_log(tmp_path, data)
    store = FileLogStore(str(tmp_path))
    events = store.read(store.open_read(SID))
    assert [event_dict(e) for e in events] == [*EVENTS[:3], unknown, _with(4, seq=4)]
    assert (events[3].ignorable, json.loads(bytes(events[3].data))) == (True, {"x": [1, {"y": None}]})
    with pytest.raises(UnsupportedLog) as info:
        decode_payload(events[3], session_id=SID)
    assert info.value.code == "STORAGE_UNSUPPORTED_EVENT"
    assert check_case(tmp_path, data) == []


def test_invalid_utf8_inside_data_is_corruption(tmp_path: Path) -> None:
    """RFC 8259 JSON is UTF-8: a record whose payload holds a stray byte is damage (SPEC 3.3)."""
    good = jline(EVENTS[2])
    bad = good.replace(b"read it", b"read \xe9t")
    data = log_bytes(header_dict(), [*VALID[:2], bad, *VALID[3:]])
    write_log(tmp_path, data)
    store = FileLogStore(str(tmp_path))
    handle = store.open_read(SID)
    with pytest.raises(CorruptLog) as info:
        events = store.read(handle)
        # If the reader lets it through, its first use must still fail with a typed error.
        decode_payload(events[2], session_id=SID)
    assert (info.value.seq, info.value.offset) == (2, _offset_of(2))


def _string_spots(line: bytes) -> list[int]:
    """The offsets of the first byte inside each JSON string value or key of `line`'s data."""
    data_at = line.index(b'"data":') + len(b'"data":')
    return [i + 1 for i in range(data_at, len(line) - 1) if line[i] == 0x22 and line[i + 1] not in b'",:}]']


UNKNOWN_IGNORABLE = {
    "seq": 7,
    "type": "team/task",
    "time": T + 8,
    "data": {"note": "abc", "k": ["x"]},
    "ignorable": True,
}
DESCRIPTOR = {"seq": 7, "type": "subagent/descriptor", "time": T + 8, "data": {"label": "abc", "more": {"k": "v"}}}


@pytest.mark.parametrize("extra", [None, UNKNOWN_IGNORABLE, DESCRIPTOR], ids=["vocabulary", "unknown", "descriptor"])
def test_a_stray_byte_in_any_string_of_any_payload_is_corruption_at_read(tmp_path: Path, extra: Any) -> None:
    """Every string of every event's data — a known type's (checked by its strict payload
    decode), a descriptor's free-form object, an ignorable unknown type's — is UTF-8 checked by
    the read itself: the log is corrupt at that record, never read."""
    events = [*EVENTS, extra] if extra is not None else EVENTS
    lines = [jline(e) for e in events]
    cases = [(n, spot) for n, line in enumerate(lines) for spot in _string_spots(line)]
    assert len(cases) > 30
    for n, spot in cases:
        bad = lines[n][:spot] + b"\xe9" + lines[n][spot:]
        data = log_bytes(header_dict(), [*lines[:n], bad, *lines[n + 1 :]])
        root = tmp_path / f"case-{n}-{spot}"
        write_log(root, data)
        store = FileLogStore(str(root))
        try:
            (row,) = store.list()
            assert (row.damage, row.event_count) == ("corrupt", n), (n, bad)
            with pytest.raises(CorruptLog) as info:
                store.read(store.open_read(SID))
            assert (info.value.seq, info.value.offset) == (n, len(jline(header_dict())) + sum(map(len, lines[:n])))
        finally:
            store.close_store()


# --- NUL padding --------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 100, 4096])
def test_nul_padding_after_the_last_record_is_a_torn_tail(tmp_path: Path, count: int) -> None:
    clean = log_bytes(header_dict(), VALID)
    data = clean + b"\x00" * count
    write_log(tmp_path, data)
    store = FileLogStore(str(tmp_path))
    assert [event_dict(e) for e in store.read(store.open_read(SID))] == EVENTS
    (row,) = store.list()
    assert (row.damage, row.event_count, row.revision.size) == (None, len(EVENTS), len(data))
    handle = store.open_write(SID)
    try:
        assert handle.next_seq == len(EVENTS)
        assert log_path(tmp_path).read_bytes() == clean
        nxt = make_event(len(EVENTS), "compaction/summary", T, {"text": "on"})
        store.append(handle, [Batch(len(EVENTS), [nxt])])
    finally:
        store.close(handle)
    assert log_path(tmp_path).read_bytes() == clean + jline(dict(NEXT_EVENT, seq=7, time=T, data={"text": "on"}))


@pytest.mark.parametrize("count", [1, 100, 4096])
def test_nul_bytes_followed_by_a_newline_are_corruption(tmp_path: Path, count: int) -> None:
    clean = log_bytes(header_dict(), VALID)
    data = clean + b"\x00" * count + b"\n"
    write_log(tmp_path, data)
    store = FileLogStore(str(tmp_path))
    with pytest.raises(CorruptLog) as info:
        store.read(store.open_read(SID))
    assert (info.value.seq, info.value.offset) == (len(EVENTS), len(clean))
    with pytest.raises(CorruptLog):
        store.open_write(SID)
    assert log_path(tmp_path).read_bytes() == data  # never silently truncated
    assert check_case(tmp_path, data) == []


def test_nul_padding_inside_the_header_line_is_corruption(tmp_path: Path) -> None:
    data = jline(header_dict())[:-10] + b"\x00" * 50
    assert check_case(tmp_path, data) == []
    with pytest.raises(CorruptLog) as info:
        FileLogStore(str(tmp_path)).open_read(SID)
    assert info.value.offset == 0


# --- the header ---------------------------------------------------------------------------------

HEADER_CORRUPT = {
    "extra-key": header_dict(extra=1),
    "retired-key": header_dict(sandbox_mode="x"),
    "camel-case-key": header_dict(createdAt=T),
    "missing-type": header_dict(type=_DROP),
    "missing-format": header_dict(format=_DROP),
    "missing-id": header_dict(id=_DROP),
    "missing-created-at": header_dict(created_at=_DROP),
    "missing-is-seeded": header_dict(is_seeded=_DROP),
    "missing-inherited-event-count": header_dict(inherited_event_count=_DROP),
    "missing-delegation-depth": header_dict(delegation_depth=_DROP),
    "type-not-session": header_dict(type="event"),
    "format-as-string": header_dict(format="1"),
    "format-as-bool": header_dict(format=True),
    "format-as-float": header_dict(format=1.0),
    "created-at-string": header_dict(created_at="5"),
    "created-at-bool": header_dict(created_at=True),
    "created-at-fraction": header_dict(created_at=5.9),
    "created-at-negative": header_dict(created_at=-1),
    "depth-string": header_dict(delegation_depth="5"),
    "depth-bool": header_dict(delegation_depth=True),
    "depth-fraction": header_dict(delegation_depth=5.9),
    "depth-negative": header_dict(delegation_depth=-1),
    "count-string": header_dict(inherited_event_count="5"),
    "count-bool": header_dict(inherited_event_count=True, is_seeded=True),
    "count-fraction": header_dict(inherited_event_count=5.9, is_seeded=True),
    "count-negative": header_dict(inherited_event_count=-1),
    "is-seeded-int": header_dict(is_seeded=0),
    "is-seeded-string": header_dict(is_seeded="false"),
    "id-int": header_dict(id=5),
    "cwd-relative": header_dict(cwd="work/p"),
    "cwd-int": header_dict(cwd=5),
    "cwd-null": header_dict(cwd=None),
    "agent-preset-null": header_dict(agent_preset=None),
    "origin-other": header_dict(origin="user"),
    "parent-empty": header_dict(parent_session=""),
    "preset-int": header_dict(agent_preset=5),
    "id-not-the-folder": header_dict(id="someone-else"),
    "seeded-without-count": header_dict(is_seeded=True),
    "count-without-seeded": header_dict(inherited_event_count=3),
}


@pytest.mark.parametrize("name", list(HEADER_CORRUPT))
def test_invalid_header_is_corruption_at_offset_0(tmp_path: Path, name: str) -> None:
    data = log_bytes(HEADER_CORRUPT[name], VALID[:2])
    write_log(tmp_path, data)
    store = FileLogStore(str(tmp_path))
    with pytest.raises(CorruptLog) as info:
        store.open_read(SID)
    assert (type(info.value), info.value.code, info.value.offset, info.value.session_id) == (
        CorruptLog,
        "STORAGE_CORRUPT_LOG",
        0,
        SID,
    )
    assert "byte offset 0" in str(info.value)
    (row,) = store.list()
    # SPEC 3.3: a damaged record's header is line 1 under the format-1 rules, or None if even
    # those fail — and they fail here.
    assert (row.id, row.damage, row.header, row.event_count) == (SID, "corrupt", None, 0)
    assert check_case(tmp_path, data) == []


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[]",
        b"null",
        b'"session"',
        b"{",
        jline(header_dict())[:-1] + b"x",
        b"\xef\xbb\xbf" + jline(header_dict()),
        jline(header_dict()).replace(b"fuzz", b"f\xffzz"),
    ],
    ids=["not-json", "array", "null", "string", "open-brace", "trailing-junk", "bom", "invalid-utf8-id"],
)
def test_header_that_is_not_an_object_is_corruption(tmp_path: Path, line: bytes) -> None:
    data = line.rstrip(b"\n") + b"\n" + b"".join(VALID[:2])
    assert check_case(tmp_path, data) == []


@pytest.mark.parametrize("fmt", [2, 0, 99])
def test_another_format_is_unsupported_and_names_both_versions(tmp_path: Path, fmt: int) -> None:
    header = header_dict(format=fmt, cwd="/work/p", delegation_depth=2)
    data = log_bytes(header, VALID[:2])
    write_log(tmp_path, data)
    store = FileLogStore(str(tmp_path))
    for op in (lambda: store.open_read(SID), lambda: store.open_write(SID)):
        with pytest.raises(UnsupportedLog) as info:
            op()
        assert info.value.code == "STORAGE_UNSUPPORTED_FORMAT"
        assert f"format {fmt}" in str(info.value) and "format 1" in str(info.value)
    (row,) = store.list()
    assert (row.damage, row.header, row.event_count) == (
        "unsupported",
        header_value(format=fmt, cwd="/work/p", delegation_depth=2),
        0,
    )
    assert check_case(tmp_path, data) == []


@pytest.mark.parametrize(
    "header",
    [
        header_dict(format=2, extra=1),
        header_dict(format=2, created_at="5"),
        header_dict(format=2, id="other"),
        header_dict(format=2, cwd=None),
    ],
    ids=["extra-key", "wrong-type", "id-not-the-folder", "null-key"],
)
def test_another_format_with_an_invalid_rest_lists_without_a_header(tmp_path: Path, header: dict) -> None:
    data = log_bytes(header, VALID[:2])
    write_log(tmp_path, data)
    store = FileLogStore(str(tmp_path))
    with pytest.raises(UnsupportedLog) as info:
        store.open_read(SID)
    assert info.value.code == "STORAGE_UNSUPPORTED_FORMAT"
    (row,) = store.list()
    assert (row.damage, row.header) == ("unsupported", None)


def test_a_valid_header_with_every_optional_key_round_trips(tmp_path: Path) -> None:
    header = header_dict(
        cwd="/work/p", parent_session="parent-1", origin="subagent", agent_preset="coder", delegation_depth=3
    )
    data = log_bytes(header, VALID)
    assert check_case(tmp_path, data) == []
    handle = FileLogStore(str(tmp_path)).open_read(SID)
    assert handle.header == header_value(
        cwd="/work/p", parent_session="parent-1", origin="subagent", agent_preset="coder", delegation_depth=3
    )


@pytest.mark.parametrize("size", [5000, 40000], ids=["over-4k", "over-32k"])
def test_a_long_header_line_is_read_whole(tmp_path: Path, size: int) -> None:
    header = header_dict(agent_preset="p" * size)
    data = log_bytes(header, VALID[:2])
    assert check_case(tmp_path, data) == []
    assert FileLogStore(str(tmp_path)).open_read(SID).header.agent_preset == "p" * size
    torn = jline(header)[:-20]
    assert check_case(tmp_path, torn) == []
    with pytest.raises(CorruptLog) as info:
        FileLogStore(str(tmp_path)).open_read(SID)
    assert info.value.offset == 0


# --- seeding ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "events", "k", "seq"),
    [
        ("marker-untagged", [*seeded_events(2)[:2], _event(2, "session/end-seed", {})], 2, 2),
        ("marker-elsewhere", [*seeded_events(3)[:2], *seeded_events(2)[2:]], 3, 3),
        ("marker-other-type", [*seeded_events(2)[:2], _event(2, "turn/start", {"turn": 1})], 2, 2),
        ("ends-before-marker", seeded_events(2)[:2], 2, 2),
        ("ends-well-before", seeded_events(4)[:1], 4, 1),
        ("empty-seeded", [], 2, 0),
    ],
)
def test_seed_marker_damage_is_corruption(tmp_path: Path, name: str, events: list, k: int, seq: int) -> None:
    data = log_bytes(header_dict(is_seeded=True, inherited_event_count=k), events)
    write_log(tmp_path, data)
    store = FileLogStore(str(tmp_path))
    handle = store.open_read(SID)
    assert handle.inherited_event_count == k
    with pytest.raises(CorruptLog) as info:
        store.read(handle)
    assert (type(info.value), info.value.seq) == (CorruptLog, seq)
    assert check_case(tmp_path, data) == []


def test_a_well_seeded_log_reads(tmp_path: Path) -> None:
    events = seeded_events(3)
    data = log_bytes(header_dict(is_seeded=True, inherited_event_count=3), events)
    assert check_case(tmp_path, data) == []
    (row,) = FileLogStore(str(tmp_path)).list()
    assert (row.damage, row.inherited_event_count, row.event_count) == (None, 3, 6)


# --- folders: both forms, unpublished sessions, listing ---------------------------------------


def test_both_log_forms_in_one_folder_are_corruption(tmp_path: Path) -> None:
    data = log_bytes(header_dict(), VALID)
    write_log(tmp_path, data)
    (log_path(tmp_path).parent / "session.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd anything")
    store = FileLogStore(str(tmp_path))
    for op in (lambda: store.open_read(SID), lambda: store.open_write(SID)):
        with pytest.raises(CorruptLog) as info:
            op()
        assert info.value.session_id == SID and type(info.value) is CorruptLog
    (row,) = store.list()
    # Damage is reported; line 1 of the plain log is intact, so the row still shows it.
    assert (row.id, row.damage, row.header, row.event_count) == (SID, "corrupt", header_value(), 0)
    assert store.stat(SID) == row


def _publish(store: FileLogStore, sid: str, *texts: str) -> None:
    handle = store.create(SessionHeader(id=sid, created_at=T))
    try:
        events = [make_event(i, "compaction/summary", T, {"text": t}) for i, t in enumerate(texts)]
        store.append(handle, [Batch(0, events)])
    finally:
        store.close(handle)


def test_list_reports_damage_per_session_and_keeps_healthy_siblings(tmp_path: Path) -> None:
    store = FileLogStore(str(tmp_path))
    _publish(store, "healthy-a", "one")
    _publish(store, "z healthy", "one", "two")  # folder "z~20healthy"
    sessions = tmp_path / "sessions"

    def plant(folder: str, files: dict[str, bytes]) -> None:
        (sessions / folder).mkdir()
        for name, content in files.items():
            (sessions / folder / name).write_bytes(content)

    plant("bad-json", {"session.jsonl": log_bytes(header_dict("bad-json"), [VALID[0], b"{oops\n"])})
    plant("format-two", {"session.jsonl": log_bytes(header_dict("format-two", format=2), VALID[:1])})
    plant("torn-header", {"session.jsonl": jline(header_dict("torn-header"))[:20]})
    plant("empty-file", {"session.jsonl": b""})
    plant("both", {"session.jsonl": log_bytes(header_dict("both"), []), "session.jsonl.zst": b"x"})
    plant("only-lock", {"lock": b""})
    plant("only-publish-tmp", {"publish.tmp": log_bytes(header_dict("only-publish-tmp"), VALID)})
    plant("empty-folder", {})
    plant("log-is-a-folder", {})
    (sessions / "log-is-a-folder" / "session.jsonl").mkdir()
    # Names that are not the canonical encoding of any id: ignored, whatever they hold.
    for name in ("~61bc", "a~2f", ".hidden", "~2e", "x~", "x~4", "~C3", "a~7e", "sp ace"):
        plant(name, {"session.jsonl": log_bytes(header_dict(name), VALID[:1])})
    (sessions / "a-plain-file").write_bytes(log_bytes(header_dict("a-plain-file"), []))

    rows = store.list()
    got = {r.id: (r.damage, r.event_count) for r in rows}
    assert got == {
        "healthy-a": (None, 1),
        "z healthy": (None, 2),
        "bad-json": ("corrupt", 1),
        "format-two": ("unsupported", 0),
        "torn-header": ("corrupt", 0),
        "empty-file": ("corrupt", 0),
        "both": ("corrupt", 0),
        "log-is-a-folder": ("corrupt", 0),
    }
    by_id = {r.id: r for r in rows}
    assert by_id["healthy-a"].header == SessionHeader(id="healthy-a", created_at=T)
    assert by_id["bad-json"].header == header_value("bad-json")
    assert by_id["format-two"].header == header_value("format-two", format=2)
    assert by_id["torn-header"].header is None and by_id["empty-file"].header is None
    for sid in ("only-lock", "only-publish-tmp", "empty-folder"):
        assert store.stat(sid) is None
        with pytest.raises(SessionNotFound):
            store.open_read(sid)
    for r in rows:
        assert store.stat(r.id) == r


@pytest.mark.parametrize("leftover", ["lock", "publish.tmp"])
def test_an_unpublished_folder_is_invisible_and_create_reuses_it(tmp_path: Path, leftover: str) -> None:
    folder = tmp_path / "sessions" / FOLDER
    folder.mkdir(parents=True)
    (folder / leftover).write_bytes(log_bytes(header_dict(created_at=1), VALID) if leftover != "lock" else b"")
    store = FileLogStore(str(tmp_path), compression="none")
    assert store.list() == [] and store.stat(SID) is None
    with pytest.raises(SessionNotFound):
        store.open_read(SID)
    handle = store.create(header_value())
    try:
        store.append(handle, [Batch(0, [make_event(0, "turn/start", T, {"turn": 1})])])
    finally:
        store.close(handle)
    assert log_path(tmp_path).read_bytes() == jline(header_dict()) + jline(
        {"seq": 0, "type": "turn/start", "time": T, "data": {"turn": 1}}
    )
    assert not (folder / "publish.tmp").exists()
    (row,) = store.list()
    assert (row.id, row.damage, row.event_count) == (SID, None, 1)


# --- symlinks -----------------------------------------------------------------------------------


def _snapshot(path: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(path.rglob("*")) if p.is_file()}


CORRUPT_ROW = ("corrupt", None, 0)  # (damage, header, event_count) of a refused log


# planted: (open_read, open_write, create) error codes, list() rows or its error code, stat() row
PLANTED = {
    "session-folder": (
        ("STORAGE_UNSAFE_PATH",) * 3,
        [],  # the folder is not a folder: not a session
        None,
    ),
    "log-file": (
        ("STORAGE_UNSAFE_PATH", "STORAGE_UNSAFE_PATH", "STORAGE_SESSION_ALREADY_EXISTS"),
        [(SID, *CORRUPT_ROW)],
        CORRUPT_ROW,
    ),
    "sessions-folder": (
        ("STORAGE_UNSAFE_PATH",) * 3,
        "STORAGE_UNSAFE_PATH",  # sessions/ itself is a link: the whole root is refused
        "STORAGE_UNSAFE_PATH",
    ),
}


@pytest.mark.parametrize("planted", list(PLANTED))
def test_planted_symlinks_are_refused_and_never_followed(tmp_path: Path, planted: str) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    secret = "SECRET-CONTENT"
    (outside / "sessions" / FOLDER).mkdir(parents=True)
    (outside / "sessions" / FOLDER / "session.jsonl").write_bytes(log_bytes(header_dict(agent_preset=secret), VALID))
    (outside / "sessions" / FOLDER / "lock").write_bytes(b"")
    (root / "sessions").mkdir(parents=True)
    if planted == "session-folder":
        (root / "sessions" / FOLDER).symlink_to(outside / "sessions" / FOLDER)
    elif planted == "log-file":
        (root / "sessions" / FOLDER).mkdir()
        log_path(root).symlink_to(outside / "sessions" / FOLDER / "session.jsonl")
    else:
        (root / "sessions").rmdir()
        (root / "sessions").symlink_to(outside / "sessions")
    before = _snapshot(outside)
    store = FileLogStore(str(root))
    codes, want_rows, want_stat = PLANTED[planted]

    got_codes = []
    for op in (lambda: store.open_read(SID), lambda: store.open_write(SID), lambda: store.create(header_value())):
        try:
            result = op()
        except StorageError as exc:
            got_codes.append(exc.code)
            assert secret not in str(exc)
        else:
            raise AssertionError(f"followed a planted symlink: {result}")
    assert tuple(got_codes) == codes
    try:
        rows: object = [(r.id, r.damage, r.header, r.event_count) for r in store.list()]
    except StorageError as exc:
        rows = exc.code
    assert rows == want_rows
    try:
        info = store.stat(SID)
        got_stat: object = None if info is None else (info.damage, info.header, info.event_count)
    except StorageError as exc:
        got_stat = exc.code
    assert got_stat == want_stat

    assert _snapshot(outside) == before
    assert sorted(p.name for p in (outside / "sessions" / FOLDER).iterdir()) == ["lock", "session.jsonl"]


def test_a_symlinked_sibling_does_not_hide_healthy_sessions(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = FileLogStore(str(root))
    _publish(store, "healthy", "x")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "session.jsonl").write_bytes(log_bytes(header_dict("linked"), VALID))
    (root / "sessions" / "linked").symlink_to(tmp_path / "outside")
    assert [(r.id, r.damage) for r in store.list()] == [("healthy", None)]


def test_a_planted_fifo_never_blocks_a_reader(tmp_path: Path) -> None:
    """A FIFO named like a log must be refused, not opened: opening one for reading blocks
    until a writer appears, which would hang `list()` (and every cold read) for good.

    The calls run in a thread watched for 5 s — only a hang ever waits that long — and the
    FIFO's write end is opened afterwards so that a blocked thread is released, not leaked.
    """
    store = FileLogStore(str(tmp_path))
    _publish(store, "healthy", "x")
    fifo = log_path(tmp_path)
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    results: dict[str, object] = {}

    def calls() -> None:
        results["list"] = [(r.id, r.damage) for r in store.list()]
        try:
            store.open_read(SID)
        except StorageError as exc:
            results["open_read"] = exc.code
        else:
            results["open_read"] = "no error"

    worker = threading.Thread(target=calls, daemon=True)
    worker.start()
    worker.join(timeout=5)
    hung = worker.is_alive()
    while worker.is_alive():  # release a blocked open() by becoming the FIFO's writer
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no reader yet: the thread is between two opens
            worker.join(timeout=0.01)
            continue
        os.close(fd)
        worker.join(timeout=1)
    assert not hung, "a FIFO in place of session.jsonl blocked the store (list() / open_read)"
    assert results["list"] in ([("healthy", None)], [("fuzz.session-1", "corrupt"), ("healthy", None)])
    assert results["open_read"] != "no error"


# --- large logs: chunks, located damage, checkpoints --------------------------------------------

BIG_TEXT = "y" * 1000


def _big_lines(n: int) -> list[bytes]:
    return [jline({"seq": i, "type": "compaction/summary", "time": T, "data": {"text": BIG_TEXT}}) for i in range(n)]


def _chunk_starts(lines: list[bytes]) -> list[int]:
    """Where each decode chunk starts (as a line index): whole lines packed greedily into chunks
    of at most CHUNK_BYTES, a longer line alone in its own chunk."""
    starts = []
    i = 0
    while i < len(lines):
        starts.append(i)
        size = len(lines[i])
        i += 1
        while i < len(lines) and size + len(lines[i]) <= CHUNK_BYTES:
            size += len(lines[i])
            i += 1
    return starts


N_BIG = 2600  # ~2.6 MiB: three chunks


def test_a_large_log_reads_in_chunks_calling_the_poll_between_them(tmp_path: Path) -> None:
    lines = _big_lines(N_BIG)
    assert sum(map(len, lines)) > 2 * CHUNK_BYTES
    write_log(tmp_path, jline(header_dict()) + b"".join(lines))
    store = FileLogStore(str(tmp_path))
    handle = store.open_read(SID)
    calls = []
    events = store.read(handle, poll=lambda: calls.append(1))
    assert len(events) == N_BIG and [e.seq for e in events] == list(range(N_BIG))
    assert len(calls) == len(_chunk_starts(lines)) - 1 >= 2


def test_an_exception_from_the_poll_propagates_unchanged(tmp_path: Path) -> None:
    lines = _big_lines(N_BIG)
    assert len(_chunk_starts(lines)) >= 3
    write_log(tmp_path, jline(header_dict()) + b"".join(lines))
    store = FileLogStore(str(tmp_path))
    handle = store.open_read(SID)

    class Cancelled(Exception):
        pass

    boom = Cancelled("cancelled by the caller")
    calls = []

    def poll() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise boom

    with pytest.raises(Cancelled) as info:
        store.read(handle, poll=poll)
    assert info.value is boom and len(calls) == 2
    # The handle is still usable: the abandoned read left nothing behind.
    assert len(store.read(handle)) == N_BIG


def test_a_line_longer_than_a_chunk_reads_whole(tmp_path: Path) -> None:
    huge = {"seq": 1, "type": "compaction/summary", "time": T, "data": {"text": "z" * (CHUNK_BYTES + 10)}}
    lines = [_big_lines(1)[0], jline(huge), *_big_lines(3)[2:]]
    write_log(tmp_path, log_bytes(header_dict(), lines))
    store = FileLogStore(str(tmp_path))
    calls = []
    events = store.read(store.open_read(SID), poll=lambda: calls.append(1))
    assert [e.seq for e in events] == [0, 1, 2]
    assert json.loads(bytes(events[1].data)) == huge["data"]
    assert len(calls) == len(_chunk_starts(lines)) - 1 == 2


@pytest.mark.parametrize("damage", ["invalid-json", "seq-gap", "unknown-type", "empty-line", "two-on-one-line"])
def test_damage_in_a_later_chunk_is_located(tmp_path: Path, damage: str) -> None:
    lines = _big_lines(N_BIG)
    at = 2300  # beyond two chunks
    bad = at
    kind: type[StorageError] = CorruptLog
    if damage == "invalid-json":
        lines[at] = lines[at][:100] + b"\n"
    elif damage == "seq-gap":
        del lines[at]
    elif damage == "unknown-type":
        lines[at] = lines[at].replace(b"compaction/summary", b"compaction/unknown")
        kind = UnsupportedEvent
    elif damage == "empty-line":
        lines.insert(at, b"\n")
    else:
        lines[at : at + 2] = [lines[at][:-1] + lines[at + 1]]
    offset = HEAD_LEN + sum(map(len, lines[:at]))
    assert offset > 2 * CHUNK_BYTES
    data = jline(header_dict()) + b"".join(lines)
    write_log(tmp_path, data)
    store = FileLogStore(str(tmp_path))
    calls = []
    with pytest.raises(kind) as info:
        store.read(store.open_read(SID), poll=lambda: calls.append(1))
    assert type(info.value) is kind and info.value.seq == bad
    if kind is CorruptLog:
        assert info.value.offset == offset and f"byte offset {offset}" in str(info.value)
    # Found while decoding the chunk holding line `at`, after a poll before each earlier one.
    damaged_chunk = max(i for i, start in enumerate(_chunk_starts(lines)) if start <= at)
    assert len(calls) == damaged_chunk >= 2
    (row,) = store.list()
    assert (row.damage, row.event_count) == ("corrupt" if kind is CorruptLog else "unsupported", bad)
