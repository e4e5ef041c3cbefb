"""Placement on serving hosts (issue 19 item 3; runtime/serve.py, runtime/delegation/service.py):
with a host serving, a started background child is left to the placement queue, claimed and run
by the serving host, and its settlement reaches the parent's host through the parent's mailbox —
recorded once, with its notice. With no host serving, children run where they are started.

Two runtimes ("hosts") on one in-memory disk (`MemoryLogStore`s and `MemoryMailbox`es on one
`CrashFs`) and one `MemoryPlacements` queue, under `autojump_clock`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import trio
from log_lines import read_all
from subagents.runtime import ScenarioClock, open_runtime
from subagents.runtime.ids import CountingIds
from subagents.runtime.models.script_format import load_script
from subagents.runtime.models.scripted_model import ScriptedModel
from subagents.runtime.serve import ServeStats, serve_placements
from subagents.storage.testing import CrashFs, MemoryLogStore, MemoryMailbox, MemoryPlacements

Json = dict[str, Any]


def _start(label: str, prompt: str) -> Json:
    arguments = {"description": label, "prompt": prompt}
    return {"name": "subagent", "arguments": arguments}


@asynccontextmanager
async def _host(
    tmp_path: Path, fs: CrashFs, mailbox: MemoryMailbox, placements: MemoryPlacements, *agents: Json, ids: str
) -> AsyncIterator[Any]:
    # No stall timeout: the stores work in worker threads, and while a thread works every Trio
    # task is blocked, so the autojump clock may leap past any deadline (`_until` guards hangs).
    model = ScriptedModel(load_script(json.dumps({"agents": list(agents)})), stall_timeout=None)
    async with open_runtime(
        tmp_path,
        model=model,
        clock=ScenarioClock(),
        id_factory=CountingIds(ids),
        log_store=MemoryLogStore(fs=fs, compression="none"),
        mailbox=mailbox,
        placements=placements,
    ) as rt:
        yield rt


async def _until(holds: Callable[[], bool]) -> None:
    """Until `holds()`, looked at every virtual 50 ms (autojump_clock)."""
    with trio.fail_after(600):
        while not holds():
            with trio.move_on_after(0.05):
                await trio.sleep_forever()


def _events(fs: CrashFs, sid: str) -> list[tuple[str, Json]]:
    return [(e.type, msgspec.json.decode(e.data)) for e in read_all(MemoryLogStore(fs=fs, compression="none"), sid)]


async def test_a_serving_host_runs_placed_children_and_their_settlements_reach_the_parent(
    tmp_path: Path, autojump_clock: Any
) -> None:
    fs = CrashFs()
    mine = MemoryMailbox(fs=fs)
    queue = MemoryPlacements("parent-host")
    parent_script = {
        "session": "boss",
        "responses": [
            {"tool_calls": [_start("kid-1", "count the apples"), _start("kid-2", "count the pears")]},
            {"text": "started two"},
            {"text": "noted"},
            {"text": "noted"},
        ],
    }
    kids = [{"label": f"kid-{i}", "responses": [{"text": f"{i} counted"}]} for i in (1, 2)]
    async with (
        _host(tmp_path, fs, mine, queue, parent_script, ids="p") as here,
        _host(tmp_path, fs, mine.sibling(), queue.sibling("serve-host"), *kids, ids="s") as there,
        trio.open_nursery() as nursery,
    ):
        stats: ServeStats = await nursery.start(serve_placements, there.subagents, there.subagents.placements, 2)
        boss = await here.agents.create(session_id="boss")
        await boss.send("split the work")
        await here.subagents.wait_tree_idle(boss)
        assert stats.adopted == 2 and stats.finished == 2 and not stats.running
        nursery.cancel_scope.cancel()

    boss_events = _events(fs, "boss")
    catalog = [d["child_id"] for t, d in boss_events if t == "subagent/catalog"]
    settled = [d for t, d in boss_events if t == "subagent/settled"]
    assert sorted(d["child_id"] for d in settled) == sorted(catalog) and len(catalog) == 2
    assert all("delivery_id" in d and d["reason_kind"] == "completed" for d in settled)
    for child_id, n in zip(catalog, (1, 2), strict=True):
        kid = _events(fs, child_id)
        (first,) = [d for t, d in kid if t == "user/message"]
        # the same words a child started in place receives: its prompt, then the return guidance
        content = first["message"]["content"]
        assert content[0]["text"] == ("count the apples" if n == 1 else "count the pears")
        assert content[1]["text"].startswith('Your parent agent id is "boss".')
        assert first["message"]["source"] == {"kind": "user"}
        texts = [b["text"] for t, d in kid if t == "assistant/message" for b in d["message"]["content"]]
        assert texts == [f"{n} counted"]
    assert queue.claim(10) == []  # every placement finished


async def test_with_no_host_serving_children_run_where_they_are_started(tmp_path: Path, autojump_clock: Any) -> None:
    fs = CrashFs()
    queue = MemoryPlacements("parent-host")
    script = [
        {"session": "boss", "responses": [{"tool_calls": [_start("kid-1", "go")]}, {"text": "ok"}, {"text": "ok"}]},
        {"label": "kid-1", "responses": [{"text": "done here"}]},
    ]
    async with _host(tmp_path, fs, MemoryMailbox(fs=fs), queue, *script, ids="p") as here:
        boss = await here.agents.create(session_id="boss")
        await boss.send("go")
        await here.subagents.wait_tree_idle(boss)
    (child,) = [d["child_id"] for t, d in _events(fs, "boss") if t == "subagent/catalog"]
    assert any(t == "assistant/message" for t, _ in _events(fs, child))
    assert queue.claim(10) == []  # nothing was ever enqueued
