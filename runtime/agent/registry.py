"""The agent registry: creates and resumes agents and owns the nursery they run in
(docs/design.md, "The agent loop and models").

One agent per session id. `create` draws a fresh id (skipping any that is live or on disk, so a
deterministic id factory restarted in a new process never collides), builds the header from the
runtime clock and publishes it with the first append; `resume` opens a persisted session,
appends the interrupted closers durably first (docs/format.md, "Interrupted turns"), and rebuilds
the surface from the log. `status(id)` answers `running` / `idle` for resident agents; `close`
stops every agent (`disposed`), waits a bounded time, and releases their sessions.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import msgspec
import trio

from subagents.actors import EventDraft, SessionStore
from subagents.storage import (
    Event,
    UNSET,
    LogStore,
    PersistenceFailed,
    SessionHeader,
    SessionNotFound,
    interrupted_closers,
)

from ..clock import Clock
from ..errors import AgentError, IdsExhausted, NoModel
from ..ids import IdFactory
from ..models.base import Model
from .loop import Agent, AgentConfig
from .messages import Surface
from .tools import ToolSet

__all__ = ["AgentError", "AgentRegistry"]

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class AgentRegistry:
    sessions: SessionStore
    log_store: LogStore
    clock: Clock
    id_factory: IdFactory
    model: Model | None
    config: AgentConfig
    tools: Callable[[], ToolSet]
    _nursery: trio.Nursery
    wait_settled: Callable[[str, str, int], Any] | None = None
    on_resume: Callable[[Agent, list[Event]], None] | None = None  # e.g. redeliver settlement notices
    before_release: Callable[[str], Awaitable[None]] | None = None  # e.g. drain its running children
    # (model, config, tools) a resumed session's own log asks for, or None for the defaults;
    # raises AgentError when they cannot be given (e.g. a child's model route).
    resume_setup: Callable[[str, list[Event], int], tuple[Model | None, AgentConfig, ToolSet] | None] | None = None
    # Called on resume with a session's events when its last turn was interrupted, before the
    # closers are appended (so a crash in between leaves the turn open and the call is retried):
    # e.g. close the one-shot children that turn left open.
    on_interrupted: Callable[[str, list[Event]], Awaitable[None]] | None = None
    # The tools a session is offered, from its header (e.g. no delegation at the depth limit).
    offer: Callable[[SessionHeader, ToolSet], ToolSet] | None = None
    drain_grace: float = 5.0
    index_limiter: trio.CapacityLimiter | None = None  # one index worker slot (docs/format.md, "The index")
    _agents: dict[str, Agent] = attrs.field(factory=dict)

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
        try:
            info = await trio.to_thread.run_sync(self.log_store.stat, session_id, limiter=self.index_limiter)
        except SessionNotFound:
            return False
        except PersistenceFailed:
            return False  # no root yet (create makes it), or unreadable: create then says why
        return info is not None

    async def create(
        self,
        *,
        session_id: str | None = None,
        cwd: str | None = None,
        parent_session: str | None = None,
        origin: str | None = None,
        delegation_depth: int = 0,
        agent_preset: str | None = None,
        inherited: Sequence[Event] = (),
        first: Sequence[EventDraft] = (),
        label: str | None = None,
        model: Model | None = None,
        config: AgentConfig | None = None,
        tools: ToolSet | None = None,
        created_at: int | None = None,
    ) -> Agent:
        """A new session and its agent. `first` events are published with the session."""
        sid = session_id if session_id is not None else await self.new_id()
        header = SessionHeader(
            id=sid, created_at=created_at if created_at is not None else self.clock.now_ms(), is_seeded=bool(inherited), delegation_depth=delegation_depth,
            cwd=cwd, parent_session=parent_session, origin=origin, agent_preset=agent_preset,  # type: ignore[arg-type]  # validated by SessionHeader
        )
        ref = await self.sessions.create(header, inherited=inherited)
        events: list[Event] = list(inherited)
        if first:
            result = await ref.append(list(first))
            events.extend(result.events)
        return await self._start(ref, events, label=label, model=model, config=config, tools=tools)

    async def resume(self, session_id: str, *, label: str | None = None, model: Model | None = None,
                     config: AgentConfig | None = None, tools: ToolSet | None = None) -> Agent:
        """The live agent, or the session resumed from its log. Without an explicit `model`,
        `config` or `tools`, `resume_setup` (the subagent service's) gives what the log's own
        record asks for (a child's options), so every path that resumes a session agrees."""
        live = self.get(session_id)
        if live is not None:
            return live
        ref = await self.sessions.open(session_id)
        try:
            # Read the log and rebuild the surface in a worker thread: payloads are decoded
            # there, so a long log does not hold up the event loop.
            events, surface, newest = await trio.to_thread.run_sync(self._read_all, session_id)
            observe = getattr(self.clock, "observe", None)  # a clock of the caller's may lack it
            if observe is not None and newest is not None:
                observe(newest)  # what it writes next is not older
            if self.resume_setup is not None and model is None and config is None and tools is None:
                setup = self.resume_setup(session_id, events, ref.inherited_event_count)
                if setup is not None:
                    model, config, tools = setup
            closers = interrupted_closers(events, session_id=session_id)
            if closers and self.on_interrupted is not None:
                await self.on_interrupted(session_id, events)
            if closers:
                result = await ref.append([_as_draft(e) for e in closers], expected_seq=len(events))
                events.extend(result.events)
                for event in result.events:
                    if event.surface_op is not UNSET:
                        surface.apply(event, session_id=session_id)
            agent = await self._start(ref, events, label=label, model=model, config=config, tools=tools,
                                      surface=surface)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.sessions.release(session_id)  # not resumed: its lock goes too
            raise
        if self.on_resume is not None:
            self.on_resume(agent, events)
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
        ref = await self.sessions.open(session_id)
        try:
            if ref.header.origin != "subagent" or ref.header.parent_session != child_of:
                return False
            events = await trio.to_thread.run_sync(self._read_events, session_id)
            closers = interrupted_closers(events, session_id=session_id)
            if closers and self.on_interrupted is not None:
                await self.on_interrupted(session_id, events)  # its own one-shot children first
            if closers:
                await ref.append([_as_draft(e) for e in closers], expected_seq=len(events))
            return bool(closers)
        finally:
            with trio.CancelScope(shield=True):
                await self.sessions.release(session_id)

    def _read_events(self, session_id: str) -> list[Event]:
        handle = self.log_store.open_read(session_id)
        try:
            return list(self.log_store.read(handle))
        finally:
            self.log_store.close(handle)

    def _read_all(self, session_id: str) -> tuple[list[Event], Surface, int | None]:
        events = self._read_events(session_id)
        newest = max((e.time for e in events), default=None)
        return events, Surface.from_events(events, session_id=session_id), newest

    async def _start(self, ref: Any, events: list[Event], *, label: str | None, model: Model | None,
                     config: AgentConfig | None, tools: ToolSet | None, surface: Surface | None = None) -> Agent:
        chosen = model if model is not None else self.model
        if chosen is None:
            raise NoModel("no model is configured: pass open_runtime(model=...)")
        offered = tools if tools is not None else self.tools()
        if self.offer is not None:
            offered = self.offer(ref.header, offered)
        agent = Agent(ref, model=chosen, tools=offered, clock=self.clock,
                      config=config or self.config, events=events, label=label, wait_settled=self.wait_settled,
                      surface=surface)
        await self._nursery.start(agent.run)
        self._agents[ref.session_id] = agent
        return agent

    async def stop(self, session_id: str, *, cause: str = "disposed") -> None:
        """Cancel the agent's turn with `cause`, wait (bounded) for it to close, release the
        session — after the session's own running children (`before_release`)."""
        if self.before_release is not None:
            await self.before_release(session_id)
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
