"""The ACP method dispatcher: one `AcpServer` per connection, over an open runtime.

An ACP session is a runtime session (`sessionId` = session id). Each session this connection
opened has one forwarder task (acp/session.py) that turns its durable events into
`session/update` notifications and watches for the prompt's own `turn/end`, so every update of a
turn is written before the prompt's response; the answer text the model streams (the host's
`TeeModel` hands it to `on_text`) goes out in order with those events (acp/live.py). A turn
started by a settlement notice while no prompt runs streams the same way. The server holds
nothing the log does not: `session/load` replays the log, and what the client said of a session
(cwd, MCP servers, its capabilities) is recorded in it (acp/record.py). Permission questions
about a tool call go to the client as requests of ours (acp/permission.py). The MCP servers the
client names are started for the session (acp/client_servers.py) before its agent starts, so
their tools are the session's and its descendants'; they stop when the session closes or the
connection ends. A client that advertised `subagents` sees each session's descendants as child
sessions (acp/children.py): announced, streamed, replayed by `session/load`, cancelled by
`session/cancel` with their own ids.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable

import trio
from subagents.actors import ReadGroup
from subagents.storage import Event, InvalidSessionId, SessionNotFound, SubagentsError, check_session_id

from ...agent.registry import SessionTools
from ...app import Runtime
from ...foundation.errors import AcpRequestError, AgentError, AgentStopped, SessionQueryError
from ...foundation.json_values import JsonObject as Json
from ...foundation.json_values import JsonValue
from ...tools.permissions import PermissionAnswer, PermissionRequest
from ...tools.workspace_tools import WORKSPACE_TOOL_NAMES, workspace_tools
from ...usage_totals import prompt_usage_fields
from .children import ChildTree, catalog_children, usage_object
from .client_servers import ClientServers
from .listing import Row, iso_time, page, title_of
from .live import LiveText
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
from .permission import PermissionAsker
from .record import ClientRecord, last_record
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
from .session import Live, Prompt, Session, forward, send_liveness, send_tree
from .updates import stop_reason, updates_for

__all__ = ["PROTOCOL_VERSION", "AcpServer"]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
_LIST_READERS = 4  # `session/list` reads this many of its page's logs at once (one read group)
_ANNOUNCE_WAIT = 5.0  # seconds a child's permission question waits for the child's announcement


class AcpServer:
    """The methods of ACP protocol version 1 this agent serves, over `runtime`. Replies and
    notifications go to `out` as encoded lines; forwarders run in `nursery`."""

    def __init__(
        self,
        runtime: Runtime,
        nursery: trio.Nursery,
        out: trio.MemorySendChannel[bytes],
        *,
        version: str,
        session_workspace: bool = False,
    ):
        """`session_workspace`: each session's workspace tools act in the `cwd` the client gave
        it (the editor's project), instead of the runtime's workspace."""
        self.runtime = runtime
        self._nursery = nursery
        self._out = out
        self._version = version
        self._sessions: dict[str, Session] = {}
        self._live: dict[str, Live] = {}  # by session id: the sessions whose text streams here
        self.client_capabilities: Json = {}  # fs and terminal, as the client said (for the tools issue)
        self.subagents = False  # the client advertised `subagents`: descendants are child sessions
        self._asker = PermissionAsker(out)
        self._session_workspace = session_workspace
        self._methods: dict[str, Callable[[JsonValue], Awaitable[JsonValue]]] = {
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
        """Stop streaming and the sessions' MCP servers (the runtime's own close drains the
        agents; a call of theirs still in flight answers that its server is unavailable)."""
        sessions = list(self._sessions.values())
        for session in sessions:
            session.scope.cancel()
        self._live.clear()
        async with trio.open_nursery() as nursery:
            for session in sessions:
                nursery.start_soon(self._close_servers, session.agent.session_id, session.servers)

    def client_record(self, session_id: str) -> tuple[ClientRecord, ClientRecord | None]:
        """What the client said of an open session: the record in force, and the one a
        `session/load` restored from the log (None after `session/new`)."""
        session = self._session(session_id)
        return session.record, session.restored

    def on_text(self, session_id: str, call: int, text: str) -> None:
        """Answer text of `session_id`'s model call `call` as the model streams it (the host's
        `TeeModel` calls this; sessions not open here are not streamed)."""
        live = self._live.get(session_id)
        if live is None:
            return
        agent = self.runtime.agents.get(session_id)
        live.text.text(call, text, agent.session.durable_next if agent is not None else 0)
        live.wake()

    # --- permission questions (the runtime's approver) -----------------------------------------

    async def approve(self, request: PermissionRequest) -> PermissionAnswer:
        """Ask the client about one tool call of a session of this connection (or of one of its
        subagents: asked under the session the client opened) with `session/request_permission`."""
        sid = self._client_session_of(request.session_id)
        if sid is None:
            return PermissionAnswer("deny", "no client session holds this agent: there is no one to ask")
        session = self._sessions[sid]
        if session.tree is not None and request.session_id != sid:
            # Asked under the child's own id, once the client was told of it (its catalog may be
            # durable a moment after the child began); a child never announced is asked about
            # under the session the client opened, as without the opt-in.
            if request.session_id not in session.announced:
                seen = session.waiting.setdefault(request.session_id, trio.Event())
                with trio.move_on_after(_ANNOUNCE_WAIT):
                    await seen.wait()
            if request.session_id in session.announced:
                sid = request.session_id
        return await self._asker.ask(sid, request)

    def on_response(self, message: Incoming) -> None:
        """The client's response to a request of ours (one we did not send is ignored)."""
        self._asker.on_response(message)

    def _client_session_of(self, session_id: str) -> str | None:
        """The session this connection opened that is `session_id` or its ancestor."""
        sid: str | None = session_id
        for _ in range(64):  # deeper than any tree max_depth allows
            if sid is None:
                return None
            if sid in self._sessions:
                return sid
            agent = self.runtime.agents.get(sid)
            sid = agent.session.header.parent_session if agent is not None else None
        return None

    # --- methods ----------------------------------------------------------------------------

    async def initialize(self, params: JsonValue) -> Json:
        p = convert_params(params, InitializeParams)
        self.client_capabilities = {
            "fs": p.client_capabilities.get("fs", {}),
            "terminal": p.client_capabilities.get("terminal", False),
        }
        # `{}` opts in; omitted or null does not (ACP v1, unstable `subagents`).
        self.subagents = isinstance(p.client_capabilities.get("subagents"), dict)
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
                "sessionCapabilities": {"list": {}, "close": {}},
                "mcpCapabilities": {"http": True, "sse": False},
            },
            "authMethods": [],
            "agentInfo": {"name": "trio-subagents", "title": "trio-subagents", "version": self._version},
        }

    async def authenticate(self, params: JsonValue) -> Json:
        return {}  # no auth methods are offered: the model's key comes from the environment

    async def new_session(self, params: JsonValue) -> Json:
        p = convert_params(params, NewParams)
        _absolute(p.cwd)
        record = ClientRecord.of(p.cwd, p.mcp_servers, self.client_capabilities)
        # The id first: the client's servers are the session's before its agent starts.
        sid = await self.runtime.agents.new_id()
        servers = await self._open_servers(sid, p.mcp_servers, p.cwd)
        try:
            # The record is published with the session: no crash leaves a session without it.
            agent = await self.runtime.agents.create(session_id=sid, cwd=p.cwd, first=[record.draft()])
        except BaseException:  # the servers stop whatever ended the create (re-raised)
            with trio.CancelScope(shield=True):
                await self._close_servers(sid, servers)
            raise
        live = self._live[agent.session_id] = Live(LiveText(agent.session_id))
        session = Session(agent, live, record, p.mcp_servers, servers, tree=self._tree(agent.session_id))
        await self._start(session, from_seq=agent.session.durable_next, replies=0)
        return {"sessionId": agent.session_id}

    async def load_session(self, params: JsonValue) -> Json:
        p = convert_params(params, LoadParams)
        _absolute(p.cwd)
        sid = _session_id(p.session_id)
        if sid in self._sessions or sid in self._live:
            raise AcpRequestError(INVALID_REQUEST, f"session {sid!r} is already open on this connection")
        # Registered before the resume, which may start a turn at once: its text is kept until
        # the replay is sent (a reply the replay holds whole is then forgotten).
        live = self._live[sid] = Live(LiveText(sid))
        try:
            # Started before the resume, so the agent starts with their tools. (An agent this
            # runtime runs already keeps the tools it has.)
            servers = await self._open_servers(sid, p.mcp_servers, p.cwd)
        except BaseException:  # cleanup, then re-raised: nothing is swallowed
            self._live.pop(sid, None)
            raise
        try:
            agent = await self.runtime.agents.resume(sid)
        except BaseException as exc:  # cleanup; two refusals become ACP errors, the rest re-raised
            self._live.pop(sid, None)
            with trio.CancelScope(shield=True):
                await self._close_servers(sid, servers)
            if isinstance(exc, SessionNotFound):
                raise AcpRequestError(RESOURCE_NOT_FOUND, f"session {sid!r} not found", {"uri": sid}) from None
            if isinstance(exc, AgentError):  # held by another process, or not resumable
                raise AcpRequestError(INVALID_REQUEST, str(exc)) from None
            raise
        try:
            # The replay sends what the log holds now; the stream follows from the next seq (what
            # the agent writes meanwhile is in the log, so the stream reads it: nothing lost,
            # nothing twice).
            events, inherited = await self._history(sid)
            tree = self._tree(sid)
            for event in events:
                for update in updates_for([event], session_id=sid, replay=True):
                    await self._notify(sid, update)
                for target, update in tree.event(sid, event, inherited) if tree is not None else ():
                    await self._notify(target, update)
            restored = last_record(events, inherited)
            record = ClientRecord.of(p.cwd, p.mcp_servers, self.client_capabilities)
            if record != restored:
                await agent.session.append([record.draft()])
        except BaseException:  # cleanup, then re-raised: nothing is swallowed
            self._live.pop(sid, None)
            with trio.CancelScope(shield=True):
                await self._close_servers(sid, servers)
            raise
        session = Session(agent, live, record, p.mcp_servers, servers, restored=restored, tree=tree)
        replies = sum(1 for e in events if e.type == "assistant/message")
        from_seq = events[-1].seq + 1 if events else 0
        if tree is None:
            await self._start(session, from_seq=from_seq, replies=replies)
            return {}
        session.announced.update(tree.parents)
        # The descendants' histories are read once the stream is subscribed, so what they write
        # meanwhile is streamed (what the replay sent too is skipped: `ChildTree.next_seq`);
        # the stream waits for the lock until the replay is sent.
        async with live.lock:
            await self._start(session, from_seq=from_seq, replies=replies)
            await self._replay_children(session, events, inherited)
        # What the replay cannot say: a child whose runner is gone mid-turn (`orphaned`), or one
        # running without progress (`stalled`), from one listing of the tree.
        await send_liveness(self.runtime, self._notify, session)
        return {}

    async def list_sessions(self, params: JsonValue) -> Json:
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
            rows.append(Row(header.created_at, record.id, cwd))
        chosen, next_cursor = page(rows, p.cursor)
        # Only the page's logs are read (one read group): the title is the first user text,
        # the last activity the last event's time. The listing alone gives order and cwd.
        group = ReadGroup()
        limiter = trio.CapacityLimiter(_LIST_READERS)
        sessions: list[Json] = [{} for _ in chosen]

        async def describe(i: int, row: Row) -> None:
            async with limiter:
                sessions[i] = await self._info(row, group)

        async with trio.open_nursery() as nursery:
            for i, row in enumerate(chosen):
                nursery.start_soon(describe, i, row)
        result: Json = {"sessions": sessions}
        if next_cursor is not None:
            result["nextCursor"] = next_cursor
        return result

    async def _info(self, row: Row, group: ReadGroup) -> Json:
        info: Json = {"sessionId": row.session_id, "cwd": row.cwd, "updatedAt": iso_time(row.created_at)}
        try:
            async with self.runtime.query.observe_session(row.session_id, group=group) as observation:
                events = observation.events
                title = title_of(events, row.session_id)
        except (SessionQueryError, SubagentsError):
            return info  # a damaged log: listed, without what it cannot tell
        if events:
            info["updatedAt"] = iso_time(events[-1].time)
        if title is not None:
            info["title"] = title
        return info

    async def prompt(self, params: JsonValue) -> Json:
        p = convert_params(params, PromptParams)
        session = self._session(p.session_id)
        text = prompt_text(p.prompt)
        if session.prompt is not None:
            raise AcpRequestError(INVALID_REQUEST, "a prompt is already running in this session")
        prompt = session.prompt = Prompt()
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
        result: Json = {"stopReason": mapped}
        if session.tree is not None and prompt.usage != (0, 0):
            result["usage"] = usage_object(prompt.usage)  # the turn's tokens (unstable `usage`)
            runtime = self.runtime  # with the cache counts, and the cost and tree in `_meta`
            result |= await prompt_usage_fields(
                runtime.query, runtime.listing, p.session_id, prompt.turn, runtime.prices
            )
        return result

    async def cancel(self, params: JsonValue) -> None:
        p = convert_params(params, CancelParams)
        owner = self._owner_of(p.session_id) if p.session_id not in self._sessions else None
        if owner is not None:
            await self._cancel_child(owner, p.session_id)
            return
        session = self._session(p.session_id)
        if session.prompt is not None:
            session.prompt.cancelled = True  # its turn is cancelled as it starts, if not yet begun
        session.agent.cancel("user")

    async def close_session(self, params: JsonValue) -> Json:
        p = convert_params(params, CloseParams)
        session = self._session(p.session_id)
        if session.prompt is not None:
            session.prompt.cancelled = True
        sid = session.agent.session_id
        await self.runtime.agents.stop(sid, cause="user")  # its children too: then its servers
        session.scope.cancel()
        self._sessions.pop(sid, None)
        self._live.pop(sid, None)
        await self._close_servers(sid, session.servers)
        return {}

    # --- sessions ---------------------------------------------------------------------------

    def _tree(self, session_id: str) -> ChildTree | None:
        return ChildTree(session_id) if self.subagents else None

    def _owner_of(self, child_id: str) -> Session | None:
        """The open session that announced descendant `child_id` to the client."""
        for session in self._sessions.values():
            if child_id in session.announced:
                return session
        return None

    async def _cancel_child(self, owner: Session, child_id: str) -> None:
        """`session/cancel` of a child session: its current turn is interrupted, as its parent
        would (`interrupt_agent`): the direct parent where it runs here (it may interrupt its
        child wherever that runs), else the session the client opened (an ancestor)."""
        assert owner.tree is not None  # only a tree announces children
        by = self.runtime.agents.get(owner.tree.parents[child_id]) or owner.agent
        outcome = await self.runtime.subagents.interrupt(child_id, by=by)
        log.info("acp: session/cancel of child session %s: %s", child_id, outcome)

    async def _replay_children(self, session: Session, events: list[Event], inherited: int) -> None:
        """Send the histories of the descendants `events` announced, depth first (each child's
        own children are announced by its history, then replayed)."""
        tree = session.tree
        assert tree is not None
        stack = [(child, session.agent.session_id) for child in reversed(catalog_children(events, inherited))]
        while stack:
            child, parent = stack.pop()
            if tree.parents.get(child) != parent:
                continue  # not announced (under this parent): nothing of it may be sent
            try:
                child_events, child_inherited = await self._durable_history(child)
            except (SessionQueryError, SubagentsError) as exc:
                log.warning("acp: the history of child session %s cannot be read: %s", child, exc)
                await send_tree(self._notify, session, tree.unreadable(child))
                continue
            notifications = [n for e in child_events for n in tree.event(child, e, child_inherited)]
            await send_tree(self._notify, session, notifications)
            grandchildren = catalog_children(child_events, child_inherited)
            stack.extend((grandchild, child) for grandchild in reversed(grandchildren))

    async def _durable_history(self, session_id: str) -> tuple[list[Event], int]:
        """A session's events, up to its durable end when it is live here (bytes past it may be
        a write whose fsync is not done)."""
        async with self.runtime.query.observe_session(session_id) as observation:
            events, inherited = list(observation.events), observation.inherited_event_count
        ref = self.runtime.query.sessions.get(session_id)
        if ref is not None:
            events = [e for e in events if e.seq < ref.durable_next]
        return events, inherited

    def _session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise AcpRequestError(RESOURCE_NOT_FOUND, f"session {session_id!r} is not open", {"uri": session_id})
        return session

    async def _open_servers(self, sid: str, servers: list[Json], cwd: str) -> ClientServers:
        """Start the MCP servers the client named for `sid` and offer their tools to it and its
        descendants (a server that fails is logged and left out)."""
        started = await ClientServers.start(self._nursery, servers, cwd, sid)
        configured = self.runtime.mcp.tools() if self.runtime.mcp is not None else ()
        own = started.session_tools(configured)
        if self._session_workspace:
            # The editor's project is the session's workspace: its tools replace the runtime's.
            own = SessionTools(
                [*own.tools, *workspace_tools(cwd, sandbox=self.runtime.sandbox)], own.hides | set(WORKSPACE_TOOL_NAMES)
            )
        self.runtime.agents.add_session_tools(sid, own)
        return started

    async def _close_servers(self, sid: str, servers: ClientServers) -> None:
        self.runtime.agents.drop_session_tools(sid)
        await servers.aclose()

    async def _start(self, session: Session, *, from_seq: int, replies: int) -> None:
        """Stream `session` from seq `from_seq`, `replies` of the events before it replies
        (returns once the stream is subscribed)."""
        self._sessions[session.agent.session_id] = session
        session.live.text.start(from_seq, replies)
        session.live.wake()  # text kept before the start may go now
        await self._nursery.start(forward, self.runtime, self._notify, session, from_seq)

    async def _history(self, session_id: str) -> tuple[list[Event], int]:
        try:
            async with self.runtime.query.observe_session(session_id) as observation:
                return list(observation.events), observation.inherited_event_count
        except SessionQueryError as exc:
            raise AcpRequestError(INTERNAL_ERROR, exc.message) from None

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
