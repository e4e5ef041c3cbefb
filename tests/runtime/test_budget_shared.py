"""The budget limits issue 30 left per session, now shared down the tree or counted
(runtime/agent/tree_ledger.py): a descendant's turns are charged to every ancestor's
`max_turns`, and compaction's summary call is checked before it is sent and charged after, like
a step's call. Scripted models on real files, synchronised on the runtime's own waits."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from budget_trees import delegate as _delegate
from budget_trees import ends as _ends
from budget_trees import logs as _logs
from budget_trees import scripted as _model
from events import assistant_event
from log_lines import read_all
from subagents.runtime import Budget, ScenarioClock, open_runtime
from subagents.runtime.agent.compaction import CompactionPolicy
from subagents.runtime.agent.loop import AgentConfig
from subagents.runtime.agent.tree_ledger import OwnSpent, TreeLedger, own_spent, request_estimate
from subagents.runtime.foundation.budgets import spent_of
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.foundation.pricing import PriceTable
from subagents.runtime.models.base import Chunk, Finish, Model, ModelRequest, SessionBinding, Usage
from subagents.runtime.testing.scripted_model import ScriptedModel
from subagents.runtime.tools.base import FunctionTool, ToolContext
from subagents.runtime.usage import usage_of
from subagents.storage import FileLogStore
from wrapped_models import WrappedModel

Json = dict[str, Any]
T0 = 1_700_000_000_000


def _of(events: list[tuple[str, Json]], type_: str) -> list[Json]:
    return [d for t, d in events if t == type_]


# --- turns ----------------------------------------------------------------------------------------


async def test_a_descendants_turns_count_against_every_ancestors_max_turns(tmp_path: Path) -> None:
    """Root `max_turns` 4. Its first turn starts a worker (which gets the 3 turns left). The
    tree's turns: root 1, worker 1, root's notice 2 (3), worker 2 (4), root's notice 3 (5: the
    root's own 3 are within its limit, its tree's are not: refused before its model call, and
    then not counted: 4), worker 3 (5: within the worker's own 3, refused for the root's; 4
    again), root's notice 4 (5, refused). No model call is made for a refused turn."""
    model = _model(
        [
            {
                "session": "parent",
                "responses": [{"tool_calls": [_delegate("worker")]}, {"text": "started"}, {"text": "noted 1"}],
            },
            # Two answers only: a third call would fail the turn (script exhausted), not a budget.
            {"label": "worker", "responses": [{"text": "answer 1"}, {"text": "answer 2"}]},
        ]
    )
    async with open_runtime(
        tmp_path,
        model=model,
        clock=ScenarioClock(),
        id_factory=CountingIds("c"),
        compression="none",
        budget=Budget(max_turns=4),
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("go")
        await rt.subagents.wait_tree_idle(parent)
        for text in ("again", "a third time"):
            await rt.subagents.send_message(parent, "c-1", text)
            await rt.subagents.wait_tree_idle(parent)
    logs = _logs(tmp_path)
    worker, root = logs["c-1"], logs["parent"]
    assert _of(worker, "subagent/descriptor")[0]["budget"] == {"max_turns": 3}
    assert _ends(worker) == [
        {"kind": "completed"},
        {"kind": "completed"},
        {"kind": "budget", "message": "ancestor parent's max_turns 4 reached: 5 started (with its subagents')"},
    ]
    assert len(_of(worker, "assistant/message")) == 2
    assert _ends(root) == [
        {"kind": "completed"},
        {"kind": "completed"},
        {"kind": "budget", "message": "max_turns 4 reached: 5 started (with its subagents')"},
        {"kind": "budget", "message": "max_turns 4 reached: 5 started (with its subagents')"},
    ]
    assert len(_of(root, "assistant/message")) == 3  # delegate, started, noted 1


async def test_a_descendants_turns_before_a_restart_still_count_after_it(tmp_path: Path) -> None:
    """Root `max_turns` 5. First process: root 1, worker 1, root's notice 2 (3 turns). A new
    process resumes the root, which reads its worker's turn from the worker's `usage` row: worker
    2 (4), root's notice 3 (5), worker 3 (6: refused for the root, though within the worker's own
    4). Counting only what ran in the second process would have let it run."""
    options: dict[str, Any] = {"clock": ScenarioClock(), "compression": "none", "budget": Budget(max_turns=5)}
    first = _model(
        [
            {
                "session": "parent",
                "responses": [{"tool_calls": [_delegate("worker")]}, {"text": "started"}, {"text": "noted"}],
            },
            {"label": "worker", "responses": [{"text": "answer 1"}]},
        ]
    )
    async with open_runtime(tmp_path, model=first, id_factory=CountingIds("c"), **options) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("go")
        await rt.subagents.wait_tree_idle(parent)
    second = _model(
        [
            {"session": "parent", "responses": [{"text": "noted again"}] * 2},
            {"session": "c-1", "responses": [{"text": "answer 2"}, {"text": "never sent"}]},
        ]
    )
    async with open_runtime(tmp_path, model=second, **options) as rt:
        parent = await rt.agents.resume("parent")
        for text in ("again", "a third time"):
            await rt.subagents.send_message(parent, "c-1", text)
            await rt.subagents.wait_tree_idle(parent)
    worker = _logs(tmp_path)["c-1"]
    assert _of(worker, "subagent/descriptor")[0]["budget"] == {"max_turns": 4}
    assert _ends(worker) == [
        {"kind": "completed"},
        {"kind": "completed"},
        {"kind": "budget", "message": "ancestor parent's max_turns 5 reached: 6 started (with its subagents')"},
    ]


def test_the_ledger_charges_turns_to_ancestors_and_reserves_them() -> None:
    ledger = TreeLedger(prices=PriceTable())

    async def join_all() -> None:
        await ledger.join("root", None, Budget(max_turns=10), OwnSpent(turns=2))

    trio.run(join_all)
    assert ledger.remainder("root") == Budget(max_turns=8)
    ledger.start_child("root", "a", Budget(max_turns=5))
    ledger.turn_started("a")
    # The root's remainder less a's unused reservation (5 - 1) while a is open.
    assert ledger.remainder("root") == Budget(max_turns=10 - 3 - 4)
    assert ledger.remainder("a") == Budget(max_turns=4)
    ledger.settled("a")  # its unused turns return
    assert ledger.remainder("root") == Budget(max_turns=7)
    for _ in range(4):
        ledger.turn_started("a")
    assert ledger.refusal("a", 0, None, first_call=True) is None  # a: 5 of 5; root: 7 of 10
    ledger.turn_started("a")
    assert ledger.refusal("a", 0, None, first_call=True) == "max_turns 5 reached: 6 started (with its subagents')"
    assert ledger.refusal("a", 0, None) is None  # a later step of the turn: turns are not checked
    for _ in range(3):
        ledger.turn_started("root")
    assert ledger.refusal("root", 0, None, first_call=True) == "max_turns 10 reached: 11 started (with its subagents')"


def test_own_turns_are_recounted_from_the_log_for_the_ledger() -> None:
    from subagents.storage import Event

    def event(seq: int, type_: str, data: Json) -> Event:
        return Event(seq=seq, type=type_, time=1, data=msgspec.Raw(msgspec.json.encode(data)))

    events = [
        event(0, "turn/start", {"turn": 1, "trigger": {"kind": "message"}}),  # inherited: not its own
        event(1, "turn/start", {"turn": 1, "trigger": {"kind": "message"}}),
        event(2, "compaction/summary", {"text": "s", "usage": {"input_tokens": 30, "output_tokens": 5}}),
        event(3, "turn/start", {"turn": 2, "trigger": {"kind": "message"}}),
    ]
    own = own_spent(events, 1, PriceTable())
    assert (own.turns, own.tokens) == (2, 35)
    assert spent_of(events, 1).tokens == 35


def test_the_usage_unit_counts_own_turns_for_a_seed_and_ignores_a_tampered_count() -> None:
    from subagents.runtime.usage import USAGE_UNIT
    from subagents.storage import Event, SessionHeader

    def event(seq: int, type_: str, data: Json) -> Event:
        return Event(seq=seq, type=type_, time=1, data=msgspec.Raw(msgspec.json.encode(data)))

    start = {"turn": 1, "trigger": {"kind": "message"}}
    events = [event(0, "turn/start", start), event(1, "turn/start", start), event(2, "turn/start", start)]
    header = SessionHeader(id="s", created_at=1)
    state = USAGE_UNIT.fold(USAGE_UNIT.initial(header, 1), events)  # the first is inherited
    assert state["turns"] == 2 and USAGE_UNIT.view(state)["turns"] == 2
    one_by_one = USAGE_UNIT.initial(header, 1)
    for each in events:
        one_by_one = USAGE_UNIT.apply(one_by_one, each)
    assert one_by_one == state
    assert "turns" not in USAGE_UNIT.view({**state, "turns": "many"})
    assert USAGE_UNIT.fold({**state, "turns": -3}, events[2:])["turns"] == 1  # counted again from 0


async def test_a_turn_refused_before_its_first_call_is_not_counted_live_cold_or_in_show(
    tmp_path: Path, capsys: Any
) -> None:
    """Root `max_turns` 4, its worker 3. First process: root 1, worker 1, root's notice 2,
    worker 2, then the root's notice 3 and the worker's 3 and the root's 4 are refused before
    their first call: none counts (each refusal says 5 started, the tree's 4 and its own). A new
    process resumes them from the logs (the root's own turns from its log, the worker's from
    its `usage` row): the tree has 4 again, so the worker's next turn is refused for the root's
    limit at 5 — within its own 3 (2 counted), which it would have crossed had its refused turn
    counted. `show` marks the refused turns."""
    from subagents.runtime.hosts.cli import main
    from subagents.runtime.usage import USAGE_UNIT
    from subagents.storage import SessionHeader

    options: dict[str, Any] = {"clock": ScenarioClock(), "compression": "none", "budget": Budget(max_turns=4)}
    first = _model(
        [
            {
                "session": "parent",
                "responses": [{"tool_calls": [_delegate("worker")]}, {"text": "started"}, {"text": "noted"}],
            },
            {"label": "worker", "responses": [{"text": "answer 1"}, {"text": "answer 2"}]},
        ]
    )
    refused_at_5 = "ancestor parent's max_turns 4 reached: 5 started (with its subagents')"
    async with open_runtime(tmp_path, model=first, id_factory=CountingIds("c"), **options) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("go")
        await rt.subagents.wait_tree_idle(parent)
        for text in ("again", "a third time"):
            await rt.subagents.send_message(parent, "c-1", text)
            await rt.subagents.wait_tree_idle(parent)
    logs = _logs(tmp_path)
    assert _ends(logs["c-1"])[-1] == {"kind": "budget", "message": refused_at_5}
    assert (
        _ends(logs["parent"])[-2:]
        == [{"kind": "budget", "message": "max_turns 4 reached: 5 started (with its subagents')"}] * 2
    )
    # Recounted from the logs as the next process will: the refused turns are not counted.
    store = FileLogStore(str(tmp_path), compression="none")
    try:
        raw = {sid: read_all(store, sid) for sid in ("parent", "c-1")}
    finally:
        store.close_store()
    for sid, turns in (("parent", 2), ("c-1", 2)):
        assert len([e for e in raw[sid] if e.type == "turn/start"]) == turns + (2 if sid == "parent" else 1)
        assert spent_of(raw[sid], 0).turns == own_spent(raw[sid], 0, PriceTable()).turns == turns
        state = USAGE_UNIT.fold(USAGE_UNIT.initial(SessionHeader(id=sid, created_at=1), 0), raw[sid])
        assert USAGE_UNIT.view(state)["turns"] == turns and "bare" not in state
    second = _model([{"session": "c-1", "responses": [{"text": "never sent"}]}])
    async with open_runtime(tmp_path, model=second, **options) as rt:
        parent = await rt.agents.resume("parent")
        await rt.subagents.send_message(parent, "c-1", "once more")
        await rt.subagents.wait_tree_idle(parent)
    worker = _logs(tmp_path)["c-1"]
    assert _ends(worker)[-1] == {"kind": "budget", "message": refused_at_5}
    assert len(_of(worker, "assistant/message")) == 2
    # `show` (a CLI command runs its own Trio loop: in a thread here).
    assert await trio.to_thread.run_sync(main, ["show", "parent", "--json", "--root", str(tmp_path)]) == 0
    entries = json.loads(capsys.readouterr().out)
    ends = [(e["turn"], e.get("counted", True)) for e in entries if e["type"] == "turn/end"]
    assert ends == [(1, True), (2, True), (3, False), (4, False), (5, False)]
    assert await trio.to_thread.run_sync(main, ["show", "parent", "--root", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "── end of turn 2: completed\n" in text
    assert (
        "── end of turn 3: budget max_turns 4 reached: 5 started (with its subagents') "
        "(no model call: not counted as started)\n" in text
    )


def test_every_count_of_turns_leaves_out_a_turn_a_budget_ended_before_any_call() -> None:
    """One predicate (budgets.py `turn_counted`), the same count wherever turns are counted
    from a log: `spent_of`, `own_spent`, the `usage` unit folded at once or an event at a time
    (a turn's start and its end in different batches: `bare` carries over)."""
    from subagents.runtime.foundation.budgets import TurnCount, count_turns
    from subagents.runtime.usage import USAGE_UNIT
    from subagents.storage import Event, SessionHeader

    def event(seq: int, type_: str, data: Json) -> Event:
        return Event(seq=seq, type=type_, time=1, data=msgspec.Raw(msgspec.json.encode(data)))

    def start(turn: int) -> Json:
        return {"turn": turn, "trigger": {"kind": "message"}}

    def end(turn: int, kind: str) -> Json:
        return {"turn": turn, "reason": {"kind": kind, "message": "max_turns 1 reached"}}

    events = [
        event(0, "turn/start", start(1)),  # inherited: not its own
        event(1, "turn/start", start(1)),  # refused before its first call: not counted
        event(2, "step/start", {"turn": 1, "step": 1}),
        event(3, "step/end", {"turn": 1, "step": 1}),
        event(4, "turn/end", end(1, "budget")),
        event(5, "turn/start", start(2)),  # a call, then a budget: counted
        assistant_event(6, 1, turn=2, usage=(3, 1)),
        event(7, "turn/end", end(2, "budget")),
        event(8, "turn/start", start(3)),  # its call lost to a crash was sent: counted
        event(9, "turn/continue", {"turn": 3, "step": 1, "attempt": 2, "lost_model_call": True}),
        event(10, "turn/end", end(3, "budget")),
        event(11, "turn/start", start(4)),  # continued without a lost call, then refused
        event(12, "turn/continue", {"turn": 4, "step": 0, "attempt": 2, "lost_model_call": False}),
        event(13, "turn/end", end(4, "budget")),
        event(14, "turn/start", start(5)),  # no call, another end: counted
        event(15, "turn/end", end(5, "error")),
        event(16, "turn/start", start(6)),  # open, no call yet: counted for now
    ]
    assert count_turns(events, 1) == TurnCount(turns=4, bare=True)
    assert count_turns(events[:5], 1) == TurnCount(turns=0, bare=False)
    assert count_turns(events[2:], 1, count_turns(events[:2], 1)) == TurnCount(turns=4, bare=True)
    assert spent_of(events, 1).turns == own_spent(events, 1, PriceTable()).turns == 4
    header = SessionHeader(id="s", created_at=1)
    at_once = USAGE_UNIT.fold(USAGE_UNIT.initial(header, 1), events)
    assert (at_once["turns"], at_once["bare"]) == (4, True) and "bare" not in USAGE_UNIT.view(at_once)
    one_by_one = USAGE_UNIT.initial(header, 1)
    for each in events:
        one_by_one = USAGE_UNIT.apply(one_by_one, each)
    assert one_by_one == at_once
    assert USAGE_UNIT.state_version == 4  # rows of version 3 counted refused turns: not read


@pytest.mark.parametrize("lost_call", [False, True])
async def test_a_continued_turn_refused_counts_only_if_a_call_was_sent_before_the_crash(
    tmp_path: Path, lost_call: bool
) -> None:
    """A crash left turn 1 open; the resume continues it under `max_turns` 0, which refuses its
    next call. Had its step's call been sent before the crash (a lost call: issued again, so
    refused now) the turn counts; if no step had started, nothing was ever sent and it does
    not — as the log recounts it after."""
    from log_lines import header_line, json_line, new_log_file

    start = {"turn": 1, "trigger": {"kind": "message"}}
    lines = [json_line(0, "turn/start", start, time=T0)]
    if lost_call:
        user = {"id": "msg-1", "role": "user", "content": [{"type": "text", "text": "go"}], "source": {"kind": "user"}}
        lines.append(json_line(1, "step/start", {"turn": 1, "step": 1}, time=T0))
        lines.append(
            json_line(2, "user/message", {"turn": 1, "step": 1, "message": user}, time=T0, surface_op="append")
        )
    new_log_file(tmp_path, "s", "none").write_bytes(header_line("s", created_at=T0) + b"".join(lines))
    async with open_runtime(
        tmp_path,
        model=_model([{"responses": [{"text": "never sent"}]}]),
        clock=ScenarioClock(),
        compression="none",
        budget=Budget(max_turns=0),
    ) as rt:
        agent = await rt.agents.resume("s")
        result = await agent.wait_idle()
        assert agent.spent.turns == (1 if lost_call else 0)  # live, as the log recounts it below
    assert result is not None and result.reason == {"kind": "budget", "message": "max_turns 0 reached"}
    store = FileLogStore(str(tmp_path), compression="none")
    try:
        events = read_all(store, "s")
    finally:
        store.close_store()
    assert [e.type for e in events][-2:] == (["step/end", "turn/end"] if lost_call else ["turn/continue", "turn/end"])
    assert spent_of(events, 0).turns == own_spent(events, 0, PriceTable()).turns == (1 if lost_call else 0)


# --- compaction -----------------------------------------------------------------------------------


class SummaryUsage(WrappedModel):
    """A scripted model whose compaction summaries report `usage` (input, output), as a
    provider's would; it keeps the purposes of the calls made."""

    def __init__(self, inner: ScriptedModel, usage: tuple[int, int]) -> None:
        self.inner = inner
        self.usage = usage
        self.purposes: list[str] = []
        self.estimates: list[int] = []  # each call's size as the budget check estimates it

    def answer(self, session: SessionBinding, inner: Model, request: ModelRequest) -> AsyncIterator[Chunk]:
        self.purposes.append(request.purpose)
        self.estimates.append(request_estimate(request.messages))
        return self._play(inner, request)

    async def _play(self, inner: Model, request: ModelRequest) -> AsyncIterator[Chunk]:
        async for chunk in inner.stream(request):
            if isinstance(chunk, Finish) and request.purpose == "compaction":
                yield Usage(*self.usage)
            yield chunk


async def _echo(args: Json, ctx: ToolContext) -> str:
    return f"echo {json.dumps(args, sort_keys=True)}"


ECHO = FunctionTool(name="echo", description="the echo tool", fn=_echo)


def _compacting(summary_usage: tuple[int, int]) -> SummaryUsage:
    call = {
        "tool_calls": [{"name": "echo", "arguments": {"q": "alpha " * 20}}],
        "usage": {"input_tokens": 100, "output_tokens": 0},
    }
    script = _model(
        [
            {
                "session": "a",
                "responses": [call, call, {"text": "done", "usage": {"input_tokens": 10, "output_tokens": 0}}],
            }
        ],
        summaries=["They echoed alpha."],
    )
    return SummaryUsage(script, summary_usage)


async def _run_compacting(
    tmp_path: Path, model: SummaryUsage, budget: Budget, *, compacting: bool = True
) -> list[tuple[str, Json]]:
    config = AgentConfig(compaction=CompactionPolicy(max_chars=10, keep_recent=2) if compacting else None)
    async with open_runtime(
        tmp_path,
        model=model,
        clock=ScenarioClock(),
        compression="none",
        tools=lambda: [ECHO],
        agent_config=config,
        budget=budget,
    ) as rt:
        agent = await rt.agents.create(session_id="a")
        await agent.send("echo some")
        await agent.wait_idle()
    return _logs(tmp_path)["a"]


async def test_a_compaction_call_is_charged_and_the_next_call_checked_with_it(tmp_path: Path) -> None:
    """Two steps of 100 tokens, then a summary call of 800: the tree has 1000 of its 1000, so
    the step after the compaction is refused (the summary's tokens counted like a step's)."""
    model = _compacting((700, 100))
    events = await _run_compacting(tmp_path, model, Budget(max_tokens=1000))
    (summary,) = _of(events, "compaction/summary")
    assert summary == {"text": "They echoed alpha.", "usage": {"input_tokens": 700, "output_tokens": 100}}
    assert _ends(events) == [{"kind": "budget", "message": "max_tokens 1000 reached: 1000 used"}]
    assert model.purposes == ["turn", "turn", "compaction"]
    # Counted like a model call wherever usage is read (show, sessions, the ledger's resume).
    store = FileLogStore(str(tmp_path), compression="none")
    try:
        raw = read_all(store, "a")
    finally:
        store.close_store()
    _turns, total = usage_of(raw)
    assert (total.input_tokens, total.output_tokens, total.calls) == (900, 100, 3)
    assert own_spent(raw, 0, PriceTable()).tokens == spent_of(raw, 0).tokens == 1000


async def test_a_compaction_call_that_would_cross_the_budget_is_not_sent(tmp_path: Path) -> None:
    """Two steps of 100 tokens, and one token less left than the summary call's estimate: it
    is not sent and the turn ends with the budget's message."""
    probe = _compacting((1, 0))
    await _run_compacting(tmp_path / "probe", probe, Budget(max_tokens=100_000))
    summary_size = probe.estimates[2]
    model = _compacting((700, 100))
    limit = 200 + summary_size - 1
    events = await _run_compacting(tmp_path / "refused", model, Budget(max_tokens=limit))
    assert model.purposes == ["turn", "turn"]
    assert not _of(events, "compaction/start") and not _of(events, "compaction/summary")
    (end,) = _ends(events)
    assert end["kind"] == "budget"
    assert end["message"] == f"max_tokens {limit} would be crossed: 200 used, this call ~{summary_size}"


async def test_compaction_lets_a_step_fit_that_would_not_fit_uncompacted(tmp_path: Path) -> None:
    """The summary call is checked on its own before the step's: a surface too large for the
    remainder is compacted first, and the smaller call that follows fits."""
    probe = _compacting((1, 0))
    events = await _run_compacting(tmp_path / "probe", probe, Budget(max_tokens=100_000))
    assert _ends(events) == [{"kind": "completed"}]
    assert probe.purposes == ["turn", "turn", "compaction", "turn"]
    _first, _second, summary_size, compacted_size = probe.estimates
    whole = _compacting((1, 0))
    await _run_compacting(tmp_path / "whole", whole, Budget(max_tokens=100_000), compacting=False)
    uncompacted_size = whole.estimates[2]
    # Room for the summary call and the compacted step after it, not for the uncompacted step.
    limit = 200 + max(summary_size, 1 + compacted_size)
    assert 200 + uncompacted_size > limit
    uncompacted = _compacting((1, 0))
    events = await _run_compacting(tmp_path / "refused", uncompacted, Budget(max_tokens=limit), compacting=False)
    assert uncompacted.purposes == ["turn", "turn"] and _ends(events)[0]["kind"] == "budget"
    model = _compacting((1, 0))
    events = await _run_compacting(tmp_path / "tight", model, Budget(max_tokens=limit))
    assert _ends(events) == [{"kind": "completed"}], (limit, probe.estimates, model.estimates, whole.estimates)
    assert model.purposes == ["turn", "turn", "compaction", "turn"]
