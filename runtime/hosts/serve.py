"""`subagents serve`: a host that runs the background children other hosts leave to the
placement queue (SPEC §9, "Placement and failover").

Theory of operation. The host announces itself with its capacity, then loops: it claims as many
placements as it has free slots (each claim goes to exactly one host), adopts each claimed child
(`Placement.adopt`: resumed from its log, its first prompt handed over by its mailbox
owner, run as a resident Activation) and, when a child's Activation is disposed — it settled,
and its settlement went to its parent's mailbox — finishes the placement, which frees the slot.
It wakes on the queue's notifications (and every `poll_interval` anyway, for what a lost
notification hid) and, every `sweep_interval`, sweeps: the claims of hosts that are gone become
claimable again (their children resume here or elsewhere, the interrupted turn closed by the
resume's closers), and sessions dropped with work — their writer went away without releasing
them, or mail waits for them and nobody holds them (`Placements.dropped`) — are resumed here
(`Placement.take_over`): a continuable child runs until it settles (it settles even with
nothing left to do: its dead host may have finished its turn without settling it). A root is
never resumed by a sweep — only by a host a person starts for it; what waits for it stays in
its mailbox until then. Taking the lease decides which sweeper gets a session; one this host
cannot resume is not tried again by it. A host is gone only when its lease expired (or its row
is gone): a host whose connection to the database was cut for a moment keeps its children.

A claimed child that cannot be adopted never leaves its parent waiting: a refusal of this host's
— another host still holds the child, its family is at this host's `max_active_subagents`, a
read failed (tried again once a child here is let go, or at the next sweep), or this host cannot
give the child what its options ask, e.g. its model (left to the other hosts) — gives the
placement back and this host skips it; a child no host can serve — its log is damaged, it is not
a continuable child, or as many hosts as serve were unfit for it — is finished and its parent is
told through its mailbox (`settled`, `reason_kind: "error"` with the reason), which ends the
parent's stand-in. A settlement that could not be posted to the parent's mailbox (tried a few
times) gives the placement back, so the child is claimed and settled again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any, Literal, TypeVar

import attrs
import trio
from subagents.actors import Activation
from subagents.storage import AlreadyOwned, Claim, OwnershipLost, PersistenceFailed, Placements, StorageError
from trio_util import RepeatedEvent, wait_any

from ..delegation.placement import Placement
from ..delegation.service import SubagentService
from ..foundation.errors import (
    ActivationLimit,
    FamilyDraining,
    OptionsNotReapplied,
    QueryPersistenceFailed,
    SubagentError,
    UnsupportedCapability,
)

__all__ = ["ServeStats", "serve_placements"]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_POLL_INTERVAL = 1.0
DEFAULT_SWEEP_INTERVAL = 5.0
DEFAULT_FORGET_HOSTS_AFTER = 86400.0  # a day: `[store] forget_hosts_after`
_RETRIES = 5  # a finish or give-back is tried this often, waiting 0.5 s, 1 s, 2 s, … between
_RETRY_FIRST_DELAY = 0.5


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
        if self.on_event is None:
            return
        try:
            self.on_event(what, child_id)
        except Exception:  # the status line (e.g. stdout closed: BrokenPipeError) is not the host's work
            log.exception("reporting %s %s failed", what, child_id)


async def serve_placements(
    service: SubagentService,
    placements: Placements,
    capacity: int,
    *,
    stats: ServeStats | None = None,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    sweep_interval: float = DEFAULT_SWEEP_INTERVAL,
    forget_hosts_after: float = DEFAULT_FORGET_HOSTS_AFTER,
    on_event: Callable[[str, str], None] | None = None,
    task_status: trio.TaskStatus[ServeStats] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve placements with at most `capacity` children at once, until cancelled. Started
    (`task_status`) once the host is announced. `on_event(what, child_id)` hears of each child
    taken (`claimed`) and let go (`finished`). Each sweep also forgets the hosts gone for
    `forget_hosts_after` seconds (their rows deleted: `subagents hosts` lists them no more)."""
    if capacity < 1:
        raise ValueError("a serving host needs a capacity of at least 1")
    placement = service.placement  # the part of the service that serves placed children
    stats = stats if stats is not None else ServeStats()
    if on_event is not None:
        stats.on_event = on_event
    changed = RepeatedEvent()
    refused: set[str] = set()  # dropped sessions this host could not resume: not tried again
    # Placements this host gave back: `unfit` it cannot serve at all (left to the others),
    # `deferred` not now (its family's limit here, a failed read): tried again once a child
    # here is let go, or at the next sweep.
    given_back = _GivenBack()
    adopted: dict[str, Activation] = {}  # claimed children running here (handed back on a clean stop)
    watching: set[str] = set()  # children whose disposal a `_finish_when_disposed` waits for
    await trio.to_thread.run_sync(placements.serve, capacity)
    watch = await trio.to_thread.run_sync(placements.watch)
    try:
        async with trio.open_nursery() as nursery:
            task_status.started(stats)
            next_sweep = trio.current_time()
            while True:
                woken = watch.clear()  # a placement, or a lease let go: sweep now, not at the interval
                if stats.finished != given_back.finished_seen:
                    given_back.finished_seen = stats.finished
                    given_back.deferred.clear()  # a slot here freed: what waited for one may fit now
                if woken or trio.current_time() >= next_sweep:
                    next_sweep = trio.current_time() + sweep_interval
                    given_back.deferred.clear()
                    stats.reclaimed += len(await _call(placements.reclaim_orphans) or ())
                    for host_id in await _call(placements.forget_hosts, forget_hosts_after) or ():
                        log.info("host %s is forgotten (gone for over %.0f s)", host_id, forget_hosts_after)
                    free = capacity - len(stats.running)
                    for session_id in await _call(placements.dropped, free + len(refused)) or ():
                        if len(stats.running) >= capacity:
                            break
                        if session_id not in stats.running and session_id not in refused:
                            await _take_over(placement, session_id, stats, refused, nursery, changed, watching)
                free = capacity - len(stats.running)
                skip = given_back.unfit | given_back.deferred
                claimed = await _call(placements.claim, free, skip) if free > 0 else None
                for claim in claimed or ():
                    # Its slot is taken now; the adoptions run side by side (each reads a log and
                    # opens a mailbox watch: done one after the other they would pace the host).
                    stats.running.add(claim.session_id)
                    nursery.start_soon(
                        _adopt, placement, placements, claim, stats, nursery, changed, given_back, adopted, watching
                    )
                if claimed and len(claimed) == free:
                    continue  # the queue may hold more: look again once a slot frees

                async def readable() -> None:
                    await trio.lowlevel.wait_readable(watch.fileno())

                with trio.move_on_after(min(poll_interval, max(next_sweep - trio.current_time(), 0))):
                    await wait_any(readable, changed.wait)
    finally:
        watch.close()
        with trio.CancelScope(shield=True):
            await _hand_back(placement, placements, adopted)


@attrs.define
class _GivenBack:
    unfit: set[str] = attrs.field(factory=set)
    deferred: set[str] = attrs.field(factory=set)
    finished_seen: int = 0


Refusal = Literal["held", "busy", "unfit", "fatal"]


def _refusal(exc: Exception) -> Refusal:
    """Why a claimed child cannot be adopted here: `held` (another host holds its lease: later),
    `busy` (this host has no room for its family now, is draining, or a read failed: later),
    `unfit` (this host lacks what the child needs, e.g. its model: another host), `fatal` (no
    host could: its log is damaged, it is not a continuable child, a bug)."""
    cause = exc.__cause__
    if isinstance(cause, (AlreadyOwned, OwnershipLost)):
        return "held"
    transient = (PersistenceFailed, QueryPersistenceFailed)
    if isinstance(exc, (ActivationLimit, FamilyDraining, *transient)) or isinstance(cause, transient):
        return "busy"
    unfit = (OptionsNotReapplied, UnsupportedCapability)
    if isinstance(exc, unfit) or isinstance(cause, unfit):
        return "unfit"
    return "fatal"


async def _adopt(
    placement: Placement,
    placements: Placements,
    claim: Claim,
    stats: ServeStats,
    nursery: trio.Nursery,
    changed: RepeatedEvent,
    given_back: _GivenBack,
    adopted: dict[str, Activation],
    watching: set[str],
) -> None:
    child_id = claim.session_id
    try:
        activation = await placement.adopt(child_id, settle_idle=claim.attempt > 1)
    except Exception as exc:  # a SubagentError; another is a bug, and one child's must not stop the host
        stats.refused += 1
        if not isinstance(exc, (SubagentError, StorageError)):
            log.exception("placed child %s: serving it failed", child_id)
        why = _refusal(exc)
        reason = str(exc.__cause__ or exc)
        if why == "unfit":
            serving = await _call(placements.serving_hosts)
            if serving is not None and claim.attempt >= serving:
                # As many claims as hosts serve, this one unfit too: likely none of them can run it.
                why, reason = "fatal", f"no serving host could run it: {reason}"
        # `held` is routine, not a fault: a starting parent's host holds a child it places until
        # just after it enqueued it (spawning's order), so a quick claim meets its lease and is
        # given back to be claimed again; a healthy run must not print warnings for it.
        level = logging.INFO if why == "held" else logging.WARNING
        log.log(level, "placed child %s cannot be served here (%s): %s", child_id, why, reason)
        if why == "fatal" and await placement.fail_placed(child_id, reason):
            await _retry(placements.finish, child_id)  # its parent was told: the placement is done
        else:
            # Given back: for another host, or for this one once it has room (or at a sweep).
            (given_back.unfit if why == "unfit" else given_back.deferred).add(child_id)
            await _retry(placements.unclaim, child_id)
        _free(stats, child_id, changed)
        return
    if activation is None:
        stats.idle += 1  # it had nothing to do: its placement is done
        await _finish(placement, placements, child_id)
        _free(stats, child_id, changed)
        return
    if child_id in watching:
        # It runs here already (taken over by the sweep, or adopted): its slot is counted, and
        # its placement is finished when it is disposed — not now, which would place it again
        # for the message it has yet to take, claim it again, and so on while it runs.
        return
    stats.adopted += 1
    adopted[child_id] = activation
    stats.note("claimed", child_id)
    watching.add(child_id)
    nursery.start_soon(_finish_when_disposed, placement, placements, activation, stats, changed, adopted, watching)


async def _hand_back(placement: Placement, placements: Placements, adopted: dict[str, Activation]) -> None:
    """The host stops (its serve loop cancelled, before its runtime drains): its running
    children are let go unsettled and their placements given back, so each is taken over by
    another host — or this one, restarted — and settled there once, not settled here by the drain
    and again by the host that reclaims the placement. One settling already settles, and its
    placement is finished."""

    async def one(child_id: str, activation: Activation) -> None:
        if await placement.hand_back(child_id):
            log.info("placed child %s is given back (this host stops)", child_id)
            await _retry(placements.unclaim, child_id)
        else:
            await activation.disposed.wait()
            if placement.settlement.take_undelivered(child_id):
                await _retry(placements.unclaim, child_id)
            else:
                await _finish(placement, placements, child_id)
        adopted.pop(child_id, None)

    async with trio.open_nursery() as nursery:  # side by side: each may wait out a stop grace
        for child_id, activation in list(adopted.items()):
            nursery.start_soon(one, child_id, activation)


async def _finish(placement: Placement, placements: Placements, child_id: str) -> None:
    """The placement is done; a delivery that came after the child's owner stopped (or before
    it started, for a claim made early) would wait for nobody: placed again. (A sender enqueues
    around its delivery too; one of the two sees the other's work.)"""
    await _retry(placements.finish, child_id)
    mailbox = placement.mailbox
    if mailbox is not None and await _call(mailbox.drain, child_id):
        await _call(placements.enqueue, child_id)


def _free(stats: ServeStats, session_id: str, changed: RepeatedEvent) -> None:
    stats.running.discard(session_id)
    changed.set()


async def _take_over(
    placement: Placement,
    session_id: str,
    stats: ServeStats,
    refused: set[str],
    nursery: trio.Nursery,
    changed: RepeatedEvent,
    watching: set[str],
) -> None:
    try:
        taken = await placement.take_over(session_id)
    except AlreadyOwned:
        return  # another host's sweep was first
    except Exception as exc:  # SubagentError, StorageError; another is a bug: it must not stop the host
        refused.add(session_id)
        if not isinstance(exc, (SubagentError, StorageError)):
            log.exception("dropped session %s: resuming it failed", session_id)
        log.warning("dropped session %s cannot be resumed here: %s", session_id, exc.__cause__ or exc)
        return
    if taken is None:
        return
    stats.taken_over += 1
    stats.running.add(session_id)
    stats.note("resumed", session_id)
    watching.add(session_id)
    nursery.start_soon(_finish_when_disposed, placement, placement.placements, taken, stats, changed, None, watching)


async def _finish_when_disposed(
    placement: Placement,
    placements: Placements | None,
    activation: Activation,
    stats: ServeStats,
    changed: RepeatedEvent,
    adopted: dict[str, Activation] | None = None,
    watching: set[str] | None = None,
) -> None:
    await activation.disposed.wait()
    child_id = activation.child_id
    if placement.settlement.take_undelivered(child_id):
        # Its settlement never reached its parent's mailbox: given back, so that a host (maybe
        # this one) claims it again and, a claim made before, settles it again.
        log.warning("placed child %s: its settlement was not delivered; its placement is given back", child_id)
        if placements is not None:
            await _retry(partial(placements.enqueue, claimed_before=True), child_id)  # a child taken over had none
            await _retry(placements.unclaim, child_id)
    elif placements is not None:
        await _finish(placement, placements, child_id)
    if adopted is not None and adopted.get(child_id) is activation:
        del adopted[child_id]  # its placement is settled with: nothing to hand back
    if watching is not None:
        watching.discard(child_id)
    stats.finished += 1
    stats.running.discard(child_id)
    stats.note("finished", child_id)
    changed.set()


async def _retry(fn: Callable[..., T], *args: Any) -> T | None:
    """A placement-queue call that must not be lost to one failure (a finish or a give-back:
    the placement would stay with this host): tried a few times, then logged (`_call`)."""
    delay = _RETRY_FIRST_DELAY
    for _ in range(_RETRIES - 1):
        try:
            return await trio.to_thread.run_sync(fn, *args)
        except StorageError as exc:
            log.warning("the placement queue failed (trying again): %s", exc)
        await trio.sleep(delay)
        delay *= 2
    return await _call(fn, *args)


async def _call(fn: Callable[..., T], *args: Any) -> T | None:
    """A placement-queue call in a worker thread; a storage error is logged (the loop retries
    at its next look)."""
    try:
        return await trio.to_thread.run_sync(fn, *args)
    except StorageError as exc:
        log.warning("the placement queue failed (retrying): %s", exc)
        return None
