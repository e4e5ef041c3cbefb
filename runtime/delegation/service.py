"""The subagent service: start, message, resume and interrupt children
(docs/design.md, "Subagents: activations and settlement").

Theory of operation. A child is a session with `origin: "subagent"` whose first append carries
its descriptor (and, for a fork, the parent's prefix and the seed marker), so no crash leaves a
child without identity. A continuable child runs under an Activation of the continuation
manager; its body waits until the child's agent is idle with an empty inbox and no resident
children of its own — *settled* — and then hands over to `Settlement` (settlement.py), which
records `subagent/settled` in the parent, delivers the notice, and redelivers it on resume;
then the Activation is disposed (the agent stops, the session is released).

A message to a child that is not resident cold-resumes it from its log: one observation gives
the header (direct-parent check) and the identity (the own-suffix descriptor, last wins); no
provider is dispatched. Per-child order is kept by the Activation's lock.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Literal, NamedTuple

import attrs
import trio
from subagents.actors import (
    Abort,
    Activation,
    ActivationLimitReached,
    ActorStopped,
    ContinuationManager,
    Draining,
    EventDraft,
    ParentClosing,
    cancelled_when,
)
from subagents.storage import (
    AlreadyOwned,
    EnvelopeKind,
    Event,
    InvalidSessionId,
    LogInfo,
    Mailbox,
    PersistenceFailed,
    Placements,
    SessionHeader,
    SessionNotFound,
    StorageError,
    check_session_id,
    decode_payload,
)

from ..agent.inbox import Delivery, DeliveryCancelled
from ..agent.loop import Agent, AgentConfig, TurnResult
from ..agent.mailbox_owner import new_envelope
from ..agent.registry import AgentRegistry, SessionTools
from ..foundation.errors import (
    ActivationLimit,
    AgentError,
    AgentStopped,
    DepthExceeded,
    FamilyDraining,
    NoProvider,
    NotResumable,
    OptionsNotReapplied,
    ParentUnavailable,
    QueryAborted,
    RunNotCompleted,
    SessionQueryError,
    SubagentCancelled,
    SubagentError,
    Unauthorized,
    UnsupportedCapability,
)
from ..models.base import AnyModel
from ..query import SessionQuery
from ..tools.base import ToolSet
from .descriptor import MalformedDescriptor, SubagentDescriptor, parse_descriptor, snapshot_descriptor
from .listing import ListingService
from .options import ChildModel, ChildOptions, filtered_tools
from .settlement import Settlement, notice_blocks
from .units import IDENTITY_UNIT

# `notice_blocks` lives in settlement.py; it stays importable from here for existing callers.
__all__ = ["DELEGATION_TOOLS", "Reservation", "SubagentService", "notice_blocks", "return_guidance"]

log = logging.getLogger(__name__)

Json = dict[str, Any]
Provider = Literal["spawn", "fork"]
InterruptOutcome = Literal["requested", "not-running"]

DELEGATION_TOOLS = frozenset({"subagent", "subagent_fork"})

_HEADLINES = {
    "aborted": "subagent run was cancelled",
    "error": "subagent run failed",
    "max-tokens": "subagent run hit its token limit before finishing",
    "budget": "subagent run ran out of its budget before finishing",
}


def return_guidance(parent_id: str) -> str:
    pid = json.dumps(parent_id, ensure_ascii=False)
    return (
        f"Your parent agent id is {pid}. Before you finish, send your result to that agent with "
        f'send_message({{ agent_id: {pid}, message: "<self-contained result>" }}). The parent shares your '
        "workspace but does not automatically receive your transcript, tool output, or reasoning. Send "
        "earlier messages as well when a finding changes what the parent should do next; sending a "
        "message does not end your turn."
    )


class _Setup(NamedTuple):
    """What a child agent is started with (the registry's resume takes it as it is)."""

    model: AnyModel | None
    config: AgentConfig
    tools: ToolSet


@attrs.frozen
class Reservation:
    """A child id and creation time drawn in model order. `after` is set once the previous
    reservation of the same parent step has written its catalog (or given up), so the parent's
    `subagent/catalog` events follow the model's call order, not completion order."""

    child_id: str
    created_at: int
    after: trio.Event | None = attrs.field(default=None, eq=False)
    announced: trio.Event = attrs.field(factory=trio.Event, eq=False)  # see `ToolSet.prepare`


# What the model is told when its family takes no new work (the agent vocabulary, worded here
# and not in the actors, which only count and refuse).
DRAINING_TEXT = "continuable subagents are draining; the operation was not admitted"


def limit_text(limit: int) -> str:
    return (
        f"subagent limit reached (active child limit: {limit}); wait for an existing child to finish "
        "or complete this work with the current agents"
    )


def _unavailable(child_id: str) -> SubagentError:
    return NotResumable(f'subagent "{child_id}" is unavailable')


@attrs.define(eq=False)
class SubagentService:
    """Starts, messages, resumes and interrupts the subagents of a runtime; settlement itself is
    `settlement` (a `Settlement`)."""

    agents: AgentRegistry
    manager: ContinuationManager
    query: SessionQuery
    listing: ListingService
    max_depth: int = 1
    child_model: ChildModel | None = None  # builds the model a child's options select
    # The tools every agent is offered (the runtime's and the subagent tools of this service),
    # with a session's own (`SessionTools`, or None).
    toolset: Callable[[SubagentService, SessionTools | None], ToolSet] = attrs.field(
        default=lambda service, extra: ToolSet()
    )
    # Deliveries to sessions another process holds (runtime/agent/mailbox_owner.py); None: none.
    mailbox: Mailbox | None = None
    # The placement queue (SPEC §9): with serving hosts up, background children are left to
    # them (`_start_placed`); None: every child runs here.
    placements: Placements | None = None
    # How often a stand-in looks whether any host still serves (with none, its child runs here).
    fallback_interval: float = 30.0
    # placed child id -> set when its settlement reaches this host (ends its stand-in Activation)
    _placed: dict[str, trio.Event] = attrs.field(factory=dict)
    # adopted children being handed back (`hand_back`): disposed without a settlement
    _handing_back: set[str] = attrs.field(factory=set)
    # parent id → ((turn, step), the last reservation drawn in that step): the catalog chain
    _chains: dict[str, tuple[tuple[int, int], Reservation]] = attrs.field(factory=dict)
    settlement: Settlement = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.settlement = Settlement(self.agents, self.manager, self.mailbox)

    # --- starting ---------------------------------------------------------------------------

    async def reserve(self, parent_id: str | None = None, step: tuple[int, int] | None = None) -> Reservation:
        """A child id and creation time, drawn now (tools draw them in model order). With the
        parent and its (turn, step), the reservation's catalog waits for the one drawn before
        it in the same step."""
        child_id = await self.agents.new_id()
        after: trio.Event | None = None
        if parent_id is not None and step is not None:
            previous = self._chains.get(parent_id)
            if previous is not None and previous[0] == step:
                after = previous[1].announced
        reserved = Reservation(child_id, self.agents.clock.now_ms(), after)
        if parent_id is not None and step is not None:
            self._chains[parent_id] = (step, reserved)
        return reserved

    async def start_continuable(
        self,
        parent: Agent,
        provider: Provider,
        label: str,
        prompt: str,
        abort: Abort | None = None,
        *,
        reserved: Reservation | None = None,
        options: ChildOptions | None = None,
    ) -> str:
        """A background child; returns its id once its first prompt is accepted. `options` are
        recorded in its descriptor and re-applied on every cold resume."""
        if self.manager.draining:
            raise FamilyDraining(DRAINING_TEXT)
        depth = self._child_depth(parent)
        options = self._budgeted(parent, options or ChildOptions())
        descriptor = SubagentDescriptor(
            mode="continuable",
            provider=provider,
            label=label,
            agent_provider=options.agent_provider,
            agent_model=options.agent_model,
            agent_reasoning_effort=options.agent_reasoning_effort,
            persona=options.persona,
            tool_filter=options.tool_filter,
            budget=options.budget,
        )
        setup = self._setup(options, parent.session_id)  # refusals before anything exists
        if abort is not None and abort.is_set():
            raise SubagentCancelled("message delivery was cancelled")
        placed = await self._serving_hosts_up()
        reserved = reserved or await self.reserve()
        child_id = reserved.child_id
        await self._wait_room(parent.session_id, abort)
        activation = self._admit(child_id, parent.session_id)
        try:
            child = await self._create_child(parent, reserved, provider, depth, descriptor, setup)
        except BaseException:
            self.manager.forget(activation)
            raise
        if placed:
            await self._start_placed(parent, child, activation, prompt, label, reserved)
            return child_id
        try:
            first = [{"type": "text", "text": prompt}, {"type": "text", "text": return_guidance(parent.session_id)}]
            await child.send(first, "follow-up", abort=abort)
            # Inside the guard: a cancel while the catalog waits for its turn in the step (or
            # for the parent's actor) must not leave an Activation that nothing runs, which a
            # drain would wait on forever.
            await self._catalog(parent, child, "continuable", label, reserved)
        except DeliveryCancelled:
            await self._dispose_unannounced(activation)
            raise SubagentCancelled("message delivery was cancelled") from None
        except BaseException:
            await self._dispose_unannounced(activation)
            raise
        self._run_activation(activation, child)
        return child_id

    async def start(
        self,
        parent: Agent,
        provider: Provider,
        prompt: str,
        *,
        label: str | None = None,
        abort: Abort | None = None,
        reserved: Reservation | None = None,
        options: ChildOptions | None = None,
    ) -> TurnResult:
        """A one-shot foreground child: run it to the end of its turn and return the result.
        `options` apply to this run only (a one-shot descriptor records none)."""
        depth = self._child_depth(parent)
        setup = self._setup(self._budgeted(parent, options or ChildOptions()), parent.session_id)
        reserved = reserved or await self.reserve()
        child_id = reserved.child_id
        child = await self._create_child(
            parent,
            reserved,
            provider,
            depth,
            SubagentDescriptor(mode="one-shot", provider=provider, label=label),
            setup,
        )
        try:
            await self._catalog(parent, child, "one-shot", label, reserved)
            await child.send(prompt)
            async with trio.open_nursery() as nursery:
                if abort is not None:

                    async def stop_on_abort() -> None:
                        await abort.wait()
                        child.cancel("parent")

                    nursery.start_soon(stop_on_abort)
                stopped: AgentStopped | None = None
                try:
                    result = await child.wait_idle()
                except AgentStopped as exc:
                    # Its log could not be written: the run failed (not a bug of the caller's).
                    result, stopped = None, exc
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self.agents.stop(child_id, cause="parent")
        if result is None or result.reason["kind"] != "completed":
            kind = result.reason["kind"] if result is not None else "error"
            headline = _HEADLINES.get(kind, f"subagent run ended abnormally ({kind})")
            detail = result.reason.get("message") if result is not None else (str(stopped) if stopped else None)
            if detail:
                headline += f"\nDiagnostic: {detail}"
            if result is not None and result.text:
                headline += f"\nPartial output before the run ended:\n{result.text}"
            raise RunNotCompleted(headline)
        return result

    # --- placement on serving hosts (SPEC §9) -----------------------------------------------

    async def _serving_hosts_up(self) -> bool:
        """Whether a started background child is left to the serving hosts: only with a
        placement queue, a mailbox to carry its prompt and settlement, and a host serving."""
        if self.placements is None or self.mailbox is None:
            return False
        try:
            return await trio.to_thread.run_sync(self.placements.serving_hosts) > 0
        except StorageError as exc:
            log.warning("the placement queue cannot be read (the child runs here): %s", exc)
            return False

    async def _start_placed(
        self, parent: Agent, child: Agent, activation: Activation, prompt: str, label: str, reserved: Reservation
    ) -> None:
        """Leave a created child to a serving host: release it here (no turn ran), put its first
        prompt in its mailbox and enqueue it; a stand-in Activation keeps its place in the family
        (the activation limit, `wait_tree_idle`, messages and interrupts) until its settlement
        arrives through the parent's mailbox."""
        assert self.placements is not None
        child_id = child.session_id
        try:
            # In this order: its mailbox owner here must not take the prompt; the placement must
            # exist before the prompt does, or a serving host's sweep would take the child for a
            # dropped session with mail; and the child is released last, still held here while a
            # host that claims it early waits (it gives the claim back and claims it again).
            if self.agents.owners is not None:
                self.agents.owners.stop(child_id)
            # Placed from now on: a message sent before its stand-in runs goes to its mailbox.
            settled = self._placed[child_id] = trio.Event()
            await trio.to_thread.run_sync(self.placements.enqueue, child_id)
            body = {"text": prompt, "first": True, "guidance": return_guidance(parent.session_id)}
            await self._post(child_id, "message", body, parent.session_id)
            await self.agents.stop(child_id, cause="parent")
            # Before its catalog: the catalogs of one step go one after the other (the model's
            # call order), and the child need not wait for its siblings' to start.
            await self._catalog(parent, child, "continuable", label, reserved)
        except BaseException:  # a start that failed (or was cancelled) leaves no stand-in (re-raised)
            self._placed.pop(child_id, None)
            await self._dispose_unannounced(activation)
            raise
        self._stand_in(activation, settled)

    def _stand_in(self, activation: Activation, settled: trio.Event | None = None) -> None:
        """Run the stand-in Activation of a child a serving host runs: resident here until its
        settlement arrives (`record_settled`) or this host lets go (`_interrupt_disposed`). Every
        `fallback_interval` it looks whether any host still serves: with none, and its placement
        still unclaimed (or claimed by a host that is gone), the child is taken back and run
        here, in the same Activation — a placed child never waits for hosts that are all gone."""
        child_id = activation.child_id
        if settled is None:
            settled = self._placed[child_id] = trio.Event()
        # (set already when its settlement came first: the stand-in ends at once)
        hooks: list[Any] = []  # the hooks of the child itself, once it runs here

        async def body(a: Activation) -> None:
            while not hooks:
                with trio.move_on_after(self.fallback_interval):
                    await settled.wait()
                if settled.is_set():
                    return
                with trio.CancelScope(shield=True):  # a child resumed here is never left untracked
                    child = await self._take_back(child_id, settled)
                if child is not None:
                    hooks.extend(self._child_hooks(child))
            await hooks[0](a)

        def ready(a: Activation) -> bool:
            return hooks[1](a) if hooks else True

        async def settle(a: Activation) -> None:
            if hooks:
                await hooks[2](a)
            elif self._placed.get(child_id) is settled:
                del self._placed[child_id]  # its settlement is the serving host's to record

        async def dispose(a: Activation) -> None:
            if hooks:
                await hooks[3](a)

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
                await self._place_again(child_id, claims)
            return None
        try:
            _header, identity = await self._observe_child(child_id, None)
            child = await self.agents.resume(child_id, label=identity.get("label"))
        except (AlreadyOwned, StorageError, SubagentError) as exc:
            log.warning("placed child %s: no host serves it, and it cannot be run here now: %s", child_id, exc)
            await self._place_again(child_id, claims)
            return None
        if self._placed.get(child_id) is settled:
            del self._placed[child_id]  # runs here from now on: messages and interrupts reach it directly
        if self.agents.owners is not None:
            await self.agents.owners.first_drain(child_id)
        log.info("placed child %s: no host serves it any more; it runs here", child_id)
        return child

    async def _place_again(self, child_id: str, claims: int) -> None:
        try:
            await trio.to_thread.run_sync(partial(self.placements.enqueue, claimed_before=claims > 0), child_id)  # type: ignore[union-attr]  # only called with placements
        except StorageError as exc:
            log.warning("placed child %s: could not be placed again: %s", child_id, exc)

    def _end_placed(self, child_id: str) -> bool:
        """End a placed child's stand-in here (settled, or this host lets go); False if the
        child is not placed from here."""
        settled = self._placed.pop(child_id, None)
        if settled is None:
            return False
        settled.set()
        return True

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
            if not self._end_placed(child_id):
                # It runs here already (taken over, or started here): its mailbox owner takes
                # what waits for it, and its placement is done when it is disposed.
                return resident
            await resident.disposed.wait()  # its stand-in here makes way for the child itself
        header, identity = await self._observe_child(child_id, None)
        if header.parent_session is None:
            raise NotResumable(f"session {child_id!r} is not a subagent")
        await self._wait_room(header.parent_session)
        activation = self._admit(child_id, header.parent_session)
        try:
            child = await self.agents.resume(child_id, label=identity.get("label"))
        except (AlreadyOwned, StorageError, AgentError) as exc:
            self.manager.forget(activation)
            raise _unavailable(child_id) from exc
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
        self._run_activation(activation, child)
        return activation

    async def hand_back(self, child_id: str) -> bool:
        """Let go of an adopted child without settling it (a serving host stopping cleanly):
        its turn is ended, it is disposed and its session released, so that another host (its
        placement given back by the caller) takes it over and settles it — once. False when it
        is not resident here or is settling already (its settlement goes on; the caller waits
        for its disposal and finishes the placement as usual)."""
        activation = self.manager.get(child_id)
        if activation is None or activation.closing or child_id in self._placed:
            return False
        self._handing_back.add(child_id)
        try:
            await self.manager.stop(child_id, "disposed", self._interrupt_disposed)
        finally:
            self._handing_back.discard(child_id)
        return True

    async def fail_placed(self, child_id: str, reason: str) -> bool:
        """A placed child no host can serve (its log is damaged, it is not a continuable child,
        no serving host can give it its model): its parent is told it failed — a `settled`
        (`reason_kind: "error"`, `reason_message: reason`) in the parent's mailbox, which ends
        the parent's stand-in. True once told, or when no parent can be named (nobody waits);
        False when it could not be told now (the caller tries again later)."""
        try:
            info, _held = await self.query.reader.stat(child_id)
        except PersistenceFailed:
            return False
        except StorageError:
            return True  # a log that cannot even name its parent: nobody to tell
        if info is None or info.header is None or info.header.parent_session is None:
            return True
        data: Json = {"child_id": child_id, "reason_kind": "error", "reason_message": reason}
        return await self.settlement.post(info.header.parent_session, child_id, data)

    async def take_over(self, session_id: str) -> Activation | Agent | None:
        """Resume a session another host dropped with work (`subagents serve`'s sweep): a
        continuable child is adopted (`adopt`; it settles even with nothing left to do — the
        dead host may have finished its turn without settling it); any other session is resumed
        as a root — its interrupted turn closed, its notices and mail taken in — and returned
        for the caller to hold until its tree is idle. None: nothing to do. `AlreadyOwned` when
        another host took it first; `SubagentError` when it cannot be resumed."""
        try:
            info, _held = await self.query.reader.stat(session_id)
        except StorageError as exc:
            raise _unavailable(session_id) from exc
        if info is None or info.header is None:
            raise _unavailable(session_id)
        if info.header.parent_session is not None:
            try:
                return await self.adopt(session_id, settle_idle=True)
            except SubagentError as exc:
                if isinstance(exc.__cause__, AlreadyOwned):
                    raise exc.__cause__ from None
                raise
        agent = await self.agents.resume(session_id)
        if self.agents.owners is not None:
            await self.agents.owners.first_drain(session_id)
        return agent

    async def _wait_room(self, parent_id: str, abort: Abort | None = None) -> None:
        """Until an admission under `parent_id` is not refused for a slot that is being freed.
        A settled child holds its slot until it is disposed, which ends after its parent was
        given the notice: a start (or resume) the notice invites waits for that slot rather than
        being refused for it. Callers `_admit` with no checkpoint after it."""
        while self.manager.making_room(parent_id):
            async with cancelled_when(abort):
                await self.manager.wait_changed()
            if abort is not None and abort.is_set():
                raise SubagentCancelled("message delivery was cancelled")

    def _admit(self, child_id: str, parent_id: str) -> Activation:
        try:
            return self.manager.admit(child_id, parent_id)
        except ActivationLimitReached as exc:
            raise ActivationLimit(limit_text(exc.limit)) from None
        except Draining:
            raise FamilyDraining(DRAINING_TEXT) from None
        except ParentClosing as exc:  # its family is shutting down
            raise FamilyDraining(f"agent {exc.parent_id!r} is closing; it takes no new subagents") from None

    def _budgeted(self, parent: Agent, options: ChildOptions) -> ChildOptions:
        """`options` with the child's effective budget: what was asked (its `seconds` counted
        from now), lowered to the parent's remainder — a child never outlives or outspends its
        parent. None when neither limits anything."""
        asked = options.budget
        if asked is not None and asked.seconds is not None:
            asked = asked.resolved(self.agents.clock.now_ms())
        ceiling = parent.budget_remaining()
        budget = asked.clamped(ceiling) if asked is not None else ceiling
        return options.with_budget(None if budget is None or budget.unlimited else budget)

    def _child_depth(self, parent: Agent) -> int:
        depth = parent.session.header.delegation_depth + 1
        if depth > self.max_depth:
            raise DepthExceeded(f"subagent depth {depth} exceeds max_depth {self.max_depth}")
        return depth

    def tools(self, extra: SessionTools | None = None) -> ToolSet:
        """The tools every agent is offered by default, with a session's own `extra` (for the
        registry: `AgentHooks`)."""
        return self.toolset(self, extra)

    def offered_tools(self, header: SessionHeader, tools: ToolSet) -> ToolSet:
        """`tools` as a session with `header` is offered them: an agent at the depth limit does
        not see the delegation tools at all (a call would only be refused)."""
        if header.delegation_depth < self.max_depth:
            return tools
        return ToolSet(tool for tool in tools if tool.name not in DELEGATION_TOOLS)

    def resume_setup(
        self, session_id: str, events: Sequence[Event], inherited_event_count: int
    ) -> tuple[AnyModel | None, AgentConfig, ToolSet] | None:
        """For the registry, on every resume: what a continuable child's descriptor (the last
        one in its own suffix, as its identity) asks for; None for any other session."""
        descriptor: SubagentDescriptor | None = None
        for event in events[inherited_event_count:]:
            if event.type == "subagent/descriptor":
                try:
                    descriptor = parse_descriptor(decode_payload(event, session_id=session_id))
                except (MalformedDescriptor, StorageError):
                    descriptor = None  # no identity, as the unit folds it
        if descriptor is None or descriptor.mode != "continuable":
            return None
        try:
            return self._setup(ChildOptions.of(descriptor), session_id)
        except SubagentError as exc:
            raise OptionsNotReapplied(
                f"subagent {session_id!r}: its options cannot be applied again: {exc.message}"
            ) from None

    def _setup(self, options: ChildOptions, near: str) -> _Setup:
        """The model, config and tools of a child with `options` (SubagentError if the runtime
        cannot give it the model it selects). Its tools include the session tools of `near` (its
        parent, or itself once open) or of their nearest open ancestor with some."""
        model = self.agents.model
        if options.selects_model:
            if self.child_model is None:
                raise UnsupportedCapability(
                    "this runtime cannot select a model per subagent: pass open_runtime(child_model=...)"
                )
            model = self.child_model(options)
        return _Setup(
            model, options.config(self.agents.config), filtered_tools(self.agents.tools(near), options.tool_filter)
        )

    async def _create_child(
        self,
        parent: Agent,
        reserved: Reservation,
        provider: Provider,
        depth: int,
        descriptor: SubagentDescriptor,
        setup: _Setup,
    ) -> Agent:
        child_id = reserved.child_id
        # A fork inherits the parent's events up to its last `turn/end` (captured once, at
        # creation), read by `SessionStore.fork`.
        fork = (parent.session, parent.closed_prefix) if provider == "fork" else None
        if provider not in ("fork", "spawn"):
            raise NoProvider(f'no subagent provider registered for "{provider}"')
        draft = EventDraft(type="subagent/descriptor", data=snapshot_descriptor(descriptor))
        agent = await self.agents.create(
            session_id=child_id,
            parent_session=parent.session_id,
            origin="subagent",
            delegation_depth=depth,
            cwd=parent.session.header.cwd,
            fork=fork,
            first=[draft],
            label=descriptor.label,
            created_at=reserved.created_at,
            model=setup.model,
            config=setup.config,
            tools=setup.tools,
        )
        return agent

    async def _catalog(self, parent: Agent, child: Agent, mode: str, label: str | None, reserved: Reservation) -> None:
        data: Json = {
            "version": 1,
            "child_id": child.session_id,
            "child_created_at": child.session.header.created_at,
            "mode": mode,
        }
        if label is not None:
            data["label"] = label
        try:
            if reserved.after is not None:
                await reserved.after.wait()  # the child drawn before it in this step goes first
            await parent.session.append(
                [EventDraft(type="subagent/catalog", data=data, time=self.agents.clock.now_ms())]
            )
        finally:
            reserved.announced.set()
            tail = self._chains.get(parent.session_id)
            if tail is not None and tail[1] is reserved:
                del self._chains[parent.session_id]

    async def _dispose_unannounced(self, activation: Activation) -> None:
        with trio.CancelScope(shield=True):
            await self.agents.stop(activation.child_id, cause="parent")
            self.manager.forget(activation)

    # --- residency and settlement -----------------------------------------------------------

    def _run_activation(self, activation: Activation, child: Agent) -> None:
        self.manager.start(activation, *self._child_hooks(child))

    def _child_hooks(
        self, child: Agent
    ) -> tuple[
        Callable[[Activation], Awaitable[None]],
        Callable[[Activation], bool],
        Callable[[Activation], Awaitable[None]],
        Callable[[Activation], Awaitable[None]],
    ]:
        """The body, ready check, settle and dispose hooks of a resident child's Activation."""

        async def body(activation: Activation) -> None:
            while True:
                try:
                    await child.wait_idle()
                except AgentStopped:
                    return  # its log cannot be written: it settles as failed

                if child.inbox.wakes():
                    continue
                if len(child.inbox):  # parked by an interrupt: pending work, not settled
                    await child.inbox.wait_changed()
                    continue
                if any(self.manager.get(o) is not None for o in activation.owned):
                    await self.manager.wait_changed()
                    continue
                if await self.settlement.wait_parent_quiet(activation):
                    continue  # the parent moved on meanwhile: look again before settling
                return

        def ready(_a: Activation) -> bool:
            return child.status == "stopped" or (child.status != "running" and not len(child.inbox))

        async def settle(a: Activation) -> None:
            await self._settle(a, child)

        async def dispose(a: Activation) -> None:
            await self.agents.stop(a.child_id, cause=a.cause or "disposed")

        return body, ready, settle, dispose

    async def _settle(self, activation: Activation, child: Agent) -> None:
        # One seam for the Activation's settle step (the crash driver of the tests holds it).
        if activation.child_id in self._handing_back:
            return  # handed back to the placement queue: the host that takes it over settles it
        await self.settlement.settle(activation, child)

    async def close_interrupted_one_shots(self, session_id: str, events: list[Event]) -> None:
        """On the resume of a session whose last turn was interrupted: close the one-shot
        children that turn catalogued (the closers of docs/format.md, "Interrupted turns", durably,
        in their own logs). Nobody resumes a one-shot child, so without this its open turn would
        stay open forever.

        Only that turn's catalog is read (the events after its last `turn/start`): a one-shot
        child runs inside one tool call of its parent's turn, in the parent's process, so a
        crash that kills it leaves that very turn open; children of closed turns were run to
        their end. No other child log is read. A child held by another process is skipped."""
        start = next((i for i in range(len(events) - 1, -1, -1) if events[i].type == "turn/start"), None)
        if start is None:
            return
        children: list[str] = []
        for event in events[start:]:
            if event.type == "subagent/catalog":
                try:
                    catalog = decode_payload(event, session_id=session_id)
                except StorageError:
                    continue  # a damaged record names no child we could trust
                if catalog.mode == "one-shot" and catalog.child_id not in children:
                    children.append(catalog.child_id)
        for child_id in children:
            try:
                if await self.agents.close_interrupted(child_id, child_of=session_id):
                    log.info("closed the interrupted turn of one-shot subagent %s", child_id)
            except AlreadyOwned:
                log.info("one-shot subagent %s is held by another process: left to it", child_id)
            except (StorageError, ActorStopped) as exc:
                log.warning("could not close the interrupted turn of one-shot subagent %s: %s", child_id, exc)

    def redeliver_notices(self, agent: Agent, events: list[Event]) -> None:
        """On resume: the settlement notices the parent's log holds undelivered, again
        (`Settlement.redeliver_notices`)."""
        self.settlement.redeliver_notices(agent, events)

    async def wait_tree_idle(self, agent: Agent) -> TurnResult | None:
        """Until the agent is idle and no Activation of its family is resident. `AgentStopped`
        when another host took the agent's session over meanwhile: its family's settlements
        reach that host now, so this one would wait for ever."""
        while True:
            result = await agent.wait_idle()
            lost = agent.session.ownership_lost
            if lost is not None:
                raise AgentStopped(
                    f"session {agent.session_id!r} was taken over by another host (its lease, epoch {lost.epoch}): "
                    "it runs there now"
                )
            if not any(a.root_id == agent.session_id for a in self.manager.resident.values()):
                if agent.status != "running" and not agent.inbox.wakes():
                    return result
                continue
            # Called right after the look (no checkpoint between): a change made meanwhile is not
            # missed. A session lost to another host wakes it too (`ContinuationManager.poke`).
            await self.manager.wait_changed()

    async def drain(self) -> None:
        await self.manager.drain(self._interrupt_disposed)

    # --- messages and interrupts -----------------------------------------------------------

    async def send_message(self, sender: Agent, target_id: str, text: str, abort: Abort | None = None) -> None:
        if self.agents.get(sender.session_id) is not sender:
            raise Unauthorized("message delivery requires the exact live sender agent")
        if self.manager.draining:
            raise FamilyDraining(DRAINING_TEXT)
        try:
            check_session_id(target_id)
        except InvalidSessionId:
            raise _unavailable(target_id) from None
        content = [
            {"type": "text", "text": f"Agent {sender.session_id} sent a message: "},
            {"type": "text", "text": text},
        ]
        source = {"kind": "agent-message", "sender_session_id": sender.session_id}
        own = self.manager.get(sender.session_id)
        if sender.session.header.parent_session == target_id:
            if own is None:
                raise Unauthorized(
                    f'agent "{sender.session_id}" is not a resident continuable child and '
                    f'cannot send to parent "{target_id}"'
                )
            parent = self.agents.get(target_id)
            if parent is None:
                if await self._held_elsewhere(target_id) is not None:
                    await self._post(target_id, "message", {"text": text}, sender.session_id)
                    return
                raise ParentUnavailable("direct parent is not live; the message was not delivered")
            await self._deliver(parent, content, source, abort)
            return
        while True:
            activation = self.manager.get(target_id)
            if activation is None:
                elsewhere = await self._held_elsewhere(target_id)
                if elsewhere is not None:
                    if elsewhere.header is None or elsewhere.header.parent_session != sender.session_id:
                        raise Unauthorized(f'subagent "{target_id}" belongs to another parent session')
                    await self._post(target_id, "message", {"text": text}, sender.session_id)
                    return
                if await self._cold_resume(sender, target_id, text, content, source, abort):
                    return
                continue
            async with activation.lock:
                if activation.closing:
                    pass  # wait for its disposal below, then cold-resume it
                else:
                    if activation.parent_id != sender.session_id:
                        raise Unauthorized(f'subagent "{target_id}" belongs to another parent session')
                    if target_id in self._placed:  # served by another host: its mailbox
                        await self._post(target_id, "message", {"text": text}, sender.session_id)
                        # Placed again if its host let go meanwhile (idempotent while it holds it).
                        await trio.to_thread.run_sync(self.placements.enqueue, target_id)  # type: ignore[union-attr]  # a stand-in exists only with placements
                        return
                    child = self.agents.get(target_id)
                    if child is None:
                        raise _unavailable(target_id)
                    await self._deliver(child, content, source, abort)
                    return
            await activation.disposed.wait()

    async def _deliver(
        self,
        agent: Agent,
        content: list[Json],
        source: Json,
        abort: Abort | None,
        mode: Literal["steer", "follow-up"] = "steer",
    ) -> None:
        try:
            await agent.inbox.put(Delivery(content=content, source=source, trigger="message"), mode, abort)
        except DeliveryCancelled:
            raise SubagentCancelled("message delivery was cancelled") from None

    async def _cold_resume(
        self, sender: Agent, target_id: str, text: str, content: list[Json], source: Json, abort: Abort | None
    ) -> bool:
        _header, identity = await self._observe_child(target_id, abort, parent_id=sender.session_id)
        await self._wait_room(sender.session_id, abort)
        if self.manager.get(target_id) is not None:
            return False  # someone resumed it meanwhile: deliver through its Activation
        activation = self._admit(target_id, sender.session_id)
        if await self._serving_hosts_up():
            # Not pinned here either: the message waits in its mailbox for a serving host (the
            # placement first: a sweep would take a session with mail and no placement).
            try:
                await trio.to_thread.run_sync(self.placements.enqueue, target_id)  # type: ignore[union-attr]  # checked by _serving_hosts_up
                await self._post(target_id, "message", {"text": text}, sender.session_id)
            except BaseException:  # a placement that failed frees its slot (re-raised)
                self.manager.forget(activation)
                raise
            self._stand_in(activation)
            return True
        try:
            # Its options come back from its descriptor (`resume_setup`, as on every resume).
            child = await self.agents.resume(target_id, label=identity.get("label"))
        except (AlreadyOwned, StorageError, AgentError) as exc:
            log.info("subagent %r: not resumable: %s", target_id, exc)
            self.manager.forget(activation)
            raise _unavailable(target_id) from None
        except BaseException:
            self.manager.forget(activation)
            raise
        try:
            # A follow-up, not a steer: notices redelivered on resume take the first turn alone.
            await self._deliver(child, content, source, abort, mode="follow-up")
        finally:
            self._run_activation(activation, child)
        return True

    async def _observe_child(
        self, target_id: str, abort: Abort | None, *, parent_id: str | None = None
    ) -> tuple[SessionHeader, Json]:
        """The header and identity of a continuable child that is not live here (of `parent_id`,
        when given), from one observation of its log."""
        if self.agents.get(target_id) is not None or self.agents.sessions.get(target_id) is not None:
            raise _unavailable(target_id)  # live but not an Activation: refused, not adopted
        try:
            async with self.query.observe_session(target_id, abort) as observation:
                header = observation.header
                identity = observation.projections.get(IDENTITY_UNIT.key)
                k = observation.inherited_event_count
        except QueryAborted:
            raise SubagentCancelled("message delivery was cancelled") from None
        except SessionQueryError as exc:
            raise _unavailable(target_id) from exc  # the cause tells a damaged log from a failed read
        if parent_id is not None and header.parent_session != parent_id:
            raise Unauthorized(f'subagent "{target_id}" belongs to another parent session')
        if not isinstance(identity, dict) or identity.get("seq", -1) < k or identity.get("mode") != "continuable":
            raise NotResumable(
                f'subagent "{target_id}" has no supported continuation state and cannot be resumed; '
                "choose a different target"
            )
        return header, identity

    async def interrupt(self, target_id: str, by: Agent) -> InterruptOutcome:
        """Stop a live descendant's current turn (`requested`). A target that exists but is not
        resident is an accepted no-op, never a cold resume (`not-running`); an id no session
        has — or an invalid one — is `NOT_RESUMABLE` (unavailable)."""
        if target_id == by.session_id:
            raise Unauthorized(f'agent "{target_id}" cannot interrupt itself')
        try:
            check_session_id(target_id)
        except InvalidSessionId:
            raise _unavailable(target_id) from None
        activation = self.manager.get(target_id)
        if activation is None or activation.closing:
            live = self.agents.get(target_id) if activation is None else None
            if live is not None and live.session.header.parent_session == by.session_id:
                live.cancel("parent")  # the caller's own one-shot child, running in the foreground
                return "requested"
            if live is not None:
                # live, but not a child running under the caller: not the caller's to stop
                raise Unauthorized(f'subagent "{target_id}" is not a live descendant of agent "{by.session_id}"')
            elsewhere = await self._held_elsewhere(target_id) if activation is None else None
            if elsewhere is not None:
                if elsewhere.header is None or elsewhere.header.parent_session != by.session_id:
                    raise Unauthorized(f'subagent "{target_id}" is not a live descendant of agent "{by.session_id}"')
                await self._post(target_id, "interrupt", {}, by.session_id)
                return "requested"
            if activation is None and not await self._exists(target_id):
                raise _unavailable(target_id)
            return "not-running"
        if by.session_id not in self.manager.ancestors(target_id):
            raise Unauthorized(f'subagent "{target_id}" is not a live descendant of agent "{by.session_id}"')
        if target_id in self._placed:  # served by another host: its owner there interrupts it
            await self._post(target_id, "interrupt", {}, by.session_id)
            return "requested"
        child = self.agents.get(target_id)
        if child is not None:
            child.inbox.park()
            child.cancel("parent")
        return "requested"

    # --- another process's sessions (the mailbox) --------------------------------------------

    async def _held_elsewhere(self, session_id: str) -> LogInfo | None:
        """The session's stat when another process holds it (its owner drains its mailbox);
        None when this runtime has no mailbox, the session is not held elsewhere, or it cannot
        be told."""
        if self.mailbox is None or self.agents.sessions.get(session_id) is not None:
            return None
        try:
            info, held = await self.query.reader.stat(session_id)
        except StorageError:
            return None
        return info if held and info is not None else None

    async def _post(self, target_id: str, kind: EnvelopeKind, body: Json, sender: str | None) -> None:
        """Deliver to the target's mailbox, durably; its owner records it."""
        assert self.mailbox is not None
        envelope = new_envelope(self.mailbox, kind, body, sender=sender)
        try:
            await trio.to_thread.run_sync(self.mailbox.deliver, target_id, envelope)
        except StorageError as exc:
            raise NotResumable(f'subagent "{target_id}" is unavailable: its mailbox failed: {exc}') from None

    async def stop_resident(self, session_id: str, cause: str) -> None:
        """A `stop` delivery (runtime/agent/mailbox_owner.py): settle and dispose the session if it is
        a resident continuable child; its turn was ended already."""
        if self.manager.get(session_id) is None:
            return

        def interrupt(activation: Activation) -> None:
            self.settlement.open_gate(activation.child_id)
            child = self.agents.get(activation.child_id)
            if child is not None:
                child.cancel(cause)  # type: ignore[arg-type]  # one of the three causes

        await self.manager.stop(session_id, cause, interrupt)

    async def record_settled(self, parent: Agent, body: Json, delivery_id: str) -> None:
        """A `settled` delivery (runtime/agent/mailbox_owner.py): `Settlement.record_delivered`."""
        await self.settlement.record_delivered(parent, body, delivery_id)
        child_id = body.get("child_id")
        if isinstance(child_id, str):
            self._end_placed(child_id)  # a child served elsewhere has settled

    async def _exists(self, session_id: str) -> bool:
        """Whether any session — live, or a log on disk, damaged or not — has this id."""
        if self.agents.sessions.get(session_id) is not None:
            return True
        (info,) = await self.query.stat_many([session_id])
        if isinstance(info, (SessionNotFound, PersistenceFailed)):
            return False  # no such log, or none that can be found: unavailable either way
        if isinstance(info, Exception):
            raise info
        return info is not None

    async def release_children_of(self, session_id: str) -> None:
        """Before a session is released: stop its resident children (child-first). Their
        settlements are recorded in its log; the notices wait for its next resume."""
        with self.settlement.disposing(session_id):
            for activation in [a for a in self.manager.resident.values() if a.parent_id == session_id]:
                await self.manager.stop(activation.child_id, "disposed", self._interrupt_disposed)

    def _interrupt_disposed(self, activation: Activation) -> None:
        if self._end_placed(activation.child_id):
            return  # served elsewhere: it goes on there, its settlement reaches the parent's mailbox
        self.settlement.open_gate(activation.child_id)  # the family is stopping: settle now
        child = self.agents.get(activation.child_id)
        if child is not None:
            child.cancel("disposed")
