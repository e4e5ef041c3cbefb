"""The mechanisms the listing's speed rests on, in storage, against what they replace.

- Projection units may declare `types` (events of other types leave the state as it is) or a
  batch `fold`; `ProjectionCells.fold` then skips events or calls the batch — and must give
  exactly the states, watermarks, counts and broken cells the plain left fold of `apply` gives.
- The envelope rules are checked by `Event(...)` (its metaclass) and by the decoders in one
  loop instead of a `__post_init__`: every line must be accepted or refused exactly as an
  envelope with the former `__post_init__` is, with the same message (and line path).
  Events take no part in the cyclic GC.
- A stored checkpoint row decodes its value when it is first read; an undecodable value is a
  row no unit reads.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import UNSET, UnsetType
from subagents.storage import Event, ProjectionBroken, ReplaceOp, SessionHeader, make_event
from subagents.storage._codec import decode_event, decode_events
from subagents.storage.events import KNOWN_TYPES, SOURCE_SEQ_TYPES, SURFACE_TYPES
from subagents.storage.index import UNREADABLE, SessionIndex
from subagents.storage.index_rows import row_crc as _crc  # planting a row as a writer would
from subagents.storage.projection import CheckpointRow, Lifecycle, ProjectionRegistry

HEADER = SessionHeader(id="s", created_at=1)  # type: ignore[arg-type]  # a plain str where the header takes a SessionId
TYPES = ["turn/start", "turn/end", "step/start", "compaction/start", "session/end-seed"]


def event(seq: int, type_: str, time: int = 1) -> Event:
    data: dict[str, Any] = {
        "turn/end": {"turn": 1, "reason": {"kind": "completed"}},
        "step/start": {"turn": 1, "step": 1},
        "session/end-seed": {},
    }.get(type_, {"turn": 1})
    return make_event(seq, type_, time, data)


# --- projection units with `types` or a batch `fold` ------------------------------------------


class Counting:
    """Counts the events of its types and remembers the last one's seq; ignores the others."""

    key = "counting"
    state_version = 1
    types = frozenset({"turn/start", "turn/end"})

    def initial(self, header: Any, k: int) -> dict[str, int]:
        return {"n": 0, "last": -1}

    def apply(self, state: dict[str, int], e: Event) -> dict[str, int]:
        if e.type not in self.types:
            return state
        return {"n": state["n"] + 1, "last": e.seq}

    def view(self, state: dict[str, int]) -> dict[str, int]:
        return dict(state)


class Batched:
    """Sums seqs and times; folds a run in one call."""

    key = "batched"
    state_version = 1

    def initial(self, header: Any, k: int) -> list[int]:
        return [0, 0]

    def apply(self, state: list[int], e: Event) -> list[int]:
        return [state[0] + e.seq, state[1] + e.time]

    def fold(self, state: list[int], events: Sequence[Event]) -> list[int]:
        return [state[0] + sum(e.seq for e in events), state[1] + sum(e.time for e in events)]

    def view(self, state: list[int]) -> list[int]:
        return list(state)


class Exploding(Counting):
    """Raises from a given seq on — through `apply` (types) or `fold` (batch)."""

    key = "exploding"

    def __init__(self, at: int, batch: bool) -> None:
        self.at = at
        if batch:
            self.fold = self._fold  # type: ignore[method-assign]  # an instance attribute, on purpose

    def apply(self, state: dict[str, int], e: Event) -> dict[str, int]:
        if e.seq >= self.at and e.type in self.types:  # (it keeps its `types` promise)
            raise ZeroDivisionError("boom")
        return super().apply(state, e)

    def _fold(self, state: dict[str, int], events: Sequence[Event]) -> dict[str, int]:
        for e in events:
            state = self.apply(state, e)
        return state


class Plain:
    """Wraps a unit and hides its `types` and `fold`: the reference left fold of `apply`."""

    def __init__(self, unit: Any) -> None:
        self.unit = unit
        self.key = unit.key
        self.state_version = unit.state_version
        self.view = unit.view

    def initial(self, header: Any, k: int) -> Any:
        return self.unit.initial(header, k)

    def apply(self, state: Any, e: Event) -> Any:
        return self.unit.apply(state, e)


def outcome(units: list[Any], events: list[Event], cuts: list[int]) -> tuple[Any, ...]:
    cells = ProjectionRegistry(units).cells(HEADER, 0)
    counts = []
    start = 0
    for cut in [*cuts, len(events)]:
        counts.append(cells.fold(events[start:cut]))
        start = cut
    views: dict[str, Any] = {}
    for unit in units:
        try:
            views[unit.key] = cells.snapshot([unit.key])[unit.key]
        except ProjectionBroken as exc:
            views[unit.key] = ("broken", type(exc.cause).__name__)
    return counts, views, cells.checkpoint(), cells.floor


runs = st.lists(st.sampled_from(TYPES), max_size=40).flatmap(
    lambda types: st.tuples(
        st.just([event(i, t, time=1 + i * 7) for i, t in enumerate(types)]),
        st.lists(st.integers(0, len(types)), max_size=4).map(sorted),
    )
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(runs, st.integers(0, 40), st.booleans())
def test_types_and_batch_folds_equal_the_plain_fold(run: tuple[list[Event], list[int]], at: int, batch: bool) -> None:
    events, cuts = run
    fast = [Counting(), Batched(), Exploding(at, batch)]
    assert outcome(fast, events, cuts) == outcome([Plain(u) for u in fast], events, cuts)


def test_a_fold_resumes_from_checkpoint_rows_as_the_plain_one() -> None:
    events = [event(i, TYPES[i % len(TYPES)]) for i in range(30)]
    for units in ([Counting(), Batched()], [Plain(Counting()), Plain(Batched())]):
        first = ProjectionRegistry(units).cells(HEADER, 0)
        first.fold(events[:11])
        restored = ProjectionRegistry(units).cells(HEADER, 0, first.checkpoint())
        assert restored.fold(events) == 2 * (len(events) - 11)  # both cells skip what they have seen
        assert restored.snapshot() == outcome(units, events, [])[1]


def test_types_that_are_not_a_frozenset_are_ignored() -> None:
    class Odd(Counting):
        types = ["turn/start"]  # type: ignore[assignment]  # not a frozenset: no skipping

        def apply(self, state: dict[str, int], e: Event) -> dict[str, int]:
            return {"n": state["n"] + 1, "last": e.seq}  # breaks the `types` promise on purpose

    cells = ProjectionRegistry([Odd()]).cells(HEADER, 0)
    cells.fold([event(i, TYPES[i % len(TYPES)]) for i in range(9)])
    assert cells.snapshot() == {"counting": {"n": 9, "last": 8}}


# --- the envelope checks: metaclass and bulk decode vs the former __post_init__ ------------------


class Former(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, frozen=True, kw_only=True):
    """`Event` as it was: the same fields, and the checks a decoder ran in `__post_init__`."""

    seq: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]  # the decoder checks the ranges
    type: str
    time: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
    data: msgspec.Raw
    ignorable: Literal[True] | UnsetType = UNSET
    surface_op: Literal["append"] | ReplaceOp | UnsetType = UNSET
    source_event_seqs: list[int] | UnsetType = UNSET

    def __post_init__(self) -> None:  # the decoding path (trusted: no vocabulary check)
        seq = self.seq
        if not self.data:
            raise TypeError("data must be raw JSON")
        if memoryview(self.data)[0] != 0x7B:
            raise ValueError("data must be a JSON object")
        if self.type not in KNOWN_TYPES:
            return  # a later format's type: this format's surface and source rules are not its own
        op = self.surface_op
        if self.type in SURFACE_TYPES:
            if op is UNSET:
                raise ValueError(f"surface event {self.type!r} requires surface_op")
            if isinstance(op, ReplaceOp):
                if not 0 <= op.start_seq <= op.end_seq < seq:
                    raise ValueError("surface_op replace range must be ascending and before the event")
        elif op is not UNSET:
            raise ValueError(f"surface_op is forbidden on {self.type!r}")
        seqs = self.source_event_seqs
        if seqs is not UNSET:
            if self.type not in SOURCE_SEQ_TYPES:
                raise ValueError(f"source_event_seqs is forbidden on {self.type!r}")
            if not seqs:
                raise ValueError("source_event_seqs must be a non-empty list")
            prev = -1
            for s in seqs:
                if s <= prev:
                    raise ValueError("source_event_seqs must be strictly ascending non-negative ints")
                prev = s
            if prev >= seq:
                raise ValueError("source_event_seqs must precede the event")


_former = msgspec.json.Decoder(Former)

envelopes = st.fixed_dictionaries(
    {
        "seq": st.integers(-2, 12),
        "type": st.sampled_from(sorted(KNOWN_TYPES) + ["custom/x"]),
        "time": st.integers(-1, 3),
        "data": st.sampled_from([{}, {"a": [1, {"b": None}]}, [], 5, "x", None, {"data": 1}]),
    },
    optional={
        "surface_op": st.one_of(
            st.just("append"),
            st.just("prepend"),
            st.builds(
                lambda a, b: {"op": "replace", "start_seq": a, "end_seq": b}, st.integers(-1, 13), st.integers(-1, 13)
            ),
        ),
        "source_event_seqs": st.lists(st.integers(-1, 13), max_size=3),
        "ignorable": st.sampled_from([True, False]),
    },
)


def former(lines: list[bytes]) -> list[Any] | str:
    try:
        return [msgspec.structs.asdict(e) for e in _former.decode_lines(b"\n".join(lines) + b"\n")]
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return f"{type(exc).__name__}: {exc}"


def current(lines: list[bytes]) -> list[Any] | str:
    try:
        return [msgspec.structs.asdict(e) for e in decode_events(b"\n".join(lines) + b"\n")]
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return f"{type(exc).__name__}: {exc}"


def normalized(result: list[Any] | str) -> list[Any] | str:
    if isinstance(result, str):
        return result
    return [{k: bytes(v) if isinstance(v, msgspec.Raw) else v for k, v in d.items()} for d in result]


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(st.lists(envelopes, min_size=1, max_size=4))
def test_decoders_accept_and_refuse_as_the_former_post_init(items: list[dict[str, Any]]) -> None:
    lines = [msgspec.json.encode(item) for item in items]
    now, then = normalized(current(lines)), normalized(former(lines))
    # Several lines: the same events, or a refusal by both. (Which bad line a chunk names may
    # differ when a later line also has a wrong type: msgspec checks types while it decodes,
    # the rules after. Readers locate damage line by line anyway.)
    assert now == then or (isinstance(now, str) and isinstance(then, str))
    for line in lines:  # one line: exactly the same outcome and message
        assert normalized(current_one(line)) == normalized(former_one(line))
        assert normalized(current([line])) == normalized(former([line]))


def former_one(line: bytes) -> list[Any] | str:
    try:
        return [msgspec.structs.asdict(msgspec.json.decode(line, type=Former))]
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return f"{type(exc).__name__}: {exc}"


def current_one(line: bytes) -> list[Any] | str:
    try:
        return [msgspec.structs.asdict(decode_event(line))]
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"seq": -1}, ValueError),
        ({"time": True}, TypeError),
        ({"data": msgspec.Raw(b"[]")}, ValueError),
        ({"data": msgspec.Raw(b"")}, TypeError),
        ({"type": "nope/never"}, ValueError),  # built by hand: the vocabulary is checked
        ({"type": "user/message"}, ValueError),  # a surface event without surface_op
        ({"source_event_seqs": [0]}, ValueError),  # not on turn/start
        # SPEC 2: what JSON cannot carry losslessly is refused before it reaches a log.
        ({"data": msgspec.Raw(b'{"turn":1,"f":1e999}')}, ValueError),
        ({"data": msgspec.Raw(b'{"turn":1,"big":123456789012345678901234567890}')}, ValueError),
        ({"data": msgspec.Raw(b'{"turn":1,"big":9223372036854775808}')}, ValueError),  # 2^63
        ({"data": msgspec.Raw(b'{"turn":1,"small":-9223372036854775809}')}, ValueError),
        ({"data": msgspec.Raw(b'{"turn":1,"deep":' + b"[" * 5000 + b"]" * 5000 + b"}")}, ValueError),
        ({"data": msgspec.Raw(b'{"turn":1,"bad":"\\ud800"}')}, ValueError),  # a lone surrogate
    ],
)
def test_building_an_event_by_hand_still_checks_it(fields: dict[str, Any], error: type[Exception]) -> None:
    args: dict[str, Any] = {"seq": 3, "type": "turn/start", "time": 1, "data": msgspec.Raw(b'{"turn":1}')}
    with pytest.raises(error):
        Event(**(args | fields))
    # (A descriptor's payload is any object: the lossless rules alone decide these.)
    edge = {
        "type": "subagent/descriptor",
        "data": msgspec.Raw(b'{"turn":1,"max":9223372036854775807,"min":-9223372036854775808,"f":1.5e308}'),
    }
    assert Event(**(args | edge)).data == edge["data"]  # the range's own ends are fine


@pytest.mark.parametrize(
    ("type_", "data"),
    [
        ("turn/start", b'{"turn":"1"}'),
        ("user/message", b'{"turn":1,"step":1,"message":{"role":"user","content":[],"source":{"kind":"user"}}}'),
        ("turn/start", b'{"turn":1,"extra":true}'),
    ],
)
def test_building_an_event_by_hand_checks_its_payload(type_: str, data: bytes) -> None:
    """A writer vouches for every event it appended (the index trusts it): an event built by hand
    is held to the payload rules `make_event` and every reader apply."""
    op = {"surface_op": "append"} if type_ == "user/message" else {}
    with pytest.raises(ValueError, match="payload"):
        Event(seq=3, type=type_, time=1, data=msgspec.Raw(data), **op)


def test_events_take_no_part_in_the_cyclic_gc() -> None:
    e = make_event(
        2,
        "user/message",
        1,
        {"turn": 1, "step": 1, "message": {"id": "m", "role": "user", "content": [], "source": {"kind": "user"}}},
        surface_op="append",
        source_event_seqs=[0, 1],
    )
    assert not gc.is_tracked(e)
    before = gc.get_count()[0]
    decoded = decode_events(
        b"".join(msgspec.json.encode(make_event(i, "turn/start", 1, {"turn": 1})) + b"\n" for i in range(500))
    )
    assert len(decoded) == 500 and gc.get_count()[0] - before < 100  # no GC header: no gen-0 count


# --- stored checkpoint rows decode their value when first read ------------------------------------


def test_a_stored_row_decodes_its_value_when_read() -> None:
    index = SessionIndex(None)
    lifecycle = Lifecycle.of(HEADER, 0)
    assert index.save_checkpoint(HEADER.id, lifecycle, {"u": CheckpointRow(ver=2, seq=4, val={"a": [1]})}, 99)
    (stored,) = index.load_checkpoints([HEADER.id])[HEADER.id]  # type: ignore[index]  # not a cache miss here
    assert (stored.key, stored.ver, stored.seq, stored.log_offset, stored.lifecycle) == ("u", 2, 4, 99, lifecycle)
    assert stored.value() == {"a": [1]} and stored.value() is not stored.value()  # a fresh value each time
    assert stored.row == CheckpointRow(ver=2, seq=4, val={"a": [1]}) and stored.row is stored.row


def test_an_undecodable_stored_value_is_a_row_no_unit_reads() -> None:
    index = SessionIndex(None)
    lifecycle = Lifecycle.of(HEADER, 0)
    assert index.save_checkpoint(HEADER.id, lifecycle, {"u": CheckpointRow(ver=2, seq=4, val={})}, 9)
    conn = index._connect()  # noqa: SLF001 - planting a row this build did not write
    (fields,) = conn.execute(
        "SELECT session_id, unit_key, ver, seq, val, log_offset, lifecycle FROM checkpoints"
    ).fetchall()
    fields = (*fields[:4], b"{not json", *fields[5:])
    # With a checksum that matches (a row whose checksum does not is garbled: never loaded).
    conn.execute("UPDATE checkpoints SET val = ?, crc = ?", (b"{not json", _crc(fields)))
    (stored,) = index.load_checkpoints([HEADER.id])[HEADER.id]  # type: ignore[index]  # not a cache miss here
    assert stored.value() is UNREADABLE
    assert stored.row.ver == -1  # every state_version is >= 0: no cell takes it
    cells = ProjectionRegistry([Counting()]).cells(HEADER, 0, {"counting": stored.row})
    assert cells.floor == -1


def test_a_unit_without_a_view_is_host_only() -> None:
    """SPEC 3.5: `view` is optional — a unit with no `view` at all is host-only, like one
    whose `view` is None: never in a snapshot, refused by name, still checkpointed."""
    from subagents.storage import UnknownProjection

    class NoViewAtAll:
        key = "bare"
        state_version = 1

        def initial(self, header: Any, k: int) -> int:
            return 0

        def apply(self, state: int, event: Event) -> int:
            return state + 1

    class ViewNone(NoViewAtAll):
        key = "none"
        view = None

    class Shown(NoViewAtAll):
        key = "shown"

        def view(self, state: int) -> int:
            return state

    cells = ProjectionRegistry([NoViewAtAll(), ViewNone(), Shown()]).cells(SessionHeader(id="s", created_at=1), 0)
    cells.fold([make_event(0, "turn/start", 1, {"turn": 1})])
    assert cells.snapshot() == {"shown": 1}
    assert cells.snapshot(["shown"]) == {"shown": 1}
    for key in ("bare", "none"):
        with pytest.raises(UnknownProjection, match="host-only"):
            cells.snapshot([key])
    assert set(cells.checkpoint()) == {"bare", "none", "shown"}


def test_seq_and_time_fit_a_signed_64_bit_int() -> None:
    from subagents.storage import InvalidEvent

    with pytest.raises(ValueError, match="below 2\\*\\*63"):
        Event(seq=3, type="turn/start", time=2**63, data=msgspec.Raw(b'{"turn":1}'))
    with pytest.raises(InvalidEvent):
        make_event(3, "turn/start", 2**63, {"turn": 1})
    assert make_event(3, "turn/start", 2**63 - 1, {"turn": 1}).time == 2**63 - 1
    with pytest.raises(msgspec.ValidationError):
        decode_event(b'{"seq":0,"type":"turn/start","time":9223372036854775808,"data":{"turn":1}}')
