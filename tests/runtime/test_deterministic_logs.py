"""Issue 13 item 3: parallel tool calls that start several children in one step, and
settlements racing a step's end, write the same events in the same order on every run."""

from __future__ import annotations

from pathlib import Path

from subagents.runtime.scenario import check_scenario, run_scenario

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "parallel-children-interrupt"


async def test_three_children_of_one_step_then_an_interrupt_match_their_goldens_20_of_20() -> None:
    failures = [problems for _ in range(20) if (problems := await check_scenario(SCENARIO))]
    assert failures == []


async def test_catalogs_and_results_follow_the_model_order(tmp_path: Path) -> None:
    result = await run_scenario(SCENARIO, tmp_path)
    lines = result.logs["par-parent"].splitlines()
    kinds = [line.split('"type": "')[1].split('"')[0] for line in lines[1:]]
    first = kinds.index("subagent/catalog")
    assert kinds[first:first + 6] == ["subagent/catalog"] * 3 + ["tool/result"] * 3
    catalogued = [line for line in lines if '"subagent/catalog"' in line]
    assert ['"child_id": "par-1"' in catalogued[0], '"child_id": "par-2"' in catalogued[1],
            '"child_id": "par-3"' in catalogued[2]] == [True, True, True]
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

    from subagents.runtime.agent.tools import FunctionTool
    from subagents.runtime.app import open_runtime
    from subagents.runtime.clock import ScenarioClock
    from subagents.runtime.ids import CountingIds
    from subagents.runtime.models.script import load_script
    from subagents.runtime.models.scripted import ScriptedModel
    from subagents.storage import FileLogStore

    entered = trio.Event()

    async def block(args: dict, ctx: object) -> str:
        entered.set()
        await trio.sleep_forever()
        return "never"

    script = {"agents": [
        {"session": "p", "responses": [
            {"tool_calls": [{"name": "subagent", "arguments": {"description": "quick", "prompt": "go"}}]},
            {"tool_calls": [{"name": "block", "arguments": {}}]}]},
        {"label": "quick", "responses": [{"wait_for": {"steered": True}, "text": "FIRST"}, {"text": "QUICK"}]}]}
    tools = lambda: [FunctionTool(name="block", description="blocks", fn=block)]  # noqa: E731
    with trio.fail_after(20):
        async with open_runtime(tmp_path, model=ScriptedModel(load_script(json.dumps(script))), clock=ScenarioClock(),
                                id_factory=CountingIds("child"), compression="none", tools=tools) as rt:
            parent = await rt.agents.create(session_id="p")
            await parent.send("go")
            await entered.wait()
            child = rt.agents.get("child-1")
            assert child is not None
            await child.send("finish now", "steer")  # it settles while its parent blocks
            await child.wait_idle()
            await trio.testing.wait_all_tasks_blocked()
            assert rt.subagents.manager.get("child-1") is not None  # held: its parent is busy
    store = FileLogStore(str(tmp_path), use_index=False)
    handle = store.open_read("p")
    events = list(store.read(handle))
    store.close(handle)
    (settled,) = [e for e in events if e.type == "subagent/settled"]
    assert msgspec.json.decode(settled.data)["closing_text"] == "QUICK"
    assert events[-1].type == "turn/end"
