"""The continuation manager (actors/continuation.py, SPEC 4): family admission under
`max_active`, the body → ready (under the Activation lock) → settle → dispose order, failing
hooks, child-first stop, and drain. Pure in-memory: fakes record every hook call in order."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from subagents.actors import (
    Activation,
    ActivationLimitReached,
    ActorError,
    ContinuationManager,
    Draining,
    open_continuation_manager,
)


class Boom(Exception):
    pass


class Hooks:
    """Fake body/ready/settle/dispose/interrupt. A body runs until `finish[id]` is set (an
    interrupt sets it); `ready_answers` are consumed one per ready check (then True); a gated
    settle waits for its event; `fail` names the hook that raises."""

    def __init__(self, *, fail: str | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.finish: defaultdict[str, trio.Event] = defaultdict(trio.Event)
        self.settle_gate: dict[str, trio.Event] = {}
        self.ready_answers: list[bool] = []
        self.lock_held_in_ready: list[bool] = []
        self.fail = fail

    async def body(self, a: Activation) -> None:
        self.calls.append(("body", a.child_id))
        if self.fail == "body":
            raise Boom("body")
        try:
            await self.finish[a.child_id].wait()
        except trio.Cancelled:
            self.calls.append(("cancelled", a.child_id))
            raise

    def ready(self, a: Activation) -> bool:
        self.calls.append(("ready", a.child_id))
        self.lock_held_in_ready.append(a.lock.locked())
        return self.ready_answers.pop(0) if self.ready_answers else True

    async def settle(self, a: Activation) -> None:
        self.calls.append(("settle", a.child_id))
        if a.child_id in self.settle_gate:
            await self.settle_gate[a.child_id].wait()
        if self.fail == "settle":
            raise Boom("settle")

    async def dispose(self, a: Activation) -> None:
        self.calls.append(("dispose", a.child_id))

    def interrupt(self, a: Activation) -> None:
        self.calls.append(("interrupt", a.child_id))
        self.finish[a.child_id].set()

    def start(self, manager: ContinuationManager, child_id: str, parent_id: str) -> Activation:
        activation = manager.admit(child_id, parent_id)
        manager.start(activation, self.body, self.ready, self.settle, self.dispose)
        return activation

    def only(self, *kinds: str) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] in kinds]


@asynccontextmanager
async def manager_scenario(hooks: Hooks, **options: Any) -> AsyncIterator[ContinuationManager]:
    """A manager whose scenario must end clean: nothing resident and no task left for the
    nursery's exit to cancel. Gates open on the way out, so a failing test cannot hang in a
    (shielded) settle; a broken rule fails at a deadline rather than hanging."""
    with trio.fail_after(10):
        async with open_continuation_manager(**options) as manager:
            try:
                yield manager
                await trio.testing.wait_all_tasks_blocked()
                assert manager.resident == {}
                assert not manager._nursery.child_tasks
            finally:
                for gate in hooks.settle_gate.values():
                    gate.set()


async def test_the_limit_is_per_family_and_counts_reservations() -> None:
    async with manager_scenario(Hooks(), max_active=2) as manager:
        a = manager.admit("a", "top1")
        b = manager.admit("b", "a")  # a grandchild joins the family of the top-level session
        assert (a.root_id, b.root_id) == ("top1", "top1") and a.owned == {"b"}
        with pytest.raises(ActivationLimitReached) as refused:
            manager.admit("c", "top1")  # two reservations, neither started, fill the family
        with pytest.raises(ActivationLimitReached):
            manager.admit("c", "b")
        assert isinstance(refused.value, ActorError) and refused.value.limit == 2
        assert str(refused.value) == "the family is at its limit of 2 active children"
        others = [manager.admit("x", "top2"), manager.admit("y", "top2")]  # not a global limit
        with pytest.raises(ActorError, match="already resident"):
            manager.admit("x", "top2")
        manager.forget(b)  # a reservation that never started releases its slot
        assert a.owned == set() and b.disposed.is_set() and manager.family_size("top1") == 1
        for activation in [manager.admit("c", "a"), a, *others]:
            manager.forget(activation)


async def test_wait_changed_waits_for_the_next_admission_or_release() -> None:
    # An edge, not a level: a waiter parked before a change wakes once, and waits anew after it.
    async with manager_scenario(Hooks()) as manager:
        woken: list[int] = []

        async def waiter() -> None:
            for _ in range(2):
                await manager.wait_changed()
                woken.append(len(manager.resident))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert woken == []
            a = manager.admit("a", "top")
            await trio.testing.wait_all_tasks_blocked()
            assert woken == [1]  # woken by the admission, then waiting for the next change
            manager.forget(a)
        assert woken == [1, 0]


async def test_body_then_ready_under_the_lock_then_settle_then_dispose() -> None:
    hooks = Hooks()
    async with manager_scenario(hooks) as manager:
        a = hooks.start(manager, "a", "top")
        await trio.testing.wait_all_tasks_blocked()
        async with a.lock:  # e.g. a delivery in progress: the re-check must wait for it
            hooks.finish["a"].set()
            await trio.testing.wait_all_tasks_blocked()
            assert hooks.calls == [("body", "a")]
        await a.disposed.wait()
    assert hooks.calls == [("body", "a"), ("ready", "a"), ("settle", "a"), ("dispose", "a")]
    assert hooks.lock_held_in_ready == [True]


async def test_work_arriving_as_the_body_returns_runs_the_body_again() -> None:
    hooks = Hooks()
    hooks.ready_answers = [False, True]
    async with manager_scenario(hooks) as manager:
        a = hooks.start(manager, "a", "top")
        hooks.finish["a"].set()
        await a.disposed.wait()
    assert hooks.calls == [
        ("body", "a"),
        ("ready", "a"),
        ("body", "a"),
        ("ready", "a"),
        ("settle", "a"),
        ("dispose", "a"),
    ]


async def test_dispose_waits_until_settle_has_returned() -> None:
    hooks = Hooks()
    hooks.settle_gate["a"] = trio.Event()
    async with manager_scenario(hooks, max_active=1) as manager:
        a = hooks.start(manager, "a", "top")
        hooks.finish["a"].set()
        await trio.testing.wait_all_tasks_blocked()
        assert hooks.calls[-1] == ("settle", "a")  # settle is running, dispose is not
        assert manager.get("a") is a and a.closing and not a.disposed.is_set()
        with pytest.raises(ActivationLimitReached):
            manager.admit("b", "top")  # still holds its slot until disposed
        hooks.settle_gate["a"].set()
        await a.disposed.wait()
        manager.forget(manager.admit("b", "top"))  # the slot is free again
    assert hooks.only("settle", "dispose") == [("settle", "a"), ("dispose", "a")]


async def test_a_full_family_makes_room_only_while_a_member_is_closing() -> None:
    # `making_room`: an admission waits (for `wait_changed`) rather than being refused only when
    # a member of the full family is on its way out and will free its slot by itself.
    hooks = Hooks()
    hooks.settle_gate["a"] = trio.Event()
    async with manager_scenario(hooks, max_active=1) as manager:
        a = hooks.start(manager, "a", "top")
        assert not manager.making_room("top")  # full, and nothing is leaving: refused at once
        hooks.finish["a"].set()
        await trio.testing.wait_all_tasks_blocked()
        assert a.closing and manager.making_room("top")  # settling: its slot is being freed
        assert not manager.making_room("a")  # a closing parent admits nothing (`admit` says why)
        assert not manager.making_room("elsewhere")  # another family has room
        manager.draining = True
        assert not manager.making_room("top")  # draining: refused at once
        manager.draining = False
        hooks.settle_gate["a"].set()
        await a.disposed.wait()
        assert not manager.making_room("top")
        manager.forget(manager.admit("b", "top"))


@pytest.mark.parametrize("failing", ["body", "settle"])
async def test_a_failing_hook_still_disposes_and_frees_the_slot(failing: str) -> None:
    hooks = Hooks(fail=failing)
    try:
        with trio.fail_after(10):
            async with open_continuation_manager(max_active=1) as manager:
                a = hooks.start(manager, "a", "top")
                hooks.finish["a"].set()
                await a.disposed.wait()
    except* Boom:
        pass  # the manager may surface the hook's error (today: from its nursery)
    assert manager.resident == {}
    assert ("dispose", "a") in hooks.calls, f"dispose was lost after a failing {failing}: {hooks.calls}"


async def test_stop_stops_resident_children_first() -> None:
    hooks = Hooks()
    async with manager_scenario(hooks) as manager:
        a = hooks.start(manager, "a", "top")
        b = hooks.start(manager, "b", "a")
        c = hooks.start(manager, "c", "b")
        other = hooks.start(manager, "other", "top")
        await trio.testing.wait_all_tasks_blocked()
        await manager.stop("a", "parent", hooks.interrupt)
        assert hooks.only("interrupt", "settle", "dispose") == [
            ("interrupt", "c"),
            ("settle", "c"),
            ("dispose", "c"),
            ("interrupt", "b"),
            ("settle", "b"),
            ("dispose", "b"),
            ("interrupt", "a"),
            ("settle", "a"),
            ("dispose", "a"),
        ]
        assert (a.cause, b.cause, c.cause) == ("parent", "parent", "parent")
        assert list(manager.resident) == ["other"] and not other.closing  # a's sibling is untouched
        await manager.stop("nobody", "parent", hooks.interrupt)  # not resident: a no-op
        await manager.stop("other", "parent", hooks.interrupt)


async def test_a_parent_that_settles_stops_its_children_before_its_own_settlement() -> None:
    hooks = Hooks()
    async with manager_scenario(hooks) as manager:
        a = hooks.start(manager, "a", "top")
        b = hooks.start(manager, "b", "a")
        await trio.testing.wait_all_tasks_blocked()
        hooks.finish["a"].set()  # a's body returns while b still runs
        await a.disposed.wait()
    assert hooks.only("cancelled", "settle", "dispose") == [
        ("cancelled", "b"),
        ("settle", "b"),
        ("dispose", "b"),
        ("settle", "a"),
        ("dispose", "a"),
    ]
    assert b.cause == "disposed" and ("ready", "b") not in hooks.calls  # forced: no re-check


async def test_stop_cancels_a_body_that_ignores_the_interrupt_after_the_grace(autojump_clock: Any) -> None:
    hooks = Hooks()
    async with manager_scenario(hooks, stop_grace=5.0) as manager:
        a = hooks.start(manager, "a", "top")
        await trio.testing.wait_all_tasks_blocked()
        began = trio.current_time()
        await manager.stop("a", "user", lambda act: hooks.calls.append(("interrupt", act.child_id)))
        assert trio.current_time() - began == pytest.approx(5.0)
        assert a.stop_requested and a.cause == "user"
    assert hooks.calls == [("body", "a"), ("interrupt", "a"), ("cancelled", "a"), ("settle", "a"), ("dispose", "a")]


async def test_drain_stops_everything_child_first_and_refuses_admission() -> None:
    hooks = Hooks()
    hooks.settle_gate["b"] = trio.Event()
    async with manager_scenario(hooks) as manager:
        started = [hooks.start(manager, child, parent) for child, parent in [("a", "top1"), ("b", "a"), ("c", "top2")]]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(manager.drain, hooks.interrupt)
            await trio.testing.wait_all_tasks_blocked()
            assert manager.draining and hooks.calls[-1] == ("settle", "b")
            with pytest.raises(Draining) as refused:
                manager.admit("d", "top3")  # refused while draining
            assert str(refused.value) == "the continuation manager is draining: nothing new is admitted"
            hooks.settle_gate["b"].set()
        with pytest.raises(Draining):
            manager.admit("d", "top3")  # and after
        assert hooks.only("interrupt", "settle", "dispose") == [  # each top-most stopped child-first
            ("interrupt", "b"),
            ("settle", "b"),
            ("dispose", "b"),
            ("interrupt", "a"),
            ("settle", "a"),
            ("dispose", "a"),
            ("interrupt", "c"),
            ("settle", "c"),
            ("dispose", "c"),
        ]
        assert [a.cause for a in started] == ["disposed"] * 3


async def test_a_child_admitted_while_its_parent_closes_is_not_left_behind() -> None:
    hooks = Hooks()
    hooks.settle_gate["b"] = trio.Event()
    async with manager_scenario(hooks) as manager:
        a = hooks.start(manager, "a", "top")
        hooks.start(manager, "b", "a")
        await trio.testing.wait_all_tasks_blocked()
        hooks.finish["a"].set()  # a closes: it stops b first, and b's settlement is slow
        await trio.testing.wait_all_tasks_blocked()
        assert a.closing and hooks.calls[-1] == ("settle", "b")
        from subagents.actors import ParentClosing

        with pytest.raises(ParentClosing):  # e.g. a's still-running turn resumes a child meanwhile
            hooks.start(manager, "c", "a")
        hooks.settle_gate["b"].set()
        await a.disposed.wait()
        assert manager.get("c") is None, "c outlived its disposed parent a"


def test_refusals_carry_their_codes() -> None:
    from subagents.actors import Draining, ParentClosing

    assert ActivationLimitReached(3).code == "ACTOR_ACTIVATION_LIMIT_REACHED"
    assert Draining().code == "ACTOR_DRAINING"
    closing = ParentClosing("a")
    assert (closing.code, str(closing)) == (
        "ACTOR_PARENT_CLOSING",
        "parent 'a' is closing: no child is admitted under it",
    )
