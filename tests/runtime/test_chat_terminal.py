"""The chat's terminal parts without a terminal: `TerminalOutput` never writes through a drawn
prompt and never loses a line whatever the prompt thread is doing; the toolbar's tree; the tree
the chat hands to its terminal (the pty tests in test_chat.py drive the real prompt)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from subagents.runtime import ScriptedModel, load_script
from subagents.runtime.hosts.chat.host import chat
from subagents.runtime.hosts.chat.terminal import TerminalOutput, streaming_line, toolbar_text
from subagents.runtime.hosts.run_progress import ChildStatus, RunProgress


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
        self.invalidated = 0  # redraws asked (the toolbar shows a partial line as it grows)

    def invalidate(self) -> None:
        self.invalidated += 1


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


def test_a_partial_line_written_under_the_prompt_is_shown_in_its_toolbar_until_its_newline() -> None:
    out, screen = output()
    app = FakeApp()
    assert out.partial() == ""
    out.prompt_starting()
    out.prompt_running(app)
    out.write("assistant: str")
    out.write("eaming")
    assert (out.partial(), app.invalidated, screen.getvalue()) == ("assistant: streaming", 2, "")
    out.write(" done\n")
    app.loop.run()
    assert (out.partial(), screen.getvalue()) == ("", "assistant: streaming done\n")
    out.write("next")
    out.prompt_ended()
    assert (out.partial(), screen.getvalue()) == ("", "assistant: streaming done\nnext")  # no prompt: no toolbar line


def test_the_streaming_line_in_the_toolbar_is_its_tail_without_control_characters() -> None:
    assert streaming_line("", 80) == ""
    assert streaming_line("assistant: hi\x1b[2Jthere", 80) == "assistant: hi[2Jthere\n"  # no escape reaches it
    long = streaming_line("x" * 500, 40)
    assert long.startswith("…") and len(long) == 80 and long.endswith("x\n")


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


def progress_with(children: int, running: set[int]) -> RunProgress:
    progress = RunProgress("root-1", turn=2, activity="done")
    for i in range(children):
        progress.children[f"c{i}"] = ChildStatus(
            id=f"c{i}",
            parent="root-1",
            label=f"job {i}",
            mode="continuable",
            state="running" if i in running else "idle",
        )
    return progress


def plain(ansi: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", ansi)


def test_the_toolbar_is_the_status_line_alone_without_children() -> None:
    assert plain(toolbar_text(RunProgress("root-1", activity="idle"), 80)) == "root-1 · idle"


def test_the_toolbar_shows_the_tree_under_the_status_line_with_state_and_label() -> None:
    progress = progress_with(2, running={1})
    progress.children["g"] = ChildStatus(id="g", parent="c1", label="grandchild", mode="one-shot", state="running")
    lines = plain(toolbar_text(progress, 80)).splitlines()
    assert lines[0] == "root-1 · turn 2 · done · 2 children working"
    assert [line.rstrip() for line in lines[1:]] == [
        "subagents",
        "├── c0 [idle] — job 0",
        "└── c1 [running] — job 1",
        "    └── g [running] — grandchild",
    ]


def test_a_long_tree_shows_the_working_children_first_then_how_many_more() -> None:
    text = plain(toolbar_text(progress_with(12, running={10, 11}), 80, most=4))
    shown = re.findall(r"(c\d+) \[", text)
    assert shown == ["c0", "c1", "c10", "c11"]  # the two working ones kept, in their start order
    assert text.rstrip().endswith("… and 8 more (/agents all)")


class RecordedLines:
    """A person who types `typed` and then leaves; keeps every tree the chat handed over."""

    steers = False

    def __init__(self, typed: list[str]) -> None:
        self.typed = list(typed)
        self.trees: list[dict[str, str]] = []
        self.stall_after_ms: list[int] = []

    def turn_running(self, running: bool) -> None:
        pass

    async def read(self, prompt: str) -> str | None:
        return self.typed.pop(0) if self.typed else None

    def progress(self, progress: RunProgress) -> None:
        self.trees.append({c.id: c.state for c in progress.children.values()})
        self.stall_after_ms.append(progress.stall_after_ms)


ONE_CHILD = {
    "agents": [
        {
            "responses": [
                {
                    "tool_calls": [
                        {
                            "name": "subagent",
                            "arguments": {"description": "Bg", "prompt": "go", "run_in_background": True},
                        }
                    ]
                },
                {"text": "started it"},
                {"text": "noted"},
            ]
        },
        {"label": "Bg", "responses": [{"text": "child done"}]},
    ]
}


async def test_the_chat_hands_its_tree_to_the_terminal_and_a_resumed_chat_starts_from_the_listing(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "root")
    first = RecordedLines(["start a child", "/wait"])
    model = ScriptedModel(load_script(json.dumps(ONE_CHILD)))
    assert await chat(root, model, lines=first, console=Console(file=io.StringIO()), compression="none") == 0
    assert first.trees[0] == {}  # handed over before anything happened
    (child,) = first.trees[-1]
    assert "running" in [tree.get(child) for tree in first.trees]
    assert first.trees[-1] == {child: "settled: completed"}

    session = next(p.name for p in (tmp_path / "root" / "sessions").iterdir() if p.name != child)
    again = RecordedLines([])
    model = ScriptedModel(load_script(json.dumps({"agents": [{"responses": []}]})))
    await chat(root, model, session_id=session, lines=again, console=Console(file=io.StringIO()))
    assert again.trees == [{child: "ready"}]  # known from the listing, before any event: as /agents says
    assert set(first.stall_after_ms) == {300_000}  # the tree's `stalled` is the listings' (default 5 minutes)
    third = RecordedLines([])
    await chat(
        root,
        model,
        session_id=session,
        lines=third,
        console=Console(file=io.StringIO()),
        runtime_options={"stall_after": 90},
    )
    assert set(third.stall_after_ms) == {90_000}  # subagents.toml's `stall_after`, as the host passes it


def test_a_descendants_turn_end_names_its_cause_apart_from_its_kind() -> None:
    from subagents.runtime import StreamEvent
    from subagents.runtime.hosts.chat.view import event_line
    from subagents.storage import make_event

    def end(reason: dict[str, Any]) -> str | None:
        return event_line(StreamEvent("c1", make_event(5, "turn/end", 1, {"turn": 2, "reason": reason})), "root")

    assert end({"kind": "aborted", "cause": "user"}) == "  ⋯ c1 turn 2 aborted user"  # not `aborteduser`
    assert end({"kind": "error", "message": "the model  failed"}) == "  ⋯ c1 turn 2 error the model failed"
    assert end({"kind": "completed"}) == "  ⋯ c1 turn 2 completed"
