"""Budgets shared down the tree (issue 30 item 4; runtime/agent/tree_ledger.py): a child's
spending is charged to every ancestor, a model call is refused before it is sent when its
estimated size would cross any ancestor's remainder, a new child's budget is reserved out of its
parent's remainder (less what its open siblings hold), and `max_descendants` bounds the tree.
Scripted models on real files, synchronised on the runtime's own waits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from budget_trees import delegate as _delegate
from budget_trees import ends as _ends
from budget_trees import label_of as _label
from budget_trees import logs as _logs
from budget_trees import scripted as _model
from budget_trees import usage as _usage
from subagents.runtime import Budget, ScenarioClock, open_runtime
from subagents.runtime.agent.tree_ledger import OwnSpent, Seeded, TreeLedger
from subagents.runtime.delegation.agent_types import AgentType
from subagents.runtime.foundation.budgets import budget_json, parse_budget
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.foundation.pricing import Price, PriceTable
from subagents.runtime.models.specs import ModelRecord
from subagents.runtime.testing.scripted_model import ScriptedModel

Json = dict[str, Any]


async def _run_tree(root: Path, model: ScriptedModel, **options: Any) -> None:
    """The root `parent` told "go" and run until its tree is idle, on a runtime with the
    scenario clock and counting ids (`c-1`, …), plain logs and `options` (its budget)."""
    async with open_runtime(
        root, model=model, clock=ScenarioClock(), id_factory=CountingIds("c"), compression="none", **options
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("go")
        await rt.subagents.wait_tree_idle(parent)


def _spent(events: list[tuple[str, Json]]) -> int:
    return sum(sum(d["usage"].values()) for t, d in events if t == "assistant/message" and "usage" in d)


def _worker(label: str, per_call: int) -> Json:
    """An agent that keeps working (a tool call per step) until a budget stops it."""
    call = {"tool_calls": [{"name": "list_agents", "arguments": {}}], "usage": _usage(per_call)}
    return {"label": label, "responses": [call] * 30 + [{"text": f"{label} done"}]}


async def test_children_that_together_would_exceed_the_root_stop_at_its_limit(tmp_path: Path) -> None:
    """Root 10,000 tokens; it spends 4,000 itself; L1 (its reservation: 9,000) starts L2a and L2b,
    which ask 5,000 each (L2b gets the 3,500 L1 has left beside L2a's reservation) and spend
    400 a call: together they would take the tree to 13,500. The root's limit stops them before
    it is crossed by more than one call (400), and the stop names it."""
    model = _model(
        [
            {
                "session": "parent",
                "responses": [
                    {"tool_calls": [_delegate("L1")], "usage": _usage(1000)},
                    {"text": "root started", "usage": _usage(3000)},
                    *[{"text": "root noted"}] * 4,
                ],
            },
            {
                "label": "L1",
                "responses": [
                    {
                        "tool_calls": [_delegate("L2a", max_tokens=5000), _delegate("L2b", max_tokens=5000)],
                        "usage": _usage(500),
                    },
                    {"text": "L1 started", "usage": _usage(500)},
                    *[{"text": "L1 noted"}] * 4,
                ],
            },
            _worker("L2a", 400),
            _worker("L2b", 400),
        ]
    )
    await _run_tree(tmp_path, model, budget=Budget(max_tokens=10_000), max_depth=2)
    logs = _logs(tmp_path)
    by_label = {_label(events) or sid: events for sid, events in logs.items()}
    assert set(by_label) == {"parent", "L1", "L2a", "L2b"}
    budgets = {
        label: d.get("budget") for label, events in by_label.items() for t, d in events if t == "subagent/descriptor"
    }
    # Reservations: L1 got what the root had left; L2b what L1 had left beside L2a's reservation.
    assert budgets["L1"] == {"max_tokens": 9000}
    assert budgets["L2a"] == {"max_tokens": 5000}
    assert budgets["L2b"] == {"max_tokens": 3500}
    asked = 4000 + 1000 + 5000 + 3500
    assert asked > 10_000  # what the tree would spend unshared
    total = sum(_spent(events) for events in logs.values())
    assert 9000 <= total <= 10_000 + 400, total  # stopped at the root's limit, at most one call over
    reasons = [r for events in logs.values() for r in _ends(events)]
    stops = [r["message"] for r in reasons if r["kind"] == "budget"]
    assert any(m.startswith("ancestor parent's max_tokens 10000") for m in stops), stops
    # The parent is told its children ran out, as before.
    l1_texts = [
        b["text"]
        for t, d in by_label["L1"]
        if t == "user/message" and d["message"]["source"]["kind"] == "subagent-settled"
        for b in d["message"]["content"]
        if b["type"] == "text"
    ]
    assert any("ran out of its budget before it finished (ancestor parent's max_tokens 10000" in t for t in l1_texts)


async def test_max_descendants_refuses_a_child_past_the_limit(tmp_path: Path) -> None:
    model = _model(
        [
            {
                "session": "parent",
                "responses": [
                    {"tool_calls": [_delegate("one"), _delegate("two")]},
                    {"text": "done"},
                    *[{"text": "noted"}] * 3,
                ],
            },
            {"label": "one", "responses": [{"text": "one done"}]},
            {"label": "two", "responses": [{"text": "two done"}]},
        ]
    )
    await _run_tree(tmp_path, model, budget=Budget(max_descendants=1))
    logs = _logs(tmp_path)
    assert len(logs) == 2  # the root and one child
    results = [
        b["content"][0]["text"] for t, d in logs["parent"] if t == "tool/result" for b in d["message"]["content"]
    ]
    assert any("no subagent started: max_descendants 1 reached: 1 started" in r for r in results), results


def test_the_ledger_charges_ancestors_reserves_and_returns() -> None:
    """The arithmetic, without a runtime: a table of joins, charges, starts and settlements."""
    ledger = TreeLedger(prices=PriceTable({"m": Price(input=1.0, output=2.0, cache_read=0.1, cache_write=1.25)}))

    async def join(sid: str, parent: str | None, budget: Budget | None) -> None:
        await ledger.join(sid, parent, budget, OwnSpent())

    import trio

    trio.run(join, "root", None, Budget(max_tokens=1000, max_cost=1.0))
    ledger.start_child("root", "a", Budget(max_tokens=600))
    trio.run(join, "a", "root", Budget(max_tokens=600))
    assert ledger.remainder("root") == Budget(max_tokens=400, max_cost=1.0)  # a holds 600
    ledger.charge("a", {"input_tokens": 200, "output_tokens": 100}, "m")
    spent = ledger.spent("root")
    assert spent is not None and (spent.tokens, spent.descendants) == (300, 1)
    assert spent.cost == pytest.approx(0.0004)  # 200 in at 1.0, 100 out at 2.0 per million
    left = ledger.remainder("root")
    assert left is not None and left.max_tokens == 400 and left.max_cost == pytest.approx(1.0 - 0.0004)
    ledger.settled("a")  # its unused 300 returns
    assert ledger.remainder("root").max_tokens == 700
    assert ledger.refusal("a", 50, "m") is None
    assert ledger.refusal("a", 301, "m") == "max_tokens 600 would be crossed: 300 used, this call ~301"
    trio.run(join, "b", "root", None)  # no budget of its own: only its ancestors' limits
    assert ledger.refusal("b", 701, "m") == "ancestor root's max_tokens 1000 would be crossed: 300 used, this call ~701"
    assert ledger.refusal("b", 600, "m") is None  # sent: held in flight until charged
    assert (
        ledger.refusal("root", 101, "m") == "max_tokens 1000 would be crossed: 300 used, ~600 in flight, this call ~101"
    )
    ledger.charge("b", {"input_tokens": 0, "output_tokens": 0}, "m")  # landed: nothing in flight
    ledger.charge("a", {"input_tokens": 800, "output_tokens": 0}, "m")
    assert ledger.refusal("a", 1, "m") == "max_tokens 600 reached: 1100 used (500 over)"
    ledger.charge("root", {"input_tokens": 1}, "unpriced-model")
    assert ledger.refusal("root", 0, "m") == "max_tokens 1000 reached: 1101 used (101 over)"


def test_the_shared_limits_are_recorded_in_the_descriptor_strictly() -> None:
    budget = Budget(max_tokens=10, max_cost=1.5, max_descendants=2)
    assert budget_json(budget) == {"max_tokens": 10, "max_cost": 1.5, "max_descendants": 2}
    assert parse_budget(budget_json(budget)) == budget
    assert parse_budget({"max_cost": 2}) == Budget(max_cost=2)
    assert parse_budget({"max_cost": -1}) == 'field "max_cost" must be a number >= 0'
    assert parse_budget({"max_cost": "1"}) == 'field "max_cost" must be a number >= 0'
    assert parse_budget({"max_descendants": 1.5}) == 'field "max_descendants" must be an int >= 0'
    assert Budget(max_tokens=100, max_cost=2.0).clamped(Budget(max_cost=1.0, max_descendants=3)) == Budget(
        max_tokens=100, max_cost=1.0, max_descendants=3
    )
    with pytest.raises(ValueError, match="max_cost must be a finite number >= 0"):
        Budget(max_cost=float("inf"))


def _priced(model: ScriptedModel, spec: str) -> ScriptedModel:
    """The scripted model as if built from `spec` (its `session/model` record names it)."""
    setattr(model, "subagents_model_record", ModelRecord(model=spec))  # noqa: B010  # the builder's attribute
    return model


async def test_a_cost_budget_stops_the_tree_and_an_unpriced_model_is_refused(tmp_path: Path) -> None:
    """`max_cost` 0.01 at 10 per million tokens: the root spends 0.006, its child gets the 0.004
    left and spends 0.003 a call: it is stopped before its second, and the root's next call is
    refused with the tree's cost (0.009) counted."""
    model = _model(
        [
            {
                "session": "parent",
                "responses": [
                    {"tool_calls": [_delegate("worker")], "usage": _usage(600)},
                    {"text": "started"},
                    *[{"text": "noted"}] * 3,
                ],
            },
            _worker("worker", 300),
        ]
    )
    prices = PriceTable({"fake-model": Price(input=10.0, output=10.0, cache_read=1.0, cache_write=10.0)})
    async with open_runtime(
        tmp_path / "priced",
        model=_priced(model, "scripted:fake-model"),
        clock=ScenarioClock(),
        id_factory=CountingIds("c"),
        compression="none",
        budget=Budget(max_cost=0.01),
        prices=prices,
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("go")
        await rt.subagents.wait_tree_idle(parent)
    logs = _logs(tmp_path / "priced")
    total = sum(_spent(events) for events in logs.values())
    assert total * 10 / 1e6 <= 0.01  # the estimates held it under
    (budget,) = [d["budget"] for t, d in logs["c-1"] if t == "subagent/descriptor"]
    assert budget == {"max_cost": pytest.approx(0.004)}  # the root's remainder when it started
    (child_stop,) = _ends(logs["c-1"])
    assert child_stop["message"] == "max_cost $0.0040 would be crossed: $0.0030 used, this call ~$0.0022"
    # The root's own call for the notice: its tree's cost counted (its own 600 tokens cost 0.006).
    assert _ends(logs["parent"])[-1]["message"].startswith("max_cost $0.0100 would be crossed: $0.0090 used")

    # The same budget with no price for the model: no call is made at all.
    async with open_runtime(
        tmp_path / "unpriced",
        model=_model([{"session": "parent", "responses": [{"text": "never asked for"}]}]),
        clock=ScenarioClock(),
        compression="none",
        budget=Budget(max_cost=0.01),
        prices=prices,
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("go")
        await parent.wait_idle()
    (events,) = _logs(tmp_path / "unpriced").values()
    assert _ends(events) == [
        {"kind": "budget", "message": "max_cost $0.0100: cost unknown (no price for (none recorded))"}
    ]


async def test_a_child_resumed_without_its_ancestors_is_held_to_its_own_reservation(tmp_path: Path) -> None:
    """What a host that runs only the child (a serving host, a takeover) enforces: the budget its
    descriptor recorded — reserved out of its parent's remainder when it started — and its own
    spending read back from its log."""
    first = _model(
        [
            {
                "session": "parent",
                "responses": [
                    {"tool_calls": [_delegate("worker", max_tokens=1000)], "usage": _usage(100)},
                    {"text": "started"},
                    {"text": "noted"},
                ],
            },
            {"label": "worker", "responses": [{"text": "part one", "usage": _usage(600)}]},
        ]
    )
    options: dict[str, Any] = {"clock": ScenarioClock(), "id_factory": CountingIds("c"), "compression": "none"}
    async with open_runtime(tmp_path, model=first, budget=Budget(max_tokens=10_000), **options) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("go")
        await rt.subagents.wait_tree_idle(parent)
    second = _model([{"session": "c-1", "responses": [{"text": "part two", "usage": _usage(600)}, {"text": "never"}]}])
    async with open_runtime(tmp_path, model=second, **options) as rt:  # another host: no root budget, no parent
        child = await rt.agents.resume("c-1")
        await child.send("more")
        await child.wait_idle()
        await child.send("and more")
        await child.wait_idle()
    ends = _ends(_logs(tmp_path)["c-1"])
    assert ends == [
        {"kind": "completed"},
        {"kind": "completed"},  # 600 spent, read back from its log: one more call fits
        {"kind": "budget", "message": "max_tokens 1000 reached: 1200 used (200 over)"},
    ]


async def test_a_start_refused_after_its_reservation_gives_the_reservation_back(tmp_path: Path) -> None:
    """A `subagent` call refused after its budget was reserved (here: an agent type that selects
    a model this runtime cannot build) returns the reservation at once: the next child gets the
    whole remainder, not what the refused one would have left."""
    picky = AgentType(name="picky", description="wants its own model", prompt="p", model="openai:other")
    model = _model(
        [
            {
                "session": "parent",
                "responses": [
                    {"tool_calls": [_delegate("Bad", agent_type="picky")], "usage": _usage(1000)},
                    {"tool_calls": [_delegate("L1")], "usage": _usage(1000)},
                    {"text": "root started"},
                    *[{"text": "root noted"}] * 3,
                ],
            },
            {"label": "L1", "responses": [{"text": "L1 done", "usage": _usage(10)}]},
        ]
    )
    await _run_tree(tmp_path, model, budget=Budget(max_tokens=10_000), agent_types={"picky": picky})
    logs = _logs(tmp_path)
    refused = [d for t, d in logs["parent"] if t == "tool/result"][0]
    assert refused["message"]["content"][0]["is_error"] is True
    by_label = {_label(events) or sid: events for sid, events in logs.items()}
    (descriptor,) = [d for t, d in by_label["L1"] if t == "subagent/descriptor"]
    assert descriptor["budget"] == {"max_tokens": 8000}  # 10,000 less the root's two calls


# --- joining while the descendants are read -------------------------------------------------------


class HeldSeeder:
    """A seeder that answers what a test gives it, and holds its read open until released:
    what the ledger sees of a store read that awaits while the tree goes on running."""

    def __init__(self, seeds: dict[str, Seeded]) -> None:
        self.seeds = seeds
        self.reading = trio.Event()
        self.release = trio.Event()

    async def __call__(self, session_id: str) -> dict[str, Seeded]:
        self.reading.set()
        await self.release.wait()
        return self.seeds


def _totals(ledger: TreeLedger, sid: str) -> tuple[int, float | None, int, int]:
    spent = ledger.spent(sid)
    assert spent is not None
    return (spent.tokens, spent.cost, spent.descendants, spent.turns)


async def _join_while(ledger: TreeLedger, seeder: HeldSeeder, meanwhile: Any, own: OwnSpent) -> None:
    """`root` joins (budget shared, children started) and, while its seeder reads,
    `meanwhile()` runs: charges and joins of its descendants."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.join, "root", None, Budget(max_tokens=10_000, max_turns=50), own)
        await seeder.reading.wait()
        await meanwhile()
        seeder.release.set()


ROOT_OWN = OwnSpent(tokens=7, cost=0.0, parent=True, turns=2)


async def test_a_descendants_charge_during_the_seed_counts_once() -> None:
    """Root's tree: a (in the ledger, running, its child g started live) and d (only on disk,
    with its child e). While the root's seed reads, g is charged 100 tokens and starts a turn:
    the charge stops at a (the root is not in the ledger yet). The read saw none of it. The
    root's totals are exact: a brings its ledger totals (g's charge included), d and e what the
    read found. Adding the read's totals to the root, as the ledger did, missed g's 100."""
    seeder = HeldSeeder(
        {
            "a": Seeded("root", OwnSpent(tokens=10, turns=1)),
            "g": Seeded("a", OwnSpent()),  # the read: nothing yet
            "d": Seeded("root", OwnSpent(tokens=20, turns=1)),
            "e": Seeded("d", OwnSpent(tokens=3, turns=1)),
        }
    )
    ledger = TreeLedger(prices=PriceTable(), seeder=seeder)
    await ledger.join("a", "root", Budget(max_tokens=500), OwnSpent(tokens=10, turns=1))
    ledger.start_child("a", "g", Budget(max_tokens=400))
    await ledger.join("g", "a", Budget(max_tokens=400), OwnSpent())

    async def meanwhile() -> None:
        ledger.turn_started("g")
        ledger.charge("g", _usage(100), None)

    await _join_while(ledger, seeder, meanwhile, ROOT_OWN)
    assert _totals(ledger, "a") == (110, None, 1, 2)
    assert _totals(ledger, "root") == (7 + 110 + 20 + 3, None, 4, 2 + 2 + 2)
    ledger.charge("g", _usage(5), None)  # from now on charged all the way up
    assert _totals(ledger, "root")[0] == 145


async def test_a_charge_the_seed_read_saw_too_counts_once() -> None:
    """The same charge, but the read saw it (the store had it): counted once, not twice."""
    seeder = HeldSeeder({"a": Seeded("root", OwnSpent(tokens=60, turns=1))})
    ledger = TreeLedger(prices=PriceTable(), seeder=seeder)
    await ledger.join("a", "root", Budget(max_tokens=500), OwnSpent(tokens=10, turns=1))

    async def meanwhile() -> None:
        ledger.charge("a", _usage(50), None)

    await _join_while(ledger, seeder, meanwhile, ROOT_OWN)
    assert _totals(ledger, "root") == (7 + 60, None, 1, 3)


async def test_a_descendant_that_joins_during_the_seed_counts_once() -> None:
    """a is not in the ledger when the root's read starts; it joins (from its log: 10 tokens,
    one turn) and is charged 50 while the read is open, which found a's 10. The root counts
    a's ledger totals: 60, once."""
    seeder = HeldSeeder({"a": Seeded("root", OwnSpent(tokens=10, turns=1))})
    ledger = TreeLedger(prices=PriceTable(), seeder=seeder)

    async def meanwhile() -> None:
        await ledger.join("a", "root", Budget(max_tokens=500), OwnSpent(tokens=10, turns=1))
        ledger.turn_started("a")
        ledger.charge("a", _usage(50), None)

    await _join_while(ledger, seeder, meanwhile, ROOT_OWN)
    assert _totals(ledger, "root") == (7 + 60, None, 1, 2 + 2)


async def test_an_unseeded_descendant_is_completed_by_the_join_above_it() -> None:
    """a joined without a shared budget while it had a child already (g, on disk only: 30
    tokens), so its totals lacked g's; charged 5 while the root's read is open. The root
    counts a's own spending as the ledger has it (10 + 5) and g's as read, and a's totals are
    its whole tree's from then on."""
    seeder = HeldSeeder(
        {"a": Seeded("root", OwnSpent(tokens=10, turns=1)), "g": Seeded("a", OwnSpent(tokens=30, turns=1))}
    )
    ledger = TreeLedger(prices=PriceTable(), seeder=seeder)
    await ledger.join("a", "root", None, OwnSpent(tokens=10, turns=1, parent=True))
    assert _totals(ledger, "a") == (10, 0.0, 0, 1)

    async def meanwhile() -> None:
        ledger.charge("a", _usage(5), None)

    await _join_while(ledger, seeder, meanwhile, ROOT_OWN)
    assert _totals(ledger, "a") == (45, None, 1, 2)
    assert _totals(ledger, "root") == (7 + 45, None, 2, 2 + 2)


def test_calls_in_flight_are_checked_against_a_cost_limit_too() -> None:
    """Two calls of one tree sent at once: each fits `max_cost` alone, not both — the second is
    refused, as it would be under `max_tokens` (the first's estimate is held in flight, priced
    at the second call's model)."""
    ledger = TreeLedger(prices=PriceTable({"m": Price(input=1_000_000.0, output=0.0, cache_read=0.0, cache_write=0.0)}))
    trio.run(ledger.join, "root", None, Budget(max_cost=10.0), OwnSpent())
    trio.run(ledger.join, "a", "root", None, OwnSpent())
    trio.run(ledger.join, "b", "root", None, OwnSpent())
    assert ledger.refusal("a", 6, "m") is None  # $6 of $10: sent, held in flight
    assert ledger.refusal("b", 6, "m") == (
        "ancestor root's max_cost $10.00 would be crossed: $0.0000 used, ~$6.00 in flight, this call ~$6.00"
    )
    ledger.charge("a", {"input_tokens": 1}, "m")  # a's reply: $1 spent, nothing in flight
    assert ledger.refusal("b", 6, "m") is None


def test_a_negative_count_in_a_reply_costs_nothing() -> None:
    """A reply's counts are clamped at zero for its cost as for its tokens (as `own_spent`
    recounts it from the log on a resume): a negative count does not lower what was spent."""
    prices = PriceTable({"m": Price(input=1.0, output=1.0, cache_read=1.0, cache_write=1.0)})
    ledger = TreeLedger(prices=prices)
    trio.run(ledger.join, "root", None, Budget(max_cost=1.0), OwnSpent())
    ledger.charge("root", {"input_tokens": 1000, "output_tokens": -500}, "m")
    spent = ledger.spent("root")
    assert spent is not None and spent.tokens == 1000
    assert spent.cost == pytest.approx(0.001)


async def test_a_start_refused_after_its_reservation_is_no_descendant(tmp_path: Path) -> None:
    """Under `max_descendants 1`, a `subagent` call refused after its budget was reserved (an
    agent type whose model this runtime cannot build) starts no descendant: the next child
    starts, as a recount from the logs (no catalog for the refused one) would allow."""
    picky = AgentType(name="picky", description="wants its own model", prompt="p", model="openai:other")
    model = _model(
        [
            {
                "session": "parent",
                "responses": [
                    {"tool_calls": [_delegate("Bad", agent_type="picky")], "usage": _usage(10)},
                    {"tool_calls": [_delegate("L1")], "usage": _usage(10)},
                    {"text": "root started"},
                    *[{"text": "root noted"}] * 3,
                ],
            },
            {"label": "L1", "responses": [{"text": "L1 done", "usage": _usage(10)}]},
        ]
    )
    await _run_tree(tmp_path, model, budget=Budget(max_descendants=1), agent_types={"picky": picky})
    results = [d for t, d in _logs(tmp_path)["parent"] if t == "tool/result"]
    assert [r["message"]["content"][0]["is_error"] for r in results[:2]] == [True, False]
    assert "L1" in {_label(events) for events in _logs(tmp_path).values()}
