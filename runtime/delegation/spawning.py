"""Starting children: spawn and fork, one-shot and continuable, within the depth limit and the
family's activation limit, announced in the parent's catalog (docs/design.md, "Subagents:
activations and settlement").

Theory of operation. A child is a session with `origin: "subagent"` whose first append carries
its descriptor (and, for a fork, the parent's prefix and the seed marker), so no crash leaves a
child without identity. Ids and creation times are drawn in the model's call order
(`reserve`), and the parent's `subagent/catalog` events follow that order, not completion
order. A continuable child is admitted to its family (residency.py) and runs under an
Activation until it settles — or, with serving hosts up, is left to them (placement.py). A
child's options (`ChildOptions`) are recorded in its descriptor and re-applied on every resume
(`resume_setup`). One-shot children a crash left open are closed on their parent's resume
(`close_interrupted_one_shots`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, NamedTuple

import attrs
import trio
from subagents.actors import Abort, Activation, ActorStopped, ContinuationManager, EventDraft
from subagents.storage import AlreadyOwned, Event, SessionHeader, StorageError, decode_payload

from ..agent.inbox import DeliveryCancelled
from ..agent.loop import Agent, AgentConfig, TurnResult
from ..agent.registry import AgentRegistry
from ..foundation.errors import (
    AgentStopped,
    BudgetExhausted,
    DepthExceeded,
    FamilyDraining,
    NoProvider,
    OptionsNotReapplied,
    RunNotCompleted,
    SubagentCancelled,
    SubagentError,
    UnsupportedCapability,
)
from ..models.base import AnyModel
from ..tools.base import ToolSet
from .descriptor import MalformedDescriptor, SubagentDescriptor, parse_descriptor, snapshot_descriptor
from .options import ChildModel, ChildOptions, filtered_tools
from .placement import Placement
from .residency import DRAINING_TEXT, Residency
from .routing import Routing

__all__ = ["DELEGATION_TOOLS", "Provider", "Reservation", "Spawning", "return_guidance"]

log = logging.getLogger(__name__)

Json = dict[str, Any]
Provider = Literal["spawn", "fork"]

DELEGATION_TOOLS = frozenset({"subagent", "subagent_fork"})

_HEADLINES = {
    "aborted": "subagent run was cancelled",
    "error": "subagent run failed",
    "max-tokens": "subagent run hit its token limit before finishing",
    "budget": "subagent run ran out of its budget before finishing",
}


def return_guidance(parent_id: str, *, can_send: bool = True) -> str:
    """What a continuable child is told about returning its result; a child whose tools lack
    `send_message` is told about its closing message only (never of a tool it does not have)."""
    pid = json.dumps(parent_id, ensure_ascii=False)
    shares = (
        "The parent shares your workspace but does not automatically receive your transcript, tool output, "
        "or reasoning."
    )
    if not can_send:
        return (
            f"Your parent agent id is {pid}. When you finish, end your turn with a self-contained result: "
            f"your closing message is what your parent is given. {shares}"
        )
    return (
        f"Your parent agent id is {pid}. Before you finish, send your result to that agent with "
        f'send_message({{ agent_id: {pid}, message: "<self-contained result>" }}). {shares} Send '
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
    # The `subagent` tool call it was drawn for: its catalog names it, so a continued turn
    # reconciles an interrupted call from the catalog (docs/format.md, "Continued turns").
    call_id: str | None = None


@attrs.define(eq=False)
class Spawning:
    """Starts one-shot and continuable children, and gives a child's setup on every resume."""

    agents: AgentRegistry
    manager: ContinuationManager
    residency: Residency
    routing: Routing
    placement: Placement
    max_depth: int = 1
    child_model: ChildModel | None = None  # builds the model a child's options select
    # parent id → ((turn, step), the last reservation drawn in that step): the catalog chain
    _chains: dict[str, tuple[tuple[int, int], Reservation]] = attrs.field(factory=dict)

    async def reserve(
        self, parent_id: str | None = None, step: tuple[int, int] | None = None, *, call_id: str | None = None
    ) -> Reservation:
        """A child id and creation time, drawn now (tools draw them in model order). With the
        parent and its (turn, step), the reservation's catalog waits for the one drawn before
        it in the same step."""
        child_id = await self.agents.new_id()
        after: trio.Event | None = None
        if parent_id is not None and step is not None:
            previous = self._chains.get(parent_id)
            if previous is not None and previous[0] == step:
                after = previous[1].announced
        reserved = Reservation(child_id, self.agents.clock.now_ms(), after, call_id=call_id)
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
        options = self._budgeted(parent, options or ChildOptions(), reserved)
        with self._reservation_returned_on_failure(parent, reserved):
            return await self._start_continuable(parent, provider, label, prompt, abort, reserved, options, depth)

    async def _start_continuable(
        self,
        parent: Agent,
        provider: Provider,
        label: str,
        prompt: str,
        abort: Abort | None,
        reserved: Reservation | None,
        options: ChildOptions,
        depth: int,
    ) -> str:
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
            on_interrupted_turn=options.on_interrupted_turn,
        )
        setup = self._setup(options, parent.session_id)  # refusals before anything exists
        if abort is not None and abort.is_set():
            raise SubagentCancelled("message delivery was cancelled")
        placed = await self.placement.serving_hosts_up()
        reserved = reserved or await self.reserve()
        child_id = reserved.child_id
        await self.residency.wait_room(parent.session_id, abort)
        activation = self.residency.admit(child_id, parent.session_id)
        try:
            child = await self._create_child(
                parent, reserved, provider, depth, descriptor, setup, agent_type=options.agent_type
            )
        except BaseException:
            self.manager.forget(activation)
            raise
        guidance = return_guidance(parent.session_id, can_send="send_message" in setup.tools)
        if placed:
            await self._start_placed(parent, child, activation, prompt, label, reserved, guidance)
            return child_id
        try:
            first = [{"type": "text", "text": prompt}, {"type": "text", "text": guidance}]
            await child.send(first, "follow-up", abort=abort)
            # Inside the guard: a cancel while the catalog waits for its turn in the step (or
            # for the parent's actor) must not leave an Activation that nothing runs, which a
            # drain would wait on forever.
            await self._catalog(parent, child, "continuable", label, reserved)
        except DeliveryCancelled:
            await self.residency.dispose_unannounced(activation)
            raise SubagentCancelled("message delivery was cancelled") from None
        except BaseException:
            await self.residency.dispose_unannounced(activation)
            raise
        self.residency.run(activation, child)
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
        budgeted = self._budgeted(parent, options or ChildOptions(), reserved)
        with self._reservation_returned_on_failure(parent, reserved):  # (once it runs, its stop returns it)
            setup = self._setup(budgeted, parent.session_id)
            reserved = reserved or await self.reserve()
            child = await self._create_child(
                parent,
                reserved,
                provider,
                depth,
                SubagentDescriptor(mode="one-shot", provider=provider, label=label),
                setup,
                agent_type=budgeted.agent_type,
            )
        child_id = reserved.child_id
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

    async def _start_placed(
        self,
        parent: Agent,
        child: Agent,
        activation: Activation,
        prompt: str,
        label: str,
        reserved: Reservation,
        guidance: str,
    ) -> None:
        """Leave a created child to a serving host: release it here (no turn ran), put its first
        prompt in its mailbox and enqueue it; a stand-in Activation keeps its place in the family
        (the activation limit, `wait_tree_idle`, messages and interrupts) until its settlement
        arrives through the parent's mailbox."""
        child_id = child.session_id
        placed = self.residency.placed
        try:
            # In this order: its mailbox owner here must not take the prompt; the placement must
            # exist before the prompt does, or a serving host's sweep would take the child for a
            # dropped session with mail; and the child is released last, still held here while a
            # host that claims it early waits (it gives the claim back and claims it again).
            if self.agents.owners is not None:
                self.agents.owners.stop(child_id)
            # Placed from now on: a message sent before its stand-in runs goes to its mailbox.
            settled = placed[child_id] = trio.Event()
            await self.placement.enqueue(child_id)
            body = {"text": prompt, "first": True, "guidance": guidance}
            await self.routing.post(child_id, "message", body, parent.session_id)
            await self.agents.stop(child_id, cause="parent")
            # Before its catalog: the catalogs of one step go one after the other (the model's
            # call order), and the child need not wait for its siblings' to start.
            await self._catalog(parent, child, "continuable", label, reserved)
        except BaseException:  # a start that failed (or was cancelled) leaves no stand-in (re-raised)
            placed.pop(child_id, None)
            await self.residency.dispose_unannounced(activation)
            raise
        self.placement.stand_in(activation, settled)

    @contextmanager
    def _reservation_returned_on_failure(self, parent: Agent, reserved: Reservation | None) -> Iterator[None]:
        """A start that fails after `_budgeted` reserved the child's budget (a refusal, a cancel,
        a failed write) gives the reservation back to the parent's tree at once, not when the
        parent stops, and the descendant it counted; re-raised."""
        try:
            yield
        except BaseException:
            ledger = parent.config.ledger
            if ledger is not None:
                ledger.start_failed(parent.session_id, None if reserved is None else reserved.child_id)
            raise

    def _budgeted(self, parent: Agent, options: ChildOptions, reserved: Reservation | None = None) -> ChildOptions:
        """`options` with the child's effective budget: what was asked (its `seconds` counted
        from now), lowered to the parent's remainder — a child never outlives or outspends its
        parent. None when neither limits anything."""
        asked = options.budget
        if asked is not None and asked.seconds is not None:
            asked = asked.resolved(self.agents.clock.now_ms())
        ledger = parent.config.ledger
        if ledger is not None:  # budgets shared down the tree (runtime/agent/tree_ledger.py)
            refused = ledger.start_refusal(parent.session_id)
            if refused is not None:
                raise BudgetExhausted(f"no subagent started: {refused}")
        ceiling = parent.budget_remaining()
        budget = asked.clamped(ceiling) if asked is not None else ceiling
        if ledger is not None:  # reserved now, before a sibling started in the same step asks
            ledger.start_child(parent.session_id, None if reserved is None else reserved.child_id, budget)
        return options.with_budget(None if budget is None or budget.unlimited else budget)

    def _child_depth(self, parent: Agent) -> int:
        depth = parent.session.header.delegation_depth + 1
        if depth > self.max_depth:
            raise DepthExceeded(f"subagent depth {depth} exceeds max_depth {self.max_depth}")
        return depth

    def offered_tools(self, header: SessionHeader, tools: ToolSet) -> ToolSet:
        """`tools` as a session with `header` is offered them: an agent at the depth limit does
        not see the delegation tools at all (a call would only be refused); a tool described by
        its caller's agent type (`run_command`'s box) is described for this one."""
        tools = tools.for_agent_type(header.agent_preset)
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
        *,
        agent_type: str | None = None,
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
            agent_preset=agent_type,  # the agent type it was spawned as (listings show it)
            cwd=parent.session.header.cwd,
            fork=fork,
            first=[draft, *parent.child_trace(reserved.call_id)],  # its trace goes on under that call
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
        if reserved.call_id is not None:
            data["call_id"] = reserved.call_id
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
