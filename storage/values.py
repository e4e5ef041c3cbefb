"""Storage values: ids, seqs, offsets, the session header, revisions and listing rows.

A `Seq` names an existing event (0-based, contiguous in a log); an `Offset` is a count, a cut or
a read boundary and may equal the event count. They are different types on purpose.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Final, Literal, NamedTuple, NewType

import attrs

from .errors import InvalidSessionId

__all__ = [
    "ANOTHER_PROCESS",
    "FORMAT_VERSION",
    "AbortPoll",
    "MAX_ID_BYTES",
    "Damage",
    "HeaderClaim",
    "LogInfo",
    "Offset",
    "Revision",
    "Seq",
    "SessionHeader",
    "SessionId",
    "check_session_id",
    "decode_session_id",
    "encode_session_id",
]

FORMAT_VERSION = 1
MAX_ID_BYTES = 80

SessionId = NewType("SessionId", str)
Seq = NewType("Seq", int)
Offset = NewType("Offset", int)

Damage = Literal["corrupt", "unsupported"]

# A read's abort poll (not a projection checkpoint): called between chunks of a long read;
# raising from it abandons the read.
AbortPoll = Callable[[], None]


def check_session_id(value: object) -> SessionId:
    """Return `value` as a `SessionId`, or raise `InvalidSessionId` saying why."""
    if type(value) is not str:
        raise InvalidSessionId(f"session id must be a str, got {type(value).__name__}")
    if not value:
        raise InvalidSessionId("session id must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidSessionId(f"session id {value!r} is not valid UTF-8 (lone surrogate)") from None
    if size > MAX_ID_BYTES:
        raise InvalidSessionId(f"session id {value[:20]!r}… is {size} UTF-8 bytes; at most {MAX_ID_BYTES} are allowed")
    # ASCII ids (the usual case) hold a control character only if they are not printable: no
    # per-character lookup for them.
    if not (value.isascii() and value.isprintable()):
        for ch in value:
            if unicodedata.category(ch) == "Cc":
                raise InvalidSessionId(f"session id {value!r} contains control character {ch!r}")
    return SessionId(value)


_KEPT = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_DOT = ord(".")


def encode_session_id(session_id: str) -> str:
    """The folder name of a session: safe bytes kept, every other byte (and `~`) as `~XX`.

    At most 240 characters for a valid id, so it always fits a file name, and never `.`/`..`
    or anything with a `/`, so it cannot leave `sessions/`.
    """
    sid = check_session_id(session_id)
    out: list[str] = []
    for i, byte in enumerate(sid.encode("utf-8")):
        if byte in _KEPT or (byte == _DOT and i > 0):
            out.append(chr(byte))
        else:
            out.append(f"~{byte:02X}")
    return "".join(out)


def decode_session_id(name: str) -> SessionId | None:
    """The id a folder name canonically encodes, or `None` for any other name."""
    raw = bytearray()
    i = 0
    n = len(name)
    try:
        while i < n:
            ch = name[i]
            if ch == "~":
                hexpart = name[i + 1 : i + 3]
                if len(hexpart) != 2 or hexpart.upper() != hexpart:
                    return None
                raw.append(int(hexpart, 16))
                i += 3
            else:
                raw.append(ord(ch))
                i += 1
        sid = check_session_id(raw.decode("utf-8"))
    except (ValueError, InvalidSessionId):
        return None
    return sid if encode_session_id(sid) == name else None


def _non_negative(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    # JSON ints beyond 64 bits are not lossless, and SQLite could not hold them either.
    if type(value) is not int or not 0 <= value < 2**63:
        raise ValueError(f"{attribute.name} must be an int in [0, 2**63), got {value!r}")


def _optional_id(_inst: object, attribute: attrs.Attribute[SessionId | None], value: SessionId | None) -> None:
    if value is not None:
        check_session_id(value)


def _text(value: object, name: str) -> str:
    if type(value) is not str:
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} {value!r} is not valid UTF-8 (lone surrogate)") from None
    return value


def _absolute_cwd(_inst: object, _attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and not _text(value, "cwd").startswith("/"):
        raise ValueError(f"cwd must be an absolute path, got {value!r}")


def _optional_text(_inst: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None:
        _text(value, attribute.name)


def _bool(_inst: object, attribute: attrs.Attribute[bool], value: bool) -> None:
    if type(value) is not bool:
        raise TypeError(f"{attribute.name} must be a bool, got {type(value).__name__}")


@attrs.frozen(kw_only=True)
class SessionHeader:
    """Immutable storage metadata of a session (the logical header; the inherited cut is not here)."""

    id: SessionId = attrs.field(validator=lambda _i, _a, v: check_session_id(v))
    created_at: int = attrs.field(validator=_non_negative)
    is_seeded: bool = attrs.field(default=False, validator=_bool)
    delegation_depth: int = attrs.field(default=0, validator=_non_negative)
    cwd: str | None = attrs.field(default=None, validator=_absolute_cwd)
    parent_session: SessionId | None = attrs.field(default=None, validator=_optional_id)
    origin: Literal["subagent"] | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(("subagent",)))
    )
    agent_preset: str | None = attrs.field(default=None, validator=_optional_text)
    format: int = FORMAT_VERSION


ANOTHER_PROCESS: Final = "another process"  # a lock holder `LogReader.holders` cannot name


class Revision(NamedTuple):
    """What tells a changed log from an unchanged one without reading it.

    A named tuple rather than an attrs class: a listing builds and compares one per session,
    and that must stay within a small factor of a bare `stat`.
    """

    size: int
    mtime_ns: int
    inode: int


class HeaderClaim(NamedTuple):
    """What the line 1 of a damaged log *says* about its lineage, unvalidated.

    Kept only when line 1 is a JSON object that does not pass the header rules (an unknown key,
    a wrong type, an id that is not its folder's): listings must not lose such a child
    (docs/design.md, "Listing": candidates; "still a JSON object" is what counts). Each field is
    the raw value when it has the right JSON type, else None. Never a `SessionHeader`: nothing
    may mistake it for a validated one.
    """

    origin: str | None
    parent_session: str | None
    created_at: int | None

    @classmethod
    def of(cls, raw: dict[str, object]) -> HeaderClaim:
        """The claim of a decoded line 1 (a JSON object)."""
        origin, parent, created = raw.get("origin"), raw.get("parent_session"), raw.get("created_at")
        return cls(
            origin=origin if type(origin) is str else None,
            parent_session=parent if type(parent) is str else None,
            created_at=created if type(created) is int and -(2**63) <= created < 2**63 else None,
        )


@attrs.frozen(kw_only=True)
class LogInfo:
    """One session as `LogStore.list()`/`stat()` report it; damage is reported, never raised.

    For a damaged log `header` is line 1 parsed with the format-1 rules except the `format`
    value, or `None` when even that fails; then `claimed` is what line 1 says of its lineage if
    it is at least a JSON object (else None). `event_count` counts the events before the damage.

    `last_time`: the `time` field of the last event counted (epoch ms): the session's last durable
    event, the same on every backend (a log file's mtime is not: a copy or an export moves it).
    0 when unknown: no event, or a damaged log whose events before the damage were not decoded.

    `checked` False: only line 1 was read (a store told to list one parent's children reads no
    more of a log whose line 1 names another parent): `header` is line 1's, and `damage`,
    `event_count` and `last_time` (0) are unknown — a `stat` of the session reads it whole.
    """

    id: SessionId
    header: SessionHeader | None
    damage: Damage | None
    inherited_event_count: Offset
    revision: Revision
    event_count: Offset
    claimed: HeaderClaim | None = None
    checked: bool = True
    last_time: int = 0

    @classmethod
    def healthy(
        cls, id: SessionId, header: SessionHeader, k: int, revision: Revision, event_count: int, last_time: int
    ) -> LogInfo:
        """A log read whole without damage: its header, `k` inherited events, `event_count` and
        the last one's `time` (0 without events)."""
        k, count = Offset(k), Offset(event_count)
        return cls(
            id=id,
            header=header,
            damage=None,
            inherited_event_count=k,
            revision=revision,
            event_count=count,
            last_time=last_time if event_count else 0,
        )
