"""Projection units, their per-session cells, and checkpoint values (docs/design.md, "Projections
and checkpoints"; the stored rows: docs/format.md, "The index").

A unit is a pure fold over a session's events: `initial(header, inherited_event_count)`, then
`apply(state, event)` for every event, returning the *same object* for events it ignores. State
is plain JSON. An optional `view(state)` is the client-visible value; a unit without one is
host-only (never in snapshots, still checkpointed). Units must not raise on bad data — they
reset to their "no value" state — but if `apply` raises anyway (a bug), only that unit's cell is
marked broken: a snapshot naming its key raises `ProjectionBroken`, every other key and the
session carry on.

Two optional members let a unit fold a long read cheaply; both must give exactly the state the
plain left fold of `apply` gives. `types` (a frozenset of event types) promises that `apply`
returns the same state for every other type, so a fold skips those events unseen. `fold(state,
events)` folds a whole run of contiguous events in one call (a unit that reacts to every event,
but only cheaply, folds a long read without a Python call per event).

`ProjectionCells` holds one cell per registered unit for one session: the state and the
watermark (the last folded seq, -1 before any). `snapshot(keys)` brings every cell to the end
but views only the selected keys, so a broken view of an unrelated unit cannot break a keyed
read. Checkpoint rows `{key: {ver, seq, val}}` bind to a `Lifecycle` identity; a row with
another `ver` or identity is ignored, never migrated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, cast

import attrs

from ._codec import Event
from .errors import ProjectionBroken, UnknownProjection
from .values import Offset, Revision, SessionHeader, SessionId

__all__ = [
    "CheckpointRow",
    "Lifecycle",
    "ObservedCheckpoint",
    "ProjectionCells",
    "ProjectionRegistry",
    "ProjectionUnit",
]

JsonValue = Any  # plain JSON: None, bool, int, float, str, list, dict[str, ...]


class ProjectionUnit(Protocol):
    key: str
    state_version: int

    @property
    def view(self) -> Callable[[JsonValue], JsonValue] | None:
        """The client-visible value of a state (a unit's method; None: host-only)."""
        ...

    def initial(self, header: SessionHeader, inherited_event_count: Offset) -> JsonValue: ...

    def apply(self, state: JsonValue, event: Event) -> JsonValue: ...

    # Optional (looked up with getattr, so plain units need neither):
    #   types: frozenset[str] | None — `apply` ignores every event of another type
    #   fold(state, events: Sequence[Event]) -> state — the left fold of `apply` in one call


BatchFold = Callable[[JsonValue, Sequence[Event]], JsonValue]


@attrs.frozen(kw_only=True)
class Lifecycle:
    """Binds checkpoint rows to one lifecycle of a session id (a recreated id never matches)."""

    format: int
    created_at: int
    cwd: str | None
    is_seeded: bool
    inherited_event_count: int

    @classmethod
    def of(cls, header: SessionHeader, inherited_event_count: int) -> Lifecycle:
        return cls(
            format=header.format,
            created_at=header.created_at,
            cwd=header.cwd,
            is_seeded=header.is_seeded,
            inherited_event_count=inherited_event_count,
        )


@attrs.frozen(kw_only=True)
class CheckpointRow:
    ver: int
    seq: int  # the last folded seq (>= 0 for stored rows)
    val: JsonValue


@attrs.frozen(kw_only=True)
class ObservedCheckpoint:
    """Checkpoint rows a reader proved by folding a whole log (a listing's observation), all at
    seq `event_count - 1`, the last event of the log at `revision` as it was read. The values
    are JSON already: a listing keeps one of these per observed child until its one write."""

    session_id: SessionId
    lifecycle: Lifecycle
    revision: Revision
    event_count: int
    rows: tuple[tuple[str, int, bytes], ...]  # (unit key, state version, value as JSON)

    def rows_to_write(self, stored: Sequence[tuple[str, int, int]]) -> tuple[list[tuple[str, int, bytes]], bool] | None:
        """What an index writes of these rows, given `stored`: (unit key, version, seq) of the
        rows it holds for this session's lifecycle at this seq or later. None: nothing (a writer's
        fresher rows win, or the same rows are there); else (rows, replace): with none stored,
        all of them in place of whatever the session had; with rows of this very seq stored (a
        build that folded fewer units wrote them), only the units they lack or hold at another
        version, beside them — else every listing would read the log again."""
        seq = self.event_count - 1
        if not stored:
            return list(self.rows), True
        if any(at > seq for _key, _ver, at in stored):
            return None
        have = {(key, ver) for key, ver, _at in stored}
        missing = [row for row in self.rows if (row[0], row[1]) not in have]
        return (missing, False) if missing else None


@attrs.define(eq=False)
class _Cell:
    unit: ProjectionUnit
    state: JsonValue
    seq: int  # watermark: the last folded seq, -1 before any
    broken: BaseException | None = None
    batch: BatchFold | None = None  # the unit's own `fold`, if it has one
    types: frozenset[str] | None = None  # the unit's `types`, if it declares them


def _fast_paths(unit: ProjectionUnit) -> tuple[BatchFold | None, frozenset[str] | None]:
    """The unit's optional batch `fold` and `types` (anything else under those names is not)."""
    batch: object = getattr(unit, "fold", None)
    types: object = getattr(unit, "types", None)
    return (
        cast("BatchFold", batch) if callable(batch) else None,
        cast("frozenset[str]", types) if isinstance(types, frozenset) else None,
    )


class ProjectionRegistry:
    """The units of a runtime, handed in by the composition root; keys are unique."""

    def __init__(self, units: Iterable[ProjectionUnit]) -> None:
        self.units: tuple[ProjectionUnit, ...] = tuple(units)
        keys = [u.key for u in self.units]
        if len(set(keys)) != len(keys):
            raise ValueError(f"projection keys must be unique, got {keys}")
        for unit in self.units:
            if type(unit.state_version) is not int or unit.state_version < 0:
                raise ValueError(f"projection {unit.key!r}: state_version must be a non-negative int")
        self._fast = [_fast_paths(unit) for unit in self.units]  # looked up once, not per session

    def cells(
        self,
        header: SessionHeader,
        inherited_event_count: Offset,
        rows: Mapping[str, CheckpointRow] | None = None,
    ) -> ProjectionCells:
        """Fresh cells, seeded from checkpoint rows whose `ver` matches (caller checks identity)."""
        return ProjectionCells(self.units, header, inherited_event_count, rows or {}, fast=self._fast)


class ProjectionCells:
    def __init__(
        self,
        units: Sequence[ProjectionUnit],
        header: SessionHeader,
        inherited_event_count: Offset,
        rows: Mapping[str, CheckpointRow],
        *,
        fast: Sequence[tuple[BatchFold | None, frozenset[str] | None]] | None = None,
    ) -> None:
        self._cells: dict[str, _Cell] = {}
        for i, unit in enumerate(units):
            batch, types = fast[i] if fast is not None else _fast_paths(unit)
            row = rows.get(unit.key)
            if row is not None and row.ver == unit.state_version:
                self._cells[unit.key] = _Cell(unit, row.val, row.seq, batch=batch, types=types)
                continue
            cell = _Cell(unit, None, -1, batch=batch, types=types)
            try:
                cell.state = unit.initial(header, inherited_event_count)
            except Exception as exc:  # a unit bug breaks only its own cell
                cell.broken = exc
            self._cells[unit.key] = cell

    @property
    def floor(self) -> int:
        """The lowest watermark: events after it must be folded to bring every cell to the end."""
        # A broken cell never advances again; it must not hold every later read down.
        return min((c.seq for c in self._cells.values() if c.broken is None), default=-1)

    def fold(self, events: Sequence[Event]) -> int:
        """Fold contiguous events (ascending seqs) into every cell that has not seen them;
        returns how many (event, cell) applications that stands for (events a unit's `types`
        skips count too). Cell by cell, so a long read costs one tight loop per unit — or one
        call of the unit's own `fold`, or a loop over only the events of its `types`."""
        if not events:
            return 0
        first, last = events[0].seq, events[-1].seq
        if last - first != len(events) - 1:
            raise ValueError("fold takes contiguous events")
        applied = 0
        for cell in self._cells.values():
            start = cell.seq + 1 - first
            if cell.broken is not None or start >= len(events):
                continue
            run = events if start <= 0 else events[start:]
            apply, state = cell.unit.apply, cell.state
            try:
                if cell.batch is not None:
                    state = cell.batch(state, run)
                elif cell.types is not None:
                    types = cell.types
                    for event in [e for e in run if e.type in types]:
                        state = apply(state, event)
                else:
                    for event in run:
                        state = apply(state, event)
            except Exception as exc:  # a unit bug breaks only its own cell
                cell.broken = exc
                continue
            cell.state, cell.seq = state, last
            applied += len(run)
        return applied

    def snapshot(self, keys: Iterable[str] | None = None) -> dict[str, JsonValue]:
        """Views of the selected keys (every unit with a view when `keys` is None)."""
        wanted = list(self._cells) if keys is None else list(keys)
        out: dict[str, JsonValue] = {}
        for key in wanted:
            cell = self._cells.get(key)
            if cell is None:
                raise UnknownProjection(f"no projection unit {key!r}")
            view = getattr(cell.unit, "view", None)  # no view at all: host-only too
            if view is None:
                if keys is None:
                    continue  # host-only units are never in snapshots
                raise UnknownProjection(f"projection {key!r} is host-only")
            if cell.broken is not None:
                raise ProjectionBroken(key, cell.broken)
            try:
                out[key] = view(cell.state)
            except Exception as exc:
                raise ProjectionBroken(key, exc) from exc
        return out

    def checkpoint(self) -> dict[str, CheckpointRow]:
        """Rows for every healthy cell that has folded at least one event."""
        return {
            key: CheckpointRow(ver=cell.unit.state_version, seq=cell.seq, val=cell.state)
            for key, cell in self._cells.items()
            if cell.broken is None and cell.seq >= 0
        }
