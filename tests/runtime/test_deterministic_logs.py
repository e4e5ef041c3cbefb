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
