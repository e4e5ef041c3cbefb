"""What every log store checks before `create` claims a session or an append writes anything (the `LogStore` contract,
storage/log_store.py): the handle is open and alive, each batch continues the seq, the events are
`Event`s of the vocabulary (or ignorable) in order, a seeded log keeps its end-seed marker; then
the exact lines to write. A refusal here leaves the log untouched in every store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from ._codec import Event, encode_events
from .errors import HandleClosed, HandleDead, InvalidEvent, InvalidHeader, SequenceConflict
from .events import KNOWN_TYPES
from .framing import is_seed_marker
from .log_store import Batch, WriteHandle
from .values import FORMAT_VERSION, Offset, SessionHeader, SessionId, check_session_id

__all__ = ["check_append", "check_new_session"]


def check_new_session(header: SessionHeader, inherited_event_count: int) -> SessionId:
    """The id of a session `create` may make from `header`, or the refusal (before anything is
    claimed or written)."""
    sid = check_session_id(header.id)
    if type(inherited_event_count) is not int or inherited_event_count < 0:
        raise InvalidHeader(
            f"session {sid!r}: inherited_event_count must be a non-negative int, got {inherited_event_count!r}"
        )
    if header.format != FORMAT_VERSION or type(header.format) is not int:
        raise InvalidHeader(f"session {sid!r}: this build writes format {FORMAT_VERSION}, not {header.format!r}")
    if header.is_seeded != (inherited_event_count > 0):
        raise InvalidHeader(f"session {sid!r}: is_seeded must be true exactly when inherited_event_count > 0")
    return sid


def check_append(handle: WriteHandle, batches: Sequence[Batch]) -> tuple[list[Event], bytes] | None:
    """The events of `batches` and their encoded lines, or None when they hold no event (each
    batch's expected seq checked all the same)."""
    sid = handle.session_id
    if handle.closed:
        raise HandleClosed(sid, "append")
    if handle.dead is not None:
        raise HandleDead(sid, handle.dead)
    if not any(batch.events for batch in batches):
        for batch in batches:
            if batch.expected_seq != handle.next_seq:
                raise SequenceConflict(sid, expected=batch.expected_seq, actual=handle.next_seq)
        return None
    return _check_batches(handle, batches)


def _check_batches(handle: WriteHandle, batches: Sequence[Batch]) -> tuple[list[Event], bytes]:
    """The events of `batches`, checked and encoded, or a refusal before anything is written."""
    sid = handle.session_id
    events: list[Event] = []
    nxt = handle.next_seq
    for batch in batches:
        if batch.expected_seq != nxt:
            raise SequenceConflict(sid, expected=batch.expected_seq, actual=nxt)
        events.extend(batch.events)
        nxt = Offset(nxt + len(batch.events))
    # One pass of cheap comparisons for the common case; the slow loop only names the culprit.
    # (An Event is valid by construction; a decoded one may carry an unknown type, which a log
    # must not gain by an append.)
    first = handle.next_seq
    if not all(type(e) is Event for e in events) or [e.seq for e in events] != list(range(first, nxt)):
        _refuse_events(sid, first, events)
    if not KNOWN_TYPES.issuperset(e.type for e in events if e.ignorable is not True):
        _refuse_events(sid, first, events)
    k = handle.inherited_event_count
    if k:
        if not handle.published and nxt <= k:
            raise InvalidEvent(
                f"session {sid!r}: a seeded log is published with its whole seed and the end-seed marker at seq {k}"
            )
        if first <= k < nxt and not is_seed_marker(events[k - first]):
            raise InvalidEvent(f"session {sid!r}: seq {k} must be the tagged session/end-seed marker")
    # Every Event is valid by construction (raw data built by hand is checked in
    # Event.__post_init__), so the encoded lines are exactly what readers accept.
    return events, encode_events(events)


def _refuse_events(sid: SessionId, first: int, events: Sequence[Event]) -> NoReturn:
    for i, event in enumerate(events):
        if type(event) is not Event:
            raise InvalidEvent(f"session {sid!r}: batches hold Event values, got {type(event).__name__}")
        if event.type not in KNOWN_TYPES and event.ignorable is not True:
            raise InvalidEvent(f"session {sid!r}: event type {event.type!r} is not in the vocabulary and not ignorable")
        if event.seq != first + i:
            raise InvalidEvent(f"session {sid!r}: a batch holds seq {event.seq} where seq {first + i} belongs")
    raise AssertionError("no event to refuse")
