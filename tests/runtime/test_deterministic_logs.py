"""Issue 13 item 3: parallel tool calls that start several children in one step, and
settlements racing a step's end, write the same events in the same order on every run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from log_lines import read_all
from subagents.runtime.app import open_runtime
from subagents.runtime.delegation.service import Reservation
from subagents.runtime.foundation.clock import ScenarioClock
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.testing.scenario import check_scenario, run_scenario
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "parallel-children-interrupt"


@pytest.mark.slow
async def test_three_children_of_one_step_then_an_interrupt_match_their_goldens_20_of_20() -> None:
    failures = [problems for _ in range(20) if (problems := await check_scenario(SCENARIO))]
    assert failures == []


async def test_catalogs_and_results_follow_the_model_order(tmp_path: Path) -> None:
    result = await run_scenario(SCENARIO, tmp_path)
    lines = result.logs["par-parent"].splitlines()
    kinds = [line.split('"type": "')[1].split('"')[0] for line in lines[1:]]
    first = kinds.index("subagent/catalog")
    assert kinds[first : first + 6] == ["subagent/catalog"] * 3 + ["tool/result"] * 3
    catalogued = [line for line in lines if '"subagent/catalog"' in line]
    assert [
        '"child_id": "par-1"' in catalogued[0],
        '"child_id": "par-2"' in catalogued[1],
        '"child_id": "par-3"' in catalogued[2],
    ] == [True, True, True]
    # Each settlement lands while the parent waits on its model call, right after the step's
    # input, and its notice opens the next step.
    settled = [i for i, k in enumerate(kinds) if k == "subagent/settled"]
    assert len(settled) == 3
    for i in settled:
        assert kinds[i + 1] == "assistant/message"
        assert kinds[i - 1] in ("step/start", "user/message")


async def test_a_settlement_waiting_for_a_busy_parent_does_not_hold_up_the_drain(tmp_path: Path) -> None:
    """The parent is inside a tool that never returns when its child settles: the settlement
    waits for the parent to be quiet — until the runtime drains, which records it at once."""
    import json

    import msgspec
    import trio
    import trio.testing
    from subagents.runtime.app import open_runtime
    from subagents.runtime.foundation.clock import ScenarioClock
    from subagents.runtime.foundation.ids import CountingIds
    from subagents.runtime.testing.script_format import load_script
    from subagents.runtime.testing.scripted_model import ScriptedModel
    from subagents.runtime.tools.base import FunctionTool
    from subagents.storage import FileLogStore

    entered = trio.Event()

    async def block(args: dict, ctx: object) -> str:
        entered.set()
        await trio.sleep_forever()
        return "never"

    script = {
        "agents": [
            {
                "session": "p",
                "responses": [
                    {"tool_calls": [{"name": "subagent", "arguments": {"description": "quick", "prompt": "go"}}]},
                    {"tool_calls": [{"name": "block", "arguments": {}}]},
                ],
            },
            {"label": "quick", "responses": [{"wait_for": {"steered": True}, "text": "FIRST"}, {"text": "QUICK"}]},
        ]
    }
    tools = lambda: [FunctionTool(name="block", description="blocks", fn=block)]  # noqa: E731
    with trio.fail_after(20):
        async with open_runtime(
            tmp_path,
            model=ScriptedModel(load_script(json.dumps(script))),
            clock=ScenarioClock(),
            id_factory=CountingIds("child"),
            compression="none",
            tools=tools,
        ) as rt:
            parent = await rt.agents.create(session_id="p")
            await parent.send("go")
            await entered.wait()
            child = rt.agents.get("child-1")
            assert child is not None
            await child.send("finish now", "steer")  # it settles while its parent blocks
            await child.wait_idle()
            await trio.testing.wait_all_tasks_blocked()
            assert rt.subagents.manager.get("child-1") is not None  # held: its parent is busy
    events = read_all(FileLogStore(str(tmp_path), use_index=False), "p")
    (settled,) = [e for e in events if e.type == "subagent/settled"]
    assert msgspec.json.decode(settled.data)["closing_text"] == "QUICK"
    assert events[-1].type == "turn/end"


async def test_a_start_cancelled_while_its_catalog_waits_leaves_no_activation(tmp_path: Path) -> None:
    """The second child of a step waits for the first one's catalog; a cancel there disposes the
    child instead of leaving an Activation nothing runs (the runtime's drain would wait on it
    forever)."""

    class Waited:  # an Event that says when it is waited on (trio.Event is final)
        def __init__(self) -> None:
            self.waiting = trio.Event()

        async def wait(self) -> None:
            self.waiting.set()
            await trio.sleep_forever()

    script = load_script(json.dumps({"agents": [{"label": "B", "responses": [{"text": "ok"}]}]}))
    with trio.fail_after(60):  # a hang guard only: the drain must not wait forever
        async with open_runtime(
            tmp_path, model=ScriptedModel(script), clock=ScenarioClock(), id_factory=CountingIds("c")
        ) as rt:
            parent = await rt.agents.create(session_id="p")
            first = Waited()  # the first call of the step never writes its catalog
            reserved = Reservation("c-1", 1789000000000, after=first)  # type: ignore[arg-type]  # a stand-in Event
            async with trio.open_nursery() as nursery:

                async def start() -> None:
                    await rt.subagents.start_continuable(parent, "spawn", "B", "hi", reserved=reserved)

                nursery.start_soon(start)
                await first.waiting.wait()
                nursery.cancel_scope.cancel()
            assert rt.subagents.manager.get("c-1") is None
            assert reserved.announced.is_set()
