"""The event envelope and its codec: the one module that turns events into lines and back.

The envelope is a strict msgspec Struct (no `"5"`, `true` or `5.9` for an int, unknown keys
refused) whose `data` stays raw JSON until a payload is asked for, so the hot read path never
decodes payloads it does not need. Envelope rules that span fields (surface ops, source seqs)
and that msgspec's types cannot say (non-negative seqs, an object as data) are checked on every
path that makes an `Event`: `Event(...)` itself (its metaclass checks the built value, types
included, since msgspec checks none there) and the two decoders, `decode_event` and
`decode_events` (the only ones: msgspec has already checked the types, and one tight loop checks
the rest for a whole chunk — a `__post_init__` would cost a Python call per event on the hot read
path). So an `Event` that exists is a valid envelope. (Other msgspec builders that bypass both,
`msgspec.structs.replace` and `msgspec.convert`, are not used on events.) Events take no part in
the cyclic GC (`gc=False`: they hold no container that could point back at them), so reading
a large log does not trigger collections.

Writers build events with `make_event`, which refuses data that JSON cannot carry losslessly
(non-finite floats, non-str keys, ints outside ±2^63, lone surrogates, foreign types).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, cast

import msgspec
from msgspec import UNSET, UnsetType

from .errors import InvalidEvent, InvalidPayload, NonLosslessData, UnsupportedEvent
from .events import KNOWN_TYPES, PAYLOAD_TYPES, SOURCE_SEQ_TYPES, SURFACE_TYPES

__all__ = [
    "DECODE_ERRORS",
    "UNSET",
    "Event",
    "PAYLOAD_DECODERS",
    "ReplaceOp",
    "SurfaceOp",
    "check_lossless",
    "check_payload",
    "decode_event",
    "decode_events",
    "decode_payload",
    "encode_event",
    "encode_events",
    "make_event",
    "payload_problem",
]

_INT_MIN = -(2**63)
_INT_MAX = 2**63 - 1


class ReplaceOp(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    op: Literal["replace"]
    start_seq: int
    end_seq: int


SurfaceOp = Literal["append"] | ReplaceOp


_any_value = msgspec.json.Decoder()


def _check_raw(data: msgspec.Raw) -> None:
    """Raw data built by hand must be what a reader accepts: one JSON value in valid UTF-8, on
    the event's own line, that JSON carries losslessly (docs/format.md, "Events": no non-finite
    floats, no ints outside ±2^63 — a reader could not decode them)."""
    raw = bytes(memoryview(data))
    if b"\n" in raw:
        raise ValueError("data holds a line break")
    raw.decode("utf-8")  # UnicodeDecodeError is a ValueError
    try:
        value = _any_value.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ValueError(f"data is not JSON a reader accepts: {exc}") from None
    check_lossless(value, "$.data")


class _EventMeta(msgspec.StructMeta):
    """Checks every `Event` built by calling the class (the decoders check theirs in bulk)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        event = super().__call__(*args, **kwargs)
        _check_envelope(event, trusted=False)
        return event


class Event(
    msgspec.Struct,
    forbid_unknown_fields=True,
    omit_defaults=True,
    frozen=True,
    kw_only=True,
    gc=False,
    metaclass=_EventMeta,
):
    """One event of a session log, exactly as it is stored.

    Optional keys are `UNSET` when absent: on disk they are omitted, and an explicit `null`
    is refused like any other wrong type.
    """

    # The ranges are checked by the decoder itself (in C) when a log is read; `_check_envelope`
    # checks them for an event built by hand.
    seq: Annotated[int, msgspec.Meta(ge=0, le=_INT_MAX)]
    type: str
    time: Annotated[int, msgspec.Meta(ge=0, le=_INT_MAX)]
    data: msgspec.Raw
    ignorable: Literal[True] | UnsetType = UNSET
    surface_op: SurfaceOp | UnsetType = UNSET
    source_event_seqs: list[int] | UnsetType = UNSET


def _check_envelope(event: Event, *, trusted: bool, reading: bool = False) -> None:
    """Raise ValueError/TypeError unless `event` is a valid envelope. Types are checked too
    (msgspec checks them when decoding, not when constructing). `trusted`: built by the codec
    from checked values or decoded from checked lines, so its raw data needs no second look."""
    seq = event.seq
    if type(seq) is not int or type(event.time) is not int or type(event.type) is not str:
        raise TypeError("seq and time must be ints and type a str")
    if not (0 <= seq <= _INT_MAX and 0 <= event.time <= _INT_MAX):
        raise ValueError("seq and time must be non-negative and below 2**63")
    if type(event.data) is not msgspec.Raw or not event.data:
        raise TypeError("data must be raw JSON")
    # An object is the only JSON value that starts with "{" (encoders never emit leading
    # whitespace, and hand-written logs must not either).
    if memoryview(event.data)[0] != 0x7B:
        raise ValueError("data must be a JSON object")
    if not trusted:
        # Built by hand: check what the codec's own builders guarantee. (Readers meet
        # unknown types too, and report them as unsupported rather than corrupt.)
        if event.type not in KNOWN_TYPES and event.ignorable is not True:
            raise ValueError(f"event type {event.type!r} is not in the vocabulary and not ignorable")
        _check_raw(event.data)
        # Its payload too, as `make_event` checks it: a writer vouches for every event it
        # appended (the index trusts it), so no event may reach a log unvalidated.
        decoder = _payload_decoders.get(event.type)
        if decoder is not None:
            try:
                decoder.decode(event.data)
            except DECODE_ERRORS as exc:
                raise ValueError(payload_problem(event, exc)) from None
    if event.ignorable is not True and event.ignorable is not UNSET:
        raise ValueError("ignorable must be true or absent")
    op = event.surface_op
    if reading and event.type not in KNOWN_TYPES:
        # Read from a log: the surface and source rules are this format's, for its own types.
        # A type of a later format is judged by `ignorable` alone (unsupported when it is
        # not); writers of this format still may not put them on a type of their own.
        return
    if event.type in SURFACE_TYPES:
        if op is UNSET:
            raise ValueError(f"surface event {event.type!r} requires surface_op")
        if isinstance(op, ReplaceOp):
            start, end = op.start_seq, op.end_seq
            if type(start) is not int or type(end) is not int or not 0 <= start <= end < seq:
                raise ValueError("surface_op replace range must be ascending and before the event")
        elif op != "append":
            raise ValueError(f"surface_op must be 'append' or a replace, got {op!r}")
    elif op is not UNSET:
        raise ValueError(f"surface_op is forbidden on {event.type!r}")
    seqs = event.source_event_seqs
    if seqs is not UNSET:
        if event.type not in SOURCE_SEQ_TYPES:
            raise ValueError(f"source_event_seqs is forbidden on {event.type!r}")
        if type(seqs) is not list or not seqs:
            raise ValueError("source_event_seqs must be a non-empty list")
        prev = -1
        for s in seqs:
            if type(s) is not int or s <= prev:
                raise ValueError("source_event_seqs must be strictly ascending non-negative ints")
            prev = s
        if prev >= seq:
            raise ValueError("source_event_seqs must precede the event")


_first_byte = struct.Struct("B").unpack_from


def _check_decoded(events: list[Event], *, lines: bool) -> None:
    """The envelope rules msgspec's types cannot say, for freshly decoded events, in one loop:
    the common case costs a few attribute reads per event, and anything unusual (a replace op,
    source seqs, or a broken rule) goes through `_check_envelope`, which raises what a
    `__post_init__` would have: a `msgspec.ValidationError` with the same message (and, for
    `decode_lines`, the same ``- at `$[i]` `` suffix)."""
    surface, unset, replace, first = SURFACE_TYPES, UNSET, ReplaceOp, _first_byte
    for event in events:
        op = event.surface_op
        if (
            first(event.data)[0] != 0x7B
            or (op is unset) is (event.type in surface)  # a surface event needs an op, others refuse one
            or op.__class__ is replace
            or event.source_event_seqs is not unset
        ):
            try:
                _check_envelope(event, trusted=True, reading=True)
            except (ValueError, TypeError) as exc:
                where = f" - at `$[{events.index(event)}]`" if lines else ""
                raise msgspec.ValidationError(f"{exc}{where}") from None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)


def encode_event(event: Event) -> bytes:
    """One event as one line, newline included."""
    return _encoder.encode(event) + b"\n"


def encode_events(events: Sequence[Event]) -> bytes:
    """Events as newline-terminated lines, in one call. Every `Event` is valid by construction
    (see `Event.__post_init__`), so what this returns is what readers accept."""
    return _encoder.encode_lines(events)


def decode_event(line: bytes | memoryview) -> Event:
    """Decode one line; raises `UnicodeDecodeError` or msgspec errors (mapped by the caller)."""
    str(line, "utf-8")  # the decoder does not look inside raw data
    event = _decoder.decode(line)
    _check_decoded([event], lines=False)
    return event


def decode_events(buf: bytes | memoryview, *, utf8: bool = True) -> list[Event]:
    """Decode newline-delimited events; raises `UnicodeDecodeError` or msgspec errors whose
    path names the line index. `utf8=False` leaves the raw `data` values' UTF-8 to the caller:
    the decoder checks every other byte (the envelope forbids unknown fields), and a payload
    check's strict decode checks all of a `data` it accepts (see `decode_event_lines`)."""
    if utf8:
        str(buf, "utf-8")  # the decoder does not look inside raw data
    events = _decoder.decode_lines(buf)
    _check_decoded(events, lines=True)
    return events


# --- writing ----------------------------------------------------------------------------------


MAX_DEPTH = 200  # nesting no event needs, well inside what decoders and the stack allow


def check_lossless(value: object, path: str = "$") -> None:
    """Raise `NonLosslessData` naming the JSON path of the first value JSON cannot carry.

    Iterative, with a depth cap: hostile nesting is a refusal, never a `RecursionError`."""
    stack: list[tuple[object, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        t = type(item)
        if item is None or t is bool:
            continue
        if t is str:
            try:
                item.encode("utf-8")  # type: ignore[union-attr]  # t is str
            except UnicodeEncodeError:
                raise NonLosslessData(f"{where}: string holds a lone surrogate") from None
        elif t is int:
            if not _INT_MIN <= item <= _INT_MAX:  # type: ignore[operator]  # t is int
                raise NonLosslessData(f"{where}: int {item} is outside the signed 64-bit range")
        elif t is float:
            if not math.isfinite(item):  # type: ignore[arg-type]  # t is float
                raise NonLosslessData(f"{where}: float {item} is not finite")
        elif t is dict or t is list or t is tuple or isinstance(item, msgspec.Struct):
            if depth >= MAX_DEPTH:
                raise NonLosslessData(f"{where}: nested deeper than {MAX_DEPTH} levels")
            if isinstance(item, msgspec.Struct):
                stack.append((msgspec.to_builtins(item), where, depth))
            elif isinstance(item, dict):  # exactly a dict (checked above)
                entries = cast("dict[object, object]", item)  # of JSON values, checked here
                for key, child in reversed(list(entries.items())):
                    if type(key) is not str:
                        raise NonLosslessData(f"{where}: key {key!r} is not a str")
                    stack.append((child, f"{where}.{key}", depth + 1))
                    stack.append((key, where, depth + 1))
            elif isinstance(item, (list, tuple)):  # exactly a list or tuple (checked above)
                items = cast("list[object] | tuple[object, ...]", item)  # of JSON values, checked here
                for i in range(len(items) - 1, -1, -1):
                    stack.append((items[i], f"{where}[{i}]", depth + 1))
        else:
            raise NonLosslessData(f"{where}: {t.__name__} is not a JSON value")


def _plain(value: object, depth: int) -> bool:
    """True when `value` is JSON that JSON carries losslessly, its strings aside (the encoder
    itself refuses a lone surrogate): `make_event`'s quick yes for the common case, without the
    JSON paths `check_lossless` builds for every value it visits. A no (and any Struct) is
    judged again by `check_lossless`, which names the culprit, so the two never disagree.
    Scalars inside a container are judged inline: a call per container, not per value."""
    t = type(value)
    items: Iterable[tuple[object, object]]
    if t is dict:
        if depth >= MAX_DEPTH:
            return False
        items = cast("dict[object, object]", value).items()  # exactly a dict (checked above)
    elif t is list or t is tuple:
        if depth >= MAX_DEPTH:
            return False
        items = enumerate(cast("list[object] | tuple[object, ...]", value))  # exactly one of them
        t = list
    else:
        return _plain_scalar(value)
    for key, child in items:
        if t is dict and type(key) is not str:
            return False
        c = type(child)
        if c is str or c is bool or child is None:
            continue
        if c is int:
            if not _INT_MIN <= child <= _INT_MAX:  # type: ignore[operator]  # `type(c) is int` narrows nothing for the checker
                return False
        elif c is float:
            if not math.isfinite(child):  # type: ignore[arg-type]  # `type(c) is float`, as above
                return False
        elif not _plain(child, depth + 1):
            return False
    return True


def _plain_scalar(value: object) -> bool:
    t = type(value)
    if t is str or value is None or t is bool:
        return True
    if t is int:
        return _INT_MIN <= value <= _INT_MAX  # type: ignore[operator]  # `type(value) is int`, as above
    if t is float:
        return math.isfinite(value)  # type: ignore[arg-type]  # `type(value) is float`, as above
    return False


# The constructor `Event(...)` runs through `_EventMeta`, which checks untrusted events in full;
# `make_event` builds from values it has just checked and calls `_check_envelope` itself.
_build_struct = msgspec.StructMeta.__call__


def make_event(
    seq: int,
    type: str,
    time: int,
    data: Mapping[str, Any] | msgspec.Struct,
    *,
    ignorable: bool = False,
    surface_op: SurfaceOp | None = None,
    source_event_seqs: list[int] | None = None,
) -> Event:
    """Build an event to append: the data is checked for lossless JSON and, for a known type,
    against its payload schema, so a log never holds something its readers would refuse."""
    if type.__class__ is not str:  # (`type` is the parameter here, not the builtin)
        raise InvalidEvent(f"event type must be a str, got {type!r}")
    if not isinstance(data, (dict, msgspec.Struct)):
        raise InvalidEvent(f"event {type!r}: data must be an object, got {data.__class__.__name__}")
    if not _plain(data, 0):
        check_lossless(data, "$.data")  # names what JSON cannot carry (a Struct may pass)
    try:
        raw = msgspec.Raw(_encoder.encode(data))
    except UnicodeEncodeError:
        check_lossless(data, "$.data")  # a lone surrogate: named by its JSON path
        raise
    if type in KNOWN_TYPES:
        _check_payload(type, raw)
    elif not ignorable:
        raise InvalidEvent(f"event type {type!r} is not in the vocabulary and not ignorable")
    try:
        event: Event = _build_struct(
            Event,
            seq=seq,
            type=type,
            time=time,
            data=raw,
            ignorable=True if ignorable else UNSET,
            surface_op=UNSET if surface_op is None else surface_op,
            source_event_seqs=UNSET if source_event_seqs is None else source_event_seqs,
        )
        if not (
            seq.__class__ is int
            and time.__class__ is int
            and 0 <= seq <= _INT_MAX
            and 0 <= time <= _INT_MAX
            and surface_op is None
            and source_event_seqs is None
            and data.__class__ is dict
            and type not in SURFACE_TYPES
        ):
            # (Else every rule `_check_envelope` makes holds already: ints in range, a dict
            # encodes as an object, no surface op or source seqs on a type that takes none.)
            _check_envelope(event, trusted=True)  # the data was just encoded from checked values
    except (ValueError, TypeError) as exc:
        raise InvalidEvent(f"event {type!r} at seq {seq}: {exc}") from None
    return event


def _check_payload(type: str, raw: msgspec.Raw) -> None:
    try:
        _payload_decoders[type].decode(raw)
    except msgspec.ValidationError as exc:
        raise InvalidEvent(f"event {type!r}: invalid data: {exc}") from None


# --- payloads ---------------------------------------------------------------------------------

# The one rule set for payloads: `make_event` refuses what these refuse, every read of a log
# checks each known type's payload with them (framing, in its per-event loop), and
# `decode_payload` returns what they build. Read-only by convention.
PAYLOAD_DECODERS: Mapping[str, msgspec.json.Decoder[Any]] = {
    t: msgspec.json.Decoder(cls) for t, cls in PAYLOAD_TYPES.items()
}
_payload_decoders = PAYLOAD_DECODERS
# What hostile bytes make a decoder raise (msgspec errors, invalid UTF-8, a broken struct rule,
# deep nesting, a hostile length): for a reader, every one of them is damage, never a traceback.
DECODE_ERRORS = (msgspec.MsgspecError, ValueError, TypeError, RecursionError, MemoryError)


def decode_payload(event: Event, *, session_id: str) -> Any:
    """The typed payload of a known event type (docs/format.md, "The vocabulary"). Every read of
    a log has already checked it with the same decoder (a log holding a malformed one is corrupt
    for every reader alike); events that come from elsewhere are checked here.

    A malformed payload raises `InvalidPayload` (the session is corrupt); an unknown type raises
    `UnsupportedEvent`.
    """
    decoder = _payload_decoders.get(event.type)
    if decoder is None:
        raise UnsupportedEvent(
            session_id,
            f"event type {event.type!r} is unknown",
            seq=event.seq,
        )
    try:
        return decoder.decode(event.data)
    except DECODE_ERRORS as exc:
        raise InvalidPayload(session_id, payload_problem(event, exc), seq=event.seq) from None


def check_payload(event: Event, *, session_id: str, offset: int | None = None) -> None:
    """Raise `InvalidPayload` (with `offset`, where the line starts) unless the payload of a
    known type validates; events of unknown types are the caller's to judge."""
    decoder = _payload_decoders.get(event.type)
    if decoder is None:
        return
    try:
        decoder.decode(event.data)
    except DECODE_ERRORS as exc:
        raise InvalidPayload(session_id, payload_problem(event, exc), seq=event.seq, offset=offset) from None


def payload_problem(event: Event, exc: BaseException) -> str:
    """The reason an `InvalidPayload` gives (one wording for every reader)."""
    what = str(exc) or type(exc).__name__
    return f"invalid {event.type!r} payload: {what}"
