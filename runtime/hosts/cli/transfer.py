"""`subagents export` and `subagents import`: whole sessions from one log store to another
(SPEC §9; README, "PostgreSQL").

A session is copied as its header (line 1, with its inherited-event count) and its events, read
through the source's `LogStore` contract and appended to a fresh session of the target in one
append (one durable write). The events are the stored values themselves (`data` kept as raw
JSON), so the target writes byte-identical event lines; each one is checked to carry the next seq before it is
written, and the copy is read back and compared event by event before it counts.

Refusals come before anything is written: a session the target already has (all of them named),
a damaged session in the source. Checkpoint rows and the index are caches and are not copied:
the target rebuilds them on its first listing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import attrs
from subagents.storage import Batch, Event, LogStore, Offset, StorageError

from ...foundation.errors import CommandFailed, UsageError

__all__ = ["CHUNK", "Copied", "copy_sessions", "empty_folder"]

CHUNK = 1000  # events per `Batch` of the one append


@attrs.frozen
class Copied:
    """One session copied: its id and how many events it holds."""

    session_id: str
    events: int


def empty_folder(path: str) -> bool:
    """`path` is absent or an empty folder (an export target needing no permission)."""
    if not os.path.lexists(path):
        return True
    if not os.path.isdir(path):
        raise UsageError(f"the target is not a folder: {path}")
    return not os.listdir(path)


def copy_sessions(source: LogStore, target: LogStore) -> list[Copied]:
    """Copy every session of `source` into `target`, checked (module docstring). `UsageError`
    when a session exists in both or one of the source's is damaged (nothing written then);
    `CommandFailed` when a read or a write fails part-way (the sessions copied before it stay,
    whole: each is published by its one append)."""
    infos = sorted(source.list(), key=lambda info: info.id)
    damaged = [info.id for info in infos if info.damage is not None]
    if damaged:
        raise UsageError(f"damaged sessions in the source, nothing copied: {', '.join(damaged)}")
    clash = sorted({info.id for info in infos} & {info.id for info in target.list()})
    if clash:
        raise UsageError(f"sessions already in the target, nothing copied: {', '.join(clash)}")
    copied = []
    for info in infos:
        try:
            copied.append(_copy_one(source, target, info.id))
        except StorageError as exc:
            raise CommandFailed(f"copying session {info.id!r} failed after {len(copied)} sessions: {exc}") from None
    return copied


def _copy_one(source: LogStore, target: LogStore, session_id: str) -> Copied:
    reader = source.open_read(session_id)
    try:
        events = source.read(reader)
        header, inherited = reader.header, reader.inherited_event_count
    finally:
        source.close(reader)
    _check_seqs(session_id, events)
    if not events:
        raise CommandFailed(f"session {session_id!r} has no events: nothing to publish")
    writer = target.create(header, inherited_event_count=inherited)
    try:
        # One append: the session is published whole or not at all.
        target.append(writer, [Batch(expected_seq=Offset(first), events=chunk) for first, chunk in _chunks(events)])
    finally:
        target.close(writer)
    _verify(target, session_id, events)
    return Copied(session_id, len(events))


def _check_seqs(session_id: str, events: Sequence[Event]) -> None:
    for seq, event in enumerate(events):
        if event.seq != seq:
            raise CommandFailed(f"session {session_id!r}: event {seq} carries seq {event.seq}")


def _chunks(events: Sequence[Event]) -> Iterator[tuple[int, Sequence[Event]]]:
    for first in range(0, len(events), CHUNK):
        yield first, events[first : first + CHUNK]


def _verify(target: LogStore, session_id: str, events: Sequence[Event]) -> None:
    reader = target.open_read(session_id)
    try:
        back = target.read(reader)
    finally:
        target.close(reader)
    if len(back) != len(events):
        raise CommandFailed(f"session {session_id!r}: wrote {len(events)} events, read back {len(back)}")
    for ours, theirs in zip(events, back, strict=True):
        if ours != theirs or bytes(ours.data) != bytes(theirs.data):
            raise CommandFailed(f"session {session_id!r}: event {ours.seq} reads back differently")
