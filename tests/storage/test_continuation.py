"""Table tests for `plan_continuation` (docs/format.md, "Continued turns"): every shape a crash
leaves a turn in, written out as hand-built logs, and what continuing it must do."""

from __future__ import annotations

import json
from typing import Any

import pytest
from clocks import T
from subagents.storage import (
    Event,
    InvalidPayload,
    PendingCall,
    ReplaceOp,
    make_event,
    plan_continuation,
)
from subagents.storage._codec import decode_event


class Log:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def _add(self, type_: str, data: dict[str, Any], **envelope: Any) -> Log:
        seq = len(self.events)
        self.events.append(make_event(seq, type_, T + 10 * seq, data, **envelope))
        return self

    def turn_start(self, turn: int) -> Log:
        return self._add("turn/start", {"turn": turn})

    def turn_end(self, turn: int) -> Log:
        return self._add("turn/end", {"turn": turn, "reason": {"kind": "completed"}})

    def cont(self, turn: int, step: int, attempt: int, lost: bool) -> Log:
        return self._add("turn/continue", {"turn": turn, "step": step, "attempt": attempt, "lost_model_call": lost})

    def step_start(self, turn: int, step: int) -> Log:
        return self._add("step/start", {"turn": turn, "step": step})

    def step_end(self, turn: int, step: int) -> Log:
        return self._add("step/end", {"turn": turn, "step": step})

    def user(self, turn: int, step: int) -> Log:
        message = {"id": f"u-{len(self.events)}", "role": "user", "content": [{"type": "text", "text": "hi"}]}
        message["source"] = {"kind": "user"}
        return self._add("user/message", {"turn": turn, "step": step, "message": message}, surface_op="append")

    def assistant(self, turn: int, step: int, *calls: str, finish: str | None = None) -> Log:
        content: list[dict[str, Any]] = [{"type": "text", "text": "ok"}]
        content += [{"type": "tool-call", "id": c, "name": f"tool_{c}", "arguments": f'{{"c":"{c}"}}'} for c in calls]
        message = {"id": f"a-{len(self.events)}", "role": "assistant", "content": content, "source": {"kind": "model"}}
        data = {"turn": turn, "step": step, "message": message, "finish": finish or ("tool-calls" if calls else "stop")}
        return self._add("assistant/message", data, surface_op="append")

    def tool_call(self, turn: int, step: int, call_id: str) -> Log:
        data = {"turn": turn, "step": step, "call_id": call_id, "name": f"tool_{call_id}", "arguments": "{}"}
        return self._add("tool/call", data)

    def tool_result(self, turn: int, step: int, call_id: str) -> Log:
        block = {
            "type": "tool-result",
            "call_id": call_id,
            "content": [{"type": "text", "text": "done"}],
            "is_error": False,
        }
        message = {"id": f"r-{len(self.events)}", "role": "user", "content": [block]}
        message["source"] = {"kind": "tool", "call_id": call_id}
        return self._add("tool/result", {"turn": turn, "step": step, "message": message}, surface_op="append")

    def catalog(self, child: str, mode: str, call_id: str | None) -> Log:
        data: dict[str, Any] = {"version": 1, "child_id": child, "child_created_at": T, "mode": mode}
        if call_id is not None:
            data["call_id"] = call_id
        return self._add("subagent/catalog", data)

    def compaction(self, turn: int, step: int) -> Log:
        self._add("compaction/start", {"turn": turn})
        self._add("compaction/summary", {"text": "so far"})
        message = {"id": f"c-{len(self.events)}", "role": "user", "content": [{"type": "text", "text": "s"}]}
        message["source"] = {"kind": "compaction"}
        self._add(
            "user/message",
            {"turn": turn, "step": step, "message": message},
            surface_op=ReplaceOp(op="replace", start_seq=1, end_seq=3),
            source_event_seqs=[1, 2, 3],
        )
        return self._add("compaction/end", {"start_seq": 1, "end_seq": 3})


def _pending(call_id: str, step: int, call_seq: int | None = None) -> PendingCall:
    return PendingCall(
        call_id=call_id, name=f"tool_{call_id}", arguments=f'{{"c":"{call_id}"}}', step=step, call_seq=call_seq
    )


def test_no_turn_or_a_closed_turn_plans_nothing() -> None:
    assert plan_continuation([]) is None
    assert plan_continuation(Log().user(0, 0).events) is None
    log = Log().turn_start(1).step_start(1, 1).user(1, 1).assistant(1, 1).step_end(1, 1).turn_end(1)
    assert plan_continuation(log.events) is None


def test_a_turn_with_no_step_started() -> None:
    plan = plan_continuation(Log().turn_start(3).events)
    assert plan is not None
    assert (plan.turn, plan.step, plan.step_open, plan.attempt, plan.lost_model_call) == (3, 0, False, 2, False)
    assert plan.marker() == {"turn": 3, "step": 0, "attempt": 2, "lost_model_call": False}
    assert (plan.started, plan.unstarted, plan.last_finish) == ((), (), None)


def test_a_step_open_before_its_reply_lost_its_model_call() -> None:
    log = Log().turn_start(1).step_start(1, 1).user(1, 1).assistant(1, 1, "a").tool_call(1, 1, "a")
    log.tool_result(1, 1, "a").step_end(1, 1).step_start(1, 2)
    plan = plan_continuation(log.events)
    assert plan is not None
    assert (plan.step, plan.step_open, plan.lost_model_call, plan.attempt) == (2, True, True, 2)
    assert plan.marker() == {"turn": 1, "step": 2, "attempt": 2, "lost_model_call": True}
    assert (plan.started, plan.unstarted) == ((), ())


def test_a_step_open_after_its_reply_with_calls_started_unstarted_and_answered() -> None:
    log = Log().turn_start(1).step_start(1, 1).user(1, 1).assistant(1, 1, "a", "b", "c", "d")
    log.tool_call(1, 1, "a").tool_call(1, 1, "b").tool_result(1, 1, "a")
    plan = plan_continuation(log.events)
    assert plan is not None
    assert (plan.step, plan.step_open, plan.lost_model_call, plan.last_finish) == (1, True, False, "tool-calls")
    assert plan.started == (_pending("b", 1, 5),)
    assert plan.unstarted == (_pending("c", 1), _pending("d", 1))


def test_a_step_open_after_its_reply_with_every_call_answered() -> None:
    log = Log().turn_start(1).step_start(1, 1).user(1, 1).assistant(1, 1, "a").tool_call(1, 1, "a")
    log.tool_result(1, 1, "a")
    plan = plan_continuation(log.events)
    assert plan is not None
    assert (plan.step_open, plan.lost_model_call, plan.started, plan.unstarted) == (True, False, (), ())
    assert plan.last_finish == "tool-calls"


def test_no_step_open_after_a_step_ended_names_that_step() -> None:
    log = Log().turn_start(2).step_start(2, 1).user(2, 1).assistant(2, 1, "a").tool_call(2, 1, "a")
    log.tool_result(2, 1, "a").step_end(2, 1)
    plan = plan_continuation(log.events)
    assert plan is not None
    assert (plan.turn, plan.step, plan.step_open, plan.lost_model_call, plan.last_finish) == (
        2,
        1,
        False,
        False,
        "tool-calls",
    )


def test_a_repeated_continuation_counts_its_attempts() -> None:
    log = Log().turn_start(1).step_start(1, 1).user(1, 1).cont(1, 1, 2, True)
    plan = plan_continuation(log.events)
    assert plan is not None
    assert (plan.attempt, plan.lost_model_call) == (3, True)
    # The re-issued call answered (attempt 3's reply), then its tool call was cut again.
    log.cont(1, 1, 3, True).assistant(1, 1, "x").tool_call(1, 1, "x")
    plan = plan_continuation(log.events)
    assert plan is not None
    assert (plan.attempt, plan.lost_model_call, plan.started) == (4, False, (_pending("x", 1, 6),))


def test_only_the_last_turn_counts() -> None:
    log = Log().turn_start(1).step_start(1, 1).user(1, 1).cont(1, 1, 2, True).assistant(1, 1).step_end(1, 1)
    log.turn_end(1).turn_start(2).step_start(2, 1).user(2, 1)
    plan = plan_continuation(log.events)
    assert plan is not None
    assert (plan.turn, plan.attempt, plan.lost_model_call) == (2, 2, True)


def test_compaction_mid_turn_changes_nothing() -> None:
    log = Log().turn_start(1).step_start(1, 1).user(1, 1).assistant(1, 1, "a").tool_call(1, 1, "a")
    log.tool_result(1, 1, "a").step_end(1, 1).compaction(1, 2).step_start(1, 2).user(1, 2)
    plan = plan_continuation(log.events)
    assert plan is not None
    assert (plan.step, plan.step_open, plan.lost_model_call, plan.started, plan.unstarted) == (2, True, True, (), ())


def test_the_turns_catalog_by_call_id() -> None:
    log = Log().turn_start(1).step_start(1, 1).user(1, 1).assistant(1, 1, "s1", "s2")
    log.tool_call(1, 1, "s1").tool_call(1, 1, "s2").catalog("kid-1", "continuable", "s1")
    plan = plan_continuation(log.events)
    assert plan is not None
    assert set(plan.catalog) == {"s1"}
    assert (plan.catalog["s1"].child_id, plan.catalog["s1"].mode, plan.unkeyed_catalog) == (
        "kid-1",
        "continuable",
        False,
    )
    log.catalog("kid-2", "one-shot", None)
    plan = plan_continuation(log.events)
    assert plan is not None and plan.unkeyed_catalog


def test_an_earlier_turns_catalog_is_not_read() -> None:
    log = Log().turn_start(1).catalog("old", "continuable", None).turn_end(1).turn_start(2)
    plan = plan_continuation(log.events)
    assert plan is not None
    assert (plan.catalog, plan.unkeyed_catalog) == ({}, False)


def _raw(seq: int, type_: str, data: dict[str, Any]) -> Event:
    """An envelope-valid event whose payload `make_event` would refuse (as a damaged log holds)."""
    return decode_event(json.dumps({"seq": seq, "type": type_, "time": T, "data": data}).encode())


@pytest.mark.parametrize(
    ("type_", "data"),
    [
        ("turn/continue", {"turn": 1, "step": 1, "attempt": 1, "lost_model_call": True}),
        ("turn/continue", {"turn": 1, "step": 1, "attempt": 2}),
        ("subagent/catalog", {"version": 1, "child_id": "k", "child_created_at": T, "mode": "x"}),
        ("tool/call", {"turn": 1, "step": 1, "name": "n", "arguments": "{}"}),
        ("tool/call", {"turn": 1, "step": "1", "call_id": "c", "name": "n", "arguments": "{}"}),
    ],
    ids=["attempt-below-2", "no-lost-model-call", "catalog-bad-mode", "tool-call-no-call-id", "tool-call-string-step"],
)
def test_a_malformed_payload_is_invalid_payload(type_: str, data: dict[str, Any]) -> None:
    log = Log().turn_start(1).step_start(1, 1)
    with pytest.raises(InvalidPayload) as info:
        plan_continuation([*log.events, _raw(2, type_, data)], session_id="s-1")
    assert (info.value.code, info.value.seq, info.value.session_id) == ("STORAGE_INVALID_PAYLOAD", 2, "s-1")
