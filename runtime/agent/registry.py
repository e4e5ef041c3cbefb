"""The agent registry: creates and resumes agents and owns the nursery they run in
(docs/design.md, "The agent loop and models").

One agent per session id. `create` draws a fresh id (skipping any that is live or on disk, so a
deterministic id factory restarted in a new process never collides), builds the header from the
runtime clock and publishes it with the first append; `resume` opens a persisted session,
appends the interrupted closers durably first (docs/format.md, "Interrupted turns"), and rebuilds
the surface from the log. `status(id)` answers `running` / `idle` for resident agents; `close`
stops every agent (`disposed`), waits a bounded time, and releases their sessions.

Tools beyond every agent's (`SessionTools`: an ACP client's MCP servers) may be added for one
session (`add_session_tools`) before it starts; they are offered to it and to every descendant
started while its entry stands (`tools(session_id)` finds the nearest open ancestor that has an
entry), and to no other session.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import attrs
import msgspec
import trio
from subagents.actors import EventDraft, SessionRef, SessionStore, StoreReader
from subagents.storage import (
    UNSET,
    Continuation,
    Event,
    Offset,
    PersistenceFailed,
    SessionHeader,
    SessionId,
    SessionNotFound,
    interrupted_closers,
    plan_continuation,
    stopped,
)

from ..foundation.clock import Clock
from ..foundation.errors import IdsExhausted, NoModel
from ..foundation.ids import IdFactory
from ..models.base import AnyModel
from ..models.messages import Surface
from ..tools.base import Tool, ToolSet
from .loop import Agent, AgentConfig
from .model_record import ModelFactory, resumed_model

__all__ = ["AgentHooks", "AgentOwners", "AgentRegistry", "SessionTools"]

log = logging.getLogger(__name__)


class AgentOwners(Protocol):
    """Tasks that live as long as a resident agent (the mailbox owners, runtime/agent/mailbox_owner.py)."""

    def start(self, agent: Agent) -> None: ...

    def stop(self, session_id: str) -> None: ...

    async def close(self, session_id: str) -> None:
        """Ack what the session's log recorded, then `stop`."""
        ...

    async def first_drain(self, session_id: str) -> None:
        """Until the session's owner has handed its agent what the mailbox held when it started
        (at once if it has no owner)."""
        ...


@attrs.frozen
class SessionTools:
    """Tools one session and its descendants get beyond every agent's: `tools` are added, and
    the default tools named in `hides` are left out (the ones they replace)."""

    tools: tuple[Tool, ...] = attrs.field(default=(), converter=tuple)
    hides: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)


class AgentHooks(Protocol):
    """What the registry asks of the layer that runs subagents on top of it (the subagent
    service implements it); handed to the registry at construction (`AgentRegistry(hooks=...)`).
    The registry calls none of it while it is being constructed, so an implementation that
    needs the registry itself may be completed once, after (runtime/delegation/service.py)."""

    def tools(self, extra: SessionTools | None = None) -> ToolSet:
        """The tools every agent is offered by default, with `extra` (a session's own)."""
        ...

    def redeliver_notices(self, agent: Agent, events: list[Event]) -> None:
        """On resume, with the session's events: e.g. redeliver settlement notices."""
        ...

    async def resume_children(self, agent: Agent, events: list[Event]) -> None:
        """On resume, after `redeliver_notices`: e.g. take up the children whose turns a dead
        process cut (they run under the agent until they settle)."""
        ...

    def resume_setup(
        self, session_id: str, events: Sequence[Event], inherited_event_count: int
    ) -> tuple[AnyModel | None, AgentConfig, ToolSet] | None:
        """(model, config, tools) a resumed session's own log asks for, or None for the
        defaults; raises AgentError when they cannot be given (e.g. a child's model route)."""
        ...

    def offered_tools(self, header: SessionHeader, tools: ToolSet) -> ToolSet:
        """The tools a session is offered, from its header (e.g. no delegation at the depth limit)."""
        ...

    async def close_interrupted_one_shots(self, session_id: str, events: list[Event]) -> None:
        """Called on resume with a session's events when its last turn was interrupted, before
        the closers or its `turn/continue` are appended (so a crash in between leaves the turn
        open and the call is retried): e.g. close the one-shot children that turn left open
        (a continued turn reconciles their calls as in doubt; nobody continues a one-shot child)."""
        ...

    async def release_children_of(self, session_id: str) -> None:
        """Before a session is released: e.g. drain its running children."""
        ...


@attrs.define(eq=False)
class AgentRegistry:
    """Creates, resumes and stops agents; `hooks` is what it asks of the layer above
    (`AgentHooks`), given at construction, so nothing is assigned to the registry afterwards."""

    sessions: SessionStore
    reader: StoreReader  # its stats go through the one index slot
    clock: Clock
    id_factory: IdFactory
    model: AnyModel | None
    config: AgentConfig
    _nursery: trio.Nursery = attrs.field(alias="nursery")
    hooks: AgentHooks
    drain_grace: float = 5.0
    owners: AgentOwners | None = None  # started with each agent, stopped before it
    # Builds the model a resumed subagent's log recorded, with this host's credentials (None:
    # every session runs `model`): model_record.py.
    model_factory: ModelFactory | None = None
    _agents: dict[str, Agent] = attrs.field(factory=dict)
    _session_tools: dict[str, SessionTools] = attrs.field(factory=dict)

    def tools(self, session_id: str | None = None) -> ToolSet:
        """The tools an agent is offered by default (the hooks'): for `session_id`, with the
        session tools of it or of its nearest open ancestor that has some."""
        return self.hooks.tools(self._session_tools_of(session_id))

    def add_session_tools(self, session_id: str, tools: SessionTools) -> None:
        """Offer `tools` to `session_id` and its descendants, from their next start (an agent
        already running keeps the tools it started with)."""
        self._session_tools[session_id] = tools

    def drop_session_tools(self, session_id: str) -> None:
        self._session_tools.pop(session_id, None)

    def _session_tools_of(self, session_id: str | None) -> SessionTools | None:
        # Up the parents through the open sessions (a session being started or resumed is
        # open before its tools are chosen); a closed ancestor ends the walk: none.
        sid = session_id
        for _ in range(64):  # deeper than any tree max_depth allows
            if sid is None:
                return None
            found = self._session_tools.get(sid)
            if found is not None:
                return found
            ref = self.sessions.get(sid)
            sid = ref.header.parent_session if ref is not None else None
        return None

    def get(self, session_id: str) -> Agent | None:
        agent = self._agents.get(session_id)
        return agent if agent is not None and agent.status != "stopped" else None

    def status(self, session_id: str) -> str | None:
        agent = self.get(session_id)
        return None if agent is None else agent.status

    def list(self) -> list[Agent]:
        return [a for a in self._agents.values() if a.status != "stopped"]

    async def new_id(self) -> str:
        for _ in range(1000):
            candidate = self.id_factory()
            if self.sessions.get(candidate) is None and not await self._exists(candidate):
                return candidate
        raise IdsExhausted("the id factory keeps proposing ids that already exist")

    async def _exists(self, session_id: str) -> bool:
        (info,) = await self.reader.stat_many([session_id])
        if isinstance(info, (SessionNotFound, PersistenceFailed)):
            return False  # no root yet (create makes it), or unreadable: create then says why
        if isinstance(info, Exception):
            raise info
        return info is not None

    async def create(
        self,
        *,
        session_id: str | None = None,
        cwd: str | None = None,
        parent_session: str | None = None,
        origin: Literal["subagent"] | None = None,
        delegation_depth: int = 0,
        agent_preset: str | None = None,
        inherited: Sequence[Event] = (),
        fork: tuple[SessionRef, int] | None = None,
        first: Sequence[EventDraft] = (),
        label: str | None = None,
        model: AnyModel | None = None,
        config: AgentConfig | None = None,
        tools: ToolSet | None = None,
        created_at: int | None = None,
    ) -> Agent:
        """A new session and its agent. `first` events are published with the session. It is
        seeded with `inherited`, or with `fork`'s (source, prefix): the source's first `prefix`
        events, read by `SessionStore.fork`."""
        sid = session_id if session_id is not None else await self.new_id()
        seeded = bool(inherited) or (fork is not None and fork[1] > 0)
        header = SessionHeader(
            id=SessionId(sid),
            created_at=created_at if created_at is not None else self.clock.now_ms(),
            is_seeded=seeded,
            delegation_depth=delegation_depth,
            cwd=cwd,
            parent_session=None if parent_session is None else SessionId(parent_session),
            origin=origin,
            agent_preset=agent_preset,
        )
        if fork is not None:
            source, prefix = fork
            ref, seed = await self.sessions.fork_with_events(source, Offset(prefix), header)
        else:
            ref, seed = await self.sessions.create(header, inherited=inherited), list(inherited)
        events: list[Event] = seed
        if first:
            result = await ref.append(list(first))
            events.extend(result.events)
        return await self._start(ref, events, label=label, model=model, config=config, tools=tools)

    async def resume(
        self,
        session_id: str,
        *,
        label: str | None = None,
        model: AnyModel | None = None,
        config: AgentConfig | None = None,
        tools: ToolSet | None = None,
        on_interrupted_turn: Literal["continue", "close"] | None = None,
    ) -> Agent:
        """The live agent, or the session resumed from its log. Without an explicit `model`,
        `config` or `tools`, `resume_setup` (the subagent service's) gives what the log's own
        record asks for (a child's options), so every path that resumes a session agrees.
        A last turn a crash left open is continued (docs/format.md, "Continued turns": its
        `turn/continue` appended durably first) or closed by the closers, as
        `on_interrupted_turn` says, else as the config's policy."""
        live = self.get(session_id)
        if live is not None:
            return live
        # The events the session store read to open it (one read of the log, not two).
        ref, events = await self.sessions.open_with_events(session_id)
        try:
            # Rebuild the surface in a worker thread: payloads are decoded there, so a long log
            # does not hold up the event loop.
            surface, newest = await trio.to_thread.run_sync(self._surface_of, session_id, events)
            observe = getattr(self.clock, "observe", None)  # a clock of the caller's may lack it
            if observe is not None and newest is not None:
                observe(newest)  # what it writes next is not older
            if model is None and config is None and tools is None:
                setup = self.hooks.resume_setup(session_id, events, ref.inherited_event_count)
                if setup is not None:
                    model, config, tools = setup
            policy = on_interrupted_turn or (config or self.config).on_interrupted_turn
            if stopped(events, ref.inherited_event_count):
                policy = "close"  # stopped for good: a turn its stop left open is not continued
            plan = plan_continuation(events, session_id=session_id) if policy == "continue" else None
            closers = [] if plan is not None else interrupted_closers(events, session_id=session_id)
            if closers or plan is not None:
                # The one-shot children the open turn left are closed either way: nobody else
                # runs them, and a continued `subagent` call is reconciled, never re-run.
                await self.hooks.close_interrupted_one_shots(session_id, events)
            if closers:
                result = await ref.append([_as_draft(e) for e in closers], expected_seq=len(events))
                events.extend(result.events)
                for event in result.events:
                    if event.surface_op is not UNSET:
                        surface.apply(event, session_id=session_id)
            if plan is not None:
                # Durable before the turn goes on: a crash in the continuation counts one more attempt.
                marker = EventDraft(type="turn/continue", data=plan.marker(), time=self.clock.now_ms())
                result = await ref.append([marker], expected_seq=len(events))
                events.extend(result.events)
            agent = await self._start(
                ref,
                events,
                label=label,
                model=model,
                config=config,
                tools=tools,
                surface=surface,
                continuation=plan,
            )
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.sessions.release(session_id)  # not resumed: its lock goes too
            raise
        agent.resumed_interrupted = bool(closers)
        self.hooks.redeliver_notices(agent, events)
        await self.hooks.resume_children(agent, events)
        return agent

    async def close_interrupted(self, session_id: str, *, child_of: str) -> bool:
        """Append the interrupted closers (docs/format.md, "Interrupted turns") to a session that
        is not live, durably, without starting an agent: open it through the session store, append,
        release. True when it had an open turn. Only a subagent whose header names `child_of` as
        its parent is touched (a catalog is data: a tampered one, or a fork's inherited one, must
        not close somebody else's session). `AlreadyOwned` (held by another process) and storage
        errors are the caller's to judge."""
        if self.sessions.get(session_id) is not None:
            return False  # live here: its own agent (or a resume) closes its turns
        ref, events = await self.sessions.open_with_events(session_id)
        try:
            if ref.header.origin != "subagent" or ref.header.parent_session != child_of:
                return False
            closers = interrupted_closers(events, session_id=session_id)
            if closers:
                await self.hooks.close_interrupted_one_shots(session_id, events)  # its own one-shot children first
            if closers:
                await ref.append([_as_draft(e) for e in closers], expected_seq=len(events))
            return bool(closers)
        finally:
            with trio.CancelScope(shield=True):
                await self.sessions.release(session_id)

    @staticmethod
    def _surface_of(session_id: str, events: list[Event]) -> tuple[Surface, int | None]:
        newest = max((e.time for e in events), default=None)
        return Surface.from_events(events, session_id=session_id), newest

    async def _start(
        self,
        ref: Any,
        events: list[Event],
        *,
        label: str | None,
        model: AnyModel | None,
        config: AgentConfig | None,
        tools: ToolSet | None,
        surface: Surface | None = None,
        continuation: Continuation | None = None,
    ) -> Agent:
        chosen = model if model is not None else self.model
        if chosen is None:
            raise NoModel("no model is configured: pass open_runtime(model=...)")
        if chosen is self.model and ref.header.origin == "subagent":  # a root runs its host's model
            chosen = resumed_model(ref.session_id, events, chosen, self.model_factory)
        offered = self.hooks.offered_tools(ref.header, tools if tools is not None else self.tools(ref.session_id))
        agent = Agent(
            ref,
            model=chosen,
            tools=offered,
            clock=self.clock,
            config=config or self.config,
            events=events,
            label=label,
            feed=self.sessions.feed,
            surface=surface,
            continuation=continuation,
        )
        await self._nursery.start(agent.run)
        self._agents[ref.session_id] = agent
        if self.owners is not None:
            self.owners.start(agent)
        return agent

    async def stop(self, session_id: str, *, cause: str = "disposed") -> None:
        """Cancel the agent's turn with `cause`, wait (bounded) for it to close, release the
        session — after the session's own running children (`hooks.release_children_of`)."""
        await self.hooks.release_children_of(session_id)
        if self.owners is not None:
            await self.owners.close(session_id)  # acks what was recorded; the rest stays in the mailbox
        agent = self._agents.pop(session_id, None)
        if agent is not None:
            agent.cancel(cause)  # type: ignore[arg-type]  # one of the three causes
            with trio.move_on_after(self.drain_grace):
                await agent.wait_turn_closed()
            await agent.stop()
        await self.sessions.release(session_id)

    async def aclose(self) -> None:
        for session_id in list(self._agents):
            await self.stop(session_id)


def _as_draft(event: Event) -> EventDraft:
    return EventDraft(
        type=event.type,
        data=msgspec.json.decode(event.data),
        time=event.time,
        ignorable=event.ignorable is True,
        surface_op=None if event.surface_op is UNSET else event.surface_op,
        source_event_seqs=None if event.source_event_seqs is UNSET else list(event.source_event_seqs),
    )
