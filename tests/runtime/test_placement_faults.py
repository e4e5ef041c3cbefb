"""Placements that go wrong (issue 19 review, items 2, 3, 5 and 8; runtime/hosts/serve.py): a child a
serving host cannot serve never leaves its parent waiting forever — a host-specific refusal (its
family limit, a model it cannot give the child) is given back for another host or for later, a
permanent one (a damaged log, not a continuable child) ends the placement and tells the parent
with an `error` settlement; a serving host stopped cleanly hands its running children back
without settling them, so they settle once, elsewhere.

Hosts on one in-memory disk under `autojump_clock` (tests/helpers/memory_hosts.py)."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from clocks import until_virtual
from log_lines import memory_events
from memory_hosts import memory_host
from subagents.runtime.delegation.agent_types import AgentType
from subagents.runtime.hosts.serve import ServeStats, serve_placements
from subagents.storage import PersistenceFailed
from subagents.storage.testing import CrashFs, MemoryMailbox, MemoryPlacements

Json = dict[str, Any]


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Virtual time that jumps only after 2 ms of real idleness: the hosts' storage calls run in
    worker threads, and with a jump at every idle moment virtual time (the serve loops' polls,
    the guards) outran them now and then."""
    return trio.testing.MockClock(autojump_threshold=0.002)


def _start(label: str, prompt: str = "go", **more: str) -> Json:
    return {"name": "subagent", "arguments": {"description": label, "prompt": prompt, **more}}


async def until_tree_idle(host: Any, agent: Any, nursery: trio.Nursery) -> None:
    """Until `wait_tree_idle` returns (the hang guard of `until_virtual`: a worker thread's work
    lets the autojump clock leap, so a plain timeout around the wait could fire at once)."""
    idle = trio.Event()

    async def wait() -> None:
        await host.subagents.wait_tree_idle(agent)
        idle.set()

    nursery.start_soon(wait)
    await until_virtual(idle.is_set)


def _settled(fs: CrashFs, parent: str = "boss") -> list[Json]:
    return [d for t, d in memory_events(fs, parent) if t == "subagent/settled"]


async def test_a_child_whose_model_no_serving_host_has_settles_as_failed_and_the_parent_goes_on(
    tmp_path: Path, autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)  # a "held" refusal is routine: logged at info (issue 27)
    fs = CrashFs()
    mine = MemoryMailbox(fs=fs)
    queue = MemoryPlacements("parent-host")
    boss = {
        "session": "boss",
        "responses": [{"tool_calls": [_start("kid-1", "review", agent_type="reviewer")]}, {"text": "started"}]
        + [{"text": "noted"}] * 3,
    }
    kid = {"label": "kid-1", "responses": [{"text": "reviewed"}]}
    types = {"reviewer": AgentType(name="reviewer", description="reviews", prompt="You review.", model="scripted:x")}
    async with (
        memory_host(tmp_path, fs, mine, boss, ids="p", placements=queue, agent_types=types, child_model=None) as here,
        # a serving host configured without child models: it cannot give the child its model
        memory_host(
            tmp_path, fs, mine.sibling(), kid, ids="s", placements=queue.sibling("serve-host"), agent_types=types
        ) as there,
        trio.open_nursery() as nursery,
    ):
        here.subagents.child_model = lambda options: here.agents.model
        stats: ServeStats = await nursery.start(serve_placements, there.subagents, there.subagents.placements, 1)
        parent = await here.agents.create(session_id="boss")
        await parent.send("go")
        await until_tree_idle(here, parent, nursery)  # before the fix: the stand-in waited forever
        nursery.cancel_scope.cancel()
    # Refused once as fatal; a claim made while the parent's host still held the child (it lets
    # go right after enqueueing) is refused as "held" first, and given back, as designed.
    refusals = [r.getMessage() for r in caplog.records if "cannot be served here" in r.getMessage()]
    assert [m for m in refusals if "(fatal)" in m] == refusals[-1:] and stats.adopted == 0
    assert stats.refused == len(refusals) and all("(held)" in m for m in refusals[:-1])
    (settled,) = _settled(fs)
    assert settled["reason_kind"] == "error" and "model" in settled["reason_message"], settled
    # ... and the model is told why
    texts = [b["text"] for t, d in memory_events(fs, "boss") if t == "user/message" for b in d["message"]["content"]]
    assert any(
        t.startswith("Background subagent p-1 failed before it finished (no serving host could run it: ") for t in texts
    ), texts


async def test_a_claim_past_the_serving_hosts_family_limit_waits_for_a_slot(
    tmp_path: Path, autojump_clock: Any
) -> None:
    fs = CrashFs()
    mine = MemoryMailbox(fs=fs)
    queue = MemoryPlacements("parent-host")
    boss = {"session": "boss", "responses": [{"tool_calls": [_start("kid-1"), _start("kid-2")]}] + [{"text": "ok"}] * 4}
    kids = [{"label": f"kid-{i}", "responses": [{"text": f"{i} done"}]} for i in (1, 2)]
    async with (
        memory_host(tmp_path, fs, mine, boss, ids="p", placements=queue, max_active_subagents=8) as here,
        # the serving host's own limit is lower: one child of a family at once
        memory_host(
            tmp_path, fs, mine.sibling(), *kids, ids="s", placements=queue.sibling("serve-host"), max_active_subagents=1
        ) as there,
        trio.open_nursery() as nursery,
    ):
        stats: ServeStats = await nursery.start(serve_placements, there.subagents, there.subagents.placements, 4)
        parent = await here.agents.create(session_id="boss")
        await parent.send("go")
        await until_tree_idle(here, parent, nursery)  # before the fix: the refused child's stand-in waited forever
        nursery.cancel_scope.cancel()
    settled = _settled(fs)
    assert sorted(d["reason_kind"] for d in settled) == ["completed", "completed"], settled
    assert stats.adopted == 2


class _FlakyMailbox(MemoryMailbox):
    """A mailbox whose first `failures` deliveries of a `settled` envelope fail (a database
    blip on the serving host)."""

    def __init__(self, fs: CrashFs, wakeups: Any, failures: int) -> None:
        super().__init__(fs=fs, wakeups=wakeups)
        self.failures = failures

    def deliver(self, session_id: str, envelope: Any) -> None:
        if envelope.kind == "settled" and self.failures > 0:
            self.failures -= 1
            raise PersistenceFailed("the mailbox is down for a moment")
        super().deliver(session_id, envelope)


@pytest.mark.parametrize("failures", [2, 6])  # 6: past the retries, the placement is given back and settled again
async def test_a_settlement_whose_delivery_fails_for_a_while_still_reaches_the_parent_once(
    tmp_path: Path, autojump_clock: Any, failures: int
) -> None:
    fs = CrashFs()
    mine = MemoryMailbox(fs=fs)
    queue = MemoryPlacements("parent-host")
    boss = {"session": "boss", "responses": [{"tool_calls": [_start("kid-1")]}] + [{"text": "ok"}] * 3}
    kid = {"label": "kid-1", "responses": [{"text": "1 done"}]}
    flaky = _FlakyMailbox(fs, mine.wakeups, failures)
    async with (
        memory_host(tmp_path, fs, mine, boss, ids="p", placements=queue) as here,
        memory_host(tmp_path, fs, flaky, kid, ids="s", placements=queue.sibling("serve-host")) as there,
        trio.open_nursery() as nursery,
    ):
        stats: ServeStats = await nursery.start(serve_placements, there.subagents, there.subagents.placements, 1)
        parent = await here.agents.create(session_id="boss")
        await parent.send("go")
        await until_tree_idle(here, parent, nursery)  # before the fix: the one settlement was lost
        await until_virtual(lambda: not stats.running)
        nursery.cancel_scope.cancel()
    assert flaky.failures == 0 and stats.adopted == (1 if failures < 5 else 2)
    (settled,) = _settled(fs)  # once
    if failures < 5:
        assert settled["reason_kind"] == "completed" and settled["closing_text"] == "1 done"
    else:  # made again by the next claim, from the log: its last result is not kept (README: "aborted")
        assert settled["reason_kind"] == "aborted"
    assert queue.claim(10) == []  # its placement finished once the settlement went through


async def test_a_serving_host_stopped_cleanly_hands_its_children_back_and_each_settles_once(
    tmp_path: Path, autojump_clock: Any
) -> None:
    fs = CrashFs()
    mine = MemoryMailbox(fs=fs)
    queue = MemoryPlacements("parent-host")
    boss = {"session": "boss", "responses": [{"tool_calls": [_start("kid-1", "work long")]}] + [{"text": "ok"}] * 4}
    kid = {"label": "kid-1", "responses": [{"hang": True}]}
    there_queue = queue.sibling("serve-1")
    async with memory_host(tmp_path, fs, mine, boss, ids="p", placements=queue) as here:
        parent = await here.agents.create(session_id="boss")
        async with memory_host(tmp_path, fs, mine.sibling(), kid, ids="s", placements=there_queue) as there:
            async with trio.open_nursery() as nursery:
                stats: ServeStats = await nursery.start(serve_placements, there.subagents, there_queue, 1)
                await parent.send("go")
                await until_virtual(lambda: stats.adopted == 1)
                (child_id,) = stats.running
                await until_virtual(lambda: any(t == "turn/start" for t, _ in memory_events(fs, child_id)))
                nursery.cancel_scope.cancel()  # Ctrl-C: `serve_command`'s interrupt scope
            # the runtime closes now: its drain stops what is still resident
        there_queue.close()  # what closing a PostgreSQL store does: its hosts row and liveness go
        # Handed back, not settled: before the fix the drain settled it here ("aborted") and the
        # next host, reclaiming the placement, settled it a second time.
        assert _settled(fs) == []
        assert [t for t, _ in memory_events(fs, child_id)][-1] == "turn/end"  # its turn was ended, durably
        async with (
            memory_host(tmp_path, fs, mine.sibling(), kid, ids="t", placements=queue.sibling("serve-2")) as again,
            trio.open_nursery() as nursery,
        ):
            stats2: ServeStats = await nursery.start(serve_placements, again.subagents, again.subagents.placements, 1)
            await until_tree_idle(here, parent, nursery)
            await until_virtual(lambda: stats2.finished == 1)
            nursery.cancel_scope.cancel()
        assert stats2.adopted == 1 and queue.claim(10) == []
    (settled,) = _settled(fs)  # one child, one run: settled once
    assert settled["child_id"] == child_id and settled["reason_kind"] == "aborted"


async def test_a_claim_of_a_child_running_here_already_waits_for_its_disposal(
    tmp_path: Path, autojump_clock: Any
) -> None:
    fs = CrashFs()
    queue = MemoryPlacements("only-host")
    boss = {"session": "boss", "responses": [{"tool_calls": [_start("kid-1")]}] + [{"text": "ok"}] * 4}
    kid = {"label": "kid-1", "responses": [{"hang": True}]}
    async with (
        memory_host(tmp_path, fs, MemoryMailbox(fs=fs), boss, kid, ids="p", placements=queue) as here,
        trio.open_nursery() as nursery,
    ):
        parent = await here.agents.create(session_id="boss")
        await parent.send("go")  # no host serves yet: the child runs here, in place
        await until_virtual(lambda: len(here.subagents.manager.resident) == 1)
        (child_id,) = here.subagents.manager.resident
        stats: ServeStats = await nursery.start(serve_placements, here.subagents, queue, 2)
        # A placement for it after all (a sender that saw no resident child, or a take-over by the
        # sweep): it is claimed here, where the child runs.
        queue.enqueue(child_id)
        await until_virtual(lambda: queue._shared.queue.get(child_id, (0, None))[1] == "only-host")
        for _ in range(20):  # long enough for the spin the fix removes to go round many times
            await until_virtual(lambda: True)
            await trio.sleep(0.1)
        # Before the fix the claim was finished at once (nothing to adopt: "idle"), the child left
        # `running` while it ran, and a message waiting for it placed it again: claimed, finished, ...
        assert stats.idle == 0 and child_id in stats.running
        assert queue._shared.queue[child_id][1] == "only-host"  # claimed until the child is disposed
        await here.subagents.stop_resident(child_id, "parent")
        await until_virtual(lambda: stats.finished == 1)
        assert child_id not in stats.running and queue.claim(10) == []
        nursery.cancel_scope.cancel()


async def test_a_status_line_that_cannot_be_written_does_not_stop_the_host(tmp_path: Path, autojump_clock: Any) -> None:
    def report(what: str, child_id: str) -> None:
        raise BrokenPipeError(32, "Broken pipe")  # `serve`'s stdout closed (piped into a `head` that exited)

    boss = {"session": "boss", "responses": [{"tool_calls": [_start("kid-1")]}] + [{"text": "ok"}] * 3}
    kid = {"label": "kid-1", "responses": [{"text": "1 done"}]}
    fs = CrashFs()
    mine = MemoryMailbox(fs=fs)
    queue = MemoryPlacements("parent-host")
    async with (
        memory_host(tmp_path, fs, mine, boss, ids="p", placements=queue) as here,
        memory_host(tmp_path, fs, mine.sibling(), kid, ids="s", placements=queue.sibling("serve-host")) as there,
        trio.open_nursery() as nursery,
    ):
        stats: ServeStats = await nursery.start(
            partial(serve_placements, there.subagents, there.subagents.placements, 1, on_event=report)
        )
        parent = await here.agents.create(session_id="boss")
        await parent.send("go")
        await until_tree_idle(here, parent, nursery)  # before the fix: the error killed the serve loop
        await until_virtual(lambda: stats.finished == 1)
        nursery.cancel_scope.cancel()
    (settled,) = _settled(fs)
    assert settled["reason_kind"] == "completed"


@pytest.mark.parametrize("claimed", [False, True])  # True: the last host claimed it, then went away
async def test_with_every_serving_host_gone_a_placed_child_runs_where_it_was_started(
    tmp_path: Path, autojump_clock: Any, claimed: bool
) -> None:
    fs = CrashFs()
    queue = MemoryPlacements("parent-host")
    boss = {"session": "boss", "responses": [{"tool_calls": [_start("kid-1", "count")]}] + [{"text": "ok"}] * 3}
    kid = {"label": "kid-1", "responses": [{"text": "counted here"}]}
    last = queue.sibling("last-host")
    last.serve(1)  # a host serves when the child is started ...
    async with memory_host(tmp_path, fs, MemoryMailbox(fs=fs), boss, kid, ids="p", placements=queue) as here:
        async with trio.open_nursery() as nursery:
            parent = await here.agents.create(session_id="boss")
            await parent.send("go")
            await until_virtual(lambda: len(queue._shared.queue) == 1)  # placed
            if claimed:
                await until_virtual(lambda: last.claim(1) != [])
            last.close()  # ... and goes away before it runs it
            await until_tree_idle(here, parent, nursery)  # before the fix: its stand-in waited forever
        assert queue.claim(10) == []
    (settled,) = _settled(fs)
    assert settled["reason_kind"] == "completed" and settled["closing_text"] == "counted here"
    assert "delivery_id" not in settled  # recorded in place, by the parent's own host
