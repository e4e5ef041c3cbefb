"""`subagents serve`: a host that runs the background children other hosts leave to the
placement queue (SPEC §9, "Placement and failover").

Theory of operation. The host announces itself with its capacity, then loops: it claims as many
placements as it has free slots (each claim goes to exactly one host), adopts each claimed child
(`SubagentService.adopt`: resumed from its log, its first prompt handed over by its mailbox
owner, run as a resident Activation) and, when a child's Activation is disposed — it settled,
and its settlement went to its parent's mailbox — finishes the placement, which frees the slot.
It wakes on the queue's notifications (and every `poll_interval` anyway, for what a lost
notification hid) and, every `sweep_interval`, sweeps: the claims of hosts that are gone become
claimable again (their children resume here or elsewhere, the interrupted turn closed by the
resume's closers), and sessions dropped with work — their writer went away without releasing
them, or mail waits for them and nobody holds them (`Placements.dropped`) — are resumed here
(`SubagentService.take_over`): a continuable child runs until it settles (it settles even with
nothing left to do: its dead host may have finished its turn without settling it), any other
session is held until its tree is idle, then let go. Taking the lease decides which sweeper gets a
session; one this host cannot resume is not tried again by it.

A child that cannot be adopted (its log is damaged, it is not a continuable child, another host
still holds it) is logged; a placement whose session cannot be served at all is finished (it
would be claimed forever), one whose session is held elsewhere is given back for later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import trio
from subagents.actors import Activation
from subagents.storage import AlreadyOwned, Claim, Placements, StorageError
from trio_util import RepeatedEvent, wait_any

from .agent.loop import Agent
from .delegation.service import SubagentService
from .errors import AgentStopped, SubagentError

__all__ = ["ServeStats", "serve_placements"]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_POLL_INTERVAL = 1.0
DEFAULT_SWEEP_INTERVAL = 5.0


@attrs.define
class ServeStats:
    """What a serving host has done so far (for its status line and the tests)."""

    adopted: int = 0
    finished: int = 0
    refused: int = 0
    idle: int = 0  # claimed, but the child had nothing to do
    reclaimed: int = 0
    taken_over: int = 0  # dropped sessions resumed by the sweep
    running: set[str] = attrs.field(factory=set)
    on_event: Callable[[str, str], None] | None = None

    def note(self, what: str, child_id: str) -> None:
        if self.on_event is not None:
            self.on_event(what, child_id)


async def serve_placements(
    service: SubagentService,
    placements: Placements,
    capacity: int,
    *,
    stats: ServeStats | None = None,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    sweep_interval: float = DEFAULT_SWEEP_INTERVAL,
    on_event: Callable[[str, str], None] | None = None,
    task_status: trio.TaskStatus[ServeStats] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve placements with at most `capacity` children at once, until cancelled. Started
    (`task_status`) once the host is announced. `on_event(what, child_id)` hears of each child
    taken (`claimed`) and let go (`finished`)."""
    if capacity < 1:
        raise ValueError("a serving host needs a capacity of at least 1")
    stats = stats if stats is not None else ServeStats()
    if on_event is not None:
        stats.on_event = on_event
    changed = RepeatedEvent()
    refused: set[str] = set()  # dropped sessions this host could not resume: not tried again
    await trio.to_thread.run_sync(placements.serve, capacity)
    watch = await trio.to_thread.run_sync(placements.watch)
    try:
        async with trio.open_nursery() as nursery:
            task_status.started(stats)
            next_sweep = trio.current_time()
            while True:
                woken = watch.clear()  # a placement, or a lease let go: sweep now, not at the interval
                if woken or trio.current_time() >= next_sweep:
                    next_sweep = trio.current_time() + sweep_interval
                    stats.reclaimed += len(await _call(placements.reclaim_orphans) or ())
                    free = capacity - len(stats.running)
                    for session_id in await _call(placements.dropped, free + len(refused)) or ():
                        if len(stats.running) >= capacity:
                            break
                        if session_id not in stats.running and session_id not in refused:
                            await _take_over(service, session_id, stats, refused, nursery, changed)
                free = capacity - len(stats.running)
                claimed = await _call(placements.claim, free) if free > 0 else None
                for claim in claimed or ():
                    # Its slot is taken now; the adoptions run side by side (each reads a log and
                    # opens a mailbox watch: done one after the other they would pace the host).
                    stats.running.add(claim.session_id)
                    nursery.start_soon(_adopt, service, placements, claim, stats, nursery, changed)
                if claimed and len(claimed) == free:
                    continue  # the queue may hold more: look again once a slot frees

                async def readable() -> None:
                    await trio.lowlevel.wait_readable(watch.fileno())

                with trio.move_on_after(min(poll_interval, max(next_sweep - trio.current_time(), 0))):
                    await wait_any(readable, changed.wait)
    finally:
        watch.close()


async def _adopt(
    service: SubagentService,
    placements: Placements,
    claim: Claim,
    stats: ServeStats,
    nursery: trio.Nursery,
    changed: RepeatedEvent,
) -> None:
    child_id = claim.session_id
    try:
        activation = await service.adopt(child_id, settle_idle=claim.attempt > 1)
    except Exception as exc:  # a SubagentError; another is a bug, and one child's must not stop the host
        stats.refused += 1
        held = isinstance(exc.__cause__, AlreadyOwned)
        if not isinstance(exc, SubagentError):
            log.exception("placed child %s: serving it failed", child_id)
        log.warning("placed child %s cannot be served here (%s): %s", child_id, "later" if held else "dropped", exc)
        await _call(placements.unclaim if held else placements.finish, child_id)
        _free(stats, child_id, changed)
        return
    if activation is None:
        stats.idle += 1  # it had nothing to do: its placement is done
        await _finish(service, placements, child_id)
        _free(stats, child_id, changed)
        return
    stats.adopted += 1
    stats.note("claimed", child_id)
    nursery.start_soon(_finish_when_disposed, service, placements, activation, stats, changed)


async def _finish(service: SubagentService, placements: Placements, child_id: str) -> None:
    """The placement is done; a delivery that came after the child's owner stopped (or before
    it started, for a claim made early) would wait for nobody: placed again. (A sender enqueues
    around its delivery too; one of the two sees the other's work.)"""
    await _call(placements.finish, child_id)
    mailbox = service.mailbox
    if mailbox is not None and await _call(mailbox.drain, child_id):
        await _call(placements.enqueue, child_id)


def _free(stats: ServeStats, session_id: str, changed: RepeatedEvent) -> None:
    stats.running.discard(session_id)
    changed.set()


async def _take_over(
    service: SubagentService,
    session_id: str,
    stats: ServeStats,
    refused: set[str],
    nursery: trio.Nursery,
    changed: RepeatedEvent,
) -> None:
    try:
        taken = await service.take_over(session_id)
    except AlreadyOwned:
        return  # another host's sweep was first
    except Exception as exc:  # SubagentError, StorageError; another is a bug: it must not stop the host
        refused.add(session_id)
        if not isinstance(exc, (SubagentError, StorageError)):
            log.exception("dropped session %s: resuming it failed", session_id)
        log.warning("dropped session %s cannot be resumed here: %s", session_id, exc)
        return
    if taken is None:
        return
    stats.taken_over += 1
    stats.running.add(session_id)
    stats.note("resumed", session_id)
    if isinstance(taken, Activation):
        nursery.start_soon(_finish_when_disposed, service, service.placements, taken, stats, changed)
    else:
        nursery.start_soon(_release_when_idle, service, taken, stats, changed)


async def _release_when_idle(service: SubagentService, agent: Agent, stats: ServeStats, changed: RepeatedEvent) -> None:
    """Hold a resumed root session until it and its resident children are idle, then let go
    (what comes later waits in its mailbox for the next sweep)."""
    try:
        await service.wait_tree_idle(agent)
    except AgentStopped:
        pass  # its log cannot be written here any more (taken over): let go all the same
    with trio.CancelScope(shield=True):
        await service.agents.stop(agent.session_id, cause="disposed")
    stats.running.discard(agent.session_id)
    stats.note("finished", agent.session_id)
    changed.set()


async def _finish_when_disposed(
    service: SubagentService,
    placements: Placements | None,
    activation: Activation,
    stats: ServeStats,
    changed: RepeatedEvent,
) -> None:
    await activation.disposed.wait()
    child_id = activation.child_id
    if placements is not None:
        await _finish(service, placements, child_id)
    stats.finished += 1
    stats.running.discard(child_id)
    stats.note("finished", child_id)
    changed.set()


async def _call(fn: Callable[..., T], *args: Any) -> T | None:
    """A placement-queue call in a worker thread; a storage error is logged (the loop retries
    at its next look)."""
    try:
        return await trio.to_thread.run_sync(fn, *args)
    except StorageError as exc:
        log.warning("the placement queue failed (retrying): %s", exc)
        return None
