"""A descendant's charges reach an ancestor that is here even when the sessions between them
are not (issue 30 item 4; runtime/agent/tree_ledger.py `_link`, `_combine`): the leaf C of
A → P → C joins while P never runs here, before A joins or after. The ledger alone with a
fake store (seeds and headers a test gives, reads a test holds open), then scripted models on
real files: the ancestor's totals, its refusal, its remainder for a new child, and a restart's
recount agreeing with the live totals."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from budget_trees import delegate as _delegate
from budget_trees import ends as _ends
from budget_trees import label_of as _label
from budget_trees import logs as _logs
from budget_trees import scripted as _model
from budget_trees import usage as _usage
from subagents.runtime import Budget, ScenarioClock, open_runtime
from subagents.runtime.agent.tree_ledger import OwnSpent, Seeded, TreeLedger, TreeSpent
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.foundation.pricing import PriceTable

Json = dict[str, Any]

LIMIT = Budget(max_tokens=1000, max_turns=50)
# The store: A → P → C, each one's own spending as a seed read finds it.
A_OWN = OwnSpent(tokens=7, turns=2, parent=True)
P_SEED = Seeded("A", OwnSpent(tokens=50, turns=1))
C_OWN = OwnSpent(tokens=30, turns=1)
HEADERS = {"A": None, "P": "A", "C": "P"}


class Store:
    """The ledger's view of a store: seeds and parents from a table, and, per read named in
    `hold` (`seed:ID`, `lineage:ID`), a read that waits (`reading` set) until the test releases
    it."""

    def __init__(self, seeds: dict[str, dict[str, Seeded]], hold: frozenset[str] = frozenset()) -> None:
        self.seeds = seeds
        self.hold = hold
        self.reading = trio.Event()
        self.release = trio.Event()
        self.looked_up: list[str] = []

    async def _wait(self, read: str) -> None:
        if read in self.hold:
            self.reading.set()
            await self.release.wait()

    async def seeder(self, session_id: str) -> dict[str, Seeded]:
        await self._wait(f"seed:{session_id}")
        return self.seeds.get(session_id, {})

    async def lineage(self, session_id: str) -> str | None:
        self.looked_up.append(session_id)
        await self._wait(f"lineage:{session_id}")
        return HEADERS.get(session_id)

    def ledger(self) -> TreeLedger:
        return TreeLedger(prices=PriceTable(), seeder=self.seeder, lineage=self.lineage)


def _tokens(n: int) -> dict[str, int]:
    return {"input_tokens": n, "output_tokens": 0}


def _spent(ledger: TreeLedger, sid: str) -> tuple[int, int, int]:
    """Its tree's tokens, descendants and turns (no prices here: a cost is unknown)."""
    spent = ledger.spent(sid)
    assert spent is not None, sid
    return (spent.tokens, spent.descendants, spent.turns)


async def test_a_leaf_that_joins_under_an_absent_parent_is_charged_to_the_ancestor_here() -> None:
    """Order (a): A joins (its seed: P 50, C 30), then C, whose parent P never runs here. C's
    join finds P's parent in the store and puts P in between without touching A's totals; C's
    charges and turns then reach A: its spent totals, its refusal, its remainder. Without the
    link they stopped at C."""
    store = Store({"A": {"P": P_SEED, "C": Seeded("P", C_OWN)}})
    ledger = store.ledger()
    await ledger.join("A", None, LIMIT, A_OWN)
    assert _spent(ledger, "A") == (87, 2, 4)
    await ledger.join("C", "P", Budget(max_tokens=5000), C_OWN)
    assert store.looked_up == ["P"]  # up to the first session here: A
    assert _spent(ledger, "A") == (87, 2, 4)  # nothing counted twice
    ledger.turn_started("C")
    ledger.charge("C", _tokens(800), None)
    assert _spent(ledger, "A") == (887, 2, 5)
    assert _spent(ledger, "C") == (830, 0, 2)
    assert ledger.remainder("A") == Budget(max_tokens=113, max_turns=45)  # P holds nothing: not running
    assert ledger.refusal("C", 200, None) == ("ancestor A's max_tokens 1000 would be crossed: 887 used, this call ~200")
    ledger.start_child("C", "G", None)
    assert _spent(ledger, "A")[1] == 3
    # P runs here after all: its own spending joins its totals, A's stay as charged.
    await ledger.join("P", "A", None, OwnSpent(tokens=50, turns=1, parent=True))
    ledger.charge("C", _tokens(10), None)
    assert _spent(ledger, "A")[0] == 897
    assert _spent(ledger, "P")[0] == 50 + 810  # its own and C's charges since it was put in


async def test_a_stand_in_that_joins_seeded_is_completed_and_its_ancestor_left_as_charged() -> None:
    """P, put in as C's parent, joins here after all with a shared budget: its read (C: 30 as
    the store has it) gives it its whole tree's totals, C's from the ledger (30 + 100 charged);
    A's are what it counted and was charged. Then C's charges reach both."""
    store = Store({"A": {"P": P_SEED, "C": Seeded("P", C_OWN)}, "P": {"C": Seeded("P", C_OWN)}})
    ledger = store.ledger()
    await ledger.join("A", None, LIMIT, A_OWN)
    await ledger.join("C", "P", None, C_OWN)
    ledger.charge("C", _tokens(100), None)
    assert _spent(ledger, "P") == (100, 0, 0)  # a stand-in: only what was charged through it
    await ledger.join("P", "A", Budget(max_tokens=400), OwnSpent(tokens=50, turns=1, parent=True))
    assert _spent(ledger, "P") == (180, 1, 2)
    assert _spent(ledger, "A") == (187, 2, 4)
    ledger.charge("C", _tokens(300), None)
    assert ledger.refusal("C", 1, None) == "ancestor P's max_tokens 400 reached: 480 used (80 over)"
    assert _spent(ledger, "A")[0] == 487


async def test_a_leaf_here_before_its_ancestor_is_linked_by_the_ancestors_seed() -> None:
    """Order (b): C joins first (nobody above it here: nothing to link), is charged 100; then
    A joins, its seed (which saw C's 30 only) adds C's ledger totals and puts P in, whole, so
    C's next charges reach A."""
    store = Store({"A": {"P": P_SEED, "C": Seeded("P", C_OWN)}})
    ledger = store.ledger()
    await ledger.join("C", "P", Budget(max_tokens=5000), C_OWN)
    assert store.looked_up == ["P", "A"]  # up to the root: no ancestor here
    assert ledger.spent("P") is None
    ledger.charge("C", _tokens(100), None)
    await ledger.join("A", None, LIMIT, A_OWN)
    assert _spent(ledger, "A") == (187, 2, 4)
    ledger.turn_started("C")
    ledger.charge("C", _tokens(700), None)
    assert _spent(ledger, "A") == (887, 2, 5)
    assert _spent(ledger, "P") == (880, 1, 3)  # put in whole: its 50, C's 130, and C's since
    assert ledger.refusal("C", 200, None) == ("ancestor A's max_tokens 1000 would be crossed: 887 used, this call ~200")
    assert ledger.remainder("A") == Budget(max_tokens=113, max_turns=45)


async def test_an_ancestor_that_joins_during_the_leafs_lookup_is_linked_once() -> None:
    """C's lookup of P's parent is held open; meanwhile A joins (its seed saw C's 30). When the
    lookup returns, A is here: P is put in between, A's totals are left as its seed made them,
    and C's charges reach A from then on."""
    store = Store({"A": {"P": P_SEED, "C": Seeded("P", C_OWN)}}, hold=frozenset({"lineage:P"}))
    ledger = store.ledger()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.join, "C", "P", Budget(max_tokens=5000), C_OWN)
        await trio.testing.wait_all_tasks_blocked()
        assert store.reading.is_set()  # the join is in its read
        await ledger.join("A", None, LIMIT, A_OWN)  # C is not here yet: its seed counts C as read
        store.release.set()
    assert store.looked_up == ["P"]
    assert _spent(ledger, "A") == (87, 2, 4)
    ledger.charge("C", _tokens(100), None)
    assert _spent(ledger, "A")[0] == 187


async def test_a_leafs_charge_during_the_ancestors_seed_counts_once_and_links() -> None:
    """C is here first and is charged 100 while A's seed (which saw C's 30) is read: A counts
    C's ledger totals (130) once, puts P in, and C's next charge reaches it."""
    store = Store({"A": {"P": P_SEED, "C": Seeded("P", C_OWN)}}, hold=frozenset({"seed:A"}))
    ledger = store.ledger()
    await ledger.join("C", "P", Budget(max_tokens=5000), C_OWN)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.join, "A", None, LIMIT, A_OWN)
        await trio.testing.wait_all_tasks_blocked()
        assert store.reading.is_set()  # the join is in its read
        ledger.charge("C", _tokens(100), None)  # stops at C: A is not here yet
        store.release.set()
    assert _spent(ledger, "A") == (187, 2, 4)
    ledger.charge("C", _tokens(5), None)
    assert _spent(ledger, "A")[0] == 192


# --- a runtime on real files ----------------------------------------------------------------------


OPTIONS: dict[str, Any] = {
    "clock": ScenarioClock(),
    "compression": "none",
    "budget": Budget(max_tokens=2000),
    "max_depth": 2,
}


@pytest.mark.parametrize("order", ["root first", "leaf first"])
async def test_a_leaf_resumed_without_its_parent_is_held_to_the_roots_limit(tmp_path: Path, order: str) -> None:
    """Root 2,000 tokens. First process: the root spends 100 + 600, mid (its child) 200, leaf
    (mid's child, reserved 1,700) 300: 1,200. A second process resumes the root and the leaf,
    never mid, in either order; the leaf spends 790 (1,990 of the root's 2,000; 1,090 of its
    own 1,700), the root's remainder for a new child is the 10 left, and the leaf's next call is
    refused for the root's limit. A third process resumes the root alone: its recount of the
    tree from the logs is the second's live totals."""
    first = _model(
        [
            {
                "session": "parent",
                "responses": [
                    {"tool_calls": [_delegate("mid")], "usage": _usage(100)},
                    {"text": "started"},
                    {"text": "noted", "usage": _usage(600)},  # after the leaf's reservation
                    *[{"text": "noted again"}] * 3,
                ],
            },
            {
                "label": "mid",
                "responses": [
                    {"tool_calls": [_delegate("leaf", max_tokens=5000)], "usage": _usage(200)},
                    {"text": "mid started"},
                    *[{"text": "mid noted"}] * 3,
                ],
            },
            {"label": "leaf", "responses": [{"text": "part one", "usage": _usage(300)}]},
        ]
    )
    async with open_runtime(tmp_path, model=first, id_factory=CountingIds("c"), **OPTIONS) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("go")
        await rt.subagents.wait_tree_idle(parent)
    ids = {_label(events): sid for sid, events in _logs(tmp_path).items()}
    mid, leaf = ids["mid"], ids["leaf"]
    assert next(d for t, d in _logs(tmp_path)[leaf] if t == "subagent/descriptor")["budget"] == {"max_tokens": 1700}

    second = _model(
        [{"session": leaf, "responses": [{"text": "part two", "usage": _usage(790)}, {"text": "never sent"}]}]
    )
    async with open_runtime(tmp_path, model=second, **OPTIONS) as rt:
        ledger = rt.agents.config.ledger
        assert ledger is not None
        if order == "root first":
            root = await rt.agents.resume("parent")
            child = await rt.agents.resume(leaf)
        else:
            child = await rt.agents.resume(leaf)
            root = await rt.agents.resume("parent")
        assert ledger.spent("parent") == TreeSpent(1200, None, 2, 5)
        await child.send("more")
        await child.wait_idle()
        live = ledger.spent("parent")
        assert live == TreeSpent(1990, None, 2, 6)
        assert ledger.spent(mid) is not None  # put between them, never run here
        assert rt.sessions.get(mid) is None
        assert root.budget_remaining() == Budget(max_tokens=10)
        await child.send("and more")
        await child.wait_idle()
        assert ledger.spent("parent") == live  # refused before its call: not a turn, nothing spent
    ends = _ends(_logs(tmp_path)[leaf])
    assert ends[:2] == [{"kind": "completed"}, {"kind": "completed"}]
    assert len(ends) == 3 and ends[2]["kind"] == "budget", ends
    assert re.fullmatch(
        r"ancestor parent's max_tokens 2000 would be crossed: 1990 used, this call ~\d+", ends[2]["message"]
    ), ends[2]

    third = _model([{"session": "parent", "responses": [{"text": "never asked for"}]}])
    async with open_runtime(tmp_path, model=third, **OPTIONS) as rt:
        await rt.agents.resume("parent")
        assert rt.agents.config.ledger is not None
        assert rt.agents.config.ledger.spent("parent") == live
