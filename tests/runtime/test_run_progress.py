"""`run`'s progress on a terminal (issue 15 item 2): the pure fold over the event stream and its
rich rendering through a fake console, then the real command through a pseudo-terminal (stdlib
`pty`): progress on the terminal while it works, stdout unchanged, and after Ctrl-C a screen
with no status line or tree left on it (a small screen model replays what the terminal got).
"""

from __future__ import annotations

import io
import os
import pty
import re
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_process import CLI, clean_env, write_script
from log_lines import log_file
from rich.console import Console
from scripts import BACKGROUND_CHILD
from subagents.runtime import StreamEvent
from subagents.runtime.hosts.run_progress import RunProgress, ago, child_line, render_progress
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
        "root · turn 2 · ended aborted (user)",
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


def test_each_child_keeps_its_last_action_and_when_and_the_line_says_how_long_ago() -> None:
    def at(session_id: str, seq: int, kind: str, data: dict[str, Any], time: int) -> StreamEvent:
        return StreamEvent(session_id, make_event(seq, kind, time, data))

    call = {"turn": 1, "step": 1, "call_id": "c", "name": "grep", "arguments": "{}"}
    progress = fold(
        ev("root", 1, "subagent/catalog", catalog("kid")),
        at("kid", 0, "turn/start", {"turn": 1}, 1_000),
        at("kid", 1, "tool/call", call, 5_000),
    )
    kid = progress.children["kid"]
    assert (kid.state, kid.last, kid.last_at) == ("running", "called grep", 5_000)
    assert child_line(kid) == "kid [running] — helper"  # no clock: no time (run's display)
    assert child_line(kid, now_ms=17_400) == "kid [running] — helper · called grep, 12s ago"
    # Issue 29: no durable progress for longer than stall_after (default 5 minutes): stalled.
    assert child_line(kid, now_ms=5_000 + 300_000) == "kid [running] — helper · called grep, 5m ago"
    assert child_line(kid, now_ms=5_001 + 300_000) == "kid [stalled] — helper · called grep, 5m ago"
    assert child_line(kid, now_ms=5_001 + 300_000, stall_after_ms=600_000) == (
        "kid [running] — helper · called grep, 5m ago"
    )
    progress.apply(at("kid", 2, "turn/end", {"turn": 1, "reason": {"kind": "aborted", "cause": "user"}}, 20_000))
    progress.apply(at("root", 2, "subagent/settled", {"child_id": "kid", "reason_kind": "aborted"}, 20_500))
    assert child_line(kid, now_ms=20_000 + 3 * 3_600_000) == (
        "kid [settled: aborted] — helper · ended its turn (aborted), 3h ago"
    )
    assert [ago(ms) for ms in (-5, 999, 1_000, 59_999, 60_000, 7_200_000, 2 * 86_400_000)] == [
        "just now",
        "just now",
        "1s ago",
        "59s ago",
        "1m ago",
        "2h ago",
        "2d ago",
    ]


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


def run_on_a_terminal(
    tmp_path: Path,
    script: Any,
    *args: str,
    interrupt_at: str | None = None,
    again_when: Callable[[], bool] | None = None,
) -> tuple[int, str, str]:
    """`subagents run` with stderr on a pseudo-terminal and stdout on a pipe (read only once
    the run has ended): (status, stdout, everything the terminal received). `interrupt_at`:
    send SIGINT as soon as the terminal has shown this text; `again_when`: after that, send a
    second SIGINT once it returns True (checked as the terminal is read)."""
    model = write_script(tmp_path / "s.json", script)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*CLI, "run", "--root", str(tmp_path / "root"), "--model", model, *args],
        cwd=tmp_path,
        env=clean_env(TERM="xterm-256color", COLUMNS="120", LINES="40"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        # A child of a non-interactive shell may inherit SIGINT ignored: give it the default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    os.close(slave)
    seen = bytearray()
    deadline = time.monotonic() + TIMEOUT  # a hang guard only
    try:
        while time.monotonic() < deadline:
            if interrupt_at is None and again_when is not None and again_when():
                proc.send_signal(signal.SIGINT)
                again_when = None
            ready, _, _ = select.select([master], [], [], 1.0 if again_when is None else 0.01)
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
            if interrupt_at is not None and interrupt_at.encode() in seen:
                proc.send_signal(signal.SIGINT)
                interrupt_at = None
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


_CONTROL = re.compile(rb"\x1b\[([?0-9;]*)([A-Za-z])|([\r\n])|([^\x1b\r\n]+)")


def screen(received: str) -> tuple[list[str], bool]:
    """What a terminal shows after `received`: its non-empty lines, and whether the cursor is
    visible. Models the controls rich's live display writes: carriage return, line feed,
    cursor up (`CSI n A`), erase line (`CSI 2K`), cursor shown/hidden (`CSI ?25h/l`); colours
    and any other control are ignored."""
    lines: list[str] = [""]
    row, col, visible = 0, 0, True
    for match in _CONTROL.finditer(received.encode()):
        params, final, newline, text = match.groups()
        if text is not None:
            chars = text.decode(errors="replace")
            line = lines[row].ljust(col)
            lines[row] = line[:col] + chars + line[col + len(chars) :]
            col += len(chars)
        elif newline == b"\r":
            col = 0
        elif newline == b"\n":
            row += 1
            if row == len(lines):
                lines.append("")
        elif final == b"A":
            row = max(0, row - int(params or b"1"))
        elif final == b"K" and params == b"2":
            lines[row] = ""
        elif params == b"?25" and final in (b"h", b"l"):
            visible = final == b"h"
    return [line.rstrip() for line in lines if line.strip()], visible


def test_the_screen_model() -> None:
    assert screen("a\r\nbc\r\x1b[2Kd\r\n") == (["a", "d"], True)
    assert screen("x\r\n\x1b[?25ls1\r\ns2\r\n\x1b[?25h\r\x1b[1A\x1b[2K\x1b[1A\x1b[2Kdone\r\n") == (["x", "done"], True)
    assert screen("\x1b[?25l\x1b[2mtree\x1b[0m") == (["tree"], False)


# A parent that starts a background child and then waits on its model; the child's model hangs.
CHILD_HANGS = {
    "agents": [
        {
            "responses": [
                {"tool_calls": [{"name": "subagent", "arguments": {"description": "helper", "prompt": "do it"}}]},
                {"hang": True},
            ]
        },
        {"label": "helper", "responses": [{"hang": True}]},
    ]
}


@pytest.mark.slow
def test_ctrl_c_on_a_terminal_follows_the_drain_then_leaves_a_clean_screen(tmp_path: Path) -> None:
    status, stdout, terminal = run_on_a_terminal(
        tmp_path, CHILD_HANGS, "--session", "p1", "go", interrupt_at="[running] — helper"
    )
    assert status == 130, terminal
    assert stdout == ""
    assert "Traceback" not in terminal
    # The display followed the drain: the root's turn ended aborted and the child settled.
    assert "turn 1 · ended aborted (user)" in terminal
    assert "[settled: aborted] — helper" in terminal
    # Then it was taken down: no status line or tree is left half-drawn, the cursor is back.
    assert screen(terminal) == (["session p1", "subagents: the turn ended aborted (user)"], True)


@pytest.mark.slow
def test_a_second_ctrl_c_on_a_terminal_also_leaves_a_clean_screen(tmp_path: Path) -> None:
    # `run --stream` into a pipe nobody reads yet (the prompt's line is larger than a pipe
    # holds), progress on the terminal: after the first Ctrl-C has drained, the run waits for
    # stdout's reader; the second leaves at once, and the display is taken down all the same.
    log = log_file(tmp_path / "root", "s1")
    status, stdout, terminal = run_on_a_terminal(
        tmp_path,
        {"agents": [{"responses": [{"hang": True}]}]},
        *("--session", "s1", "--compression", "none", "--stream", "x" * 120_000),
        interrupt_at="thinking",
        again_when=lambda: b'"reason":{"kind":"aborted","cause":"user"}' in log.read_bytes(),
    )
    assert status == 130, terminal
    assert "Traceback" not in terminal
    assert screen(terminal) == (
        ["session s1", "subagents: interrupted again: stopped without waiting for the rest"],
        True,
    )
    assert '"type":"result"' not in stdout
