"""`subagents stop ID --tree` across processes (issue 27, item 5): a `chat` hosts a root A whose
background child B started a background child C; the operator's `stop B --tree` (another
process) stops B and C for good. Then the host is SIGKILLed and the root resumed by a new
process: nothing in the stopped subtree runs again, each is settled once; a later `send` to B
starts it again (an explicit message clears its marker), and C stays stopped.

Every wait is on another process's output or on the files it writes, bounded by `TIMEOUT` real
seconds that only a hang reaches."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from chat_driver import TIMEOUT, Chat
from cli_process import CLI, clean_env, write_script

Json = dict[str, Any]


def _cli(root: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args[:1], "--root", root, *args[1:]],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=cwd,
    )


def _log(root: str, sid: str) -> list[Json]:
    done = _cli(root, "tail", sid)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _until(holds: Callable[[], bool], what: str) -> None:
    """A bounded poll of files another process writes (no event crosses processes)."""
    deadline = time.monotonic() + TIMEOUT
    while not holds():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def _types(events: list[Json]) -> list[str]:
    return [e["type"] for e in events]


def _started(events: list[Json]) -> list[str]:
    """The ids of the children the session's `subagent` calls started."""
    out = []
    for e in events:
        if e["type"] == "tool/result":
            for block in e["data"]["message"]["content"]:
                for part in block.get("content", []):
                    m = re.fullmatch(r"started subagent (\S+)", part.get("text") or "")
                    if m:
                        out.append(m.group(1))
    return out


def _spawn(label: str) -> Json:
    return {"tool_calls": [{"name": "subagent", "arguments": {"description": label, "prompt": "work"}}]}


@pytest.mark.slow  # four processes: a chat host, the operator's stop, a restarted host, a send
def test_stop_tree_stops_a_subtree_for_good_across_processes_and_a_send_starts_it_again(tmp_path: Path) -> None:
    (tmp_path / "subagents.toml").write_text("max_depth = 2\n")
    script = {
        "agents": [
            {"responses": [_spawn("Mid"), {"text": "started it"}, {"text": "noted the settlement"}]},
            {"label": "Mid", "responses": [_spawn("Leaf"), {"hang": True}]},
            {"label": "Leaf", "responses": [{"hang": True}]},
        ]
    }
    chat = Chat(tmp_path, script)
    root_id = chat.expect(r"^session (\S+) \(/help for commands\)$").group(1)
    chat.line("start the tree")
    mid = chat.expect(r"^  ← started subagent (\S+)$").group(1)
    chat.expect(r"^assistant: started it$")
    _until(lambda: bool(_started(_log(chat.root, mid))), "the middle child started its own child")
    (leaf,) = _started(_log(chat.root, mid))
    _until(lambda: "turn/start" in _types(_log(chat.root, leaf)), "the leaf's turn started")

    stop = _cli(chat.root, "stop", mid, "--tree")
    assert (stop.returncode, stop.stderr) == (0, ""), stop
    assert stop.stdout == f"stopped 2 sessions: {mid} and its descendants {leaf}\n"
    chat.expect(r"^assistant: noted the settlement$")  # the root heard of its child once
    chat.proc.send_signal(signal.SIGKILL)
    chat.proc.wait(timeout=TIMEOUT)

    before = {sid: _log(chat.root, sid) for sid in (mid, leaf)}
    # The middle child's marker records the delivery of the stop; its host stopped the leaf with it.
    (mid_marker,) = [e["data"] for e in before[mid] if e["type"] == "session/stopped"]
    assert mid_marker == {"by": "operator", "tree": True, "delivery_id": mid_marker["delivery_id"]}
    assert re.fullmatch(r"[0-9A-Z]{26}", mid_marker["delivery_id"])
    assert [e["data"] for e in before[leaf] if e["type"] == "session/stopped"] == [{"by": "operator", "tree": True}]
    for events in before.values():
        assert [e["data"]["reason"] for e in events if e["type"] == "turn/end"] == [
            {"kind": "aborted", "cause": "user"}
        ]
    shown = _cli(chat.root, "show", mid)
    assert shown.returncode == 0, shown.stderr
    assert "── stopped by operator with its tree: nothing resumes it until a new message" in shown.stdout.splitlines()
    settled_in = {
        sid: [e["data"]["child_id"] for e in _log(chat.root, sid) if e["type"] == "subagent/settled"]
        for sid in (root_id, mid)
    }
    assert settled_in == {root_id: [mid], mid: [leaf]}  # each settled once

    # Stopped already: said, and nothing more written.
    twice = _cli(chat.root, "stop", mid, "--tree")
    assert (twice.returncode, twice.stdout) == (
        0,
        f"stopped 2 sessions: {mid} and its descendants {leaf} (2 of them stopped already)\n",
    ), twice
    assert {sid: _log(chat.root, sid) for sid in (mid, leaf)} == before

    # The host is gone; a new one resumes the root (its own new prompt): nothing below it runs.
    again = write_script(tmp_path / "again.json", {"agents": [{"responses": [{"text": "root again"}]}]})
    rerun = _cli(chat.root, "run", "--model", again, "--session", root_id, "hello again", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.strip() == "root again"
    assert {sid: _log(chat.root, sid) for sid in (mid, leaf)} == before
    assert [e["data"]["child_id"] for e in _log(chat.root, root_id) if e["type"] == "subagent/settled"] == [mid]

    # An explicit message to the stopped child starts it again; its own stopped child stays so.
    back = write_script(tmp_path / "back.json", {"agents": [{"responses": [{"text": "back at work"}]}]})
    sent = _cli(chat.root, "send", "--model", back, mid, "resume please", cwd=tmp_path)
    assert sent.returncode == 0, sent.stderr
    assert "back at work" in sent.stdout
    after = _log(chat.root, mid)
    new = after[len(before[mid]) :]
    said = [e["data"]["message"] for e in new if e["type"] == "user/message"]
    assert [(m["source"], m["content"][-1]["text"]) for m in said] == [({"kind": "user"}, "resume please")]
    assert [e["data"]["reason"] for e in new if e["type"] == "turn/end"] == [{"kind": "completed"}]
    assert _log(chat.root, leaf) == before[leaf]
