"""The ACP method dispatcher: one `AcpServer` per connection, over an open runtime.

An ACP session is a runtime session (`sessionId` = session id). Each session this connection
opened has one forwarder task that follows the runtime's event stream of the session (its
durable events, runtime/event_stream.py), turns them into `session/update` notifications
(`updates_for`) and watches for the prompt's own `turn/end`, so every update of a turn is
written before the prompt's response. A turn started
by a settlement notice while no prompt runs streams the same way. The server holds nothing the
log does not: `session/load` replays the log.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import msgspec
import trio
from subagents.storage import Event, InvalidSessionId, SessionNotFound, SubagentsError, check_session_id, decode_payload

from ..agent.loop import Agent
from ..app import Runtime
from ..errors import AcpRequestError, AgentError, AgentStopped, SessionQueryError
from ..event_stream import open_event_stream
from .params import (
    CancelParams,
    CloseParams,
    InitializeParams,
    ListParams,
    LoadParams,
    NewParams,
    PromptParams,
    convert_params,
    prompt_text,
)
from .rpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    RESOURCE_NOT_FOUND,
    Incoming,
    error_line,
    notification_line,
    result_line,
)
from .updates import stop_reason, updates_for

__all__ = ["PROTOCOL_VERSION", "AcpServer"]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
Json = dict[str, Any]


@attrs.define
class _Prompt:
    done: trio.Event = attrs.field(factory=trio.Event)
    turn: int | None = None  # the turn that answers it, once it started
    reason: Json | None = None  # its `turn/end` reason
    cancelled: bool = False


@attrs.define
class _Session:
    agent: Agent
    cwd: str
    mcp_servers: list[Json]  # recorded for the tools issue; not connected yet
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    prompt: _Prompt | None = None
    turn: int | None = None  # the turn the session's events are in, as the forwarder saw them


class AcpServer:
    """The methods of ACP protocol version 1 this agent serves, over `runtime`. Replies and
    notifications go to `out` as encoded lines; forwarders run in `nursery`."""

    def __init__(self, runtime: Runtime, nursery: trio.Nursery, out: trio.MemorySendChannel[bytes], *, version: str):
        self.runtime = runtime
        self._nursery = nursery
        self._out = out
        self._version = version
        self._sessions: dict[str, _Session] = {}
        self.client_capabilities: Json = {}  # fs and terminal, as the client said (for the tools issue)
        self._methods: dict[str, Callable[[Any], Awaitable[Any]]] = {
            "initialize": self.initialize,
            "authenticate": self.authenticate,
            "session/new": self.new_session,
            "session/load": self.load_session,
            "session/list": self.list_sessions,
            "session/prompt": self.prompt,
            "session/cancel": self.cancel,
            "session/close": self.close_session,
        }

    async def handle(self, message: Incoming) -> None:
        """Run one request or notification; a request gets exactly one reply. Bad input is a
        JSON-RPC error, never a log record or an exception out of here."""
        try:
            method = self._methods.get(message.method or "")
            if method is None:
                raise AcpRequestError(METHOD_NOT_FOUND, f"Method not found: {message.method}")
            result = await method(message.params)
        except AcpRequestError as exc:
            reply = error_line(message.id, exc.rpc_code, exc.message, exc.data)
        except SubagentsError as exc:  # the runtime refused (a damaged log, a stopped agent)
            reply = error_line(message.id, INTERNAL_ERROR, str(exc), {"code": exc.code})
        except Exception as exc:  # a bug: this request fails loudly, the connection carries on
            log.exception("acp: %s failed", message.method)
            reply = error_line(message.id, INTERNAL_ERROR, f"internal error: {exc}")
        else:
            reply = result_line(message.id, {} if result is None else result) if message.id is not None else b""
        if message.id is not None:
            await self._out.send(reply)

    async def aclose(self) -> None:
        """Stop streaming (the runtime's own close drains the agents)."""
        for session in self._sessions.values():
            session.scope.cancel()

    # --- methods ----------------------------------------------------------------------------

    async def initialize(self, params: Any) -> Json:
        p = convert_params(params, InitializeParams)
        self.client_capabilities = {
            "fs": p.client_capabilities.get("fs", {}),
            "terminal": p.client_capabilities.get("terminal", False),
        }
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
                "sessionCapabilities": {"list": {}, "close": {}},
            },
            "authMethods": [],
            "agentInfo": {"name": "trio-subagents", "title": "trio-subagents", "version": self._version},
        }

    async def authenticate(self, params: Any) -> Json:
        return {}  # no auth methods are offered: the model's key comes from the environment

    async def new_session(self, params: Any) -> Json:
        p = convert_params(params, NewParams)
        _absolute(p.cwd)
        agent = await self.runtime.agents.create(cwd=p.cwd)
        self._start(agent, p.cwd, p.mcp_servers, from_seq=0)
        return {"sessionId": agent.session_id}

    async def load_session(self, params: Any) -> Json:
        p = convert_params(params, LoadParams)
        _absolute(p.cwd)
        sid = _session_id(p.session_id)
        if sid in self._sessions:
            raise AcpRequestError(INVALID_REQUEST, f"session {sid!r} is already open on this connection")
        try:
            agent = await self.runtime.agents.resume(sid)
        except SessionNotFound:
            raise AcpRequestError(RESOURCE_NOT_FOUND, f"session {sid!r} not found", {"uri": sid}) from None
        except AgentError as exc:  # held by another process, or not resumable
            raise AcpRequestError(INVALID_REQUEST, str(exc)) from None
        # The replay sends what the log holds now; the stream follows from the next seq (what the
        # agent writes meanwhile is in the log, so the stream reads it: nothing lost, nothing twice).
        events = await self._history(sid)
        for update in updates_for(events, session_id=sid, replay=True):
            await self._notify(sid, update)
        self._start(agent, p.cwd, p.mcp_servers, from_seq=events[-1].seq + 1 if events else 0)
        return {}

    async def list_sessions(self, params: Any) -> Json:
        p = convert_params(params, ListParams)
        try:
            records = await self.runtime.query.list_sessions()
        except SessionQueryError as exc:
            raise AcpRequestError(INTERNAL_ERROR, exc.message) from None
        rows = []
        for record in records:
            header = record.header
            if header is None or header.parent_session is not None:
                continue  # a damaged log, or a subagent (reached through its parent)
            cwd = header.cwd if header.cwd else os.getcwd()
            if p.cwd is not None and cwd != p.cwd:
                continue
            rows.append((header.created_at, {"sessionId": record.id, "cwd": cwd}))
        rows.sort(key=lambda row: row[0], reverse=True)
        return {"sessions": [row for _, row in rows]}

    async def prompt(self, params: Any) -> Json:
        p = convert_params(params, PromptParams)
        session = self._session(p.session_id)
        text = prompt_text(p.prompt)
        if session.prompt is not None:
            raise AcpRequestError(INVALID_REQUEST, "a prompt is already running in this session")
        prompt = session.prompt = _Prompt()
        try:
            await session.agent.send(text)
            async with trio.open_nursery() as nursery:

                async def stopped() -> None:
                    try:
                        await session.agent.wait_idle()
                    except AgentStopped as exc:
                        prompt.reason = {"kind": "error", "message": str(exc)}
                        prompt.done.set()

                nursery.start_soon(stopped)
                await prompt.done.wait()
                nursery.cancel_scope.cancel()
        finally:
            session.prompt = None
        reason = prompt.reason or {"kind": "error", "message": "the turn did not end"}
        mapped = stop_reason(reason)
        if mapped is None:
            raise AcpRequestError(
                INTERNAL_ERROR, reason.get("message") or "the turn ended in error", {"reason": reason}
            )
        return {"stopReason": mapped}

    async def cancel(self, params: Any) -> None:
        p = convert_params(params, CancelParams)
        session = self._session(p.session_id)
        if session.prompt is not None:
            session.prompt.cancelled = True  # its turn is cancelled as it starts, if not yet begun
        session.agent.cancel("user")

    async def close_session(self, params: Any) -> Json:
        p = convert_params(params, CloseParams)
        session = self._session(p.session_id)
        if session.prompt is not None:
            session.prompt.cancelled = True
        await self.runtime.agents.stop(session.agent.session_id, cause="user")
        session.scope.cancel()
        self._sessions.pop(session.agent.session_id, None)
        return {}

    # --- sessions ---------------------------------------------------------------------------

    def _session(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise AcpRequestError(RESOURCE_NOT_FOUND, f"session {session_id!r} is not open", {"uri": session_id})
        return session

    def _start(self, agent: Agent, cwd: str, mcp_servers: list[Json], *, from_seq: int) -> None:
        session = _Session(agent=agent, cwd=cwd, mcp_servers=mcp_servers)
        self._sessions[agent.session_id] = session
        self._nursery.start_soon(self._forward, session, from_seq)

    async def _history(self, session_id: str) -> list[Event]:
        try:
            async with self.runtime.query.observe_session(session_id) as observation:
                return list(observation.events)
        except SessionQueryError as exc:
            raise AcpRequestError(INTERNAL_ERROR, exc.message) from None

    async def _forward(self, session: _Session, from_seq: int) -> None:
        sid = session.agent.session_id
        runtime = self.runtime
        with session.scope:
            # The session's own events only: a subagent's are its session's, not this one's.
            stream_cm = open_event_stream(
                runtime.sessions, runtime.log_store, sid, from_seq=from_seq, descendants=False
            )
            async with stream_cm as stream:
                async for item in stream:
                    for update in updates_for([item.event], session_id=sid):
                        await self._notify(sid, update)
                    self._track(session, item.event)

    def _track(self, session: _Session, event: Event) -> None:
        """Find the prompt's turn among the events: the turn in which the person's message
        (a `user/message` from the user) is written after the prompt was sent — whatever
        started that turn (a notice claimed together with it may have)."""
        if event.type not in ("turn/start", "turn/end", "user/message"):
            return
        data = msgspec.to_builtins(decode_payload(event, session_id=session.agent.session_id))
        if event.type == "turn/start":
            session.turn = data["turn"]
            return
        prompt = session.prompt
        if prompt is None:
            return
        if event.type == "user/message":
            if prompt.turn is None and data["message"]["source"]["kind"] == "user":
                prompt.turn = session.turn
                if prompt.cancelled:
                    session.agent.cancel("user")
        elif data["turn"] == prompt.turn:
            prompt.reason = data["reason"]
            prompt.done.set()

    async def _notify(self, session_id: str, update: Json) -> None:
        await self._out.send(notification_line("session/update", {"sessionId": session_id, "update": update}))


def _absolute(cwd: str) -> None:
    if not os.path.isabs(cwd):
        raise AcpRequestError(INVALID_PARAMS, f"Invalid params: cwd must be an absolute path: {cwd!r}")


def _session_id(session_id: str) -> str:
    try:
        return check_session_id(session_id)
    except InvalidSessionId as exc:
        raise AcpRequestError(INVALID_PARAMS, f"Invalid params: {exc.message}") from None
