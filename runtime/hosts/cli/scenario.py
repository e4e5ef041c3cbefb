"""`subagents scenario run|check|update PATH`: the keyless scenarios (runtime/testing/scenario.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

import trio

from ...foundation.errors import ScenarioError, UsageError
from .common import STALL_HELP, stall_timeout

if TYPE_CHECKING:
    from pathlib import Path

    from .common import Commands

__all__ = ["add_scenario_command", "scenario_main"]


def add_scenario_command(commands: Commands) -> None:
    """The parser of `scenario`."""
    scenario = commands.add_parser("scenario", help="run, check or update keyless scenarios")
    scenario.add_argument(
        "action",
        choices=("run", "check", "update"),
        metavar="ACTION",
        help="run: print the outputs; check: compare with the goldens; update: rewrite them",
    )
    scenario.add_argument("path", metavar="PATH", help="a scenario folder, or a folder of them")
    scenario.add_argument("--stall-timeout", metavar="SECONDS", default=None, help=STALL_HELP)


def scenario_main(args: argparse.Namespace) -> int:
    """`scenario`: its arguments checked, then each scenario folder in turn."""
    from ...testing.scenario import scenario_dirs

    stall = stall_timeout(args)
    try:
        dirs = scenario_dirs(args.path)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from None
    return trio.run(scenario_command, args.action, dirs, stall)


async def scenario_command(action: str, dirs: list[Path], stall_timeout: float) -> int:
    from ...testing.scenario import check_scenario, run_scenario, update_scenario

    failed = 0
    for directory in dirs:
        try:
            if action == "run":
                import tempfile

                with tempfile.TemporaryDirectory(prefix="scenario-") as tmp:
                    result = await run_scenario(directory, tmp, stall_timeout=stall_timeout)
                print(json.dumps({"scenario": directory.name, "outputs": result.outputs}, ensure_ascii=False))
            elif action == "update":
                sessions = await update_scenario(directory, stall_timeout=stall_timeout)
                print(f"{directory.name}: updated ({len(sessions)} sessions)")
            else:
                problems = await check_scenario(directory, stall_timeout=stall_timeout)
                if problems:
                    failed += 1
                    print(f"{directory.name}: FAILED", file=sys.stderr)
                    for problem in problems:
                        print(problem, file=sys.stderr)
                else:
                    print(f"{directory.name}: ok")
        except ScenarioError as exc:
            raise UsageError(str(exc)) from None
    return 1 if failed else 0
