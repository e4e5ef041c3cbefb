"""Table tests for the event vocabulary, the envelope codec and the header record codec."""

from __future__ import annotations

import decimal
import math
from typing import Any

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from subagents.storage import (
    SURFACE_TYPES,
    UNSET,
    Event,
    InvalidEvent,
    InvalidPayload,
    NonLosslessData,
    Offset,
    ReplaceOp,
    SessionHeader,
    SessionId,
    UnsupportedLog,
    check_lossless,
    decode_payload,
    make_event,
)
from subagents.storage._codec import decode_event, encode_event
from subagents.storage._records import HeaderError, HeaderRecord, decode_header_line, encode_header_line
from subagents.storage.events import KNOWN_TYPES, PAYLOAD_TYPES
from vocabulary import SURFACE, VOCABULARY

SEQ = 7
TIME = 1789000000001
INT_MIN = -(2**63)
INT_MAX = 2**63 - 1


def _message(role: str = "user", source: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "m1",
        "role": role,
        "content": [{"type": "text", "text": "hello"}],
        "source": source if source is not None else {"kind": "user"},
        **extra,
    }


def _surface(type_: str) -> str | None:
    return "append" if type_ in SURFACE_TYPES else None


def _line(envelope: dict[str, Any]) -> bytes:
    return msgspec.json.encode(envelope)


def _envelope(type_: str, data: Any, **extra: Any) -> dict[str, Any]:
    env: dict[str, Any] = {"seq": SEQ, "type": type_, "time": TIME, "data": data}
    if type_ in SURFACE_TYPES:
        env["surface_op"] = "append"
    env.update(extra)
    return env


TOOL_RESULT_MESSAGE = {
    "id": "m3",
    "role": "user",
    "content": [
        {
            "type": "tool-result",
            "call_id": "c1",
            "content": [{"type": "text", "text": "ok"}],
            "is_error": False,
        }
    ],
    "source": {"kind": "tool", "call_id": "c1"},
}

ASSISTANT_MESSAGE = {
    "id": "m2",
    "role": "assistant",
    "content": [
        {"type": "text", "text": "let me look"},
        {"type": "tool-call", "id": "c1", "name": "read", "arguments": '{"path": "a"}'},
    ],
    "source": {"kind": "model"},
}

VALID_PAYLOADS: list[tuple[str, dict[str, Any]]] = [
    ("system/message", {"turn": 1, "step": 0, "message": _message("system")}),
    ("user/message", {"turn": 1, "step": 0, "message": _message()}),
    (
        "user/message",
        {
            "turn": 2,
            "step": 0,
            "message": {
                "id": "m9",
                "role": "user",
                "content": [
                    {"type": "text", "text": "Agent parent sent a message: "},
                    {"type": "text", "text": "go"},
                ],
                "source": {"kind": "agent-message", "sender_session_id": "parent"},
            },
        },
    ),
    (
        "user/message",
        {"turn": 3, "step": 0, "message": _message(source={"kind": "subagent-settled", "sender_session_id": "c"})},
    ),
    ("user/message", {"turn": 3, "step": 0, "message": _message(source={"kind": "compaction"})}),
    ("assistant/message", {"turn": 1, "step": 0, "message": ASSISTANT_MESSAGE, "finish": "tool-calls"}),
    (
        "assistant/message",
        {
            "turn": 1,
            "step": 1,
            "message": _message("assistant", {"kind": "model"}),
            "finish": "aborted",
            "usage": {"input_tokens": 10, "output_tokens": 3},
            "interrupted": True,
        },
    ),
    (
        "assistant/message",
        {"turn": 1, "step": 1, "message": _message("assistant", {"kind": "model"}), "finish": "stop"},
    ),
    ("tool/result", {"turn": 1, "step": 0, "message": TOOL_RESULT_MESSAGE}),
    (
        "tool/result",
        {
            "turn": 1,
            "step": 0,
            "message": TOOL_RESULT_MESSAGE,
            "error": {"name": "ToolError", "code": "TOOL_NOT_STARTED"},
        },
    ),
    (
        "assistant/message",
        {"turn": 2, "step": 3, "message": _message("assistant", {"kind": "model"}), "finish": "stop", "attempt": 2},
    ),
    ("tool/result", {"turn": 1, "step": 0, "message": TOOL_RESULT_MESSAGE, "in_doubt": True}),
    ("turn/start", {"turn": 1}),
    ("turn/start", {"turn": 2, "trigger": {"kind": "notice"}}),
    ("turn/continue", {"turn": 2, "step": 3, "attempt": 2, "lost_model_call": True}),
    ("turn/continue", {"turn": 1, "step": 0, "attempt": 5, "lost_model_call": False}),
    ("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
    ("turn/end", {"turn": 1, "reason": {"kind": "aborted", "cause": "parent", "message": "stopped"}}),
    ("turn/end", {"turn": 1, "reason": {"kind": "interrupted"}}),
    ("turn/end", {"turn": 1, "reason": {"kind": "budget", "message": "max_turns 3 reached"}}),
    # SPEC §8: a reason kind a reader does not know is read (and treated as "error"), not corrupt.
    ("turn/end", {"turn": 1, "reason": {"kind": "finished"}}),
    ("step/start", {"turn": 1, "step": 0}),
    ("step/end", {"turn": 1, "step": 0}),
    ("tool/call", {"turn": 1, "step": 0, "call_id": "c1", "name": "read", "arguments": '{"path": "a"}'}),
    ("session/end-seed", {}),
    ("session/end-seed", {"inherited": True}),
    ("subagent/descriptor", {"version": 2, "anything": [1, {"x": None}]}),
    ("subagent/descriptor", {}),
    ("subagent/catalog", {"version": 1, "child_id": "c", "child_created_at": 5, "mode": "one-shot"}),
    (
        "subagent/catalog",
        {"version": 1, "child_id": "c", "child_created_at": 5, "mode": "continuable", "label": "helper"},
    ),
    ("subagent/settled", {"child_id": "c", "reason_kind": "completed"}),
    ("subagent/settled", {"child_id": "c", "reason_kind": "error", "closing_text": "bye"}),
    ("subagent/settled", {"child_id": "c", "reason_kind": "budget", "reason_message": "deadline reached"}),
    ("subagent/catalog", {"version": 1, "child_id": "c", "child_created_at": 5, "mode": "one-shot", "call_id": "k"}),
    ("subagent/settled", {"child_id": "c", "reason_kind": "completed", "run_key": "c@41"}),
    ("session/model", {"model": "openai:gpt-4o"}),
    ("session/model", {"model": "anthropic:claude", "base_url": "https://api.example/v1"}),
    ("session/stopped", {"by": "operator", "tree": False}),
    ("session/stopped", {"by": "p", "tree": True, "delivery_id": "01J0000000000000000000000A"}),
    ("compaction/start", {"turn": 4}),
    ("compaction/summary", {"text": "summary"}),
    ("compaction/end", {"start_seq": 0, "end_seq": 3}),
]

INVALID_PAYLOADS: list[tuple[str, dict[str, Any]]] = [
    ("system/message", {"turn": 1, "step": 0}),
    ("system/message", {"turn": "1", "step": 0, "message": _message("system")}),
    ("user/message", {"turn": True, "step": 0, "message": _message()}),
    ("user/message", {"turn": 1.5, "step": 0, "message": _message()}),
    ("user/message", {"turn": 1.0, "step": 0, "message": _message()}),
    ("user/message", {"turn": 1, "step": 0, "message": _message(), "extra": 1}),
    ("user/message", {"turn": 1, "step": 0, "message": {k: v for k, v in _message().items() if k != "id"}}),
    ("user/message", {"turn": 1, "step": 0, "message": _message("tool")}),
    ("user/message", {"turn": 1, "step": 0, "message": _message(source={"kind": "alien"})}),
    ("user/message", {"turn": 1, "step": 0, "message": _message(source={"kind": "tool"})}),
    ("user/message", {"turn": 1, "step": 0, "message": _message(source={"kind": "agent-message"})}),
    ("user/message", {"turn": 1, "step": 0, "message": {**_message(), "content": [{"type": "image", "url": "x"}]}}),
    ("user/message", {"turn": 1, "step": 0, "message": {**_message(), "content": [{"type": "text"}]}}),
    ("user/message", {"turn": 1, "step": 0, "message": _message(extra=1)}),
    ("assistant/message", {"turn": 1, "step": 0, "message": ASSISTANT_MESSAGE}),
    ("assistant/message", {"turn": 1, "step": 0, "message": ASSISTANT_MESSAGE, "finish": "done"}),
    (
        "assistant/message",
        {"turn": 1, "step": 0, "message": ASSISTANT_MESSAGE, "finish": "stop", "usage": {"input_tokens": 1}},
    ),
    ("assistant/message", {"turn": 1, "step": 0, "message": ASSISTANT_MESSAGE, "finish": "stop", "interrupted": False}),
    (
        "assistant/message",
        {
            "turn": 1,
            "step": 0,
            "message": {
                **ASSISTANT_MESSAGE,
                "content": [{"type": "tool-call", "id": "c", "name": "n", "arguments": {}}],
            },
            "finish": "tool-calls",
        },
    ),
    ("tool/result", {"turn": 1, "step": 0, "message": TOOL_RESULT_MESSAGE, "error": {"name": "E"}}),
    (
        "tool/result",
        {
            "turn": 1,
            "step": 0,
            "message": {
                **TOOL_RESULT_MESSAGE,
                "content": [{"type": "tool-result", "call_id": "c1", "content": [], "is_error": "no"}],
            },
        },
    ),
    # SPEC 3.2: role user, source {kind: tool, call_id}, one tool-result block of that call.
    ("tool/result", {"turn": 1, "step": 0, "message": {**TOOL_RESULT_MESSAGE, "role": "assistant"}}),
    ("tool/result", {"turn": 1, "step": 0, "message": {**TOOL_RESULT_MESSAGE, "source": {"kind": "model"}}}),
    ("tool/result", {"turn": 1, "step": 0, "message": {**TOOL_RESULT_MESSAGE, "content": []}}),
    (
        "tool/result",
        {"turn": 1, "step": 0, "message": {**TOOL_RESULT_MESSAGE, "content": [{"type": "text", "text": "x"}]}},
    ),
    (
        "tool/result",
        {"turn": 1, "step": 0, "message": {**TOOL_RESULT_MESSAGE, "content": TOOL_RESULT_MESSAGE["content"] * 2}},
    ),
    (
        "tool/result",
        {"turn": 1, "step": 0, "message": {**TOOL_RESULT_MESSAGE, "source": {"kind": "tool", "call_id": "other"}}},
    ),
    ("turn/start", {}),
    ("turn/start", {"turn": 1, "trigger": {"kind": "timer"}}),
    ("turn/start", {"turn": 1, "trigger": "message"}),
    ("turn/end", {"turn": 1}),
    ("turn/end", {"turn": 1, "reason": {"kind": 5}}),
    ("turn/end", {"turn": 1, "reason": {"kind": "budget", "message": 3}}),
    ("turn/end", {"turn": 1, "reason": {"kind": "aborted", "cause": "god"}}),
    ("turn/end", {"turn": 1, "reason": "completed"}),
    ("step/start", {"turn": 1}),
    ("step/end", {"turn": 1, "step": "0"}),
    ("tool/call", {"turn": 1, "step": 0, "call_id": "c1", "name": "read", "arguments": {"path": "a"}}),
    ("tool/call", {"turn": 1, "step": 0, "name": "read", "arguments": "{}"}),
    ("session/end-seed", {"inherited": False}),
    ("session/end-seed", {"inherited": "true"}),
    ("session/end-seed", {"inherited": 1}),
    ("session/end-seed", {"other": True}),
    ("subagent/catalog", {"version": 2, "child_id": "c", "child_created_at": 5, "mode": "one-shot"}),
    ("subagent/catalog", {"version": 1, "child_id": "c", "child_created_at": 5, "mode": "forever"}),
    ("subagent/catalog", {"version": 1, "child_created_at": 5, "mode": "one-shot"}),
    ("subagent/catalog", {"version": 1, "child_id": "c", "child_created_at": "5", "mode": "one-shot"}),
    ("subagent/catalog", {"version": True, "child_id": "c", "child_created_at": 5, "mode": "one-shot"}),
    ("subagent/settled", {"child_id": "c"}),
    ("subagent/settled", {"child_id": "c", "reason_kind": "completed", "closing_text": 5}),
    ("subagent/settled", {"child_id": "c", "reason_kind": "budget", "reason_message": 5}),
    ("assistant/message", {"turn": 1, "step": 0, "message": ASSISTANT_MESSAGE, "finish": "stop", "attempt": 1}),
    ("tool/result", {"turn": 1, "step": 0, "message": TOOL_RESULT_MESSAGE, "in_doubt": False}),
    ("turn/continue", {"turn": 1, "step": 0, "attempt": 1, "lost_model_call": False}),
    ("turn/continue", {"turn": 1, "step": 0, "attempt": 2}),
    ("subagent/catalog", {"version": 1, "child_id": "c", "child_created_at": 5, "mode": "one-shot", "call_id": 3}),
    ("subagent/settled", {"child_id": "c", "reason_kind": "completed", "run_key": 41}),
    ("session/model", {}),
    ("session/model", {"model": "m", "api_key": "k"}),
    ("session/stopped", {"by": "p"}),
    ("session/stopped", {"by": "p", "tree": False, "delivery_id": "lower"}),
    ("compaction/start", {}),
    ("compaction/summary", {"text": 5}),
    ("compaction/end", {"start_seq": "0", "end_seq": 3}),
    ("compaction/end", {"start_seq": 0}),
]


def _ids(table: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [f"{t}-{i}" for i, (t, _) in enumerate(table)]


# --- the vocabulary -----------------------------------------------------------------------------


def test_vocabulary_is_the_spec_table() -> None:
    assert KNOWN_TYPES == VOCABULARY
    assert SURFACE_TYPES == SURFACE


def test_every_known_type_has_a_valid_example() -> None:
    assert {t for t, _ in VALID_PAYLOADS} == KNOWN_TYPES


@pytest.mark.parametrize(("type_", "data"), VALID_PAYLOADS, ids=_ids(VALID_PAYLOADS))
def test_valid_payloads_make_events_that_round_trip(type_: str, data: dict[str, Any]) -> None:
    event = make_event(SEQ, type_, TIME, data, surface_op=_surface(type_))
    assert event.seq == SEQ
    assert event.type == type_
    assert event.time == TIME
    assert event.ignorable is UNSET
    line = encode_event(event)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    back = decode_event(line)
    assert back == event
    assert decode_event(line[:-1]) == event
    assert msgspec.json.decode(back.data) == data
    payload = decode_payload(back, session_id="s")
    expected_class = PAYLOAD_TYPES[type_]
    assert isinstance(payload, expected_class)
    assert msgspec.to_builtins(payload) == data


@pytest.mark.parametrize(("type_", "data"), VALID_PAYLOADS, ids=_ids(VALID_PAYLOADS))
def test_make_event_accepts_a_payload_struct(type_: str, data: dict[str, Any]) -> None:
    cls = PAYLOAD_TYPES[type_]
    if cls is dict:
        return
    struct = msgspec.json.decode(msgspec.json.encode(data), type=cls)
    event = make_event(SEQ, type_, TIME, struct, surface_op=_surface(type_))
    assert msgspec.json.decode(event.data) == data


@pytest.mark.parametrize(("type_", "data"), INVALID_PAYLOADS, ids=_ids(INVALID_PAYLOADS))
def test_make_event_refuses_invalid_payloads(type_: str, data: dict[str, Any]) -> None:
    with pytest.raises(InvalidEvent) as info:
        make_event(SEQ, type_, TIME, data, surface_op=_surface(type_))
    assert info.value.code == "STORAGE_INVALID_EVENT"
    assert type_ in str(info.value)


@pytest.mark.parametrize(("type_", "data"), INVALID_PAYLOADS, ids=_ids(INVALID_PAYLOADS))
def test_make_event_refuses_invalid_payloads_even_when_ignorable(type_: str, data: dict[str, Any]) -> None:
    with pytest.raises(InvalidEvent):
        make_event(SEQ, type_, TIME, data, ignorable=True, surface_op=_surface(type_))


@pytest.mark.parametrize(("type_", "data"), INVALID_PAYLOADS, ids=_ids(INVALID_PAYLOADS))
def test_decode_payload_reports_invalid_payloads_as_corrupt(type_: str, data: dict[str, Any]) -> None:
    event = decode_event(_line(_envelope(type_, data)))  # the envelope itself is fine
    with pytest.raises(InvalidPayload) as info:
        decode_payload(event, session_id="sess-1")
    err = info.value
    assert err.code == "STORAGE_INVALID_PAYLOAD"
    assert err.session_id == "sess-1"
    assert err.seq == SEQ
    assert "'sess-1'" in str(err)
    assert f"seq {SEQ}" in str(err)
    assert type_ in str(err)


@pytest.mark.parametrize(
    ("field", "value"),
    [("turn", "5"), ("turn", True), ("turn", 5.9), ("turn", 5.0), ("step", "0"), ("step", False)],
)
def test_decode_payload_is_strict_about_ints(field: str, value: object) -> None:
    data = {"turn": 1, "step": 0, field: value}
    event = decode_event(_line(_envelope("step/start", data)))
    with pytest.raises(InvalidPayload):
        decode_payload(event, session_id="s")


@pytest.mark.parametrize("type_", ["x/unknown", "turn/Start", "", "session"])
def test_unknown_types_are_refused_unless_ignorable(type_: str) -> None:
    with pytest.raises(InvalidEvent) as info:
        make_event(SEQ, type_, TIME, {})
    assert info.value.code == "STORAGE_INVALID_EVENT"
    event = make_event(SEQ, type_, TIME, {"anything": [1, "two"]}, ignorable=True)
    assert event.ignorable is True
    assert b'"ignorable":true' in encode_event(event)
    assert decode_event(encode_event(event)) == event


def test_decode_payload_refuses_an_unknown_type_as_unsupported() -> None:
    event = make_event(SEQ, "x/custom", TIME, {}, ignorable=True)
    with pytest.raises(UnsupportedLog) as info:
        decode_payload(event, session_id="sess-2")
    err = info.value
    assert err.code == "STORAGE_UNSUPPORTED_EVENT"
    assert err.session_id == "sess-2"
    assert err.seq == SEQ
    assert "x/custom" in str(err)


def test_known_type_can_be_marked_ignorable_and_is_still_validated() -> None:
    event = make_event(SEQ, "turn/start", TIME, {"turn": 1}, ignorable=True)
    assert event.ignorable is True
    assert decode_event(encode_event(event)) == event


@pytest.mark.parametrize(
    "data",
    [
        pytest.param([], id="list"),
        pytest.param("x", id="str"),
        pytest.param(None, id="none"),
        pytest.param(5, id="int"),
    ],
)
def test_make_event_refuses_data_that_is_not_an_object(data: Any) -> None:
    with pytest.raises(InvalidEvent):
        make_event(SEQ, "x/custom", TIME, data, ignorable=True)


# --- envelope rules -----------------------------------------------------------------------------

USER_DATA = {"turn": 1, "step": 0, "message": _message()}
TOOL_RESULT_DATA = {"turn": 1, "step": 0, "message": TOOL_RESULT_MESSAGE}
SURFACE_EXAMPLES = {t: d for t, d in reversed(VALID_PAYLOADS) if t in SURFACE_TYPES}
NON_SURFACE_EXAMPLES = {t: d for t, d in reversed(VALID_PAYLOADS) if t not in SURFACE_TYPES}


@pytest.mark.parametrize("type_", sorted(SURFACE_TYPES))
def test_surface_events_require_surface_op(type_: str) -> None:
    with pytest.raises(InvalidEvent) as info:
        make_event(SEQ, type_, TIME, SURFACE_EXAMPLES[type_])
    assert "surface_op" in str(info.value)
    line = _line({"seq": SEQ, "type": type_, "time": TIME, "data": SURFACE_EXAMPLES[type_]})
    with pytest.raises(msgspec.ValidationError):
        decode_event(line)


@pytest.mark.parametrize("type_", sorted(SURFACE_TYPES))
@pytest.mark.parametrize(
    "op",
    [
        pytest.param("append", id="append"),
        pytest.param(ReplaceOp(op="replace", start_seq=0, end_seq=SEQ - 1), id="replace-all-before"),
        pytest.param(ReplaceOp(op="replace", start_seq=2, end_seq=2), id="replace-one"),
    ],
)
def test_surface_events_accept_append_and_replace(type_: str, op: Any) -> None:
    event = make_event(SEQ, type_, TIME, SURFACE_EXAMPLES[type_], surface_op=op)
    assert event.surface_op == op
    assert decode_event(encode_event(event)) == event


@pytest.mark.parametrize("type_", sorted(NON_SURFACE_EXAMPLES))
def test_surface_op_is_forbidden_on_other_types(type_: str) -> None:
    data = NON_SURFACE_EXAMPLES[type_]
    for op in ("append", ReplaceOp(op="replace", start_seq=0, end_seq=1)):
        with pytest.raises(InvalidEvent):
            make_event(SEQ, type_, TIME, data, surface_op=op)  # type: ignore[arg-type]  # deliberately invalid surface ops: the refusal under test
        with pytest.raises(msgspec.ValidationError):
            decode_event(_line(_envelope(type_, data, surface_op=msgspec.to_builtins(op))))


def test_surface_op_is_forbidden_on_ignorable_custom_types() -> None:
    with pytest.raises(InvalidEvent):
        make_event(SEQ, "x/custom", TIME, {}, ignorable=True, surface_op="append")


@pytest.mark.parametrize(
    ("start", "end"),
    [
        pytest.param(3, 2, id="descending"),
        pytest.param(0, SEQ, id="ends-at-own-seq"),
        pytest.param(SEQ, SEQ, id="only-itself"),
        pytest.param(0, SEQ + 1, id="after-itself"),
        pytest.param(-1, 2, id="negative-start"),
        pytest.param(-3, -1, id="negative-range"),
    ],
)
def test_replace_range_must_be_ascending_and_before_the_event(start: int, end: int) -> None:
    op = ReplaceOp(op="replace", start_seq=start, end_seq=end)
    with pytest.raises(InvalidEvent):
        make_event(SEQ, "user/message", TIME, USER_DATA, surface_op=op)
    raw = {"op": "replace", "start_seq": start, "end_seq": end}
    with pytest.raises(msgspec.ValidationError):
        decode_event(_line(_envelope("user/message", USER_DATA, surface_op=raw)))


@pytest.mark.parametrize(("type_", "data"), [("user/message", USER_DATA), ("tool/result", TOOL_RESULT_DATA)])
@pytest.mark.parametrize("seqs", [[0], [SEQ - 1], [0, 2, 5], list(range(SEQ))])
def test_source_event_seqs_on_user_message_and_tool_result(type_: str, data: dict[str, Any], seqs: list[int]) -> None:
    event = make_event(SEQ, type_, TIME, data, surface_op="append", source_event_seqs=seqs)
    assert event.source_event_seqs == seqs
    assert decode_event(encode_event(event)) == event


@pytest.mark.parametrize("type_", sorted(KNOWN_TYPES - {"user/message", "tool/result"}) + ["x/custom"])
def test_source_event_seqs_are_forbidden_elsewhere(type_: str) -> None:
    data = dict(NON_SURFACE_EXAMPLES.get(type_) or SURFACE_EXAMPLES.get(type_) or {})
    with pytest.raises(InvalidEvent):
        make_event(
            SEQ,
            type_,
            TIME,
            data,
            ignorable=type_ == "x/custom",
            surface_op=_surface(type_),
            source_event_seqs=[0],
        )
    extra: dict[str, Any] = {"source_event_seqs": [0]}
    if type_ == "x/custom":
        # Read from a log, a type of a later format is judged by `ignorable` alone: this
        # format's source rules are for its own types (a writer of this format is refused above).
        extra["ignorable"] = True
        assert decode_event(_line(_envelope(type_, data, **extra))).source_event_seqs == [0]
        return
    with pytest.raises(msgspec.ValidationError):
        decode_event(_line(_envelope(type_, data, **extra)))


@pytest.mark.parametrize(
    "seqs",
    [
        pytest.param([], id="empty"),
        pytest.param([2, 1], id="descending"),
        pytest.param([1, 1], id="duplicate"),
        pytest.param([SEQ], id="own-seq"),
        pytest.param([0, SEQ + 1], id="after-itself"),
        pytest.param([-1], id="negative"),
        pytest.param([-1, 0], id="negative-first"),
    ],
)
def test_source_event_seqs_must_be_non_empty_ascending_and_before_the_event(seqs: list[int]) -> None:
    with pytest.raises(InvalidEvent):
        make_event(SEQ, "user/message", TIME, USER_DATA, surface_op="append", source_event_seqs=seqs)
    with pytest.raises(msgspec.ValidationError):
        decode_event(_line(_envelope("user/message", USER_DATA, source_event_seqs=seqs)))


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"seq": True}, id="bool-seq"),
        pytest.param({"seq": 5.9}, id="float-seq"),
        pytest.param({"seq": 5.0}, id="integral-float-seq"),
        pytest.param({"seq": -1}, id="negative-seq"),
        pytest.param({"time": True}, id="bool-time"),
        pytest.param({"time": 5.9}, id="float-time"),
        pytest.param({"time": -1}, id="negative-time"),
        pytest.param({"surface_op": "bogus"}, id="unknown-surface-op"),
        pytest.param({"source_event_seqs": [True]}, id="bool-source-seq"),
        pytest.param({"source_event_seqs": [0.0]}, id="float-source-seq"),
    ],
)
def test_make_event_never_returns_an_event_its_reader_refuses(changes: dict[str, Any]) -> None:
    args: dict[str, Any] = {"seq": SEQ, "time": TIME, "surface_op": "append", **changes}
    with pytest.raises(InvalidEvent):
        make_event(
            args.pop("seq"),
            "user/message",
            args.pop("time"),
            USER_DATA,
            **args,
        )


# --- decode_event strictness --------------------------------------------------------------------

BASE_ENVELOPE: dict[str, Any] = {"seq": SEQ, "type": "turn/start", "time": TIME, "data": {"turn": 1}}


def test_base_envelope_decodes() -> None:
    event = decode_event(_line(BASE_ENVELOPE))
    assert event == make_event(SEQ, "turn/start", TIME, {"turn": 1})


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"seq": "5"}, id="str-seq"),
        pytest.param({"seq": True}, id="bool-seq"),
        pytest.param({"seq": 5.9}, id="float-seq"),
        pytest.param({"seq": 5.0}, id="integral-float-seq"),
        pytest.param({"seq": None}, id="null-seq"),
        pytest.param({"seq": -1}, id="negative-seq"),
        pytest.param({"time": "5"}, id="str-time"),
        pytest.param({"time": True}, id="bool-time"),
        pytest.param({"time": 5.9}, id="float-time"),
        pytest.param({"time": 5.0}, id="integral-float-time"),
        pytest.param({"time": -1}, id="negative-time"),
        pytest.param({"type": 5}, id="int-type"),
        pytest.param({"type": None}, id="null-type"),
        pytest.param({"extra": 1}, id="unknown-key"),
        pytest.param({"Seq": 1}, id="unknown-key-case"),
        pytest.param({"ignorable": False}, id="ignorable-false"),
        pytest.param({"ignorable": "true"}, id="ignorable-str"),
        pytest.param({"ignorable": 1}, id="ignorable-int"),
        pytest.param({"ignorable": None}, id="ignorable-null"),
        pytest.param({"source_event_seqs": None}, id="source-seqs-null"),
        pytest.param({"surface_op": None}, id="surface-op-null"),
        pytest.param({"data": []}, id="data-list"),
        pytest.param({"data": "x"}, id="data-str"),
        pytest.param({"data": 5}, id="data-int"),
        pytest.param({"data": None}, id="data-null"),
        pytest.param({"data": True}, id="data-bool"),
    ],
)
def test_decode_event_refuses_malformed_envelopes(changes: dict[str, Any]) -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_event(_line({**BASE_ENVELOPE, **changes}))


@pytest.mark.parametrize("key", ["seq", "type", "time", "data"])
def test_decode_event_refuses_missing_keys(key: str) -> None:
    envelope = {k: v for k, v in BASE_ENVELOPE.items() if k != key}
    with pytest.raises(msgspec.ValidationError):
        decode_event(_line(envelope))


@pytest.mark.parametrize(
    "surface_op",
    [
        pytest.param("prepend", id="unknown-op-str"),
        pytest.param({"op": "append"}, id="append-as-object"),
        pytest.param({"op": "replace", "start_seq": 0}, id="missing-end"),
        pytest.param({"op": "replace", "start_seq": 0, "end_seq": 1, "extra": 1}, id="unknown-key"),
        pytest.param({"op": "replace", "start_seq": "0", "end_seq": 1}, id="str-start"),
        pytest.param({"op": "replace", "start_seq": 0, "end_seq": True}, id="bool-end"),
        pytest.param({"op": "replace", "start_seq": 0.0, "end_seq": 1}, id="float-start"),
        pytest.param({"op": "delete", "start_seq": 0, "end_seq": 1}, id="unknown-op"),
        pytest.param(None, id="null"),
        pytest.param(5, id="int"),
    ],
)
def test_decode_event_refuses_malformed_surface_ops(surface_op: Any) -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_event(_line(_envelope("user/message", USER_DATA, surface_op=surface_op)))


@pytest.mark.parametrize(
    "seqs",
    [["0"], [True], [0.0], [0.5], "0", 0],
    ids=["str", "bool", "integral-float", "float", "str-not-list", "int-not-list"],
)
def test_decode_event_refuses_malformed_source_event_seqs(seqs: Any) -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_event(_line(_envelope("user/message", USER_DATA, source_event_seqs=seqs)))


@pytest.mark.parametrize(
    "line",
    [b"", b"{", b"[]", b"null", b"5", b'"x"', b"{} {}"],
    ids=["empty", "truncated", "array", "null", "int", "str", "two-values"],
)
def test_decode_event_refuses_lines_that_are_not_an_envelope(line: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_event(line)


def test_decode_event_does_not_check_the_payload() -> None:
    # Payloads are lazy: a malformed known payload is only found by decode_payload.
    event = decode_event(_line({**BASE_ENVELOPE, "data": {"turn": "one"}}))
    assert event.type == "turn/start"


# --- lossless data ------------------------------------------------------------------------------


class _Thing:
    pass


NON_LOSSLESS: list[Any] = [
    pytest.param(math.nan, id="nan"),
    pytest.param(math.inf, id="inf"),
    pytest.param(-math.inf, id="minus-inf"),
    pytest.param([1, [math.nan]], id="nested-nan"),
    pytest.param({"a": {"b": math.inf}}, id="nested-inf"),
    pytest.param({1: "x"}, id="int-key"),
    pytest.param({None: "x"}, id="none-key"),
    pytest.param({True: "x"}, id="bool-key"),
    pytest.param({(1, 2): "x"}, id="tuple-key"),
    pytest.param({"a": {2.5: "x"}}, id="nested-float-key"),
    pytest.param(2**63, id="int-2^63"),
    pytest.param(-(2**63) - 1, id="int-below-min"),
    pytest.param(10**30, id="huge-int"),
    pytest.param([2**64], id="nested-huge-int"),
    pytest.param("a\ud800", id="lone-surrogate"),
    pytest.param({"k": ["\udfff"]}, id="nested-lone-surrogate"),
    pytest.param({"\ud800": 1}, id="lone-surrogate-key"),
    pytest.param({1, 2}, id="set"),
    pytest.param(frozenset(), id="frozenset"),
    pytest.param(b"bytes", id="bytes"),
    pytest.param(bytearray(b"x"), id="bytearray"),
    pytest.param(_Thing(), id="object"),
    pytest.param(decimal.Decimal("1.5"), id="decimal"),
    pytest.param(1 + 2j, id="complex"),
    pytest.param({"a": [{"b": {1, 2}}]}, id="nested-set"),
]


@pytest.mark.parametrize("value", NON_LOSSLESS)
def test_check_lossless_refuses_what_json_cannot_carry(value: Any) -> None:
    with pytest.raises(NonLosslessData) as info:
        check_lossless(value)
    assert info.value.code == "STORAGE_NON_LOSSLESS_DATA"
    assert isinstance(info.value, InvalidEvent)


@pytest.mark.parametrize("value", NON_LOSSLESS)
def test_make_event_refuses_what_json_cannot_carry(value: Any) -> None:
    with pytest.raises(NonLosslessData):
        make_event(SEQ, "x/custom", TIME, {"value": value}, ignorable=True)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(2**63 - 1, id="int-max"),
        pytest.param(-(2**63), id="int-min"),
        pytest.param(0, id="zero"),
        pytest.param(-0.0, id="negative-zero"),
        pytest.param(1.7976931348623157e308, id="max-float"),
        pytest.param(5e-324, id="min-subnormal"),
        pytest.param('\u2028\u2029\x00\n"\\é😀', id="awkward-text"),
        pytest.param({"": [None, True, False, [], {}]}, id="nested"),
        pytest.param((1, "x"), id="tuple"),
    ],
)
def test_check_lossless_accepts_json_values_and_they_round_trip(value: Any) -> None:
    check_lossless(value)
    event = make_event(SEQ, "x/custom", TIME, {"value": value}, ignorable=True)
    back = decode_event(encode_event(event))
    expected = list(value) if isinstance(value, tuple) else value
    assert msgspec.json.decode(back.data) == {"value": expected}


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": [1, math.nan]}, "$.a[1]"),
        ({"a": {"b": 2**63}}, "$.a.b"),
        ([{"x": b"y"}], "$[0].x"),
    ],
)
def test_check_lossless_names_the_path(value: Any, path: str) -> None:
    with pytest.raises(NonLosslessData) as info:
        check_lossless(value)
    assert path in str(info.value)


# --- hypothesis round trips ---------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(INT_MIN, INT_MAX),
    st.sampled_from([INT_MIN, INT_MAX, 0, -1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
    st.sampled_from(["\u2028", "\u2029", "a\nb", "\r\n", "\x00", '"', "\\", "😀", "日本語"]),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(st.lists(children, max_size=5), st.dictionaries(st.text(), children, max_size=5)),
    max_leaves=25,
)


@pytest.mark.slow
@given(
    seq=st.integers(0, INT_MAX),
    time=st.integers(0, INT_MAX),
    data=st.dictionaries(st.text(), json_values, max_size=6),
)
@example(seq=0, time=0, data={"\u2028": "\u2029", "n": INT_MAX, "m": INT_MIN, "f": 1e308})
def test_custom_events_round_trip_through_one_line(seq: int, time: int, data: dict[str, Any]) -> None:
    event = make_event(seq, "x/custom", time, data, ignorable=True)
    line = encode_event(event)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    back = decode_event(line)
    assert back == event
    assert back.seq == seq
    assert back.time == time
    assert msgspec.json.decode(back.data) == data


# Leaves JSON cannot carry, and keys that are not strs, mixed into otherwise valid data.
bad_leaves = st.sampled_from(
    [math.nan, math.inf, 2**63, -(2**63) - 1, 10**30, "a\ud800", "\udfff", {1, 2}, b"x", decimal.Decimal(1), 1j]
)
mixed_values = st.recursive(
    st.one_of(json_scalars, bad_leaves),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(
            st.one_of(st.text(max_size=3), st.sampled_from(["\ud800", 1, None, 2.5])), children, max_size=4
        ),
    ),
    max_leaves=12,
)


def _nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@given(data=st.dictionaries(st.text(max_size=3), mixed_values, max_size=4))
@example(data={"a": "\ud800", "b": math.nan})  # the first bad value in walk order is named
@example(data={"a": math.nan, "\ud800": 1})
@example(data={"a": _nested(198, 1)})  # just inside the depth cap
@example(data={"a": _nested(199, 1)})
@example(data={"a": _nested(199, "\ud800")})
@example(data={"a": _nested(250, 1)})
def test_make_event_refuses_exactly_what_check_lossless_refuses_and_names_it_alike(data: dict[str, Any]) -> None:
    # Issue 28 item 3: `make_event` says yes to plain data without building JSON paths, and
    # leaves every no (and every lone surrogate, which the encoder refuses) to `check_lossless`.
    try:
        check_lossless(data, "$.data")
    except NonLosslessData as exc:
        with pytest.raises(NonLosslessData) as info:
            make_event(SEQ, "x/custom", TIME, data, ignorable=True)
        assert str(info.value) == str(exc)
        return
    event = make_event(SEQ, "x/custom", TIME, data, ignorable=True)
    assert bytes(event.data) == msgspec.json.encode(data)


@given(text=st.text(), seq=st.integers(0, 1000))
@example(text="\u2028\u2029", seq=0)
@example(text="line\nbreak\r\n\x00", seq=1)
def test_user_message_text_round_trips(text: str, seq: int) -> None:
    data = {
        "turn": 1,
        "step": 0,
        "message": {"id": "m", "role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": "user"}},
    }
    event = make_event(seq, "user/message", TIME, data, surface_op="append")
    line = encode_event(event)
    assert line.count(b"\n") == 1
    back = decode_event(line)
    assert back == event
    payload = decode_payload(back, session_id="s")
    assert payload.message.content[0].text == text


# --- the header record --------------------------------------------------------------------------

ID_CHARS = st.characters(blacklist_categories=("Cc", "Cs"))
session_ids = st.text(ID_CHARS, min_size=1, max_size=20).filter(lambda s: len(s.encode("utf-8")) <= 80)
optional_text = st.none() | st.text()


@st.composite
def header_records(draw: st.DrawFn) -> HeaderRecord:
    k = draw(st.one_of(st.just(0), st.integers(1, INT_MAX)))
    header = SessionHeader(
        id=SessionId(draw(session_ids)),
        created_at=draw(st.integers(0, INT_MAX)),
        is_seeded=k > 0,
        delegation_depth=draw(st.integers(0, INT_MAX)),
        cwd=draw(st.none() | st.text().map(lambda s: "/" + s)),
        parent_session=draw(st.none() | session_ids),
        origin=draw(st.sampled_from([None, "subagent"])),
        agent_preset=draw(optional_text),
    )
    return HeaderRecord(header=header, inherited_event_count=Offset(k))


REQUIRED_HEADER_KEYS = ["type", "format", "id", "created_at", "is_seeded", "inherited_event_count", "delegation_depth"]
OPTIONAL_HEADER_KEYS = ["cwd", "parent_session", "origin", "agent_preset"]


@given(header_records())
def test_header_record_round_trips(record: HeaderRecord) -> None:
    line = encode_header_line(record)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert decode_header_line(line[:-1], record.header.id) == record
    raw = msgspec.json.decode(line)
    assert list(raw)[: len(REQUIRED_HEADER_KEYS)] == REQUIRED_HEADER_KEYS
    assert raw["type"] == "session"
    assert raw["format"] == 1
    for key in OPTIONAL_HEADER_KEYS:
        assert (key in raw) == (getattr(record.header, key) is not None)


def test_minimal_header_line_is_the_documented_one() -> None:
    record = HeaderRecord(
        header=SessionHeader(id=SessionId("abc"), created_at=1789000000000), inherited_event_count=Offset(0)
    )
    assert encode_header_line(record) == (
        b'{"type":"session","format":1,"id":"abc","created_at":1789000000000,"is_seeded":false,'
        b'"inherited_event_count":0,"delegation_depth":0}\n'
    )


BASE_HEADER: dict[str, Any] = {
    "type": "session",
    "format": 1,
    "id": "s",
    "created_at": 1789000000000,
    "is_seeded": False,
    "inherited_event_count": 0,
    "delegation_depth": 0,
}


def test_base_header_decodes() -> None:
    record = decode_header_line(msgspec.json.encode(BASE_HEADER), "s")
    assert record.header == SessionHeader(id=SessionId("s"), created_at=1789000000000)
    assert record.inherited_event_count == 0


@pytest.mark.parametrize(
    "optional",
    [
        {"cwd": "/work"},
        {"parent_session": "p"},
        {"origin": "subagent"},
        {"agent_preset": "coder"},
        {"cwd": "/", "parent_session": "p", "origin": "subagent", "agent_preset": ""},
    ],
)
def test_header_optional_keys_decode(optional: dict[str, Any]) -> None:
    record = decode_header_line(msgspec.json.encode({**BASE_HEADER, **optional}), "s")
    for key, value in optional.items():
        assert getattr(record.header, key) == value


def test_seeded_header_decodes() -> None:
    line = msgspec.json.encode({**BASE_HEADER, "is_seeded": True, "inherited_event_count": 4})
    record = decode_header_line(line, "s")
    assert record.header.is_seeded is True
    assert record.inherited_event_count == 4


def _without(key: str) -> dict[str, Any]:
    return {k: v for k, v in BASE_HEADER.items() if k != key}


CORRUPT_HEADERS: list[Any] = [
    pytest.param({**BASE_HEADER, "extra": 1}, id="unknown-key"),
    pytest.param({**BASE_HEADER, "inherited_cut": 1}, id="unknown-key-2"),
    *[pytest.param(_without(k), id=f"missing-{k}") for k in REQUIRED_HEADER_KEYS],
    pytest.param({**BASE_HEADER, "type": "event"}, id="type-not-session"),
    pytest.param({**BASE_HEADER, "type": 1}, id="type-int"),
    pytest.param({**BASE_HEADER, "format": "1"}, id="format-str"),
    pytest.param({**BASE_HEADER, "format": True}, id="format-bool"),
    pytest.param({**BASE_HEADER, "format": 1.0}, id="format-float"),
    pytest.param({**BASE_HEADER, "created_at": "5"}, id="created-at-str"),
    pytest.param({**BASE_HEADER, "created_at": True}, id="created-at-bool"),
    pytest.param({**BASE_HEADER, "created_at": 5.9}, id="created-at-float"),
    pytest.param({**BASE_HEADER, "created_at": 5.0}, id="created-at-integral-float"),
    pytest.param({**BASE_HEADER, "created_at": -1}, id="created-at-negative"),
    pytest.param({**BASE_HEADER, "created_at": None}, id="created-at-null"),
    pytest.param({**BASE_HEADER, "delegation_depth": "0"}, id="depth-str"),
    pytest.param({**BASE_HEADER, "delegation_depth": False}, id="depth-bool"),
    pytest.param({**BASE_HEADER, "delegation_depth": 0.5}, id="depth-float"),
    pytest.param({**BASE_HEADER, "delegation_depth": -1}, id="depth-negative"),
    pytest.param({**BASE_HEADER, "inherited_event_count": "0"}, id="k-str"),
    pytest.param({**BASE_HEADER, "inherited_event_count": False}, id="k-bool"),
    pytest.param({**BASE_HEADER, "inherited_event_count": 0.0}, id="k-float"),
    pytest.param({**BASE_HEADER, "inherited_event_count": -1}, id="k-negative"),
    pytest.param({**BASE_HEADER, "is_seeded": 0}, id="is-seeded-int"),
    pytest.param({**BASE_HEADER, "is_seeded": "false"}, id="is-seeded-str"),
    pytest.param({**BASE_HEADER, "id": 5}, id="id-int"),
    pytest.param({**BASE_HEADER, "id": ""}, id="id-empty"),
    pytest.param({**BASE_HEADER, "cwd": "relative"}, id="cwd-relative"),
    pytest.param({**BASE_HEADER, "cwd": 5}, id="cwd-int"),
    pytest.param({**BASE_HEADER, "origin": "user"}, id="origin-bad"),
    pytest.param({**BASE_HEADER, "parent_session": ""}, id="parent-empty"),
    pytest.param({**BASE_HEADER, "parent_session": "a\x00"}, id="parent-nul"),
    pytest.param({**BASE_HEADER, "agent_preset": 5}, id="preset-int"),
    # Optional keys are omitted when absent (SPEC 3.3); null is not a str.
    *[pytest.param({**BASE_HEADER, k: None}, id=f"{k}-null") for k in OPTIONAL_HEADER_KEYS],
    pytest.param({**BASE_HEADER, "is_seeded": True}, id="seeded-without-cut"),
    pytest.param({**BASE_HEADER, "inherited_event_count": 3}, id="cut-without-seeded"),
]


@pytest.mark.parametrize("raw", CORRUPT_HEADERS)
def test_decode_header_line_refuses_corrupt_headers(raw: dict[str, Any]) -> None:
    with pytest.raises(HeaderError) as info:
        decode_header_line(msgspec.json.encode(raw), "s")
    err = info.value
    assert err.unsupported is False
    storage_error = err.to_storage_error("s")
    assert storage_error.code == "STORAGE_CORRUPT_LOG"
    assert "'s'" in str(storage_error)


@pytest.mark.parametrize(
    "line",
    [b"", b"{", b"[]", b'"session"', b"null", b"not json"],
    ids=["empty", "truncated", "array", "str", "null", "garbage"],
)
def test_decode_header_line_refuses_non_objects(line: bytes) -> None:
    with pytest.raises(HeaderError) as info:
        decode_header_line(line, "s")
    assert info.value.unsupported is False
    assert info.value.header is None


def test_decode_header_line_refuses_an_id_that_does_not_match_its_folder() -> None:
    with pytest.raises(HeaderError) as info:
        decode_header_line(msgspec.json.encode(BASE_HEADER), "other")
    assert info.value.unsupported is False
    assert "'s'" in info.value.reason and "'other'" in info.value.reason
    # The id rule is a format-1 header rule: a header that breaks it is not shown (SPEC 3.3).
    assert info.value.header is None


@pytest.mark.parametrize("fmt", [0, 2, 99])
def test_another_format_is_unsupported_and_names_both_versions(fmt: int) -> None:
    with pytest.raises(HeaderError) as info:
        decode_header_line(msgspec.json.encode({**BASE_HEADER, "format": fmt}), "s")
    err = info.value
    assert err.unsupported is True
    assert f"format {fmt}" in err.reason
    assert "format 1" in err.reason
    storage_error = err.to_storage_error("s")
    assert isinstance(storage_error, UnsupportedLog)
    assert storage_error.code == "STORAGE_UNSUPPORTED_FORMAT"
    assert f"format {fmt}" in str(storage_error)
    # The rest of the record is still parsed under format-1 rules for listings.
    assert err.header is not None
    assert err.header.id == "s"
    assert err.header.format == fmt


def test_another_format_is_unsupported_even_when_the_rest_is_unreadable() -> None:
    raw = {"type": "session", "format": 2, "id": "s", "whatever": [1]}
    with pytest.raises(HeaderError) as info:
        decode_header_line(msgspec.json.encode(raw), "s")
    assert info.value.unsupported is True
    assert info.value.header is None


def test_decoded_header_rejects_inconsistent_seeding_without_a_header() -> None:
    # The seed rule is a format-1 header rule: a header breaking it is not shown (SPEC 3.3).
    with pytest.raises(HeaderError) as info:
        decode_header_line(msgspec.json.encode({**BASE_HEADER, "inherited_event_count": 2}), "s")
    assert info.value.unsupported is False
    assert "is_seeded" in info.value.reason
    assert info.value.header is None


def test_event_type_checks_use_the_exported_event_class() -> None:
    assert isinstance(make_event(SEQ, "turn/start", TIME, {"turn": 1}), Event)
