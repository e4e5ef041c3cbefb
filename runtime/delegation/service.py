"""The subagent service: the parts that start, message, place and settle children, and the one
object the agent registry and the mailbox owners call back (docs/design.md, "Subagents:
activations and settlement").

The work is done by parts, each constructed with what it needs, in dependency order:

- `Settlement` (settlement.py): records a child's settlement in its parent and delivers the notice;
- `Residency` (residency.py): admits, runs, settles and stops resident children's Activations;
- `Routing` (routing.py): reads of children not live here, and their mailboxes;
- `Placement` (placement.py): children left to serving hosts, and the serving host's side;
- `Spawning` (spawning.py): starting one-shot and continuable children, and a child's setup;
- `Messaging` (messaging.py): `send_message` and `interrupt`;
- `Stopping` (stopping.py): the durable stopped marker, and the stop of a whole tree.

`SubagentService` is what sits above none of them and below the agent registry: the registry's
`AgentHooks` and the mailbox owners' `OwnerActions`, and `Runtime.subagents` for embedders. It is
a facade that delegates; callers that need one concern may hold that part instead.

Why a bind step. The registry calls back into delegation (`AgentHooks`: a child's setup on resume,
the tools every agent gets, releasing a session's children), and every part needs the registry
(to create, resume and stop agents). That is a real cycle — an agent's tools start agents — so
one edge must be closed after construction. It is closed here, once, and checked: the service is
built first, empty; the registry (and the mailbox owners) receive it at construction; then the
parts are built from the registry, bottom up (`SubagentParts.build`); then `bind` hands them to
the service, exactly once. The registry calls no hook while it is being built, and a call before
`bind` raises `RuntimeError` rather than finding half a service. Nothing is fetched back out of
another object, and no lambda stands for an object not built yet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
from subagents.actors import Abort, Activation, ContinuationManager
from subagents.storage import Envelope, Event, Mailbox, Placements, SessionHeader

from ..agent.loop import Agent, AgentConfig, TurnResult
from ..agent.registry import AgentRegistry, SessionTools
from ..models.base import AnyModel
from ..query import SessionQuery
from ..tools.base import ToolSet
from .messaging import InterruptOutcome, Messaging
from .options import ChildModel, ChildOptions
from .placement import Placement
from .residency import Residency
from .revival import Revival
from .routing import Routing
from .settlement import Settlement, notice_blocks
from .spawning import DELEGATION_TOOLS, Provider, Reservation, Spawning, return_guidance
from .stopping import Stopping, TreeStop, stopped

# These stay importable from here for existing callers.
__all__ = [
    "DELEGATION_TOOLS",
    "Reservation",
    "SubagentParts",
    "SubagentService",
    "notice_blocks",
    "return_guidance",
]

Json = dict[str, Any]
Toolset = Callable[[SessionTools | None], ToolSet]


def _unbound() -> RuntimeError:
    return RuntimeError("the subagent service is used before its parts were bound (open_runtime binds them)")


@attrs.frozen(kw_only=True)
class SubagentParts:
    """The parts of the subagent service, built in dependency order by `build`."""

    settlement: Settlement
    residency: Residency
    routing: Routing
    placement: Placement
    spawning: Spawning
    messaging: Messaging
    stopping: Stopping
    revival: Revival

    @classmethod
    def build(
        cls,
        *,
        agents: AgentRegistry,
        manager: ContinuationManager,
        query: SessionQuery,
        mailbox: Mailbox | None = None,
        placements: Placements | None = None,
        max_depth: int = 1,
        child_model: ChildModel | None = None,
    ) -> SubagentParts:
        """Each part from the ones below it. `mailbox` carries deliveries to sessions another
        process holds; `placements` (with the mailbox) leaves background children to serving
        hosts; `child_model` builds the model a child's options select."""
        settlement = Settlement(agents, manager, mailbox, query=query)
        residency = Residency(agents=agents, manager=manager, settlement=settlement)
        routing = Routing(agents=agents, query=query, mailbox=mailbox)
        placement = Placement(
            agents=agents,
            manager=manager,
            query=query,
            settlement=settlement,
            residency=residency,
            routing=routing,
            placements=placements,
            mailbox=mailbox,
        )
        spawning = Spawning(
            agents=agents,
            manager=manager,
            residency=residency,
            routing=routing,
            placement=placement,
            max_depth=max_depth,
            child_model=child_model,
        )
        messaging = Messaging(agents=agents, manager=manager, residency=residency, routing=routing, placement=placement)
        stopping = Stopping(
            agents=agents, manager=manager, residency=residency, routing=routing, query=query, mailbox=mailbox
        )
        revival = Revival(agents=agents, manager=manager, query=query, residency=residency, placement=placement)
        return cls(
            revival=revival,
            settlement=settlement,
            residency=residency,
            routing=routing,
            placement=placement,
            spawning=spawning,
            messaging=messaging,
            stopping=stopping,
        )


@attrs.define(eq=False)
class SubagentService:
    """Starts, messages, resumes and interrupts the subagents of a runtime, through its parts
    (`bind`); the agent registry's `AgentHooks` and the mailbox owners' `OwnerActions`."""

    _parts: SubagentParts | None = attrs.field(default=None, init=False)
    _toolset: Toolset | None = attrs.field(default=None, init=False)

    def bind(self, parts: SubagentParts, toolset: Toolset) -> None:
        """Give the service its parts and the tools every agent is offered (`toolset(extra)`,
        with a session's own `SessionTools`): once, before any agent starts."""
        if self._parts is not None:
            raise RuntimeError("the subagent service is bound already")
        self._parts, self._toolset = parts, toolset

    @property
    def parts(self) -> SubagentParts:
        """The parts given to `bind`; `RuntimeError` before."""
        if self._parts is None:
            raise _unbound()
        return self._parts

    # --- the parts, and what they were built with ----------------------------------------------

    @property
    def settlement(self) -> Settlement:
        return self.parts.settlement

    @property
    def residency(self) -> Residency:
        return self.parts.residency

    @property
    def placement(self) -> Placement:
        return self.parts.placement

    @property
    def spawning(self) -> Spawning:
        return self.parts.spawning

    @property
    def messaging(self) -> Messaging:
        return self.parts.messaging

    @property
    def stopping(self) -> Stopping:
        return self.parts.stopping

    @property
    def agents(self) -> AgentRegistry:
        return self.parts.spawning.agents

    @property
    def manager(self) -> ContinuationManager:
        return self.parts.residency.manager

    @property
    def query(self) -> SessionQuery:
        return self.parts.routing.query

    @property
    def mailbox(self) -> Mailbox | None:
        return self.parts.routing.mailbox

    @property
    def placements(self) -> Placements | None:
        return self.parts.placement.placements

    @property
    def child_model(self) -> ChildModel | None:
        return self.parts.spawning.child_model

    @child_model.setter
    def child_model(self, value: ChildModel | None) -> None:
        # Settable, as it was when the service was one object (children started from now on).
        self.parts.spawning.child_model = value

    @property
    def max_depth(self) -> int:
        return self.parts.spawning.max_depth

    # --- starting (`Spawning`) ----------------------------------------------------------------

    async def reserve(self, parent_id: str | None = None, step: tuple[int, int] | None = None) -> Reservation:
        """`Spawning.reserve`."""
        return await self.parts.spawning.reserve(parent_id, step)

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
        """`Spawning.start_continuable`: a background child; its id once its first prompt is accepted."""
        return await self.parts.spawning.start_continuable(
            parent, provider, label, prompt, abort, reserved=reserved, options=options
        )

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
        """`Spawning.start`: a one-shot foreground child, run to the end of its turn."""
        return await self.parts.spawning.start(
            parent, provider, prompt, label=label, abort=abort, reserved=reserved, options=options
        )

    # --- messages and interrupts (`Messaging`) ------------------------------------------------

    async def send_message(self, sender: Agent, target_id: str, text: str, abort: Abort | None = None) -> None:
        """`Messaging.send_message`."""
        await self.parts.messaging.send_message(sender, target_id, text, abort)

    async def interrupt(self, target_id: str, by: Agent) -> InterruptOutcome:
        """`Messaging.interrupt`."""
        return await self.parts.messaging.interrupt(target_id, by)

    # --- residency (`Residency`) --------------------------------------------------------------

    async def wait_tree_idle(self, agent: Agent) -> TurnResult | None:
        """`Residency.wait_tree_idle`: until the agent is idle and no Activation of its family is resident."""
        return await self.parts.residency.wait_tree_idle(agent)

    async def drain(self) -> None:
        """`Residency.drain`: stop every family, children first."""
        await self.parts.residency.drain()

    async def mark_stopped(self, session_id: str, stop: Envelope) -> None:
        """A `stop` delivery, before its turn is ended (`OwnerActions`): its stopped marker, and
        with a tree stop the markers of what runs below it here (`Stopping.mark_delivered`)."""
        tree = stop.body.get("tree") is True
        await self.parts.stopping.mark_delivered(
            session_id, by=stop.sender or "operator", tree=tree, delivery_id=stop.delivery_id
        )

    async def stop_resident(self, session_id: str, cause: str, stop: Envelope | None = None) -> None:
        """A `stop` delivery (`OwnerActions`), its marker recorded and its turn ended: a tree
        stop stops what runs below it here too (`Stopping.stop_delivered`); else
        `Residency.stop_resident`."""
        if stop is not None and stop.body.get("tree") is True:
            await self.parts.stopping.stop_delivered(session_id, cause)
            return
        await self.parts.residency.stop_resident(session_id, cause)

    # --- stopping for good (`Stopping`) -------------------------------------------------------

    async def stop_tree(self, session_id: str, *, by: str = "operator", cause: str = "user") -> TreeStop:
        """`Stopping.stop_tree`: the session and every descendant, wherever each runs, durably."""
        return await self.parts.stopping.stop_tree(session_id, by=by, cause=cause)

    async def is_stopped(self, session_id: str) -> bool:
        """`Stopping.is_stopped`: whether the session's log says it is stopped (for the
        resume paths other parts own: a serving host's claim and sweep)."""
        return await self.parts.stopping.is_stopped(session_id)

    async def record_settled(self, parent: Agent, body: Json, delivery_id: str) -> None:
        """A `settled` delivery (`OwnerActions`): `Residency.record_settled`."""
        await self.parts.residency.record_settled(parent, body, delivery_id)

    # --- serving placed children (`Placement`) ------------------------------------------------

    async def adopt(self, child_id: str, *, settle_idle: bool = False) -> Activation | None:
        """`Placement.adopt`."""
        return await self.parts.placement.adopt(child_id, settle_idle=settle_idle)

    async def hand_back(self, child_id: str) -> bool:
        """`Placement.hand_back`."""
        return await self.parts.placement.hand_back(child_id)

    async def fail_placed(self, child_id: str, reason: str) -> bool:
        """`Placement.fail_placed`."""
        return await self.parts.placement.fail_placed(child_id, reason)

    async def take_over(self, session_id: str) -> Activation | Agent | None:
        """`Placement.take_over`."""
        return await self.parts.placement.take_over(session_id)

    # --- the registry's hooks (`AgentHooks`) ----------------------------------------------------

    def tools(self, extra: SessionTools | None = None) -> ToolSet:
        """The tools every agent is offered by default, with a session's own `extra`."""
        if self._toolset is None:
            raise _unbound()
        return self._toolset(extra)

    def offered_tools(self, header: SessionHeader, tools: ToolSet) -> ToolSet:
        """`Spawning.offered_tools`: no delegation tools at the depth limit."""
        return self.parts.spawning.offered_tools(header, tools)

    def resume_setup(
        self, session_id: str, events: Sequence[Event], inherited_event_count: int
    ) -> tuple[AnyModel | None, AgentConfig, ToolSet] | None:
        """`Spawning.resume_setup`: what a continuable child's descriptor asks for on resume."""
        return self.parts.spawning.resume_setup(session_id, events, inherited_event_count)

    async def close_interrupted_one_shots(self, session_id: str, events: list[Event]) -> None:
        """`Spawning.close_interrupted_one_shots`."""
        await self.parts.spawning.close_interrupted_one_shots(session_id, events)

    async def resume_children(self, agent: Agent, events: list[Event]) -> None:
        """On resume: `Revival.resume_cut_children` — not under a stopped session."""
        if stopped(events, agent.session.inherited_event_count):
            return
        await self.parts.revival.resume_cut_children(agent, events)

    def redeliver_notices(self, agent: Agent, events: list[Event]) -> None:
        """On resume: `Settlement.redeliver_notices` — not into a stopped session, which no notice
        may start again (they stay durable: its resume after an explicit message delivers them)."""
        if stopped(events, agent.session.inherited_event_count):
            return
        self.parts.settlement.redeliver_notices(agent, events)

    async def release_children_of(self, session_id: str) -> None:
        """Before a session is released: `Residency.release_children_of`."""
        await self.parts.residency.release_children_of(session_id)
