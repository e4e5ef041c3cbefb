"""The listing's rows and what it keeps between listings (docs/design.md, "Listing").

`ChildRow` and `DiagnosticRow` are the rows a listing answers (and their JSON); `own_identity`
is the identity a child's own suffix proves. Kept between listings, both bounded: `RowCache`
(the same child in the same state is the same row) and `CorpusShape` (who has children and the
candidates per parent, kept while the session query hands back the very same records). Pure:
the listing does the IO.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import Literal

import attrs
from subagents.storage import ANOTHER_PROCESS, StoredCheckpoint

from ..foundation.json_values import JsonObject
from ..query import SessionRecord
from .lineage import children_of, lineage, same_lifecycle
from .units import FLAGS_UNIT, IDENTITY_UNIT, TIMING_UNIT

__all__ = [
    "ChildRow",
    "CorpusShape",
    "DiagnosticRow",
    "ELSEWHERE",
    "HERE",
    "Liveness",
    "Reason",
    "Row",
    "RowCache",
    "flags_view",
    "last_event_ms",
    "open_turn_time",
    "own_identity",
    "session_liveness",
    "stored_flags",
    "stored_identities",
    "stored_turns",
    "turn_is_open",
    "with_stall",
]

Reason = Literal["corrupt", "unsupported", "unavailable"]
Liveness = Literal["stalled", "orphaned"]
HERE = "this process"  # the runner of a child resident in the listing's own process
ELSEWHERE = ANOTHER_PROCESS  # ... of one another writer holds (named `pid N`/`host H` when known)


@attrs.frozen(kw_only=True)
class ChildRow:
    id: str
    activity: Literal["running", "inactive"]
    has_children: bool
    mode: Literal["one-shot", "continuable"]
    label: str | None = None
    parent_id: str | None = None  # descendants only
    depth: int | None = None  # descendants only
    # Issue 27 (its `subagent_flags` unit): in the JSON only when set, so rows without them
    # keep the bytes of SPEC 5.4.
    stopped: bool = False  # its stop marker is in force
    in_doubt: int = 0  # results of its last turn in doubt
    # Issue 29 item 4 (liveness). In the JSON only when known or set, as the flags.
    last_event: int | None = None  # when its last durable event was written (epoch ms)
    runner: str | None = None  # who runs it, while it runs: HERE, ELSEWHERE, "pid N", "host H"
    turn_open: bool = False  # its log's last turn has no end (its timing unit is active)
    liveness: Liveness | None = None  # running without progress / its runner gone mid-turn

    def to_json(self, *, liveness: bool = False) -> JsonObject:
        """The row as SPEC 5.4 has it (and the flags, when set); with `liveness`, also the keys
        of issue 29 item 4: `last_event` (when known), `runner` (while it runs) and `liveness`
        (`stalled`/`orphaned`, when so)."""
        out: JsonObject = {
            "kind": "child",
            "id": self.id,
            "activity": self.activity,
            "has_children": self.has_children,
            "mode": self.mode,
        }
        if self.label is not None:
            out["label"] = self.label
        if self.parent_id is not None:
            out |= {"parent_id": self.parent_id, "depth": self.depth}
        if self.stopped:
            out["stopped"] = True
        if self.in_doubt > 0:
            out["in_doubt"] = self.in_doubt
        if not liveness:
            return out
        if self.last_event is not None:
            out["last_event"] = self.last_event
        if self.runner is not None:
            out["runner"] = self.runner
        if self.liveness is not None:
            out["liveness"] = self.liveness
        return out


@attrs.frozen(kw_only=True)
class DiagnosticRow:
    id: str
    reason: Reason
    parent_id: str | None = None
    depth: int | None = None

    def to_json(self, *, liveness: bool = False) -> JsonObject:
        """The row as SPEC 5.4 has it (`liveness`: nothing more; a diagnostic has none)."""
        out: JsonObject = {"kind": "diagnostic", "id": self.id, "reason": self.reason}
        if self.parent_id is not None:
            out |= {"parent_id": self.parent_id, "depth": self.depth}
        return out


Row = ChildRow | DiagnosticRow


def own_identity(identity: object, inherited_event_count: int) -> JsonObject | None:
    if isinstance(identity, dict) and type(identity.get("seq")) is int and identity["seq"] >= inherited_event_count:
        return identity
    return None


def flags_view(view: object) -> tuple[bool, int]:
    """(stopped, in_doubt) of a `subagent_flags` view; none set for anything else (a tampered
    state views as None: the row is listed, without flags)."""
    if type(view) is not dict:
        return False, 0
    stopped, in_doubt = view.get("stopped"), view.get("in_doubt")
    return stopped is True, in_doubt if type(in_doubt) is int and in_doubt > 0 else 0


_ROW_CACHE = 8192  # rows kept for reuse at most (a row is ~200 bytes)
_MODES: tuple[Literal["one-shot"], Literal["continuable"]] = ("one-shot", "continuable")  # what a descriptor holds


class RowCache:
    """Child rows are values: the same child in the same state is the same row, reused from the
    last listings instead of built again (a listing of a thousand live children then allocates
    a thousand fewer objects, and the cyclic GC runs that much less often during it)."""

    def __init__(self) -> None:
        self._made: dict[tuple[object, ...], ChildRow] = {}

    def child(
        self,
        record: SessionRecord,
        identity: JsonObject,
        has_children: bool,
        runner: str | None,
        flags: tuple[bool, int] = (False, 0),
        turn_open: bool = False,
        last_event: int | None = None,
    ) -> ChildRow:
        """The row; `runner` is who runs it (None: nobody — `inactive`), `flags` is
        (stopped, in_doubt), from `flags_view`, `turn_open` whether its last turn has no end
        yet (`turn_is_open`), `last_event` its last durable event's time when the caller knows
        it exactly (a live cell: `open_turn_time`; else the record's `last_event_ms`). A turn
        open that nobody runs is `orphaned`; `stalled` is the listing's to say (it needs the
        clock: `with_stall`)."""
        mode, label = identity["mode"], identity.get("label")
        stopped, in_doubt = flags
        last = last_event if last_event is not None else last_event_ms(record)
        orphaned: Liveness | None = "orphaned" if turn_open and runner is None else None
        if mode not in _MODES or (label is not None and type(label) is not str):
            # Not what a descriptor holds (a tampered checkpoint row): built, never kept.
            return ChildRow(
                id=record.id,
                activity="running" if runner is not None else "inactive",
                has_children=has_children,
                mode=mode,
                label=label,
                stopped=stopped,
                in_doubt=in_doubt,
                last_event=last,
                runner=runner,
                turn_open=turn_open,
                liveness=orphaned,
            )
        key = (record.id, runner, has_children, mode, label, stopped, in_doubt, last, turn_open)
        row = self._made.get(key)
        if row is None:
            if len(self._made) >= _ROW_CACHE:
                self._made.clear()
            row = self._made[key] = ChildRow(
                id=record.id,
                activity="running" if runner is not None else "inactive",
                has_children=has_children,
                mode=mode,
                label=label,
                stopped=stopped,
                in_doubt=in_doubt,
                last_event=last,
                runner=runner,
                turn_open=turn_open,
                liveness=orphaned,
            )
        return row


def last_event_ms(record: SessionRecord) -> int | None:
    """The `time` field of the record's last durable event (epoch ms), from what its store
    listing already holds (`LogInfo.last_time`, alike on every store: a file's mtime is not, since
    a copy or an export moves it, and under a scenario clock it is another clock). None when
    unknown (no event yet, a live-only record, a damaged log read no further than its damage)."""
    if not record.event_count or record.last_time <= 0:
        return None
    return record.last_time


def turn_is_open(view: object) -> bool:
    """Whether a `subagent_timing` state or view says a turn is open (an `active` span with
    int bounds; anything else — idle, a tampered row — is not)."""
    if type(view) is not dict:
        return False
    active = view.get("active")
    return type(active) is dict and type(active.get("since")) is int and type(active.get("through")) is int


def open_turn_time(view: object) -> int | None:
    """The time of the last event of the open turn a `subagent_timing` state or view holds
    (its `active.through`: every event of an open turn moves it), or None when no turn is open."""
    if not turn_is_open(view):
        return None
    assert type(view) is dict
    through: int = view["active"]["through"]
    return through


def with_stall(row: ChildRow, now_ms: int, stall_after_ms: int) -> ChildRow:
    """`row` marked `stalled` when it runs, its turn is open and its last durable event is
    older than `stall_after_ms` at `now_ms`; else `row` itself."""
    if (
        row.runner is None
        or not row.turn_open
        or row.last_event is None
        or row.liveness is not None
        or now_ms - row.last_event <= stall_after_ms
    ):
        return row
    return attrs.evolve(row, liveness="stalled")


def session_liveness(
    record: SessionRecord, turn: tuple[bool, int] | None, now_ms: int, stall_after_ms: int
) -> Liveness | None:
    """What `sessions` says of a record beside `live`: `orphaned` when its stored
    `subagent_timing` row (`turn`: from `stored_turns`) covers its log whole and says a turn is
    open while nobody runs it (no lock holder, no lease), `stalled` when it runs — here or
    elsewhere, whose writer's rows may lag its log — with a turn open and its last durable event
    older than `stall_after_ms` at `now_ms`; else None (idle, no such row, a row that lags a log
    nobody writes: unknown without a read, and `sessions` adds none)."""
    if turn is None or not turn[0]:
        return None
    runs = record.held or record.live
    if not runs:
        return "orphaned" if record.event_count is not None and turn[1] == record.event_count - 1 else None
    last = last_event_ms(record)
    return "stalled" if last is not None and now_ms - last > stall_after_ms else None


class CorpusShape:
    """What the listing derives from a corpus (who has children, the candidates per parent),
    kept while the session query hands back the very same records (a warm corpus)."""

    _PARENTS_KEPT = 64

    def __init__(self) -> None:
        self._corpus: list[SessionRecord] = []
        self.parents: frozenset[str | None] = frozenset()
        self._children: dict[str, list[SessionRecord]] = {}
        self._records: dict[str, SessionRecord] | None = None

    def of(self, corpus: list[SessionRecord]) -> CorpusShape:
        if len(corpus) != len(self._corpus) or not all(map(operator.is_, corpus, self._corpus)):
            self._corpus = corpus
            # A damaged child whose line 1 names its parent lists (as a diagnostic): its parent has
            # children. A header naming itself makes no parent: a session is never its own child.
            self.parents = frozenset(
                said[1]
                for record, said in zip(corpus, map(lineage, corpus), strict=True)
                if said is not None and said[0] == "subagent" and said[1] != record.id
            )
            self._children = {}
            self._records = None
        return self

    @property
    def records(self) -> dict[str, SessionRecord]:
        """The corpus by id."""
        if self._records is None:
            self._records = {record.id: record for record in self._corpus}
        return self._records

    def children_of(self, parent_id: str) -> list[SessionRecord]:
        """The candidates of `parent_id`, in order (kept: not to be changed)."""
        children = self._children.get(parent_id)
        if children is None:
            if len(self._children) >= self._PARENTS_KEPT:
                self._children.clear()
            children = self._children[parent_id] = children_of(self._corpus, parent_id)
        return children


def _covering_rows(
    records: Sequence[SessionRecord], rows: Mapping[str, Sequence[StoredCheckpoint]], key: str, version: int
) -> Iterator[tuple[SessionRecord, StoredCheckpoint, int]]:
    """Each record's stored rows of unit `key` at `version` that its log covers (behind its
    end) and whose lifecycle is the record's — the rows that may answer for it — with its
    event count."""
    for record in records:
        header = record.header
        if header is None or record.event_count is None:
            continue
        for row in rows.get(record.id, ()):
            if row.key != key or row.ver != version or row.seq >= record.event_count:
                continue
            if same_lifecycle(row.lifecycle, header, record.inherited_event_count):
                yield record, row, record.event_count


def stored_identities(
    records: Sequence[SessionRecord], rows: Mapping[str, Sequence[StoredCheckpoint]]
) -> dict[str, tuple[JsonObject, bool]]:
    """The identities the stored checkpoint `rows` prove for `records` (a row of this lifecycle
    the record's view of the log covers), each with whether its row covers the log whole
    (`seq` is its last event's)."""
    out = {}
    for record, row, event_count in _covering_rows(records, rows, IDENTITY_UNIT.key, IDENTITY_UNIT.state_version):
        val = row.value()  # decoded only now (UNREADABLE, an object: no identity)
        identity = own_identity(val.get("identity") if type(val) is dict else None, record.inherited_event_count)
        if identity is not None:
            out[record.id] = (identity, row.seq == event_count - 1)
    return out


def stored_flags(
    records: Sequence[SessionRecord], rows: Mapping[str, Sequence[StoredCheckpoint]]
) -> dict[str, tuple[tuple[bool, int], int]]:
    """The flags (stopped, in_doubt) the stored `subagent_flags` rows prove for `records` (a row
    of this unit version and lifecycle, behind the log end, holding a state the unit makes),
    each with the seq its row covers. A session with no such row — written before the unit, or
    a tampered row — is not in the answer: the listing observes it (and writes its rows back)."""
    out = {}
    for record, row, _count in _covering_rows(records, rows, FLAGS_UNIT.key, FLAGS_UNIT.state_version):
        view = FLAGS_UNIT.view(row.value())  # (UNREADABLE, or any other shape: None)
        if view is not None:
            out[record.id] = (flags_view(view), row.seq)
    return out


def stored_turns(
    records: Sequence[SessionRecord], rows: Mapping[str, Sequence[StoredCheckpoint]]
) -> dict[str, tuple[bool, int]]:
    """Whether the stored `subagent_timing` row of each of `records` (of this lifecycle, behind
    the log end) says a turn is open, with the seq its row covers. A session without such a row
    (written before liveness was listed, a tampered row) is not in the answer: nothing is read
    to learn more (its row says no turn is open)."""
    return {
        record.id: (turn_is_open(row.value()), row.seq)
        for record, row, _count in _covering_rows(records, rows, TIMING_UNIT.key, TIMING_UNIT.state_version)
    }
