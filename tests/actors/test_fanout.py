"""`snapshot_all`: one task asks many sessions at once; results aligned, failures as values."""

from __future__ import annotations

from typing import Any

import attrs
import trio
import trio.testing
from clocks import ticking_ms
from drafts import descriptor_draft, turn_start
from log_lines import header
from registries import subagent_registry
from subagents.actors import ActorStopped, open_session_store, snapshot_all
from subagents.actors.session_ref import AppendRequest as _Append
from subagents.storage import ProjectionBroken
from subagents.storage.testing import FaultyLogStore, MemoryLogStore

now_ms = ticking_ms()


@attrs.define
class Fragile:
    """Breaks on the event whose turn is 13."""

    key: str = "fragile"
    state_version: int = 1
    view: Any = staticmethod(lambda state: state)

    def initial(self, header: Any, inherited_event_count: int) -> int:
        return 0

    def apply(self, state: int, event: Any) -> int:
        if event.type == "turn/start" and b'"turn":13' in bytes(memoryview(event.data)):
            raise RuntimeError("boom")
        return state + 1


async def test_results_are_aligned_and_failures_are_values() -> None:
    registry = subagent_registry(Fragile())
    async with open_session_store(MemoryLogStore(), registry, now_ms=now_ms, mailbox_capacity=2) as store:
        refs = []
        for i in range(40):  # more sessions than any mailbox holds
            ref = await store.create(header(f"c{i:02d}", i + 1))
            await ref.append([descriptor_draft(f"child {i}"), turn_start(i)])
            refs.append(ref)
        await store.release("c05")

        results = await snapshot_all(refs, ["subagent"])
        assert len(results) == 40
        for i, result in enumerate(results):
            if i == 5:
                assert isinstance(result, ActorStopped)
            else:
                assert result == {"subagent": {"mode": "continuable", "label": f"child {i}", "seq": 0}}

        fragile = await snapshot_all(refs, ["fragile"])
        assert isinstance(fragile[13], ProjectionBroken)
        assert isinstance(fragile[5], ActorStopped)
        assert [r for i, r in enumerate(fragile) if i not in (5, 13)] == [{"fragile": 2}] * 38
        assert await snapshot_all([], ["subagent"]) == []


class _ActorSteps(trio.abc.Instrument):
    """Counts the steps of session actor tasks (a woken actor takes one)."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("SessionActor.run"):
            self.steps += 1


async def test_idle_actors_are_answered_without_waking_them() -> None:
    registry = subagent_registry()
    async with open_session_store(MemoryLogStore(), registry, now_ms=now_ms) as store:
        refs = []
        for i in range(20):
            ref = await store.create(header(f"c{i:02d}", i + 1))
            await ref.append([descriptor_draft(f"child {i}")])
            await ref.flush()  # after the append's checkpoint write
            refs.append(ref)
        await trio.testing.wait_all_tasks_blocked()  # every actor parked again
        counter = _ActorSteps()
        trio.lowlevel.add_instrument(counter)
        try:
            results = await snapshot_all(refs, ["subagent"])
        finally:
            trio.lowlevel.remove_instrument(counter)
        assert results == [{"subagent": {"mode": "continuable", "label": f"child {i}", "seq": 0}} for i in range(20)]
        assert counter.steps == 0  # answered from their cells: no actor task ran


async def test_a_request_handed_over_but_not_yet_served_is_waited_for() -> None:
    """An append handed to a parked actor that has not run yet: the snapshot must follow it, as
    an asked one queued behind it would."""
    registry = subagent_registry()
    async with open_session_store(MemoryLogStore(), registry, now_ms=now_ms) as store:
        ref = await store.create(header("c1", 1))
        await ref.append([turn_start(1)])
        await ref.flush()  # after the append's checkpoint write
        await trio.testing.wait_all_tasks_blocked()
        assert ref._actor.mailbox.idle()  # noqa: SLF001 - parked, nothing queued
        append = _Append([descriptor_draft("late")], None)
        assert ref._actor.mailbox.try_post(append)  # noqa: SLF001 - handed over; the actor has not run
        (result,) = await snapshot_all([ref], ["subagent"])
        assert result == {"subagent": {"mode": "continuable", "label": "late", "seq": 1}}
        assert append.done


async def test_an_actor_busy_in_storage_is_asked_and_its_answer_follows_the_append() -> None:
    faulty = FaultyLogStore(MemoryLogStore())
    async with open_session_store(faulty, subagent_registry(), now_ms=now_ms) as store:
        ref = await store.create(header("c1", 1))
        await ref.append([turn_start(1)])
        faulty.hang("append", session_id="c1")
        got: list[Any] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ref.append, [descriptor_draft("held")])
            await trio.to_thread.run_sync(faulty.wait_calls, "append", 2)  # the held append is in storage

            async def ask() -> None:
                got.extend(await snapshot_all([ref], ["subagent"]))

            nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # waits for the append in storage, not answered from the cells before it
            faulty.release()
        assert got == [{"subagent": {"mode": "continuable", "label": "held", "seq": 1}}]
