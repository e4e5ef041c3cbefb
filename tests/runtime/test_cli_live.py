"""Sessions another process is running are shown as live (issue 13, item 4).

A `subagents run` in a subprocess starts a background child whose scripted model hangs, so the
parent and the child stay held by that process. The read-only commands, run here in-process
against the same root, must say so: `show` prints no synthetic closers and marks the session
`live in another process`, `children` reports the child `running`, `agents` renders it
`running`, `sessions` marks both live. Once the process is killed they are not live any more
(and `show` closes the interrupted turn in memory, as for any crashed log).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import zstandard
from cli_process import CLI, clean_env, write_script
from descriptors import descriptor
from drafts import descriptor_draft, turn_start
from log_lines import header, plain_bytes, session_folder
from subagents.runtime.hosts.cli import main
from subagents.storage.locks import held_flocks

TIMEOUT = 60.0  # real seconds: only reached if the subprocess never gets ready

SCRIPT = {
    "agents": [
        {
            "session": "parent",
            "responses": [
                {"tool_calls": [{"name": "subagent", "arguments": {"description": "Busy", "prompt": "work"}}]},
                {"text": "started"},
            ],
        },
        {"label": "Busy", "responses": [{"hang": True}]},
    ]
}


def log_records(root: Path, session_id: str) -> list[dict[str, Any]]:
    """The complete lines of a session's log, straight from its file (a torn tail is skipped)."""
    [log] = [p for p in session_folder(root, session_id).iterdir() if p.name.startswith("session.jsonl")]
    try:
        data = plain_bytes(log)
    except zstandard.ZstdError:
        return []  # a frame being written: look again
    return [json.loads(line) for line in data.split(b"\n")[:-1]]


def session_ids(root: Path) -> list[str]:
    """The ids of the published sessions (a folder with a log file)."""
    ids = []
    for folder in (root / "sessions").iterdir():
        if any(p.name.startswith("session.jsonl") for p in folder.iterdir()):
            records = log_records(root, folder.name)
            if records:
                ids.append(records[0]["id"])
    return ids


def _wait_until_running(root: Path, process: subprocess.Popen[str]) -> str:
    """The child's id, once the child's log holds its turn/start (its model call is then hung
    and its writer, like the parent's, holds the lock). A bounded poll of the files the other
    process writes: there is no event to wait on across processes."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        assert process.poll() is None, process.communicate()
        children = [sid for sid in session_ids(root) if sid != "parent"] if (root / "sessions").is_dir() else []
        if children:
            records = log_records(root, children[0])
            if any(r.get("type") == "turn/start" for r in records[1:]):
                return children[0]
        assert time.monotonic() < deadline, "the run never started its child"
        time.sleep(0.02)


def _assert_lock_held(root: Path, session_id: str) -> None:
    # Only once the log exists (its writer published it holding the lock) may a test peek like
    # this: a shared lock taken earlier could refuse the writer's exclusive one.
    fd = os.open(session_folder(root, session_id) / "lock", os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out


def test_a_running_process_shows_as_live_until_it_is_killed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    model = write_script(tmp_path / "script.json", SCRIPT)
    process = subprocess.Popen(
        [*CLI, "run", "--root", str(root), "--session", "parent", "--model", model, "delegate"],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        child = _wait_until_running(root, process)
        _assert_lock_held(root, "parent")
        _assert_lock_held(root, child)
        r = str(root)

        shown = _cli(capsys, "show", child, "--root", r)
        assert shown.splitlines()[0] == "── live in another process (its last turn may still be running)"
        assert "end of turn" not in shown  # no synthetic closers for a turn that is still running
        entries = json.loads(_cli(capsys, "show", child, "--json", "--root", r))
        assert entries[0] == {"type": "live-elsewhere"}
        assert [e["type"] for e in entries if e["type"].startswith("turn/")] == ["turn/start"]
        assert "live in another process" in _cli(capsys, "show", "parent", "--root", r)

        rows = {row["id"]: row for row in json.loads(_cli(capsys, "sessions", "--json", "--root", r))}
        # Issue 29: who runs them, from the lock table (the `run` process's pid).
        runner = f"pid {process.pid}"
        assert {sid: (row["live"], row["live_elsewhere"], row["runner"]) for sid, row in rows.items()} == {
            "parent": (True, True, runner),
            child: (True, True, runner),
        }
        table = _cli(capsys, "sessions", "--root", r).splitlines()
        assert all(f"live ({runner})" in line for line in table[1:]) and len(table) == 3

        [row] = json.loads(_cli(capsys, "children", "parent", "--json", "--root", r))
        assert (row["id"], row["activity"], row["mode"], row["runner"]) == (child, "running", "continuable", runner)
        assert row.get("liveness") is None  # its turn runs and made progress just now
        assert _cli(capsys, "agents", "parent", "--root", r) == f"{child} [running] — Busy\n"

        # The parent is live but between turns (it waits for its child): nothing was running.
        said = _cli(capsys, "interrupt", "parent", "--root", r).splitlines()
        assert said[0].startswith("interrupt ") and said[0].endswith(
            " delivered to session parent (live in another process, which records it)"
        )
        assert said[1:] == ["session parent was idle: nothing was running (no turn was open to interrupt)"]
        assert rows == {row["id"]: row for row in json.loads(_cli(capsys, "sessions", "--json", "--root", r))}
    finally:
        process.send_signal(signal.SIGKILL)
        _, err = process.communicate(timeout=TIMEOUT)
    assert err == "session parent\n"  # named before the work started, nothing else

    r = str(root)
    shown = _cli(capsys, "show", child, "--root", r)
    assert "live in another process" not in shown
    assert shown.splitlines()[-1] == "── end of turn 1: interrupted"  # closed in memory, as after a crash
    rows: dict[str, Any] = {row["id"]: row for row in json.loads(_cli(capsys, "sessions", "--json", "--root", r))}
    assert {sid: (row["live"], row["live_elsewhere"]) for sid, row in rows.items()} == {
        "parent": (False, False),
        child: (False, False),
    }
    [row] = json.loads(_cli(capsys, "children", "parent", "--json", "--root", r))
    # Issue 29: killed mid-turn, its runner gone: orphaned, never running (nor plain ready).
    assert (row["activity"], row["liveness"], "runner" in row) == ("inactive", "orphaned", False)
    assert _cli(capsys, "agents", "parent", "--root", r) == f"{child} [orphaned] — Busy\n"


# --- the same, below the CLI: a writer of another store on the same data -------------------


def _parent_and_child(store: Any) -> Any:
    """A parent and a continuable child, published; the child's write handle is returned open,
    as another process running it would hold it (its turn 1 still open)."""
    from subagents.storage import Batch, make_event

    parent = store.create(header("p", 1))
    store.append(parent, [Batch(0, [make_event(0, "turn/start", 1, {"turn": 1})])])
    store.close(parent)
    child = store.create(header("c", 2, parent_session="p", origin="subagent"))
    busy = descriptor("Busy")
    store.append(
        child, [Batch(0, [make_event(0, "subagent/descriptor", 2, busy), make_event(1, "turn/start", 2, {"turn": 1})])]
    )
    return child


_HOLDER = """
import sys
from subagents.storage import FileLogStore
handle = FileLogStore(sys.argv[1]).open_write(sys.argv[2])
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


class _OtherProcess:
    """A writer holding session `c` of a file store from another process, until `close`."""

    def __init__(self, root: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(root), "c"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None and self.process.stdout.readline() == "held\n"

    def close(self, _handle: object = None) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=TIMEOUT)


@pytest.mark.parametrize("kind", ["memory", "file"])
async def test_listing_and_observation_see_a_writer_elsewhere(kind: str, tmp_path: Path) -> None:
    from subagents.runtime.app import open_runtime
    from subagents.storage import FileLogStore
    from subagents.storage.testing import MemoryLogStore

    writer: Any
    if kind == "memory":  # another store on the same in-memory data: it has no processes
        writer = MemoryLogStore()
        reader: Any = MemoryLogStore(fs=writer.crash_fs)
        handle = _parent_and_child(writer)
    else:
        assert held_flocks() is not None, "this suite runs on Linux, where /proc/locks is readable"
        reader = FileLogStore(str(tmp_path))
        reader.close(_parent_and_child(reader))
        writer, handle = _OtherProcess(tmp_path), None
    try:
        async with open_runtime(tmp_path, log_store=reader) as rt:
            [row] = await rt.listing.list_children("p")
            assert (row.id, row.activity) == ("c", "running")
            async with rt.query.observe_session("c") as seen:
                assert seen.held and [e.type for e in seen.events] == ["subagent/descriptor", "turn/start"]
            records = await rt.query.list_sessions(probe_locks=True)
            assert [(r.id, r.held) for r in records] == [("c", True), ("p", False)]
            assert not any(r.held for r in await rt.query.list_sessions())  # only when asked
            writer.close(handle)
            [row] = await rt.listing.list_children("p")
            assert row.activity == "inactive"
            async with rt.query.observe_session("c") as seen:
                assert not seen.held and seen.events[-1].type == "turn/end"  # closed in memory
    finally:
        if kind == "file":
            writer.close()


async def test_list_agents_renders_a_child_held_elsewhere_as_running(tmp_path: Path) -> None:
    import msgspec
    from subagents.runtime.app import open_runtime
    from subagents.runtime.foundation.clock import ScenarioClock
    from subagents.runtime.testing.script_format import load_script
    from subagents.runtime.testing.scripted_model import ScriptedModel
    from subagents.storage import Batch, make_event
    from subagents.storage.testing import MemoryLogStore

    writer = MemoryLogStore()
    reader = MemoryLogStore(fs=writer.crash_fs)
    child = writer.create(header("c", 2, parent_session="p", origin="subagent"))
    busy = descriptor("Busy")
    writer.append(child, [Batch(0, [make_event(0, "subagent/descriptor", 2, busy)])])
    script = {
        "agents": [
            {
                "session": "p",
                "responses": [
                    {"tool_calls": [{"name": "list_agents", "arguments": {}}]},
                    {"text": "done"},
                    {"tool_calls": [{"name": "list_agents", "arguments": {}}]},
                    {"text": "done"},
                ],
            }
        ]
    }
    async with open_runtime(
        tmp_path, model=ScriptedModel(load_script(json.dumps(script))), clock=ScenarioClock(), log_store=reader
    ) as rt:
        parent = await rt.agents.create(session_id="p")
        await parent.send("list them")
        await parent.wait_idle()
        writer.close(child)  # the other process ends
        await parent.send("list them again")
        await parent.wait_idle()
        handle = reader.open_read("p")
        events = list(reader.read(handle))
        reader.close(handle)
    results = [msgspec.json.decode(e.data) for e in events if e.type == "tool/result"]
    texts = [r["message"]["content"][0]["content"][0]["text"] for r in results]
    assert texts == ["c [running] — Busy", "c [ready] — Busy"]


async def test_a_child_the_checkpoint_rung_answers_is_running_while_held_elsewhere(tmp_path: Path) -> None:
    """The checkpoint rung reads no log, so the lock probe rides along: a child with checkpoint
    rows whose lock a writer elsewhere holds lists as running, without being observed."""
    import itertools

    from subagents.actors import open_session_store
    from subagents.runtime.app import open_runtime
    from subagents.runtime.delegation.units import SUBAGENT_UNITS
    from subagents.storage.projection import ProjectionRegistry
    from subagents.storage.testing import FaultyLogStore, MemoryLogStore

    memory = MemoryLogStore()  # one store: its in-memory lock table has no processes, any holder counts
    clock = itertools.count(1)
    async with open_session_store(memory, ProjectionRegistry(SUBAGENT_UNITS), now_ms=lambda: next(clock)) as sessions:
        await sessions.create(header("p", 1))
        ref = await sessions.create(header("c", 2, parent_session="p", origin="subagent"))
        await ref.append([descriptor_draft("Busy")])
        await ref.append([turn_start(1)])
        await sessions.release("c")  # checkpoint rows written
        await sessions.release("p")
    handle = memory.open_write("c")  # the writer elsewhere
    faulty = FaultyLogStore(memory)  # counts the reads
    async with open_runtime(tmp_path, log_store=faulty) as rt:
        [row] = await rt.listing.list_children("p")
        assert (row.id, row.activity, row.label) == ("c", "running", "Busy")
        assert faulty.calls["read"] == 0  # answered by the checkpoint rows, not observed
        memory.close(handle)
        [row] = await rt.listing.list_children("p")
        assert row.activity == "inactive"
