"""`snapshot_all`: one task asks many sessions at once; results aligned, failures as values."""

from __future__ import annotations

from typing import Any

import attrs

from clocks import ticking_ms
from subagents.actors import ActorStopped, EventDraft, open_session_store, snapshot_all
from subagents.runtime.delegation.descriptor import SubagentDescriptor, snapshot_descriptor
from subagents.runtime.delegation.units import SUBAGENT_UNITS
from subagents.storage import SessionHeader
from subagents.storage.testing import MemoryLogStore
from subagents.storage.projection import ProjectionBroken, ProjectionRegistry

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
    registry = ProjectionRegistry([*SUBAGENT_UNITS, Fragile()])
    async with open_session_store(MemoryLogStore(), registry, now_ms=now_ms, mailbox_capacity=2) as store:
        refs = []
        for i in range(40):  # more sessions than any mailbox holds
            ref = await store.create(SessionHeader(id=f"c{i:02d}", created_at=i + 1))
            label = f"child {i}"
            data = snapshot_descriptor(SubagentDescriptor(mode="continuable", provider="spawn", label=label))
            await ref.append([EventDraft(type="subagent/descriptor", data=data),
                              EventDraft(type="turn/start", data={"turn": i})])
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
