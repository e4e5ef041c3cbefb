"""`TerminalOutput`: the chat's output never goes through a drawn prompt and never loses a line,
whatever the prompt thread is doing (the pty tests in test_chat.py drive the real prompt)."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from subagents.runtime.chat_terminal import TerminalOutput


class FakeLoop:
    """The prompt's event loop: holds what the output hands it until `run`; closed, it refuses
    like asyncio's."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []
        self.closed = False

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        if self.closed:
            raise RuntimeError("Event loop is closed")
        self.callbacks.append(callback)

    def run(self) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback()


class FakeApp:
    def __init__(self) -> None:
        self.loop = FakeLoop()


def output() -> tuple[TerminalOutput, io.StringIO]:
    screen = io.StringIO()
    return TerminalOutput(screen, in_terminal=lambda write: write()), screen


def test_without_a_prompt_a_write_reaches_the_terminal_at_once_partial_lines_too() -> None:
    out, screen = output()
    out.write("assistant: hel")
    assert screen.getvalue() == "assistant: hel"
    out.write("lo\n")
    assert screen.getvalue() == "assistant: hello\n"


def test_lines_written_while_the_prompt_starts_come_before_its_first_draw() -> None:
    out, screen = output()
    out.prompt_starting()
    out.write("── turn 2 ended: aborted user\n")
    assert screen.getvalue() == ""  # the prompt thread may be drawing: nothing goes out now
    out.prompt_running(FakeApp())  # in the prompt's loop, before its first draw
    assert screen.getvalue() == "── turn 2 ended: aborted user\n"


def test_while_the_prompt_is_up_whole_lines_go_through_its_loop_in_order() -> None:
    out, screen = output()
    app = FakeApp()
    out.prompt_starting()
    out.prompt_running(app)
    out.write("one\n")
    out.write("two\nthr")
    assert screen.getvalue() == ""
    app.loop.run()
    assert screen.getvalue() == "one\ntwo\n"  # the partial line waits for its newline
    out.write("ee\n")
    app.loop.run()
    assert screen.getvalue() == "one\ntwo\nthree\n"


def test_lines_the_closing_loop_never_wrote_are_written_when_the_prompt_ends() -> None:
    out, screen = output()
    app = FakeApp()
    out.prompt_starting()
    out.prompt_running(app)
    out.write("handed over\n")  # scheduled, but the loop stops before running it
    app.loop.closed = True
    out.write("after the close\n")  # refused by the closed loop
    out.write("partial")
    out.prompt_ended()
    assert screen.getvalue() == "handed over\nafter the close\npartial"
    app.loop.run()  # a stale callback finds nothing left: no line twice
    assert screen.getvalue() == "handed over\nafter the close\npartial"
    out.write(" and on\n")  # no prompt: straight out again
    assert screen.getvalue() == "handed over\nafter the close\npartial and on\n"


def test_it_looks_like_the_terminal_to_rich() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out: Any = TerminalOutput(Tty())
    from rich.console import Console

    console = Console(file=out, force_terminal=None)
    assert console.is_terminal
    console.print("[bold]x[/bold]")
    assert "x" in out._stream.getvalue()
