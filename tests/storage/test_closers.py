"""Table tests for `interrupted_closers` (SPEC 3.4, reference-notes 2.3).

Expectations are the on-disk form of each closer, written out as literal dicts with the texts
copied from reference-notes 2.3 — not imported from the code under test — and compared with
what the closers encode to, so keys are checked exactly as they land on disk (snake_case).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from clocks import T
from log_lines import header
from subagents.storage import (
    Batch,
    Event,
    FileLogStore,
    InvalidPayload,
    decode_payload,
    interrupted_closers,
    make_event,
)
from subagents.storage._codec import decode_event, encode_event

OUTCOME_UNKNOWN_TEXT = (
    "The tool call was interrupted after it was recorded, but no result was durably recorded. Its "
    "outcome is unknown. Decide whether to retry from the tool semantics: retry only if the operation "
    "is read-only or idempotent; if it may have side effects, first verify external state or ask the "
    "user. Do not retry blindly."
)
NOT_STARTED_TEXT = (
    "The tool call was interrupted before the Harness recorded it as started. Retry it if it is still needed."
)


# --- a tiny log builder: seqs are positions, times strictly increase -----------------------------


class Log:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def _add(self, type_: str, data: dict[str, Any], **envelope: Any) -> Log:
        seq = len(self.events)
        self.events.append(make_event(seq, type_, T + 10 * seq, data, **envelope))
        return self

    def turn_start(self, turn: int) -> Log:
        return self._add("turn/start", {"turn": turn})

    def turn_end(self, turn: int, kind: str = "completed") -> Log:
        return self._add("turn/end", {"turn": turn, "reason": {"kind": kind}})

    def step_start(self, turn: int, step: int) -> Log:
        return self._add("step/start", {"turn": turn, "step": step})

    def step_end(self, turn: int, step: int) -> Log:
        return self._add("step/end", {"turn": turn, "step": step})

    def user(self, turn: int, step: int, text: str = "hi") -> Log:
        message = {
            "id": f"u-{len(self.events)}",
            "role": "user",
            "content": [{"type": "text", "text": text}],
            "source": {"kind": "user"},
        }
        return self._add("user/message", {"turn": turn, "step": step, "message": message}, surface_op="append")

    def assistant(self, turn: int, step: int, *call_ids: str, text: str | None = "ok") -> Log:
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text is not None else []
        content += [{"type": "tool-call", "id": c, "name": "shell", "arguments": '{"cmd":"ls"}'} for c in call_ids]
        message = {"id": f"a-{len(self.events)}", "role": "assistant", "content": content, "source": {"kind": "model"}}
        finish = "tool-calls" if call_ids else "stop"
        return self._add(
            "assistant/message",
            {"turn": turn, "step": step, "message": message, "finish": finish},
            surface_op="append",
        )

    def tool_call(self, turn: int, step: int, call_id: str) -> Log:
        return self._add(
            "tool/call", {"turn": turn, "step": step, "call_id": call_id, "name": "shell", "arguments": '{"cmd":"ls"}'}
        )

    def tool_result(self, turn: int, step: int, call_id: str, call_seq: int | None = None) -> Log:
        message = {
            "id": f"r-{len(self.events)}",
            "role": "user",
            "content": [
                {
                    "type": "tool-result",
                    "call_id": call_id,
                    "content": [{"type": "text", "text": "done"}],
                    "is_error": False,
                }
            ],
            "source": {"kind": "tool", "call_id": call_id},
        }
        extra: dict[str, Any] = {"source_event_seqs": [call_seq]} if call_seq is not None else {}
        return self._add("tool/result", {"turn": turn, "step": step, "message": message}, surface_op="append", **extra)

    def other(self, type_: str, data: dict[str, Any], **envelope: Any) -> Log:
        return self._add(type_, data, **envelope)

    @property
    def last_seq(self) -> int:
        return len(self.events) - 1

    @property
    def last_time(self) -> int:
        return self.events[-1].time


# --- expected closers, in their on-disk form ----------------------------------------------------


def _closer(
    seq: int, time: int, turn: int, step: int, call_id: str, text: str, error: dict[str, str]
) -> dict[str, Any]:
    return {
        "seq": seq,
        "type": "tool/result",
        "time": time,
        "data": {
            "turn": turn,
            "step": step,
            "message": {
                "id": f"interrupted-tool-result-{call_id}-{seq}",
                "role": "user",
                "content": [
                    {
                        "type": "tool-result",
                        "call_id": call_id,
                        "content": [{"type": "text", "text": text}],
                        "is_error": True,
                    }
                ],
                "source": {"kind": "tool", "call_id": call_id},
            },
            "error": error,
        },
        "surface_op": "append",
    }


def not_started(seq: int, time: int, turn: int, step: int, call_id: str) -> dict[str, Any]:
    return _closer(
        seq, time, turn, step, call_id, NOT_STARTED_TEXT, {"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"}
    )


def outcome_unknown(seq: int, time: int, turn: int, step: int, call_id: str, call_seq: int) -> dict[str, Any]:
    closer = _closer(
        seq,
        time,
        turn,
        step,
        call_id,
        OUTCOME_UNKNOWN_TEXT,
        {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"},
    )
    return {**closer, "source_event_seqs": [call_seq]}


def step_end(seq: int, time: int, turn: int, step: int) -> dict[str, Any]:
    return {"seq": seq, "type": "step/end", "time": time, "data": {"turn": turn, "step": step}}


def turn_end(seq: int, time: int, turn: int) -> dict[str, Any]:
    return {"seq": seq, "type": "turn/end", "time": time, "data": {"turn": turn, "reason": {"kind": "interrupted"}}}


def on_disk(event: Event) -> dict[str, Any]:
    """What a closer looks like in the log: its encoded line, decoded with the stdlib."""
    line = encode_event(event)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    return json.loads(line)


# --- the table ----------------------------------------------------------------------------------


def case_empty() -> tuple[Log, list]:
    return Log(), []


def case_balanced() -> tuple[Log, list]:
    log = Log().turn_start(1).step_start(1, 1).user(1, 1).assistant(1, 1).step_end(1, 1).turn_end(1)
    return log, []


def case_balanced_then_log_only_events() -> tuple[Log, list]:
    log = Log().turn_start(1).step_start(1, 1).assistant(1, 1).step_end(1, 1).turn_end(1, "aborted")
    log.other("subagent/settled", {"child_id": "c", "reason_kind": "completed"})
    log.other("team/task", {"x": 1}, ignorable=True)
    return log, []


def case_balanced_with_an_unanswered_call_in_a_closed_turn() -> tuple[Log, list]:
    # The turn ended (say, aborted) with a call unanswered: nothing is open, nothing to close.
    log = Log().turn_start(1).step_start(1, 1).assistant(1, 1, "c-1").tool_call(1, 1, "c-1").turn_end(1, "aborted")
    return log, []


def case_open_turn_no_step() -> tuple[Log, list]:
    log = Log().turn_start(1).step_start(1, 1).assistant(1, 1).step_end(1, 1).turn_end(1).turn_start(2)
    s, t = log.last_seq + 1, log.last_time
    return log, [turn_end(s, t, 2)]


def case_open_step() -> tuple[Log, list]:
    log = Log().turn_start(4).step_start(4, 1).user(4, 1).assistant(4, 1)
    s, t = log.last_seq + 1, log.last_time
    return log, [step_end(s, t, 4, 1), turn_end(s + 1, t, 4)]


def case_step_closed_turn_open() -> tuple[Log, list]:
    log = Log().turn_start(1).step_start(1, 1).assistant(1, 1).step_end(1, 1)
    s, t = log.last_seq + 1, log.last_time
    return log, [turn_end(s, t, 1)]


def case_three_calls_answered_started_and_not_started() -> tuple[Log, list]:
    log = Log().turn_start(3).step_start(3, 2)
    log.assistant(3, 2, "c-new", "c-run", "c-done")  # seq 2: registration order new, run, done
    log.tool_call(3, 2, "c-done")  # seq 3
    log.tool_call(3, 2, "c-run")  # seq 4
    log.tool_result(3, 2, "c-done", call_seq=3)  # seq 5
    s, t = log.last_seq + 1, log.last_time
    assert (s, t) == (6, T + 50)
    return log, [
        not_started(6, t, 3, 2, "c-new"),
        outcome_unknown(7, t, 3, 2, "c-run", 4),
        step_end(8, t, 3, 2),
        turn_end(9, t, 3),
    ]


def case_calls_of_two_assistant_messages_keep_insertion_order() -> tuple[Log, list]:
    log = Log().turn_start(1).step_start(1, 1)
    log.assistant(1, 1, "b", text=None)  # seq 2
    log.assistant(1, 1, "a")  # seq 3
    log.tool_call(1, 1, "a")  # seq 4
    s, t = log.last_seq + 1, log.last_time
    return log, [
        not_started(s, t, 1, 1, "b"),
        outcome_unknown(s + 1, t, 1, 1, "a", 4),
        step_end(s + 2, t, 1, 1),
        turn_end(s + 3, t, 1),
    ]


def case_step_end_forgets_pending_calls() -> tuple[Log, list]:
    log = Log().turn_start(1).step_start(1, 1).assistant(1, 1, "c-1").tool_call(1, 1, "c-1").step_end(1, 1)
    log.step_start(1, 2)
    s, t = log.last_seq + 1, log.last_time
    return log, [step_end(s, t, 1, 2), turn_end(s + 1, t, 1)]


def case_turn_start_forgets_pending_calls() -> tuple[Log, list]:
    # A turn that never ended and then a new turn (no closer was written in between): only the
    # new turn is closed, and the old turn's calls are not its business.
    log = Log().turn_start(1).step_start(1, 1).assistant(1, 1, "old").turn_start(2).step_start(2, 1)
    s, t = log.last_seq + 1, log.last_time
    return log, [step_end(s, t, 2, 1), turn_end(s + 1, t, 2)]


def case_pending_call_keeps_its_own_step() -> tuple[Log, list]:
    # A call registered in step 1 whose step never ended, then step 2 opened: the result closer
    # carries the call's step, the step closer the open step.
    log = Log().turn_start(1).step_start(1, 1).assistant(1, 1, "c-1").step_start(1, 2)
    s, t = log.last_seq + 1, log.last_time
    return log, [not_started(s, t, 1, 1, "c-1"), step_end(s + 1, t, 1, 2), turn_end(s + 2, t, 1)]


def case_tool_call_without_a_block_is_ignored() -> tuple[Log, list]:
    log = Log().turn_start(1).step_start(1, 1).tool_call(1, 1, "ghost")
    s, t = log.last_seq + 1, log.last_time
    return log, [step_end(s, t, 1, 1), turn_end(s + 1, t, 1)]


def case_closers_follow_an_ignorable_last_event() -> tuple[Log, list]:
    log = Log().turn_start(1).step_start(1, 1).assistant(1, 1, "c-1")
    log.other("vendor/telemetry", {"k": "v"}, ignorable=True)
    s, t = log.last_seq + 1, log.last_time
    assert log.events[-1].type == "vendor/telemetry"
    return log, [not_started(s, t, 1, 1, "c-1"), step_end(s + 1, t, 1, 1), turn_end(s + 2, t, 1)]


def case_seeded_log_with_an_open_own_turn() -> tuple[Log, list]:
    log = Log().turn_start(1).step_start(1, 1).assistant(1, 1).step_end(1, 1).turn_end(1)
    log.other("session/end-seed", {"inherited": True})
    log.turn_start(2).step_start(2, 1).assistant(2, 1, "x").tool_call(2, 1, "x")
    s, t = log.last_seq + 1, log.last_time
    return log, [
        outcome_unknown(s, t, 2, 1, "x", log.last_seq),
        step_end(s + 1, t, 2, 1),
        turn_end(s + 2, t, 2),
    ]


CASES = {name[len("case_") :]: fn for name, fn in dict(globals()).items() if name.startswith("case_")}


@pytest.mark.parametrize("name", list(CASES))
def test_interrupted_closers(name: str) -> None:
    log, expected = CASES[name]()
    closers = interrupted_closers(log.events, session_id="s-1")
    assert [on_disk(c) for c in closers] == expected
    # Closers are ordinary, valid events: their payloads decode and they close the log for good.
    for closer in closers:
        decode_payload(closer, session_id="s-1")
        assert decode_event(encode_event(closer)[:-1]) == closer
    assert interrupted_closers([*log.events, *closers]) == []


def test_every_closer_reuses_the_last_time_and_takes_the_next_seqs() -> None:
    log, _ = case_three_calls_answered_started_and_not_started()
    log.other("vendor/telemetry", {}, ignorable=True)
    closers = interrupted_closers(log.events)
    assert [c.seq for c in closers] == list(range(len(log.events), len(log.events) + 4))
    assert {c.time for c in closers} == {log.events[-1].time}
    assert log.events[-1].time > log.events[-2].time


def test_closers_do_not_depend_on_the_session_id() -> None:
    log, _ = case_open_step()
    assert interrupted_closers(log.events) == interrupted_closers(log.events, session_id="another")


# --- malformed payloads -------------------------------------------------------------------------


def _raw_event(line: dict[str, Any]) -> Event:
    """An envelope-valid event whose payload `make_event` would refuse (as a damaged log holds)."""
    return decode_event(json.dumps(line).encode())


@pytest.mark.parametrize(
    "bad",
    [
        {"seq": 2, "type": "turn/start", "time": T, "data": {"turn": "1"}},
        {"seq": 2, "type": "step/start", "time": T, "data": {"turn": 1, "step": 1, "extra": 1}},
        {"seq": 2, "type": "tool/call", "time": T, "data": {"turn": 1, "step": 1, "name": "x", "arguments": "{}"}},
        {
            "seq": 2,
            "type": "assistant/message",
            "time": T,
            "data": {
                "turn": 1,
                "step": 1,
                "message": {"id": "a", "role": "assistant", "content": [], "source": {"kind": "model"}},
            },
            "surface_op": "append",
        },
        {
            "seq": 2,
            "type": "tool/result",
            "time": T,
            "data": {"turn": 1, "step": 1, "message": {"role": "user", "content": [], "source": {"kind": "user"}}},
            "surface_op": "append",
        },
    ],
    ids=[
        "turn-start-string-turn",
        "step-start-extra-key",
        "tool-call-no-call-id",
        "assistant-no-finish",
        "tool-result-message-no-id",
    ],
)
def test_a_malformed_payload_is_invalid_payload(bad: dict[str, Any]) -> None:
    log = Log().turn_start(1).step_start(1, 1)
    events = [*log.events, _raw_event(bad)]
    with pytest.raises(InvalidPayload) as info:
        interrupted_closers(events, session_id="s-1")
    exc = info.value
    assert (exc.code, exc.seq, exc.session_id) == ("STORAGE_INVALID_PAYLOAD", 2, "s-1")
    assert "'s-1'" in str(exc) and "seq 2" in str(exc) and bad["type"] in str(exc)


# --- closers appended through a write handle ----------------------------------------------------


def test_closers_appended_through_a_write_handle_read_back_identically(tmp_path: Path) -> None:
    log, expected = case_three_calls_answered_started_and_not_started()
    store = FileLogStore(str(tmp_path), compression="none")
    handle = store.create(header("crashed", T))
    try:
        store.append(handle, [Batch(0, log.events)])
    finally:
        store.close(handle)

    # Resume: the writer reads the log, computes the closers and appends them durably first.
    writer = store.open_write("crashed")
    try:
        events = store.read(writer)
        assert events == log.events
        closers = interrupted_closers(events, session_id="crashed")
        assert store.append(writer, [Batch(writer.next_seq, closers)]) == len(log.events) + len(expected)
    finally:
        store.close(writer)

    fresh = FileLogStore(str(tmp_path))
    back = fresh.read(fresh.open_read("crashed"))
    assert back[len(log.events) :] == closers
    assert [on_disk(e) for e in back[len(log.events) :]] == expected
    lines = (tmp_path / "sessions" / "crashed" / "session.jsonl").read_bytes().splitlines()
    assert [json.loads(line) for line in lines[-len(expected) :]] == expected
    assert interrupted_closers(back) == []
    (row,) = fresh.list()
    assert (row.damage, row.event_count) == (None, len(log.events) + len(expected))


def test_closer_data_is_snake_case_json() -> None:
    log, _ = case_three_calls_answered_started_and_not_started()
    result = interrupted_closers(log.events)[1]
    data = msgspec.json.decode(bytes(result.data))
    assert set(data) == {"turn", "step", "message", "error"}
    assert set(data["message"]["content"][0]) == {"type", "call_id", "content", "is_error"}
    assert data["message"]["source"] == {"kind": "tool", "call_id": "c-run"}
    assert result.source_event_seqs == [4] and result.surface_op == "append"
