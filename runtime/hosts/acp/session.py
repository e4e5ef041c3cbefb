"""An ACP session open on a connection, and the forwarder that streams it to the client.

The forwarder follows the runtime's event stream of the session (its own durable events,
runtime/event_stream.py), turns them into `session/update` notifications (`LiveText.event`) and
watches for the running prompt's own `turn/end`. Beside it a text task sends the answer text the
model streams as soon as the events durable before it are sent (acp/live.py); the two take turns
under the session's lock, so lines keep that order.

For a client that opted in to subagents the stream follows the session's whole tree, and its
descendants' events become child-session updates (acp/children.py) in the same order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs
import msgspec
import trio
from subagents.storage import Event, decode_payload

from ...agent.loop import Agent
from ...app import Runtime
from ...delegation.listing import ChildRow
from ...event_stream import open_event_stream
from ...foundation.errors import SubagentsError
from ...foundation.json_values import JsonObject as Json
from .children import ChildTree, Notification, turn_usage
from .client_servers import ClientServers
from .live import LiveText
from .record import ClientRecord

__all__ = ["Live", "Notify", "Prompt", "Session", "forward", "liveness_every", "send_liveness"]

Notify = Callable[[str, Json], Awaitable[None]]
"""Sends one `session/update` of a session (its id, the update) to the client."""


@attrs.define
class Prompt:
    """A `session/prompt` running in a session."""

    done: trio.Event = attrs.field(factory=trio.Event)
    turn: int | None = None  # the turn that answers it, once it started
    reason: Json | None = None  # its `turn/end` reason
    cancelled: bool = False
    usage: tuple[int, int] = (0, 0)  # input and output tokens its turn's replies recorded


@attrs.define
class Live:
    """A session's streamed text, from before its forwarder starts (a load's resume may start
    a turn at once)."""

    text: LiveText
    lock: trio.Lock = attrs.field(factory=trio.Lock)  # the forwarder and the text task take turns
    ready: trio.Event = attrs.field(factory=trio.Event)  # text arrived

    def wake(self) -> None:
        self.ready.set()


@attrs.define
class Session:
    """A session open on a connection."""

    agent: Agent
    live: Live
    # What the client said of the session (recorded in its log; the MCP servers' secret values
    # only here, in `mcp_servers`, and in the running `servers`).
    record: ClientRecord
    mcp_servers: list[Json]
    servers: ClientServers
    restored: ClientRecord | None = None  # the record a `session/load` found in the log
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    prompt: Prompt | None = None
    turn: int | None = None  # the turn the session's events are in, as the forwarder saw them
    tree: ChildTree | None = None  # its descendants, for a client that opted in to subagents
    announced: set[str] = attrs.field(factory=set)  # descendants whose announcement was sent
    waiting: dict[str, trio.Event] = attrs.field(factory=dict)  # descendants a question waits to see announced


async def forward(
    runtime: Runtime,
    notify: Notify,
    session: Session,
    from_seq: int,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Stream `session` to the client from seq `from_seq` until its scope is cancelled; started
    once the stream is subscribed (what becomes durable from then on is delivered)."""
    sid = session.agent.session_id
    live = session.live
    tree = session.tree
    with session.scope:
        # Without a tree, the session's own events only: a subagent's are its session's. With
        # one, the descendants' too (the tree leaves out a fork's copy of its parent's events).
        stream_cm = open_event_stream(runtime.query, sid, from_seq=from_seq, descendants=tree is not None)
        async with stream_cm as stream, trio.open_nursery() as nursery:
            nursery.start_soon(_stream_text, notify, sid, live)
            if tree is not None:
                nursery.start_soon(_watch_liveness, runtime, notify, session)
            task_status.started()
            async for item in stream:
                own = item.session_id == sid
                async with live.lock:
                    if own:
                        for update in live.text.event(item.event):
                            await notify(sid, update)
                    if tree is not None:
                        await send_tree(
                            notify, session, tree.event(item.session_id, item.event, item.inherited_event_count)
                        )
                if own:
                    _track(session, item.event)
            nursery.cancel_scope.cancel()


def liveness_every(runtime: Runtime) -> float:
    """Seconds between two liveness listings of an open tree: a fifth of `stall_after`, so a
    child is shown `stalled` soon after it is, within [1 s, 60 s]."""
    return min(60.0, max(1.0, runtime.listing.stall_after_ms / 5000))


async def send_liveness(runtime: Runtime, notify: Notify, session: Session) -> None:
    """List the session's descendants once and send each announced child's liveness that
    changed (a listing that fails says nothing: the next one tries again)."""
    tree = session.tree
    assert tree is not None
    try:
        rows = await runtime.listing.list_descendants(session.agent.session_id)
    except SubagentsError:
        return
    async with session.live.lock:  # between the forwarder's sends, never inside one
        for row in rows:
            if isinstance(row, ChildRow):
                await send_tree(notify, session, tree.liveness(row.id, row.liveness, row.last_event, row.runner))


async def _watch_liveness(runtime: Runtime, notify: Notify, session: Session) -> None:
    every = liveness_every(runtime)
    while True:
        await trio.sleep(every)
        await send_liveness(runtime, notify, session)


async def send_tree(notify: Notify, session: Session, notifications: list[Notification]) -> None:
    """Send a tree's notifications, noting each child whose announcement went out."""
    for target, update in notifications:
        await notify(target, update)
        if update["sessionUpdate"] == "subagent_update":
            session.announced.add(update["sessionId"])
            waiting = session.waiting.pop(update["sessionId"], None)
            if waiting is not None:
                waiting.set()


async def _stream_text(notify: Notify, sid: str, live: Live) -> None:
    """Send the session's streamed text as it may go (see acp/live.py)."""
    while True:
        await live.ready.wait()
        live.ready = trio.Event()
        async with live.lock:
            for update in live.text.release():
                await notify(sid, update)


def _track(session: Session, event: Event) -> None:
    """Find the prompt's turn among the events: the turn in which the person's message
    (a `user/message` from the user) is written after the prompt was sent — whatever
    started that turn (a notice claimed together with it may have)."""
    if event.type not in ("turn/start", "turn/end", "user/message", "assistant/message"):
        return
    data = msgspec.to_builtins(decode_payload(event, session_id=session.agent.session_id))
    if event.type == "turn/start":
        session.turn = data["turn"]
        return
    prompt = session.prompt
    if prompt is None:
        return
    if event.type == "assistant/message":
        if prompt.turn is not None and data["turn"] == prompt.turn and isinstance(data.get("usage"), dict):
            prompt.usage = turn_usage(prompt.usage, data["usage"])
    elif event.type == "user/message":
        if prompt.turn is None and data["message"]["source"]["kind"] == "user":
            prompt.turn = session.turn
            if prompt.cancelled:
                session.agent.cancel("user")
    elif data["turn"] == prompt.turn:
        prompt.reason = data["reason"]
        prompt.done.set()
