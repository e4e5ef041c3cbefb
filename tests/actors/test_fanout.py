"""`snapshot_all`: one task asks many sessions at once; results aligned, failures as values."""

from __future__ import annotations

from typing import Any

import attrs
from clocks import ticking_ms
from drafts import descriptor_draft, turn_start
from log_lines import header
from registries import subagent_registry
from subagents.actors import ActorStopped, open_session_store, snapshot_all
from subagents.storage import ProjectionBroken
from subagents.storage.testing import MemoryLogStore

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
