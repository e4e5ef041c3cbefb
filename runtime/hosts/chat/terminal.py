"""The chat on a terminal: prompt-toolkit's prompt in a worker thread (history across chats, the
session's status and live child tree as its bottom toolbar), and the one way the chat's output
reaches the screen (README "Chat").

Why not prompt-toolkit's `patch_stdout`: its proxy writes from a thread of its own, so a line
printed just before a prompt could reach the terminal after the prompt was drawn, without the
prompt being redrawn below it (the screen showed `>── turn 2 ended`). Here the output knows
where the prompt is, under one lock:

- no prompt thread: a write goes straight to the terminal, before `read` can start a prompt;
- a prompt thread starting: whole lines wait, and the prompt writes them before its first draw
  (`pre_run`, in the prompt's own event loop);
- the prompt up: whole lines go to the prompt's loop, which takes the prompt off the screen,
  writes them and draws it again (`run_in_terminal`); a partial line (streamed answer text)
  waits for its newline, as the prompt would draw over it;
- the prompt thread ending: whatever its loop did not write (it closed first) is written in the
  order it came, before the thread lets go.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TextIO, cast

import attrs
import trio

if TYPE_CHECKING:  # annotations: rich and prompt-toolkit load only when a chat draws
    from prompt_toolkit.application import Application
    from rich.console import Console, RenderableType

    from ..run_progress import RunProgress

__all__ = [
    "CTRL_C",
    "ESCAPE",
    "INTERRUPTED",
    "WATCH_NEXT",
    "TerminalLines",
    "TerminalOutput",
    "history_path",
    "streaming_line",
    "toolbar_text",
]

CTRL_C = object()  # what a reader returns when the person pressed Ctrl-C at its prompt
ESCAPE = object()  # what it returns when the person pressed Esc while a turn runs
INTERRUPTED = object()  # what it returns when `interrupt` took its prompt away (a question came)
WATCH_NEXT = object()  # what it returns when the person pressed F2: watch the next working subagent
TREE_LINES = 8  # children the toolbar shows at most (the working ones first)


class TerminalOutput(TextIO):
    """A text file for the chat's console (rich) that never writes through a drawn prompt.

    A `TextIO` because that is what rich's Console takes; rich calls only what is defined here
    (write, flush, isatty, fileno, encoding)."""

    def __init__(
        self, stream: TextIO | None = None, in_terminal: Callable[[Callable[[], None]], Any] | None = None
    ) -> None:
        """`in_terminal(write)`: in the prompt's loop, take the prompt off the screen, call
        `write`, draw it again (prompt-toolkit's `run_in_terminal` unless a test passes one)."""
        # `sys.__stdout__` is None only without a console (pythonw), where no chat runs.
        self._stream = stream if stream is not None else cast(TextIO, sys.__stdout__)
        self._in_terminal = in_terminal
        self._lock = threading.Lock()
        self._prompting = False  # a prompt thread runs
        self._app: Application[Any] | None = (
            None  # its application once it runs (set in its loop before the first draw)
        )
        self._partial = ""  # text after the last newline, while a prompt thread runs
        self._queued: list[str] = []  # whole lines not written yet, in order

    # The file protocol rich uses.
    def write(self, text: str) -> int:
        with self._lock:
            if not self._prompting:
                self._put(text)
                return len(text)
            whole, newline, rest = (self._partial + text).rpartition("\n")
            self._partial = rest
            if newline:
                self._queued.append(whole + newline)
                if self._app is not None:
                    self._hand_to_prompt()
            elif self._app is not None:
                self._app.invalidate()  # thread-safe: the toolbar shows the line as it grows
        return len(text)

    def partial(self) -> str:
        """The line being written while a prompt is up (streamed answer text waiting for its
        newline): the prompt's toolbar shows it meanwhile."""
        with self._lock:
            return self._partial if self._prompting else ""

    def flush(self) -> None:
        with self._lock:
            if not self._prompting:
                self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:
        return self._stream.encoding

    # The prompt's side.
    def prompt_starting(self) -> None:
        with self._lock:
            self._prompting = True

    def prompt_running(self, app: Application[Any]) -> None:
        """In the prompt's loop, before its first draw."""
        with self._lock:
            self._app = app
            self._write_queued()

    def prompt_ended(self) -> None:
        """In the prompt thread, once its loop is closed."""
        with self._lock:
            self._write_queued()
            if self._partial:
                self._put(self._partial)
                self._partial = ""
            self._app = None
            self._prompting = False

    def _hand_to_prompt(self) -> None:
        in_terminal = self._in_terminal
        if in_terminal is None:
            from prompt_toolkit.application import run_in_terminal

            def in_prompt_loop(write: Callable[[], None]) -> Any:
                return run_in_terminal(write, in_executor=False)

            in_terminal = in_prompt_loop

        def in_loop() -> None:
            in_terminal(self._write_queued_locked)

        loop = getattr(self._app, "loop", None)  # None: the prompt is gone, or has no loop yet
        if loop is None:
            return  # its loop is gone: `prompt_ended` writes the queued lines
        try:
            loop.call_soon_threadsafe(in_loop)
        except RuntimeError:
            pass  # its loop is closed: `prompt_ended` writes the queued lines

    def _write_queued_locked(self) -> None:
        with self._lock:
            self._write_queued()

    def _write_queued(self) -> None:
        if self._queued:
            text = "".join(self._queued)
            self._queued.clear()
            self._put(text)

    def _put(self, text: str) -> None:
        self._stream.write(text)
        self._stream.flush()


class TerminalLines:
    """prompt-toolkit's prompt (line editing, history kept across chats in `history_file`, the
    session's status and child tree as a bottom toolbar kept live while the prompt is up), run
    in a worker thread so Trio keeps the main thread; imported here only, so other commands
    never load it."""

    steers = True  # lines typed while a turn runs reach it (the chat reads them then)

    def __init__(self, output: TerminalOutput, history_file: str | None = None) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.filters import Condition
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings

        history: Any = InMemoryHistory()
        if history_file is not None:
            try:
                os.makedirs(os.path.dirname(history_file), exist_ok=True)
                with open(history_file, "a"):
                    pass  # can be written: keep it
                history = FileHistory(history_file)
            except OSError:
                pass  # no place for it (read-only home): this chat's lines only
        # Esc interrupts a running turn. Eager (no wait for a longer key sequence), so only
        # while a turn runs: at the idle prompt Esc keeps its editing meaning (Alt-keys).
        self._running = False
        keys = KeyBindings()

        @keys.add("escape", eager=True, filter=Condition(lambda: self._running))
        def _escape(event: Any) -> None:
            event.app.exit(result=ESCAPE)

        # F2 follows the working subagents in turn (`/watch` by key); what was typed stays.
        @keys.add("f2")
        def _watch_next(event: Any) -> None:
            self._carry = event.app.current_buffer.text
            event.app.exit(result=WATCH_NEXT)

        self.session: Any = PromptSession(history=history, key_bindings=keys)
        self.output = output
        self._carry = ""  # what was typed at a prompt taken away (the turn ended): the next one starts with it
        self._progress: RunProgress | None = None  # the session's status and tree, swapped whole
        self._interrupt = threading.Event()  # `interrupt` asked; cleared when a prompt returns for it
        self._idle = threading.Event()  # no prompt thread runs
        self._idle.set()

    def progress(self, progress: RunProgress) -> None:
        # A copy, swapped whole: the prompt thread renders it on every redraw (the "ago" of each
        # child's last action moves with the clock), while this thread folds the next event.
        self._progress = attrs.evolve(
            progress, children={k: attrs.evolve(child) for k, child in progress.children.items()}
        )
        app = self.session.app
        if app.is_running:
            app.invalidate()  # thread-safe: the prompt's loop redraws

    def _bottom(self) -> Any:
        """The toolbar (in the prompt's loop): the answer line streaming meanwhile, if any,
        above the status and tree."""
        from prompt_toolkit.formatted_text import ANSI

        if self._interrupt.is_set():
            # An interrupt that came while the prompt was starting (before its loop could be
            # asked): this draw, at the latest the next refresh, ends the prompt instead.
            app = self.session.app
            if app.loop is not None:
                app.loop.call_soon(self._exit_if_asked, app)
        width = shutil.get_terminal_size().columns
        progress = self._progress
        tree = toolbar_text(progress, width, now_ms=int(time.time() * 1000)) if progress is not None else ""
        return ANSI(streaming_line(self.output.partial(), width) + tree)

    def turn_running(self, running: bool) -> None:
        """A turn runs (Esc interrupts it) or not. Thread-safe: the prompt's loop reads it."""
        self._running = running

    def interrupt(self) -> None:
        """Take the prompt away: the read in progress (or the next, if it is just starting)
        returns `INTERRUPTED` at once. Thread-safe."""
        self._interrupt.set()
        app = self.session.app
        loop = app.loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._exit_if_asked, app)
            except RuntimeError:
                pass  # its loop closed: the prompt is over anyway

    def _exit_if_asked(self, app: Application[Any]) -> None:
        """In the prompt's loop: end the prompt if an interrupt is pending and it still runs."""
        if self._interrupt.is_set() and app.is_running and app.future is not None and not app.future.done():
            self._carry = app.current_buffer.text
            app.exit(result=INTERRUPTED)

    async def read(self, prompt: str) -> str | object | None:
        def started() -> None:
            app = self.session.app
            self.output.prompt_running(app)
            self._exit_if_asked(app)  # an interrupt that came while it started

        carried, self._carry = self._carry, ""

        def ask() -> str | object | None:
            try:
                # The worker thread cannot own signal handlers; Ctrl-C arrives as a key.
                line = self.session.prompt(
                    prompt,
                    handle_sigint=False,
                    bottom_toolbar=self._bottom,
                    pre_run=started,
                    default=carried,
                    refresh_interval=1.0,  # each child's "12s ago" keeps time
                )
            except KeyboardInterrupt:
                return CTRL_C
            except EOFError:
                return None
            finally:
                self.output.prompt_ended()
                self._idle.set()
            if line is INTERRUPTED:
                self._interrupt.clear()
            return line

        # One prompt at a time: one abandoned by a cancel is still leaving.
        await trio.to_thread.run_sync(self._idle.wait)
        self._idle.clear()
        self.output.prompt_starting()
        try:
            return await trio.to_thread.run_sync(ask, abandon_on_cancel=True)
        except trio.Cancelled:
            self.interrupt()  # the abandoned prompt leaves the screen at once
            raise


def streaming_line(partial: str, width: int) -> str:
    """The tail of a line being streamed, as toolbar text (its own line, at most two screen
    lines' worth; control characters dropped: the text is the model's, never escapes)."""
    if not partial:
        return ""
    text = "".join(ch for ch in partial if ch.isprintable())
    room = max(20, width) * 2 - 1
    return ("…" + text[-(room - 1) :] if len(text) > room else text) + "\n"


def toolbar_text(progress: RunProgress, width: int, most: int = TREE_LINES, now_ms: int | None = None) -> str:
    """The session's status line and its child tree (at most `most` children, the working ones
    first; with `now_ms`, each one's last action and how long ago), rendered by rich as ANSI text
    `width` columns wide."""
    from rich.console import Console, Group
    from rich.text import Text
    from rich.tree import Tree

    from ..run_progress import child_line

    status = Text(progress.status_line())
    children = list(progress.children.values())
    if not children:
        return _ansi(Console, status, width)
    working = [c for c in children if c.state in ("starting", "running")]
    shown = {c.id for c in (working + [c for c in children if c not in working])[:most]}
    tree = Tree(Text("subagents", style="dim"), guide_style="dim")
    nodes = {progress.root_id: tree}
    for child in children:  # in the order they started, under their parents
        if child.id in shown:
            nodes[child.id] = nodes.get(child.parent, tree).add(
                Text(child_line(child, now_ms, progress.stall_after_ms))
            )
    parts: list[RenderableType] = [status, tree]
    if len(children) > most:
        parts.append(Text(f"… and {len(children) - most} more (/agents all)"))
    return _ansi(Console, Group(*parts), width)


def _ansi(console_type: type[Console], renderable: RenderableType, width: int) -> str:
    buffer = io.StringIO()
    console_type(file=buffer, width=max(20, width), force_terminal=True, color_system="standard").print(
        renderable, end=""
    )
    return buffer.getvalue()


def history_path(env: Mapping[str, str] | None = None) -> str:
    """Where the chat keeps the lines a person typed: `$XDG_STATE_HOME/subagents/chat_history`
    (`~/.local/state/...` when unset)."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "subagents", "chat_history")
