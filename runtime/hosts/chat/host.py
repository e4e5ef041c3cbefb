"""`subagents chat`: an interactive session over the runtime (SPEC §8, README "Chat").

Theory of operation. Trio owns the runtime; `chat` is a thin host over `open_runtime`, like
`run`. Three things run at once under one nursery:

- the *reader* asks for a line: on a terminal through prompt-toolkit (line editing, history)
  whose prompt runs in a worker thread (`trio.to_thread.run_sync`), otherwise plain lines from
  stdin, also read in a worker thread (so a pipe can script a session);
- the *view* (chat/view.py) renders the event stream (`open_event_stream`: the durable events of the session
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

import signal
import sys
from collections.abc import AsyncIterable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import trio
from subagents.storage import SessionNotFound, StorageError

from ...agent.loop import Agent
from ...app import Runtime, open_runtime
from ...delegation.agents_text import state_word
from ...delegation.listing import ChildRow
from ...delegation.tools import agent_status, interrupt_text, render_agents
from ...event_stream import StreamEvent, open_event_stream
from ...foundation.errors import AgentError, AgentStopped, SessionQueryError, SubagentsError, UsageError
from ...models.base import AnyModel
from ...models.tee import TeeModel
from ...tools.permissions import PermissionAnswer, PermissionRequest
from ...usage import usage_lines
from ...usage_totals import session_usage, tree_usage
from ..run_progress import ChildStatus, RunProgress
from ..setup import mcp_failures
from ..transcript import render, transcript
from .input import Asker, Lines
from .terminal import CTRL_C, ESCAPE, WATCH_NEXT
from .view import ChatView, cut

if TYPE_CHECKING:  # an annotation: the caller brings rich
    from rich.console import Console

__all__ = ["HELP", "Lines", "PipedLines", "chat"]

LAST_TURNS = 3  # turns a resumed session shows before its prompt

HELP = """\
commands:
  /agents [all]      the session's subagents with status and label (all: the whole tree)
  /send ID TEXT      send TEXT to the subagent ID (as this session)
  /interrupt ID      stop the subagent ID's current turn
  /watch [ID]        show subagent ID's text and tool calls live in place of this session's; /watch comes back
                     (on a terminal F2 watches the next working subagent, and after the last comes back)
  /usage             token usage per turn, for the session and its tree
  /wait              wait until the session and its subagents are idle (Ctrl-C stops waiting)
  /help              this text
  /quit              leave (Ctrl-D too; Ctrl-C cancels a running turn, or leaves when idle)"""


STEER_PROMPT = "steer> "  # the prompt while the person's turn runs: a line joins that turn
LEAVE_CHOICES = "[s]top them and leave, [w]ait for them and then leave, or Enter to stay"
LEAVE_QUESTION = "leave? [s/w/Enter] "


class PipedLines:
    """Plain lines from a file (stdin when it is not a terminal), read in a worker thread."""

    steers = False  # a script's next line is the next turn's, read once this one ended

    def __init__(self, file: Any = None) -> None:
        if file is None:
            file = sys.stdin
            # Bytes that are not UTF-8 become U+FFFD: bad input is a line like any other.
            file.reconfigure(errors="replace")
        self.file = file
        # A read a cancel gave up on (Ctrl-C at the prompt) goes on in its thread: its line is
        # the next read's answer, never lost to an abandoned thread.
        self._pending: trio.Event | None = None
        self._line: Any = None  # the thread's outcome (trio's `outcome.Outcome[str]`)

    async def read(self, prompt: str) -> str | object | None:
        if self._pending is None:
            done = self._pending = trio.Event()
            token = trio.lowlevel.current_trio_token()

            def deliver(result: Any) -> None:
                def in_trio() -> None:
                    self._line = result
                    done.set()

                try:
                    token.run_sync_soon(in_trio)
                except trio.RunFinishedError:
                    pass  # the chat ended while this line was read: nobody wants it

            trio.lowlevel.start_thread_soon(self.file.readline, deliver)
        await self._pending.wait()
        result, self._pending, self._line = self._line, None, None
        assert result is not None
        line: str = result.unwrap()
        return line.rstrip("\r\n") if line else None

    def progress(self, progress: RunProgress) -> None:
        pass  # piped: the tree's changes are the printed lines

    def interrupt(self) -> None:
        pass  # a pipe's read cannot be taken back: its next line answers the question

    def turn_running(self, running: bool) -> None:
        pass


class _Chat:
    def __init__(self, runtime: Runtime, agent: Agent, lines: Lines, view: ChatView) -> None:
        self.runtime = runtime
        self.agent = agent
        self.lines = lines
        self.view = view
        self.in_turn = False  # a line of the person's is being answered
        self.leaving = False
        self.read_scope: trio.CancelScope | None = None
        self.wait_scope: trio.CancelScope | None = None
        self.asker = Asker(lines, lambda text: view.say(text, "yellow"), agent.session_id)

    async def on_signals(self, signals: AsyncIterable[int]) -> None:
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
        while True:
            line: str | object | None = None  # a cancelled read leaves (`leaving` is set first)
            if not self.leaving:
                with trio.CancelScope() as self.read_scope:
                    line = await self.asker.prompt("> ")
                self.read_scope = None
            if line is CTRL_C:
                self.ctrl_c()
            if self.leaving:
                if await self.may_leave():
                    return 0
                self.leaving = False
                continue
            if line is None:
                return 0  # end of input: leave (the runtime's close stops what still works)
            if line is CTRL_C:
                continue
            if line is WATCH_NEXT:
                await self.watch_next()
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

    def working(self) -> list[str]:
        """The subagents of this session's tree that are still resident (leaving stops them)."""
        root = self.agent.session_id
        return [a.child_id for a in self.runtime.subagents.manager.resident.values() if a.root_id == root]

    async def may_leave(self) -> bool:
        """Ctrl-C at the idle prompt: leave — but while subagents still work, ask first whether
        to stop them, wait for them, or stay (never stop them silently)."""
        working = self.working()
        if not working:
            return True
        count = f"{len(working)} subagent{'s' if len(working) != 1 else ''}"
        # Said whole: a pipe shows no prompt.
        self.view.say(f"{count} still working: {', '.join(working)} — {LEAVE_CHOICES}", "yellow")
        answer: str | object | None = None  # Ctrl-C again (a signal cancels the read): stop them
        with trio.CancelScope() as self.read_scope:
            answer = await self.asker.prompt(LEAVE_QUESTION)
        self.read_scope = None
        word = answer.strip().lower() if isinstance(answer, str) else "stop"  # Ctrl-C again, or no input
        if word in ("s", "stop"):
            return True  # the runtime's close stops them (their settlements are recorded)
        if word in ("w", "wait"):
            self.view.say("(waiting for them; Ctrl-C stops them and leaves)", "dim")
            await self.wait_tree()
            return True
        return False

    async def turn(self, text: str) -> int | None:
        self.in_turn = True
        try:
            await self.agent.send(text)
            if self.lines.steers:
                self.view.stream_root = False
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self.steer)
                        await self.agent.wait_idle()
                        nursery.cancel_scope.cancel()  # the prompt goes; what was typed is carried over
                finally:
                    self.view.stream_root = True
            else:
                await self.agent.wait_idle()
        except AgentStopped as exc:
            self.view.say(f"subagents: {exc}", "red")
            return 1
        finally:
            self.in_turn = False
        await self.view.caught_up(self.agent.session.durable_next)
        return None

    async def steer(self) -> None:
        """While the person's turn runs (on a terminal): a line typed is steering for that turn
        (it joins its next step; the view shows it when it is recorded), a `/command` runs as at
        the idle prompt, Esc or Ctrl-C interrupts the turn."""
        self.lines.turn_running(True)
        try:
            while True:
                line = await self.asker.prompt(STEER_PROMPT)
                if line is None:
                    return  # end of input: the turn goes on; the chat leaves after it
                if line is CTRL_C or line is ESCAPE:
                    self.ctrl_c()
                    continue
                if line is WATCH_NEXT:
                    await self.watch_next()
                    continue
                assert isinstance(line, str)
                text = line.strip()
                if not text:
                    continue
                if text.startswith("/"):
                    if text.split()[0] in ("/quit", "/wait"):
                        self.view.say("(a turn is running: Esc interrupts it first)", "dim")
                    else:
                        await self.command(text)
                    continue
                await self.agent.send(text, "steer")
        finally:
            self.lines.turn_running(False)

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
                    say(interrupt_text(rest, outcome), "dim")  # the words interrupt_agent answers
            elif name == "/watch":
                await self.watch(rest)
            elif name == "/wait":
                await self.wait_tree()
            elif name == "/usage":
                sid = self.agent.session_id
                own = await session_usage(self.runtime.query, sid)
                tree = await tree_usage(self.runtime.query, self.runtime.listing, sid)
                say("\n".join(usage_lines(own, tree, self.runtime.prices)))
            else:
                say(f"unknown command {cut(name, 40)} (try /help)")
        except SubagentsError as exc:
            say(f"{name}: {cut(getattr(exc, 'message', None) or str(exc))}", "red")
        return False

    async def watch(self, target: str) -> None:
        """`/watch ID`: a descendant's lines and live text in place of the session's, from its
        current turn on; `/watch` alone comes back."""
        view = self.view
        if not target:
            if view.watching is None:
                view.say("usage: /watch ID (a subagent of this session: /agents all lists them)")
            view.unwatch()
            return
        if " " in target:
            view.say("usage: /watch ID")
            return
        known = view.progress.children.get(target)
        label = known.label if known is not None else None
        if known is None:
            rows = await self.runtime.listing.list_descendants(self.agent.session_id)
            row = next((r for r in rows if r.id == target and isinstance(r, ChildRow)), None)
            if row is None:
                view.say(f"/watch: {cut(target, 40)} is not a subagent of this session (/agents all lists them)")
                return
            label = row.label
        try:
            _k, events = await self.runtime.query.read_from(target, 0)
        except StorageError as exc:
            view.say(f"/watch: {cut(str(exc))}", "red")
            return
        start = max((i for i, e in enumerate(events) if e.type == "turn/start"), default=len(events))
        child = self.runtime.agents.get(target)  # its live text reaches this view only if it runs here
        durable = (lambda: child.session.durable_next) if child is not None else (lambda: len(events))
        view.watch(target, label or target, [StreamEvent(target, e) for e in events], start, durable)

    async def watch_next(self) -> None:
        """F2: watch the next working subagent in the tree's order; past the last, come back."""
        view = self.view
        working = [c.id for c in view.progress.children.values() if c.state in ("starting", "running")]
        current = view.watching
        after = working[working.index(current) + 1 :] if current in working else working
        if after:
            await self.watch(after[0])
        elif current is not None:
            view.unwatch()
        else:
            view.say("(no subagent is working: F2 watches the next one that is)", "dim")

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


async def _take_session(runtime: Runtime, session_id: str | None, lines: Lines, console: Console) -> tuple[Agent, bool]:
    """The chat's agent, and whether it resumed an existing session. A session whose last turn
    its process left open: the person says whether it goes on (README "When a process dies")."""
    try:
        if session_id is None:
            return await runtime.agents.create(), False
        try:
            policy = await _ask_open_turn(runtime, session_id, lines, console)
            return await runtime.resume(session_id, on_interrupted_turn=policy), True
        except SessionNotFound:
            return await runtime.agents.create(session_id=session_id), False
    except (StorageError, AgentError) as exc:
        raise UsageError(str(exc)) from None  # a bad root, or a session that cannot be taken


async def _ask_open_turn(
    runtime: Runtime, session_id: str, lines: Lines, console: Console
) -> Literal["continue", "close"] | None:
    """Ask whether a turn the session's last process left open goes on ("continue") or is closed
    as interrupted ("close"); None when there is none, or the person gave no answer (the input
    ended, or Ctrl-C): then the session's own policy decides, as it does for an empty answer."""
    try:
        cut_turn = await runtime.open_turn(session_id)
    except StorageError:
        return None  # no log, or a damaged one: the resume says what is wrong
    if cut_turn is None:
        return None
    if cut_turn.lost_model_call:
        what = "its model call was in flight"
    elif cut_turn.started:
        what = f"{len(cut_turn.started)} tool call(s) had started without a result"
    else:
        what = "between its steps"
    console.print(
        f"session {session_id}: turn {cut_turn.turn} was cut short when its process stopped ({what}).",
        markup=False,
        highlight=False,
    )
    # Enter takes the configured policy (`on_interrupted_turn`), shown as the capital letter.
    policy = runtime.agents.config.on_interrupted_turn
    choices = "[Y/n]" if policy == "continue" else "[y/N]"
    while True:
        answer = await lines.read(f"continue that turn? {choices} ")
        if not isinstance(answer, str):
            return None
        word = answer.strip().lower() or ("y" if policy == "continue" else "n")
        if word in ("y", "yes"):
            return "continue"
        if word in ("n", "no"):
            return "close"
        console.print("answer y (go on with the turn) or n (close it as interrupted)", markup=False, highlight=False)


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
                state=state_word(row, "running" if row.activity == "running" else "ready"),
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
    compression: Literal["zstd", "none"] = "zstd",
    lines: Lines,
    console: Console,
    on_ready: Callable[[], None] | None = None,
    runtime_options: Mapping[str, Any] | None = None,
) -> int:
    """Run a chat on `root` until the person leaves; the exit status (0 after a clean leave, 1
    when the agent stopped). Raises `UsageError` for a session that cannot be taken.
    `runtime_options` go to `open_runtime` (workspace, permissions, limits: the host's
    configuration); the chat answers the permission questions itself."""
    shown: list[ChatView] = []  # the view, once the session is known (the model is bound before)
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
        agent, resumed = await _take_session(runtime, session_id, lines, console)
        # One boundary for the history and the live stream: what its owner records while the
        # history is read (a queued message's turn) is streamed, not lost between the two.
        start = agent.session.durable_next
        view = ChatView(
            console,
            agent.session_id,
            start,
            agent.assistant_count,
            lambda: agent.session.durable_next,
        )
        view.progress.stall_after_ms = runtime.listing.stall_after_ms  # the tree's `stalled`, as listings say it
        shown.append(view)
        if resumed:
            try:
                history = await _last_turns(runtime, agent.session_id, LAST_TURNS, upto=start)
            except (SessionQueryError, StorageError) as exc:
                history = [f"(its history cannot be shown: {cut(str(exc))})"]
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
