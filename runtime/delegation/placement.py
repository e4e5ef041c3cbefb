"""Placement and failover: children left to serving hosts, and the serving host's side
(SPEC §9, "Placement and failover"; runtime/hosts/serve.py).

Theory of operation. With a placement queue, a mailbox and a serving host up, a started
background child is left to the serving hosts: its first prompt goes to its mailbox, it is
enqueued, and a *stand-in* Activation keeps its place in its family here (the activation limit,
`wait_tree_idle`, messages and interrupts) until its settlement arrives through the parent's
mailbox. A stand-in looks every `fallback_interval` whether any host still serves; with none,
and its placement unclaimed (or claimed by a host that is gone), the child is taken back and run
here, in the same Activation — a placed child never waits for hosts that are all gone.

The serving host's side: `adopt` a claimed child (resume it, let its mailbox owner hand it what
waits, run it until it settles), `hand_back` one when the host stops cleanly, `fail_placed` one
no host can serve (its parent is told), and `take_over` a continuable child another host
dropped (never a root).
"""

from __future__ import annotations

import logging
from functools import partial

import attrs
import msgspec
import trio
from subagents.actors import Activation, ContinuationManager
from subagents.storage import AlreadyOwned, Event, Mailbox, PersistenceFailed, Placements, StorageError, stopped

from ..agent.loop import Agent
from ..agent.registry import AgentRegistry
from ..foundation.errors import AgentError, NotResumable, SubagentError
from ..foundation.json_values import JsonObject
from ..query import SessionQuery
from .residency import ChildHooks, Residency, unavailable
from .routing import Routing
from .run_key import run_key_of
from .settlement import Settlement
from .stopped_tree import tree_stop_reason

__all__ = ["Placement"]

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class Placement:
    """Leaves children to serving hosts (stand-ins, take back) and serves placed children
    (adopt, hand back, fail, take over)."""

    agents: AgentRegistry
    manager: ContinuationManager
    query: SessionQuery
    settlement: Settlement
    residency: Residency
    routing: Routing
    # The placement queue (SPEC §9): with serving hosts up, background children are left to
    # them; None: every child runs here.
    placements: Placements | None = None
    # Deliveries to sessions another process holds; a placed child's prompt and settlement go there.
    mailbox: Mailbox | None = None
    # How often a stand-in looks whether any host still serves (with none, its child runs here).
    fallback_interval: float = 30.0

    # --- leaving children to serving hosts ---------------------------------------------------

    async def serving_hosts_up(self) -> bool:
        """Whether a started background child is left to the serving hosts: only with a
        placement queue, a mailbox to carry its prompt and settlement, and a host serving."""
        if self.placements is None or self.mailbox is None:
            return False
        try:
            return await trio.to_thread.run_sync(self.placements.serving_hosts) > 0
        except StorageError as exc:
            log.warning("the placement queue cannot be read (the child runs here): %s", exc)
            return False

    async def enqueue(self, child_id: str) -> None:
        """Place the child (idempotent while a host holds it); only with a placement queue."""
        assert self.placements is not None  # a stand-in exists only with placements
        await trio.to_thread.run_sync(self.placements.enqueue, child_id)

    def stand_in(self, activation: Activation, settled: trio.Event | None = None) -> None:
        """Run the stand-in Activation of a child a serving host runs: resident here until its
        settlement arrives (`Residency.record_settled`) or this host lets go
        (`Residency.interrupt_disposed`). Every `fallback_interval` it looks whether any host
        still serves: with none, and its placement still unclaimed (or claimed by a host that is
        gone), the child is taken back and run here, in the same Activation."""
        child_id = activation.child_id
        placed = self.residency.placed
        if settled is None:
            settled = placed[child_id] = trio.Event()
        # (set already when its settlement came first: the stand-in ends at once)
        hooks: list[ChildHooks] = []  # the hooks of the child itself, once it runs here

        async def body(a: Activation) -> None:
            while not hooks:
                with trio.move_on_after(self.fallback_interval):
                    await settled.wait()
                if settled.is_set():
                    return
                # (bound first: a cancel scope's exit may swallow, so the checker cannot see the assignment done)
                child: Agent | None = None
                with trio.CancelScope(shield=True):  # a child resumed here is never left untracked
                    child = await self._take_back(child_id, settled)
                if child is not None:
                    hooks.append(self.residency.child_hooks(child))
            await hooks[0][0](a)

        def ready(a: Activation) -> bool:
            return hooks[0][1](a) if hooks else True

        async def settle(a: Activation) -> None:
            if hooks:
                await hooks[0][2](a)
            elif placed.get(child_id) is settled:
                del placed[child_id]  # its settlement is the serving host's to record

        async def dispose(a: Activation) -> None:
            if hooks:
                await hooks[0][3](a)

        self.manager.start(activation, body, ready, settle, dispose)

    async def _take_back(self, child_id: str, settled: trio.Event) -> Agent | None:
        """A placed child whose placement no host serves, resumed here to run in place of its
        stand-in; None while a host serves, its placement is claimed by a live host, or it cannot
        be resumed here now (its placement is then left as it was)."""
        if self.placements is None:
            return None
        placements = self.placements
        try:
            if await trio.to_thread.run_sync(placements.serving_hosts) > 0:
                return None
            claims = await trio.to_thread.run_sync(placements.take_back, child_id)
        except StorageError as exc:
            log.warning("placed child %s: the placement queue cannot be read: %s", child_id, exc)
            return None
        if claims is None or settled.is_set():
            if claims is not None:
                await self._place_again(placements, child_id, claims)
            return None
        try:
            _header, identity = await self.routing.observe_child(child_id, None)
            child = await self.agents.resume(child_id, label=identity.get("label"))
        except (AlreadyOwned, StorageError, SubagentError) as exc:
            log.warning("placed child %s: no host serves it, and it cannot be run here now: %s", child_id, exc)
            await self._place_again(placements, child_id, claims)
            return None
        if self.residency.placed.get(child_id) is settled:
            del self.residency.placed[child_id]  # runs here from now on: messages and interrupts reach it directly
        if self.agents.owners is not None:
            await self.agents.owners.first_drain(child_id)
        log.info("placed child %s: no host serves it any more; it runs here", child_id)
        return child

    async def _place_again(self, placements: Placements, child_id: str, claims: int) -> None:
        try:
            await trio.to_thread.run_sync(partial(placements.enqueue, claimed_before=claims > 0), child_id)
        except StorageError as exc:
            log.warning("placed child %s: could not be placed again: %s", child_id, exc)

    # --- serving placed children (`subagents serve`) ------------------------------------------

    async def adopt(self, child_id: str, *, settle_idle: bool = False) -> Activation | None:
        """Serve a placed child here (`subagents serve`): resume it, let its mailbox owner hand
        it what waits there (its first prompt, messages), and run it as a resident Activation
        until it settles; its settlement goes to its parent's mailbox. A child resident here
        already is not resumed again: its Activation is returned. None when it has nothing
        to do — unless `settle_idle` (a placement claimed before, by a host that may have died
        between the child's last turn and its settlement): then it settles all the same. Raises
        `SubagentError` if it cannot be served."""
        resident = self.manager.get(child_id)
        if resident is not None:
            if not self.residency.end_placed(child_id):
                # It runs here already (taken over, or started here): its mailbox owner takes
                # what waits for it, and its placement is done when it is disposed.
                return resident
            await resident.disposed.wait()  # its stand-in here makes way for the child itself
        header, identity = await self.routing.observe_child(child_id, None)
        if header.parent_session is None:
            raise NotResumable(f"session {child_id!r} is not a subagent")
        if await self._stopped(child_id, header.parent_session, settle=settle_idle):
            return None
        await self.residency.wait_room(header.parent_session)
        activation = self.residency.admit(child_id, header.parent_session)
        try:
            child = await self.agents.resume(child_id, label=identity.get("label"))
        except (AlreadyOwned, StorageError, AgentError) as exc:
            self.manager.forget(activation)
            raise unavailable(child_id) from exc
        except BaseException:  # a resume that failed frees its slot (re-raised)
            self.manager.forget(activation)
            raise
        if self.agents.owners is not None:
            await self.agents.owners.first_drain(child_id)
        if not settle_idle and not child.resumed_interrupted and child.status != "running" and not len(child.inbox):
            # Nothing to do (a placement made for a message this child took before it settled):
            # let go without a settlement — it settled already. A turn its last host left open
            # (closed by the resume) is work cut short: that settles.
            with trio.CancelScope(shield=True):
                await self.agents.stop(child_id, cause="disposed")
            self.manager.forget(activation)
            return None
        self.residency.run(activation, child)
        return activation

    async def _stopped(self, child_id: str, parent_id: str, *, settle: bool) -> bool:
        """Whether the child is stopped for good (its log's `session/stopped` marker, README
        "Stopping a tree"): then no claim or sweep runs it, whatever waits in its mailbox. A claim
        made again (`settle`) settles it all the same, without running it — its stop may have
        died between the marker and the settlement; the `run_key` makes a settlement that did
        land the one the parent records. A log that cannot be read is not judged here (the
        resume that follows says what is wrong with it)."""
        try:
            inherited, events = await self.query.read_from(child_id, 0)
        except StorageError:
            return False
        if not stopped(events, inherited):
            return False
        if settle:
            data: JsonObject = {"child_id": child_id, "reason_kind": _last_reason(events)}
            detail = await tree_stop_reason(self.query, child_id) if data["reason_kind"] == "aborted" else None
            if detail is not None:
                data["reason_message"] = detail
            run_key = run_key_of(child_id, events)
            if run_key is not None:
                data["run_key"] = run_key
            if not await self.settlement.post(parent_id, child_id, data):
                raise unavailable(child_id)  # not told: the placement is given back, tried again
        log.info("placed child %s is stopped: not run", child_id)
        return True

    async def hand_back(self, child_id: str) -> bool:
        """`Residency.hand_back`: let go of an adopted child without settling it."""
        return await self.residency.hand_back(child_id)

    async def fail_placed(self, child_id: str, reason: str) -> bool:
        """A placed child no host can serve (its log is damaged, it is not a continuable child,
        no serving host can give it its model): its parent is told it failed — a `settled`
        (`reason_kind: "error"`, `reason_message: reason`) in the parent's mailbox, which ends
        the parent's stand-in. True once told, or when no parent can be named (nobody waits);
        False when it could not be told now (the caller tries again later)."""
        try:
            info, _held = await self.query.stat(child_id)
        except PersistenceFailed:
            return False
        except StorageError:
            return True  # a log that cannot even name its parent: nobody to tell
        if info is None or info.header is None or info.header.parent_session is None:
            return True
        data: JsonObject = {"child_id": child_id, "reason_kind": "error", "reason_message": reason}
        try:
            _next, events = await self.query.read_from(child_id, 0)
        except StorageError:
            events = []  # a log that cannot be read names no run: settled without a key
        run_key = run_key_of(child_id, events)
        if run_key is not None:
            data["run_key"] = run_key  # the same run failed by two hosts is recorded once
        return await self.settlement.post(info.header.parent_session, child_id, data)

    async def take_over(self, session_id: str) -> Activation | None:
        """Resume a continuable child another host dropped with work (`subagents serve`'s sweep):
        it is adopted (`adopt`; it settles even with nothing left to do — the dead host may have
        finished its turn without settling it). A root is never taken over — roots are resumed
        only by a host a person starts for them (its mail waits in its mailbox) — and gives
        `NotResumable`. None: nothing to do. `AlreadyOwned` when another host took it first;
        `SubagentError` when it cannot be resumed."""
        try:
            info, _held = await self.query.stat(session_id)
        except StorageError as exc:
            raise unavailable(session_id) from exc
        if info is None or info.header is None:
            raise unavailable(session_id)
        if info.header.parent_session is None or info.header.origin != "subagent":
            raise NotResumable(f"session {session_id!r} is a root: only a host a person starts resumes it")
        try:
            return await self.adopt(session_id, settle_idle=True)
        except SubagentError as exc:
            if isinstance(exc.__cause__, AlreadyOwned):
                raise exc.__cause__ from None
            raise


def _last_reason(events: list[Event]) -> str:
    """The reason kind of the child's last `turn/end` (`aborted` when it has none: a stop that
    came before its first turn ended)."""
    for event in reversed(events):
        if event.type == "turn/end":
            reason = msgspec.json.decode(event.data).get("reason", {})
            kind = reason.get("kind") if isinstance(reason, dict) else None
            return kind if isinstance(kind, str) else "aborted"
    return "aborted"
