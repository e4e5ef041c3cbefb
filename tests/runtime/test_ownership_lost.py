"""A session another host took over stops here (runtime/agent/mailbox_owner.py, runtime/lease_renewal.py,
SessionStore.mark_lost): its mailbox owner neither crashes the host nor acts for it (an interrupt
it would ack without effect belongs to the new owner), whether the loss shows at an append
(`OwnershipLost`) or at the store's lease renewal.

In memory (`MemoryLogStore` behind `FaultyLogStore`, `MemoryMailbox`) under `autojump_clock`:
owner retries and renewal intervals pass in virtual time."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from clocks import until_virtual
from subagents.runtime import ScenarioClock, open_runtime
from subagents.runtime.agent.mailbox_owner import new_envelope
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel
from subagents.storage import OwnershipLost
from subagents.storage.testing import CrashFs, FaultyLogStore, MemoryLogStore, MemoryMailbox


def _model() -> ScriptedModel:
    return ScriptedModel(load_script(json.dumps({"agents": [{"session": "boss", "responses": [{"text": "hi"}]}]})))


@asynccontextmanager
async def _idle_boss(tmp_path: Path, fs: CrashFs, store: Any) -> AsyncIterator[tuple[Any, MemoryMailbox]]:
    """A runtime on `store` whose root "boss" has answered once and is idle; yields boss and the
    mailbox of another host on the same disk (the one that takes boss over)."""
    mailbox = MemoryMailbox(fs=fs)
    async with open_runtime(
        tmp_path, model=_model(), clock=ScenarioClock(), id_factory=CountingIds("p"), log_store=store, mailbox=mailbox
    ) as rt:
        boss = await rt.agents.create(session_id="boss")
        await boss.send("hello")
        await boss.wait_idle()
        yield boss, mailbox.sibling()


@asynccontextmanager
async def _boss_refused(tmp_path: Path) -> AsyncIterator[tuple[Any, MemoryMailbox]]:
    """A runtime whose idle "boss" another host took over: a `settled` envelope from the new
    owner's host is in its mailbox and this host's attempt to record it was refused
    (`OwnershipLost`). Yields boss and the new owner's mailbox."""
    fs = CrashFs()
    store = FaultyLogStore(MemoryLogStore(fs=fs, compression="none"))
    async with _idle_boss(tmp_path, fs, store) as (boss, other):
        store.fail("append", OwnershipLost("boss", 1), session_id="boss", times=1)  # taken over meanwhile
        settled = new_envelope(other, "settled", {"child_id": "kid", "reason_kind": "completed"}, sender="kid")
        await trio.to_thread.run_sync(other.deliver, "boss", settled)
        await until_virtual(lambda: boss.session.stopped)  # this host's owner tried it: refused
        yield boss, other


async def test_a_settlement_for_a_parent_whose_lease_was_lost_does_not_crash_the_host(
    tmp_path: Path, autojump_clock: Any
) -> None:
    crashed: BaseException | None = None
    try:
        async with _boss_refused(tmp_path):
            await trio.sleep(10)  # what a few owner retries would take
    except BaseException as exc:  # what escaped the runtime
        crashed = exc
    assert crashed is None, repr(crashed)


async def test_a_host_that_lost_a_session_does_not_swallow_its_interrupts(tmp_path: Path, autojump_clock: Any) -> None:
    async with _boss_refused(tmp_path) as (_boss, other):
        (settled,) = await trio.to_thread.run_sync(other.drain, "boss")
        await trio.to_thread.run_sync(other.ack, "boss", settled.delivery_id)  # the new owner recorded it
        interrupt = new_envelope(other, "interrupt", {}, sender=None)
        await trio.to_thread.run_sync(other.deliver, "boss", interrupt)
        await trio.sleep(5)
        left = [e.delivery_id for e in await trio.to_thread.run_sync(other.drain, "boss")]
    assert interrupt.delivery_id in left, "the interrupt was acked by a host that no longer owns the session"


class _RenewingStore(FaultyLogStore):
    """A store with leases, as PostgreSQL's: every renewal finds the sessions in `lost` lost."""

    lease_renew_interval = 5.0

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.lost: set[str] = set()

    @property
    def leased(self) -> _RenewingStore:
        return self

    def renew_leases(self) -> frozenset[str]:
        lost, self.lost = frozenset(self.lost), set()
        return lost


async def test_a_lease_found_lost_by_renewal_stops_the_idle_session_and_its_owner(
    tmp_path: Path, autojump_clock: Any
) -> None:
    fs = CrashFs()
    store = _RenewingStore(MemoryLogStore(fs=fs, compression="none"))
    async with _idle_boss(tmp_path, fs, store) as (boss, other):
        store.lost.add("boss")  # another host took it over while it was idle
        await until_virtual(lambda: boss.session.stopped)  # a renewal ran (in a worker thread)
        assert boss.session.ownership_lost is not None
        interrupt = new_envelope(other, "interrupt", {}, sender=None)
        await trio.to_thread.run_sync(other.deliver, "boss", interrupt)
        await trio.sleep(5)
        left = [e.delivery_id for e in await trio.to_thread.run_sync(other.drain, "boss")]
    assert left == [interrupt.delivery_id]  # the new owner's to act on


async def test_waiting_for_a_tree_whose_root_was_taken_over_ends_with_agent_stopped(
    tmp_path: Path, mock_clock: Any
) -> None:
    """`run` waits for its root's tree: once another host took the root over, the children's
    settlements reach that host, so the wait ends here with `AgentStopped` (run: one line, exit 1)."""
    from subagents.runtime.foundation.errors import AgentStopped

    # The clock jumps only once the loop has been idle for 50 ms of real time: a worker
    # thread's storage call (the lease renewal's, the actors') finishes before virtual time
    # moves on, so the renewals do not race the wait.
    mock_clock.autojump_threshold = 0.05
    fs = CrashFs()
    store = _RenewingStore(MemoryLogStore(fs=fs, compression="none"))
    held = {"text": "never", "wait_for": {"steered": True}}  # the child's model call waits: resident, quiet
    script = {"agents": [{"session": "boss", "responses": [{"text": "hi"}]}, {"label": "worker", "responses": [held]}]}
    model = ScriptedModel(load_script(json.dumps(script)))
    async with open_runtime(
        tmp_path,
        model=model,
        clock=ScenarioClock(),
        id_factory=CountingIds("p"),
        log_store=store,
        mailbox=MemoryMailbox(fs=fs),
    ) as rt:
        boss = await rt.agents.create(session_id="boss")
        await boss.send("hello")
        await boss.wait_idle()
        await rt.subagents.start_continuable(boss, "spawn", "worker", "work")  # runs for ever

        async def lose_the_root() -> None:
            await trio.testing.wait_all_tasks_blocked()
            store.lost.add("boss")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lose_the_root)
            # The hang guard, in virtual seconds: each lease renewal (every 5) is a thread hop
            # during which the clock may jump, so a short guard could pass before real work does.
            with trio.fail_after(100_000), pytest.raises(AgentStopped, match="taken over by another host"):
                await rt.subagents.wait_tree_idle(boss)
