"""`subagents chat`: an interactive session over the runtime (SPEC §8, README "Chat").

Theory of operation. Trio owns the runtime; `chat` is a thin host over `open_runtime`, like
`run`. Three things run at once under one nursery:

- the *reader* asks for a line: on a terminal through prompt-toolkit (line editing, history)
  whose prompt runs in a worker thread (`trio.to_thread.run_sync`), otherwise plain lines from
  stdin, also read in a worker thread (so a pipe can script a session);
- the *view* renders the event stream (`open_event_stream`: the durable events of the session
  and its descendants, from the seq the chat starts at) as one line per message, tool call,
  tool result, child start, turn end and settlement — a notice that starts a turn while the
  person is idle shows up as it happens. The session's answer text is shown as the model
  streams it: the chat's model (`TeeModel`) hands each session's text deltas to the view,
  which shows its own session's in place and lets the durable `assistant/message` end the line;
- SIGINT is a Trio signal receiver: during a turn it cancels the turn (the agent's two-phase
  cancel, cause `user`: the log records `turn/end` aborted user); at an idle prompt it leaves.
  On a terminal prompt-toolkit reads Ctrl-C itself (a key in raw mode): the same rule applies.

A user line is sent to the agent and the reader waits until the agent is idle and the view
has shown the session's events up to that point, so the answer is printed before the next
prompt. Leaving (`/quit`, EOF, Ctrl-C at an idle prompt) closes the runtime, which drains the
session's children; the exit status is 0. The chat holds no state the log does not hold:
resuming a session (`--session ID`) prints its last turns from the log.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgspec
import trio
from subagents.storage import SessionNotFound, StorageError

from ...agent.loop import Agent
from ...app import Runtime, open_runtime
from ...delegation.listing import ChildRow
from ...delegation.tools import agent_status, render_agents
from ...event_stream import StreamEvent, open_event_stream
from ...foundation.errors import AgentError, AgentStopped, SessionQueryError, SubagentsError, UsageError
from ...models.base import AnyModel
from ...models.tee import TeeModel
from ...tools.permissions import PermissionAnswer, PermissionRequest
from ...usage import session_usage, tree_usage, usage_lines
from ..run_progress import ChildStatus, RunProgress
from ..transcript import render, transcript
from .input import Asker
from .terminal import CTRL_C

__all__ = ["HELP", "Lines", "PipedLines", "TeeModel", "chat", "event_line", "mcp_failures"]

LAST_TURNS = 3  # turns a resumed session shows before its prompt
_WIDTH = 160  # a tool call's arguments or result beyond this is cut (the log keeps all of it)

HELP = """\
commands:
  /agents [all]      the session's subagents with status and label (all: the whole tree)
  /send ID TEXT      send TEXT to the subagent ID (as this session)
  /interrupt ID      stop the subagent ID's current turn
  /usage             token usage per turn, for the session and its tree
  /wait              wait until the session and its subagents are idle (Ctrl-C stops waiting)
  /help              this text
  /quit              leave (Ctrl-D too; Ctrl-C cancels a running turn, or leaves when idle)"""


class Lines(Protocol):
    """Where the person's lines come from."""

    async def read(self, prompt: str) -> str | object | None:
        """The next line (without its newline), `CTRL_C`, or None at end of input."""
        ...

    def progress(self, progress: RunProgress) -> None:
        """The session's activity and child tree changed (a terminal shows it under the prompt)."""
        ...

    def interrupt(self) -> None:
        """Take away the prompt of the read in progress, if the reader can (thread-safe)."""
        ...


class PipedLines:
    """Plain lines from a file (stdin when it is not a terminal), read in a worker thread."""

    def __init__(self, file: Any = None) -> None:
        if file is None:
            file = sys.stdin
            # Bytes that are not UTF-8 become U+FFFD: bad input is a line like any other.
            file.reconfigure(errors="replace")
        self.file = file

    async def read(self, prompt: str) -> str | object | None:
        line = await trio.to_thread.run_sync(self.file.readline, abandon_on_cancel=True)
        return line.rstrip("\r\n") if line else None

    def progress(self, progress: RunProgress) -> None:
        pass  # piped: the tree's changes are the printed lines

    def interrupt(self) -> None:
        pass  # a pipe's read cannot be taken back: its next line answers the question


def _cut(text: str, width: int = _WIDTH) -> str:
    one = " ".join(text.split())
    return one if len(one) <= width else one[: width - 1] + "…"


def event_line(item: StreamEvent, root_id: str) -> str | None:
    """The line the chat shows for one durable event, or None for events it does not show.
    Raises `StorageError` for a payload that does not decode."""
    event = item.event
    own = item.session_id == root_id
    if not own:
        # A descendant: when it starts and ends a turn (its detail is in its own log).
        if event.type not in ("turn/start", "turn/end"):
            return None
    entries = [e for e in transcript([event], session_id=item.session_id) if e["type"] != "usage"]
    if not entries:
        return None
    e = entries[0]
    kind = e["type"]
    if not own:
        if kind == "turn/start":
            return f"  ⋯ {item.session_id} working (turn {e['turn']})"
        reason = e["reason"]
        more = "".join(f" {reason[k]}" for k in ("cause", "message") if k in reason)
        return f"  ⋯ {item.session_id} turn {e['turn']} {reason['kind']}{_cut(more, 120)}"
    if kind == "turn/start":
        # A turn the person started says nothing more; one a notice started says so.
        trigger = f" ({e['trigger']})" if e.get("trigger", "message") != "message" else ""
        return f"── turn {e['turn']}{trigger}"
    if kind == "turn/end":
        reason = e["reason"]
        if reason["kind"] == "completed":
            return None
        more = "".join(f" {reason[k]}" for k in ("cause", "message") if k in reason)
        return f"── turn {e['turn']} ended: {reason['kind']}{more}"
    if kind == "assistant/message":
        text = e["text"]
        if e.get("interrupted"):
            text += " [interrupted]"
        return f"assistant: {text}" if text else None
    if kind in ("user/message", "system/message"):
        if e["source"] in ("user", "model") or kind == "system/message":
            return None  # the person typed it; the system prompt is not news
        return f"{e['source']}: {_cut(e['text'])}"
    if kind == "tool/call":
        arguments = e["arguments"]
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        return f"  → {e['name']}({_cut(arguments)})"
    if kind == "tool/result":
        mark = "✗" if e.get("is_error") else "←"
        return f"  {mark} {_cut(e['text'])}"
    if kind in ("subagent/catalog", "subagent/settled", "compaction/summary"):
        lines = render([e])
        return lines[0] if lines else None
    return None


class _View:
    """Prints the event stream, and the root's answer text as it streams; knows how far the
    root session has been shown.

    A model call's text is shown live only once everything durable when it began answering is
    shown (its turn's start and input, the session's earlier replies): the stream may deliver
    those after a fast model has begun, and the text waits for them. The reply's
    durable `assistant/message` then only ends the line; a reply nothing was streamed for is
    printed whole from the record."""

    def __init__(self, console: Any, root_id: str, start: int, replies: int, durable_next: Callable[[], int]) -> None:
        self.console = console
        self.root_id = root_id
        self.shown = start  # the root's next seq to show
        self.replies = replies  # the root's `assistant/message` events shown (or before the chat)
        self.ended = False
        self.streaming = False  # a line of streamed answer text is open (for call `replies`)
        self.durable_next = durable_next  # the root's
        self.progress = RunProgress(root_id, activity="idle")  # the root's activity and its tree
        self.on_progress: Callable[[RunProgress], None] = lambda progress: None
        self.gates: dict[int, int] = {}  # by call: the root's durable end when its text began
        self.waiting: dict[int, list[str]] = {}  # text of calls not shown yet, by call
        self._changed = trio.Event()

    def say(self, text: str, style: str | None = None) -> None:
        self.end_stream()
        self.console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)

    def on_text(self, session_id: str, call: int, text: str) -> None:
        """Answer text of `session_id`'s model call `call` as it streams (the root's only)."""
        if session_id != self.root_id or not text:
            return
        gate = self.gates.setdefault(call, self.durable_next())
        if call != self.replies or self.shown < gate:
            self.waiting.setdefault(call, []).append(text)
            return
        if not self.streaming:
            self.console.print("assistant: ", end="", markup=False, highlight=False, soft_wrap=True)
            self.streaming = True
        self.console.print(text, end="", markup=False, highlight=False, soft_wrap=True)

    def end_stream(self, suffix: str = "") -> None:
        if self.streaming:
            self.streaming = False
            self.console.print(suffix, markup=False, highlight=False, soft_wrap=True)

    def _release(self) -> None:
        """Show the text waiting for the call whose reply comes next, if its turn is shown."""
        for call in [c for c in self.gates if c < self.replies]:
            self.gates.pop(call)
            self.waiting.pop(call, None)  # its reply was printed from the record
        if self.replies in self.waiting and self.shown >= self.gates[self.replies]:
            self.on_text(self.root_id, self.replies, "".join(self.waiting.pop(self.replies)))

    def _show(self, item: StreamEvent) -> None:
        self.progress.apply(item)
        self.on_progress(self.progress)
        root = item.session_id == self.root_id
        kind = item.event.type
        if root and kind == "assistant/message":
            self.replies += 1
            if self.streaming:
                # Its text was shown as it streamed: the durable record only ends the line.
                self.end_stream(" [interrupted]" if _interrupted(item) else "")
                self._shown(item)
                return
        try:
            line = event_line(item, self.root_id)
        except StorageError as exc:
            line = f"  ! {item.session_id} seq {item.event.seq}: {exc}"
        if line is not None:
            self.say(line, None if line.startswith("assistant:") else "dim")
        if root:
            self._shown(item)

    def _shown(self, item: StreamEvent) -> None:
        self.shown = item.event.seq + 1
        self._changed.set()
        self._changed = trio.Event()
        self._release()

    async def consume(self, stream: Any) -> None:
        try:
            async for item in stream:
                self._show(item)
        finally:
            self.ended = True
            self._changed.set()

    async def caught_up(self, durable_next: int) -> None:
        """Until the root's events below `durable_next` have been shown."""
        while self.shown < durable_next and not self.ended:
            await self._changed.wait()


def _interrupted(item: StreamEvent) -> bool:
    try:
        data = msgspec.json.decode(item.event.data)
    except msgspec.DecodeError:
        return False
    return isinstance(data, dict) and data.get("interrupted") is True


class _Chat:
    def __init__(self, runtime: Runtime, agent: Agent, lines: Lines, view: _View) -> None:
        self.runtime = runtime
        self.agent = agent
        self.lines = lines
        self.view = view
        self.in_turn = False  # a line of the person's is being answered
        self.leaving = False
        self.read_scope: trio.CancelScope | None = None
        self.wait_scope: trio.CancelScope | None = None
        self.asker = Asker(lines, lambda text: view.say(text, "yellow"))

    async def on_signals(self, signals: Any) -> None:
        async for _ in signals:
            self.ctrl_c()

    def ctrl_c(self) -> None:
        if self.agent.status == "running":
            if self.agent.cancel("user"):
                self.view.say("(cancelling the turn)", "dim")
            return
        if self.wait_scope is not None:
            self.wait_scope.cancel()  # stop a /wait (its children go on)
            return
        if self.in_turn:
            return  # the turn is between its end and the prompt: nothing to cancel
        self.leaving = True
        if self.read_scope is not None:
            self.read_scope.cancel()

    async def loop(self) -> int:
        while not self.leaving:
            with trio.CancelScope() as self.read_scope:
                line = await self.asker.prompt("> ")
            self.read_scope = None
            if self.leaving or line is None:
                return 0
            if line is CTRL_C:
                self.ctrl_c()
                continue
            assert isinstance(line, str)
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                if await self.command(text):
                    return 0
                continue
            status = await self.turn(line)
            if status is not None:
                return status
        return 0

    async def turn(self, text: str) -> int | None:
        self.in_turn = True
        try:
            await self.agent.send(text)
            await self.agent.wait_idle()
        except AgentStopped as exc:
            self.view.say(f"subagents: {exc}", "red")
            return 1
        finally:
            self.in_turn = False
        await self.view.caught_up(self.agent.session.durable_next)
        return None

    async def wait_tree(self) -> None:
        self.in_turn = True
        try:
            with trio.CancelScope() as self.wait_scope:
                await self.runtime.subagents.wait_tree_idle(self.agent)
        except AgentStopped as exc:
            self.view.say(f"subagents: {exc}", "red")
        finally:
            self.in_turn = False
            self.wait_scope = None
        await self.view.caught_up(self.agent.session.durable_next)

    async def command(self, text: str) -> bool:
        """Run one `/command`; True when the chat should end."""
        name, _, rest = text.partition(" ")
        rest = rest.strip()
        say = self.view.say
        try:
            if name == "/quit":
                return True
            if name == "/help":
                say(HELP)
            elif name == "/agents":
                say(await self.agents(rest == "all"))
            elif name == "/send":
                target, _, message = rest.partition(" ")
                if not target or not message.strip():
                    say("usage: /send ID TEXT")
                else:
                    await self.runtime.subagents.send_message(self.agent, target, message.strip())
                    say(f"sent to {target}", "dim")
            elif name == "/interrupt":
                if not rest or " " in rest:
                    say("usage: /interrupt ID")
                else:
                    outcome = await self.runtime.subagents.interrupt(rest, by=self.agent)
                    say(f"{rest}: {outcome}", "dim")
            elif name == "/wait":
                await self.wait_tree()
            elif name == "/usage":
                sid = self.agent.session_id
                own = await session_usage(self.runtime.query, sid)
                tree = await tree_usage(self.runtime.query, self.runtime.listing, sid)
                say("\n".join(usage_lines(own, tree)))
            else:
                say(f"unknown command {_cut(name, 40)} (try /help)")
        except SubagentsError as exc:
            say(f"{name}: {_cut(getattr(exc, 'message', None) or str(exc))}", "red")
        return False

    async def agents(self, descendants: bool) -> str:
        sid = self.agent.session_id
        listing = self.runtime.listing
        rows = await (listing.list_descendants(sid) if descendants else listing.list_children(sid))
        elsewhere = {row.id for row in rows if isinstance(row, ChildRow) and row.activity == "running"}
        agents = self.runtime.agents

        def status(child_id: str) -> str:
            if child_id in elsewhere and agents.get(child_id) is None:
                return "running"  # held by another process
            return agent_status(agents, child_id)

        return render_agents(rows, descendants, status)


async def _take_session(runtime: Runtime, session_id: str | None) -> tuple[Agent, bool]:
    """The chat's agent, and whether it resumed an existing session."""
    try:
        if session_id is None:
            return await runtime.agents.create(), False
        try:
            return await runtime.agents.resume(session_id), True
        except SessionNotFound:
            return await runtime.agents.create(session_id=session_id), False
    except (StorageError, AgentError) as exc:
        raise UsageError(str(exc)) from None  # a bad root, or a session that cannot be taken


def mcp_failures(runtime: Runtime) -> list[str]:
    """A line per configured MCP server that did not start (its tools are not offered)."""
    if runtime.mcp is None:
        return []
    return [
        f"MCP server {status.name!r} is unavailable: {status.error}"
        for status in runtime.mcp.status()
        if status.state != "ready"
    ]


async def _known_tree(runtime: Runtime, session_id: str, progress: RunProgress) -> None:
    """Seed a resumed chat's tree with the descendants the listing knows (the stream shows
    only what happens from now on)."""
    try:
        rows = await runtime.listing.list_descendants(session_id)
    except SubagentsError:
        return  # no tree yet; it fills in as children change
    for row in rows:
        if isinstance(row, ChildRow):
            progress.children[row.id] = ChildStatus(
                id=row.id,
                parent=row.parent_id or session_id,
                label=row.label,
                mode=row.mode,
                state="running" if row.activity == "running" else "inactive",
            )


async def _last_turns(runtime: Runtime, session_id: str, count: int, *, upto: int) -> list[str]:
    async with runtime.query.observe_session(session_id) as seen:
        entries = transcript(
            seen.events[:upto],
            session_id=session_id,
            inherited_event_count=seen.inherited_event_count,
            inherited_from=seen.header.parent_session,
        )
    starts = [i for i, e in enumerate(entries) if e["type"] == "turn/start"]
    if len(starts) > count:
        entries = entries[starts[-count] :]
    return render([e for e in entries if e["type"] != "usage"])


async def chat(
    root: str,
    model: AnyModel,
    *,
    session_id: str | None = None,
    compression: Any = "zstd",
    lines: Lines,
    console: Any,
    on_ready: Callable[[], None] | None = None,
    runtime_options: Mapping[str, Any] | None = None,
) -> int:
    """Run a chat on `root` until the person leaves; the exit status (0 after a clean leave, 1
    when the agent stopped). Raises `UsageError` for a session that cannot be taken.
    `runtime_options` go to `open_runtime` (workspace, permissions, limits: the host's
    configuration); the chat answers the permission questions itself."""
    shown: list[_View] = []  # the view, once the session is known (the model is bound before)
    asking: list[_Chat] = []  # the chat, once it runs (it answers permission questions)

    def on_text(sid: str, call: int, text: str) -> None:
        if shown:
            shown[0].on_text(sid, call, text)

    async def approve(request: PermissionRequest) -> PermissionAnswer:
        if not asking:
            return PermissionAnswer("deny", "the chat is not ready to ask")
        return await asking[0].asker.approve(request)

    options = dict(runtime_options or {})
    options["approver"] = approve
    async with open_runtime(root, model=TeeModel(model, on_text), compression=compression, **options) as runtime:
        agent, resumed = await _take_session(runtime, session_id)
        # One boundary for the history and the live stream: what its owner records while the
        # history is read (a queued message's turn) is streamed, not lost between the two.
        start = agent.session.durable_next
        view = _View(
            console,
            agent.session_id,
            start,
            agent.assistant_count,
            lambda: agent.session.durable_next,
        )
        shown.append(view)
        if resumed:
            try:
                history = await _last_turns(runtime, agent.session_id, LAST_TURNS, upto=start)
            except (SessionQueryError, StorageError) as exc:
                history = [f"(its history cannot be shown: {_cut(str(exc))})"]
            for line in history:
                view.say(line, "dim")
        for line in mcp_failures(runtime):
            view.say(line, "yellow")
        view.say(f"session {agent.session_id} (/help for commands)", "dim")
        if resumed:
            await _known_tree(runtime, agent.session_id, view.progress)
        view.on_progress = lines.progress
        lines.progress(view.progress)
        if on_ready is not None:
            on_ready()
        session = _Chat(runtime, agent, lines, view)
        asking.append(session)
        async with open_event_stream(runtime.query, agent.session_id, from_seq=start) as stream:
            with trio.open_signal_receiver(signal.SIGINT) as signals:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(view.consume, stream)
                    nursery.start_soon(session.on_signals, signals)
                    status = await session.loop()
                    nursery.cancel_scope.cancel()
    return status
