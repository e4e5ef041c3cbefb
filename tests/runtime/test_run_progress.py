"""`run`'s progress on a terminal (issue 15 item 2): the pure fold over the event stream and its
rich rendering through a fake console, then the real command through a pseudo-terminal (stdlib
`pty`): progress on the terminal while it works, stdout unchanged.
"""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from cli_process import CLI, clean_env, write_script
from rich.console import Console
from scripts import BACKGROUND_CHILD
from subagents.runtime import StreamEvent
from subagents.runtime.run_progress import RunProgress, render_progress
from subagents.storage import make_event

TIMEOUT = 60  # real seconds: only reached if a subprocess hangs


def ev(session_id: str, seq: int, kind: str, data: dict[str, Any]) -> StreamEvent:
    return StreamEvent(session_id, make_event(seq, kind, 1, data))


def catalog(child: str, label: str | None = "helper") -> dict[str, Any]:
    data: dict[str, Any] = {"version": 1, "child_id": child, "child_created_at": 1, "mode": "continuable"}
    if label is not None:
        data["label"] = label
    return data


def fold(*items: StreamEvent) -> RunProgress:
    progress = RunProgress("root")
    for item in items:
        progress.apply(item)
    return progress


STEPS = [
    ([], "root · starting", {}),
    ([ev("root", 0, "turn/start", {"turn": 1})], "root · turn 1 · thinking", {}),
    (
        [
            ev("root", 0, "turn/start", {"turn": 1}),
            ev("root", 1, "tool/call", {"turn": 1, "step": 1, "call_id": "c", "name": "subagent", "arguments": "{}"}),
        ],
        "root · turn 1 · running subagent",
        {},
    ),
    (
        [ev("root", 0, "turn/start", {"turn": 1}), ev("root", 1, "subagent/catalog", catalog("kid"))],
        "root · turn 1 · thinking · 1 child working",
        {"kid": "starting"},
    ),
    (
        [
            ev("root", 1, "subagent/catalog", catalog("kid")),
            ev("root", 2, "subagent/catalog", catalog("kid2", None)),
            ev("kid", 0, "turn/start", {"turn": 1}),
        ],
        "root · starting · 2 children working",
        {"kid": "running", "kid2": "starting"},
    ),
    (
        [
            ev("root", 1, "subagent/catalog", catalog("kid")),
            ev("kid", 0, "turn/start", {"turn": 1}),
            ev("kid", 1, "turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
        ],
        "root · starting",
        {"kid": "idle"},
    ),
    (
        [
            ev("root", 1, "subagent/catalog", catalog("kid")),
            ev("kid", 0, "turn/start", {"turn": 1}),
            ev("kid", 1, "turn/end", {"turn": 1, "reason": {"kind": "error", "message": "x"}}),
            ev("root", 2, "subagent/settled", {"child_id": "kid", "reason_kind": "error"}),
            ev("root", 3, "turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
        ],
        "root · turn 1 · done",
        {"kid": "settled: error"},
    ),
    (
        [ev("root", 3, "turn/end", {"turn": 2, "reason": {"kind": "aborted", "cause": "user"}})],
        "root · turn 2 · ended aborted",
        {},
    ),
    (  # a grandchild hangs below its parent; events of unknown sessions change nothing
        [
            ev("root", 1, "subagent/catalog", catalog("kid")),
            ev("kid", 3, "subagent/catalog", catalog("grand", "deep")),
            ev("stranger", 0, "turn/start", {"turn": 1}),
        ],
        "root · starting · 2 children working",
        {"kid": "starting", "grand": "starting"},
    ),
]


@pytest.mark.parametrize(("items", "line", "children"), STEPS)
def test_the_fold(items: list[StreamEvent], line: str, children: dict[str, str]) -> None:
    progress = fold(*items)
    assert progress.status_line() == line
    assert {c.id: c.state for c in progress.children.values()} == children


def test_the_render_shows_the_status_line_and_the_child_tree() -> None:
    progress = fold(
        ev("root", 0, "turn/start", {"turn": 1}),
        ev("root", 1, "subagent/catalog", catalog("kid")),
        ev("kid", 0, "turn/start", {"turn": 1}),
        ev("kid", 3, "subagent/catalog", catalog("grand", "deep")),
    )
    out = io.StringIO()
    Console(file=out, width=100, force_terminal=False, color_system=None).print(render_progress(progress))
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    assert lines[0].endswith("root · turn 1 · thinking · 2 children working")
    assert lines[1] == "root"
    assert lines[2].endswith("kid [running] — helper")
    assert lines[3].endswith("grand [starting] — deep") and lines[3].index("grand") > lines[2].index("kid")


SCRIPT = BACKGROUND_CHILD


def run_on_a_terminal(tmp_path: Path, script: Any, *args: str) -> tuple[int, str, str]:
    """`subagents run` with stderr on a pseudo-terminal and stdout on a pipe: (status, stdout,
    everything the terminal received)."""
    model = write_script(tmp_path / "s.json", script)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*CLI, "run", "--root", str(tmp_path / "root"), "--model", model, *args],
        cwd=tmp_path,
        env=clean_env(TERM="xterm-256color", COLUMNS="120", LINES="40"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)
    seen = bytearray()
    deadline = time.monotonic() + TIMEOUT  # a hang guard only
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        stdout = proc.communicate(timeout=TIMEOUT)[0].decode()
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stdout, seen.decode(errors="replace")


@pytest.mark.slow
def test_run_on_a_terminal_shows_progress_on_stderr_and_keeps_stdout(tmp_path: Path) -> None:
    status, stdout, terminal = run_on_a_terminal(tmp_path, SCRIPT, "go")
    assert status == 0, terminal
    assert stdout == "NOTED\n"
    assert "session " in terminal
    # The status line and the live tree: the child under its label, and its settlement.
    assert "turn 1" in terminal
    assert "— helper" in terminal
    assert "[settled: completed] — helper" in terminal  # every batch of events is drawn
    assert "Traceback" not in terminal
