"""Every scenario under `scenarios/` matches its goldens — twice, so a run that depends on
scheduling luck shows up — and a wrong or unused golden fails with a readable message."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from subagents.runtime.foundation.errors import ScenarioError
from subagents.runtime.hosts.cli import main
from subagents.runtime.testing import check_scenario, run_scenario, scenario_dirs

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
ALL = scenario_dirs(SCENARIOS)


def test_the_issue_scenarios_exist() -> None:
    assert {d.name for d in ALL} >= {
        "subagent-list-agents",
        "subagent-diagnostic",
        "crash-restart-mid-child",
        "corrupt-child-among-healthy",
        "fork-child",
        "cancel-during-list",
    }


@pytest.mark.parametrize("directory", ALL, ids=[d.name for d in ALL])
async def test_scenario_matches_its_goldens_twice(directory: Path, tmp_path: Path) -> None:
    for _ in range(2):
        assert await check_scenario(directory) == []
    first = await run_scenario(directory, tmp_path / "a")
    second = await run_scenario(directory, tmp_path / "b")
    assert first == second


def test_pinned_texts_are_in_the_goldens() -> None:
    listed = (SCENARIOS / "subagent-list-agents" / "expected" / "output.json").read_text()
    assert "child-1 [ready] — Reply with CHILD_OK" in listed
    parent = SCENARIOS / "subagent-diagnostic" / "expected" / "sessions" / "subagent-diagnostic-parent.jsonl"
    assert "subagent-diagnostic-child [diagnostic: corrupt]" in parent.read_text()
    cancelled = SCENARIOS / "cancel-during-list" / "expected" / "sessions" / "cancel-parent.jsonl"
    assert "Error: subagent listing was cancelled" in cancelled.read_text()
    child = (SCENARIOS / "crash-restart-mid-child" / "expected" / "sessions" / "crash-child.jsonl").read_text()
    assert "TOOL_OUTCOME_UNKNOWN" in child and "TOOL_NOT_STARTED" in child and '"interrupted"' in child


def _copy(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(SCENARIOS / name, target)
    return target


async def test_a_broken_golden_fails_with_a_diff(tmp_path: Path) -> None:
    directory = _copy("subagent-diagnostic", tmp_path)
    golden = directory / "expected" / "sessions" / "subagent-diagnostic-parent.jsonl"
    golden.write_text(golden.read_text().replace("PARENT_DONE", "PARENT_GONE"))
    [problem] = await check_scenario(directory)
    assert problem.startswith("--- expected/sessions/subagent-diagnostic-parent.jsonl (golden)")
    assert "-" in problem and "PARENT_GONE" in problem and "+" in problem and "PARENT_DONE" in problem


async def test_an_unused_golden_fails(tmp_path: Path) -> None:
    directory = _copy("subagent-diagnostic", tmp_path)
    (directory / "expected" / "sessions" / "ghost.jsonl").write_text("{}\n")
    problems = await check_scenario(directory)
    assert problems == ["unused golden expected/sessions/ghost.jsonl: the run produced no such session"]


async def test_a_missing_golden_fails(tmp_path: Path) -> None:
    directory = _copy("subagent-diagnostic", tmp_path)
    (directory / "expected" / "sessions" / "subagent-diagnostic-child.jsonl").unlink()
    problems = await check_scenario(directory)
    assert problems == [
        "session 'subagent-diagnostic-child' has no golden (expected/sessions/subagent-diagnostic-child.jsonl)"
    ]


def test_cli_check_exit_codes(tmp_path: Path, capsys) -> None:
    directory = _copy("subagent-diagnostic", tmp_path)
    assert main(["scenario", "check", str(directory)]) == 0
    assert capsys.readouterr().out == "subagent-diagnostic: ok\n"
    (directory / "expected" / "output.json").write_text("[]\n")
    assert main(["scenario", "check", str(directory)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("subagent-diagnostic: FAILED\n--- expected/output.json (golden)")
    assert main(["scenario", "update", str(directory)]) == 0
    assert main(["scenario", "check", str(directory)]) == 0


@pytest.mark.parametrize(
    "spec, message",
    [
        ("[]", "$ must be an object"),
        ('{"steps": []}', "$.steps must be a non-empty list"),
        ('{"steps": [{"op": "dance"}]}', "$.steps[0].op must be one of"),
        ('{"steps": [{"op": "prompt", "session": "p"}]}', "$.steps[0].text is missing"),
        ('{"steps": [{"op": "restart", "extra": 1}]}', "$.steps[0].extra is not a known key"),
        ('{"steps": [{"op": "restart"}], "colour": "red"}', "$.colour is not a known key"),
        ("{not json", "scenario.json"),
        (
            '{"steps": [{"op": "agents", "session": "p", "descendants": "yes"}]}',
            "$.steps[0].descendants must be true or false",
        ),
        ('{"steps": [{"op": "restart"}], "max_depth": true}', "$.max_depth must be a non-negative integer"),
        (
            '{"steps": [{"op": "restart"}], "max_active_subagents": -1}',
            "$.max_active_subagents must be a non-negative integer",
        ),
        ('{"steps": [{"op": "restart"}], "id_prefix": 7}', "$.id_prefix must be a string"),
    ],
)
def test_bad_scenarios_are_exit_2_with_the_json_path(tmp_path: Path, capsys, spec: str, message: str) -> None:
    directory = tmp_path / "bad"
    directory.mkdir()
    (directory / "scenario.json").write_text(spec)
    (directory / "script.json").write_text('{"agents": [{"responses": []}]}')
    assert main(["scenario", "run", str(directory)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_no_scenario_at_a_path(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no scenario"):
        scenario_dirs(tmp_path)
