"""Placement on serving hosts (issue 19 item 3; runtime/hosts/serve.py, runtime/delegation/service.py):
with a host serving, a started background child is left to the placement queue, claimed and run
by the serving host, and its settlement reaches the parent's host through the parent's mailbox —
recorded once, with its notice. With no host serving, children run where they are started.

Two runtimes ("hosts") on one in-memory disk (`MemoryLogStore`s and `MemoryMailbox`es on one
`CrashFs`) and one `MemoryPlacements` queue, under `autojump_clock` (tests/helpers/memory_hosts.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from clocks import until_virtual
from log_lines import memory_events
from memory_hosts import memory_host, two_hosts
from subagents.runtime.hosts.serve import ServeStats, serve_placements
from subagents.storage.testing import CrashFs, MemoryMailbox, MemoryPlacements

Json = dict[str, Any]


def _start(label: str, prompt: str) -> Json:
    arguments = {"description": label, "prompt": prompt}
    return {"name": "subagent", "arguments": arguments}


async def test_a_serving_host_runs_placed_children_and_their_settlements_reach_the_parent(
    tmp_path: Path, autojump_clock: Any
) -> None:
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
    async with two_hosts(tmp_path, [parent_script], kids) as hosts:
        stats = await hosts.serve(2)
        here = hosts.here
        boss = await here.agents.create(session_id="boss")
        await boss.send("split the work")
        await here.subagents.wait_tree_idle(boss)
        await until_virtual(lambda: stats.finished == 2)  # a placement is finished after its settlement
        assert stats.adopted == 2 and not stats.running
    fs, queue = hosts.fs, hosts.queue

    boss_events = memory_events(fs, "boss")
    catalog = [d["child_id"] for t, d in boss_events if t == "subagent/catalog"]
    settled = [d for t, d in boss_events if t == "subagent/settled"]
    assert sorted(d["child_id"] for d in settled) == sorted(catalog) and len(catalog) == 2
    assert all("delivery_id" in d and d["reason_kind"] == "completed" for d in settled)
    for child_id, n in zip(catalog, (1, 2), strict=True):
        kid = memory_events(fs, child_id)
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
    async with memory_host(tmp_path, fs, MemoryMailbox(fs=fs), *script, ids="p", placements=queue) as here:
        boss = await here.agents.create(session_id="boss")
        await boss.send("go")
        await here.subagents.wait_tree_idle(boss)
    (child,) = [d["child_id"] for t, d in memory_events(fs, "boss") if t == "subagent/catalog"]
    assert any(t == "assistant/message" for t, _ in memory_events(fs, child))
    assert queue.claim(10) == []  # nothing was ever enqueued


def _catalogued(fs: CrashFs, parent: str) -> list[str]:
    try:
        return [d["child_id"] for t, d in memory_events(fs, parent) if t == "subagent/catalog"]
    except Exception:  # the parent's log is not published yet: nothing catalogued
        return []


async def test_messages_and_interrupts_reach_a_placed_child_on_its_serving_host(
    tmp_path: Path, autojump_clock: Any
) -> None:
    parent_script = {
        "session": "boss",
        "responses": [{"tool_calls": [_start("kid-1", "wait for word")]}, {"text": "started"}, {"text": "noted"}],
    }
    kid = {
        "label": "kid-1",
        "responses": [{"wait_for": {"steered": True}, "text": "waiting"}, {"text": "got the word"}, {"hang": True}],
    }
    async with two_hosts(tmp_path, [parent_script], [kid]) as hosts:
        stats = await hosts.serve(1)
        fs, here = hosts.fs, hosts.here
        boss = await here.agents.create(session_id="boss")
        await boss.send("go")
        await until_virtual(
            lambda: bool(stats.running) and len(_catalogued(fs, "boss")) == 1
        )  # enqueued before its catalog
        (child_id,) = _catalogued(fs, "boss")
        await here.subagents.send_message(boss, child_id, "the word")
        # Settled and let go on its host before the next message: that message places it again.
        # (One that arrives while the child settles may find its host letting go of it: its turn is
        # then cut and closed by the next resume, and the child settles `aborted` — README.)
        await until_virtual(lambda: any(t == "subagent/settled" for t, _ in memory_events(fs, "boss")))
        await until_virtual(lambda: stats.finished == 1)
        await here.subagents.send_message(boss, child_id, "and now hang")
        await until_virtual(lambda: sum(t == "turn/start" for t, _ in memory_events(fs, child_id)) == 2)
        assert await here.subagents.interrupt(child_id, by=boss) == "requested"
        # settled after each of its two runs
        await until_virtual(lambda: sum(t == "subagent/settled" for t, _ in memory_events(fs, "boss")) == 2)
        await here.subagents.wait_tree_idle(boss)

    kid_events = memory_events(fs, child_id)
    steered = [
        d for t, d in kid_events if t == "user/message" and d["message"]["source"].get("kind") == "agent-message"
    ]
    assert [d["message"]["content"][1]["text"] for d in steered] == ["the word", "and now hang"]
    assert [d["reason"]["kind"] for t, d in kid_events if t == "turn/end"] == ["completed", "aborted"]
    settled = [d for t, d in memory_events(fs, "boss") if t == "subagent/settled"]
    assert [(d["child_id"], d["reason_kind"]) for d in settled] == [(child_id, "completed"), (child_id, "aborted")]


async def test_placed_children_count_against_the_family_limit(tmp_path: Path, autojump_clock: Any) -> None:
    parent_script = {
        "session": "boss",
        "responses": [{"tool_calls": [_start("kid-1", "a"), _start("kid-2", "b")]}, {"text": "ok"}, {"text": "ok"}],
    }
    kid = {"label": "kid-1", "responses": [{"text": "done"}]}
    async with two_hosts(tmp_path, [parent_script], [kid], max_active_subagents=1) as hosts:
        await hosts.serve(4)
        boss = await hosts.here.agents.create(session_id="boss")
        await boss.send("go")
        await hosts.here.subagents.wait_tree_idle(boss)
    fs = hosts.fs
    results = [d for t, d in memory_events(fs, "boss") if t == "tool/result"]
    texts = [json.dumps(d["message"]) for d in results]
    assert len(_catalogued(fs, "boss")) == 1
    assert sum("subagent limit reached (active child limit: 1)" in text for text in texts) == 1, texts


async def test_a_placement_that_cannot_be_served_is_dropped_and_the_host_serves_on(
    tmp_path: Path, autojump_clock: Any
) -> None:
    async with two_hosts(tmp_path, [{"session": "plain", "responses": []}], [{"responses": []}]) as hosts:
        stats = await hosts.serve(1)
        plain = await hosts.here.agents.create(session_id="plain")  # a root session, no subagent
        await hosts.here.agents.stop(plain.session_id)
        hosts.queue.enqueue("plain")
        hosts.queue.enqueue("no-such-session")
        await until_virtual(lambda: stats.refused == 2)
        assert stats.adopted == 0 and hosts.queue.claim(10) == []


async def test_claims_of_a_host_that_is_gone_are_served_by_another(tmp_path: Path, autojump_clock: Any) -> None:
    parent_script = {"session": "boss", "responses": [{"tool_calls": [_start("kid-1", "go")]}, {"text": "ok"}]}
    kid = {"label": "kid-1", "responses": [{"text": "done"}]}
    async with two_hosts(tmp_path, [parent_script], [kid]) as hosts:
        fs, here = hosts.fs, hosts.here
        dead = hosts.queue.sibling("dead-host")
        dead.serve(1)
        boss = await here.agents.create(session_id="boss")
        await boss.send("go")
        await until_virtual(lambda: len(_catalogued(fs, "boss")) == 1)
        await until_virtual(lambda: dead.claim(1) != [])  # the dead host claimed it...
        # ...another host serves (before the dead one goes: with no host serving, the stand-in
        # would take its placement back after a while and run the child itself)...
        stats = await hosts.serve(1)
        dead.close()  # ...and the dead host dies
        await here.subagents.wait_tree_idle(boss)
        assert stats.reclaimed == 1 and stats.adopted == 1
    (settled,) = [d for t, d in memory_events(fs, "boss") if t == "subagent/settled"]
    assert settled["reason_kind"] == "completed"


async def test_a_host_that_serves_runs_its_own_placed_children_in_place_of_their_stand_ins(
    tmp_path: Path, autojump_clock: Any
) -> None:
    fs = CrashFs()
    queue = MemoryPlacements("only-host")
    script = [
        {"session": "boss", "responses": [{"tool_calls": [_start("kid-1", "go")]}, {"text": "ok"}, {"text": "ok"}]},
        {"label": "kid-1", "responses": [{"text": "done here"}]},
    ]
    async with (
        memory_host(tmp_path, fs, MemoryMailbox(fs=fs), *script, ids="p", placements=queue) as here,
        trio.open_nursery() as nursery,
    ):
        stats: ServeStats = await nursery.start(serve_placements, here.subagents, queue, 1)
        boss = await here.agents.create(session_id="boss")
        await boss.send("go")
        await here.subagents.wait_tree_idle(boss)
        await until_virtual(lambda: stats.finished == 1)
        assert stats.adopted == 1
        nursery.cancel_scope.cancel()
    (settled,) = [d for t, d in memory_events(fs, "boss") if t == "subagent/settled"]
    assert settled["reason_kind"] == "completed" and "delivery_id" not in settled  # recorded in place
    left = queue.claim(10)
    if left:
        print("LEFT", left, stats, [(t, d) for t, d in memory_events(fs, left[0].session_id)])
    assert left == []


def test_the_run_key_names_a_child_and_its_last_turn_end() -> None:
    """Both sides of a settlement (the host settling, the parent recording) compute the key from
    the child's log with `run_key_of`: the same log gives the same key."""
    import msgspec
    from subagents.runtime.delegation.run_key import run_key_of
    from subagents.storage import Event

    def event(seq: int, kind: str) -> Event:
        data = {"turn/start": {"turn": 1}, "turn/end": {"turn": 1, "reason": {"kind": "completed"}}}[kind]
        return Event(seq=seq, type=kind, time=1, data=msgspec.Raw(msgspec.json.encode(data)))

    assert run_key_of("c1", []) is None
    assert run_key_of("c1", [event(0, "turn/start")]) is None  # no turn ended yet
    log = [event(0, "turn/start"), event(3, "turn/end"), event(4, "turn/start"), event(9, "turn/end")]
    assert run_key_of("c1", log) == "c1@9"
    assert run_key_of("c1", [*log, event(10, "turn/start")]) == "c1@9"  # an open turn: the last run that ended


async def test_a_resumed_child_runs_its_recorded_model_or_is_refused_naming_it(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Issue 27 item 4: the child records the model it ran; another host resuming it builds that
    model with its own credentials (its `model_factory`), or refuses in one line naming it."""
    import pytest
    from subagents.runtime.foundation.errors import ModelSpecError, OptionsNotReapplied
    from subagents.runtime.models.specs import ModelRecord

    fs = CrashFs()
    script = [
        {"session": "boss", "responses": [{"tool_calls": [_start("kid-1", "go")]}, {"text": "ok"}, {"text": "ok"}]},
        {"label": "kid-1", "responses": [{"text": "done here"}, {"text": "again"}]},
    ]
    async with memory_host(tmp_path, fs, MemoryMailbox(fs=fs), *script, ids="p") as here:
        # as if built from `deepseek:chat` (models/specs.py marks the models it builds)
        setattr(here.agents.model, "subagents_model_record", ModelRecord(model="deepseek:chat"))  # noqa: B010  # the mark build_model sets
        boss = await here.agents.create(session_id="boss")
        await boss.send("go")
        await here.subagents.wait_tree_idle(boss)
    (child,) = [d["child_id"] for t, d in memory_events(fs, "boss") if t == "subagent/catalog"]
    recorded = [d for t, d in memory_events(fs, child) if t == "session/model"]
    assert recorded == [{"model": "deepseek:chat"}]

    def lacking(spec: str, base_url: str | None) -> Any:
        raise ModelSpecError("DEEPSEEK_API_KEY is not set (needed for --model deepseek:...)")

    async with memory_host(tmp_path, fs, MemoryMailbox(fs=fs), *script, ids="q", model_factory=lacking) as there:
        with pytest.raises(OptionsNotReapplied, match=r"runs model deepseek:chat, which this host cannot run"):
            await there.agents.resume(child)
    built: list[tuple[str, str | None]] = []
    async with memory_host(tmp_path, fs, MemoryMailbox(fs=fs), *script, ids="r") as there:
        own = there.agents.model

        def factory(spec: str, base_url: str | None) -> Any:
            built.append((spec, base_url))
            return own

        there.agents.model_factory = factory
        await there.agents.resume(child)
    assert built == [("deepseek:chat", None)]


async def test_a_stopped_placed_child_is_never_run_by_the_host_that_claims_it_again(
    tmp_path: Path, autojump_clock: Any
) -> None:
    # Stopped while its claim sat with a host that then died: the serving host that claims it
    # again settles it (its parent hears once) and never runs it, its first prompt unanswered.
    parent_script = {"session": "boss", "responses": [{"tool_calls": [_start("kid-1", "go")]}, {"text": "ok"}]}
    kid = {"label": "kid-1", "responses": [{"text": "done"}]}
    async with two_hosts(tmp_path, [parent_script], [kid]) as hosts:
        fs, here = hosts.fs, hosts.here
        dead = hosts.queue.sibling("dead-host")
        dead.serve(1)
        boss = await here.agents.create(session_id="boss")
        await boss.send("go")
        await until_virtual(lambda: len(_catalogued(fs, "boss")) == 1)
        (child_id,) = _catalogued(fs, "boss")
        await until_virtual(lambda: dead.claim(1) != [])
        stop = await here.subagents.stop_tree(child_id, by="operator")
        assert stop.stopped == [child_id]
        stats = await hosts.serve(1)
        dead.close()
        await here.subagents.wait_tree_idle(boss)
        await until_virtual(lambda: stats.reclaimed == 1)
    kid_events = memory_events(fs, child_id)
    assert [t for t, _ in kid_events if t in ("assistant/message", "turn/start")] == []
    assert [t for t, _ in kid_events].count("session/stopped") == 1
    settled = [d for t, d in memory_events(fs, "boss") if t == "subagent/settled"]
    assert [d["child_id"] for d in settled] == [child_id]
