"""`subagents demo` — the README's main-job command — runs its story and leaves a store the
other commands can read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from log_lines import plain_logs

EXPECTED_END = ["demo: 3 children settled", "demo: restart", "demo: demo-2 resumed", "demo: ok"]


def _subagents(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "subagents.runtime.hosts.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_demo_ends_with_the_four_lines_and_leaves_an_inspectable_store(tmp_path: Path) -> None:
    done = _subagents("demo", cwd=tmp_path)  # the default root ./.subagents, no TTY: the plain log
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[-4:] == EXPECTED_END
    assert "demo: parent says: All three subagents finished: demo-2 [ready]" in done.stdout
    transcript = _subagents("show", "demo-1", cwd=tmp_path).stdout
    assert "The surveyor answered: Its complete lines are recovered" in transcript

    sessions = json.loads(_subagents("sessions", "--json", cwd=tmp_path).stdout)
    assert sorted(s["id"] for s in sessions) == ["demo-1", "demo-2", "demo-3", "demo-4"]
    assert all(s["damage"] is None and not s["live"] for s in sessions)
    agents = _subagents("agents", "demo-1", cwd=tmp_path)
    assert agents.stdout.splitlines() == [
        "demo-2 [ready] — Survey the storage layer",
        "demo-3 [ready] — Check the listing rules",
        "demo-4 [ready] — Draft release notes",
    ]
    shown = _subagents("show", "demo-2", cwd=tmp_path).stdout
    assert shown.count("── turn") == 2  # the first task, then the cold-resumed question


@pytest.mark.slow
def test_a_second_demo_on_the_same_root_uses_fresh_ids(tmp_path: Path) -> None:
    assert _subagents("demo", "--root", "store", cwd=tmp_path).returncode == 0
    again = _subagents("demo", "--root", "store", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-2:] == ["demo: demo-6 resumed", "demo: ok"]


async def test_the_demo_writes_the_same_logs_every_run(tmp_path: Path) -> None:
    """Issue 13 item 3: two runs into two fresh roots write every log byte for byte alike."""
    import io

    from subagents.runtime.hosts.demo import run_demo

    runs = []
    for name in ("first", "second"):
        out = io.StringIO()
        assert await run_demo(str(tmp_path / name), out=out, live=False, delay_scale=0) == 0
        assert out.getvalue().splitlines()[-4:] == EXPECTED_END
        runs.append(plain_logs(tmp_path / name))
    first, second = runs
    assert sorted(first) == ["demo-1", "demo-2", "demo-3", "demo-4"]
    assert first.keys() == second.keys()
    for sid in first:
        assert first[sid] == second[sid], sid
