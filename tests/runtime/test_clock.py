"""Clocks (runtime/foundation/clock.py): readings, and `observe` keeping what is written next after what a
log already holds — across a restart, when a new process's ScenarioClock starts again."""

from __future__ import annotations

import json
import time
from pathlib import Path

from log_lines import read_all
from subagents.runtime import CountingIds, RealClock, ScenarioClock, ScriptedModel, load_script, open_runtime
from subagents.storage import FileLogStore


def test_scenario_readings_and_observe() -> None:
    clock = ScenarioClock(start=1000, step_ms=2)
    assert [clock.now_ms() for _ in range(3)] == [1000, 1002, 1004]
    clock.observe(900)  # already behind: nothing changes
    assert clock.now_ms() == 1006
    clock.observe(5000)
    assert [clock.now_ms() for _ in range(2)] == [5001, 5003]
    twin = ScenarioClock(start=1000, step_ms=2)
    for _ in range(4):
        twin.now_ms()
    twin.observe(5000)
    assert twin.now_ms() == 5001  # deterministic: the same readings and observations, the same times


def test_real_clock_observe_and_monotony() -> None:
    clock = RealClock()
    future = time.time_ns() // 1_000_000 + 60_000
    a = clock.now_ms()
    clock.observe(future)
    b = clock.now_ms()
    assert a < b and b == future + 1 and clock.now_ms() == future + 2


def _model(*texts: str) -> ScriptedModel:
    return ScriptedModel(
        load_script(
            json.dumps(
                {
                    "agents": [
                        {"session": "parent", "responses": [{"text": t} for t in texts]},
                        {"label": "worker", "responses": [{"text": "child one"}, {"text": "child two"}]},
                    ]
                }
            )
        )
    )


def _times(root: Path, sid: str) -> list[int]:
    return [e.time for e in read_all(FileLogStore(str(root), compression="none", use_index=False), sid)]


async def test_a_restart_with_a_fresh_scenario_clock_writes_nothing_older(tmp_path: Path) -> None:
    async with open_runtime(
        tmp_path,
        model=_model("p1", "p2", "p3", "p4"),
        clock=ScenarioClock(),
        id_factory=CountingIds("c"),
        compression="none",
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        first = await rt.subagents.start_continuable(parent, "spawn", "worker", "work")
        await rt.subagents.wait_tree_idle(parent)
    before = {sid: _times(tmp_path, sid) for sid in ("parent", first)}
    async with open_runtime(
        tmp_path,
        model=_model("q1", "q2", "q3", "q4"),
        clock=ScenarioClock(),
        id_factory=CountingIds("d"),
        compression="none",
    ) as rt:
        parent = await rt.agents.resume("parent")
        second = await rt.subagents.start_continuable(parent, "spawn", "worker", "more work")
        await rt.subagents.send_message(parent, first, "again")
        await rt.subagents.wait_tree_idle(parent)
        rows = await rt.listing.list_children("parent")
    newest = max(max(times) for times in before.values())
    for sid in ("parent", first):
        after = _times(tmp_path, sid)
        assert after[: len(before[sid])] == before[sid]
        assert all(t > newest for t in after[len(before[sid]) :])  # what the second process wrote
        assert after == sorted(after)
    assert min(_times(tmp_path, second)) > newest
    assert [row.id for row in rows] == [first, second]  # created_at order: the new child is newer


def test_a_real_clock_ignores_an_observed_time_far_in_the_future() -> None:
    clock = RealClock()
    now = time.time_ns() // 1_000_000
    clock.observe(now + 2 * 24 * 3600 * 1000)  # a log from a machine two days ahead
    assert clock.now_ms() < now + 60_000
    clock.observe(now + 3600 * 1000)  # an hour ahead is taken
    assert clock.now_ms() == now + 3600 * 1000 + 1
