"""The chat's view: one line per durable event of the session and its descendants, and the
session's answer text as the model streams it, in order with those events (the rules of
runtime/hosts/acp/live.py, on a console)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, Callable
from typing import TYPE_CHECKING

import msgspec
import trio
from subagents.storage import StorageError

from ...event_stream import StreamEvent
from ..run_progress import RunProgress
from ..transcript import render, transcript

if TYPE_CHECKING:  # an annotation: rich loads with the chat's console
    from rich.console import Console

__all__ = ["ChatView", "cut", "event_line"]

_WIDTH = 160  # a tool call's arguments or result beyond this is cut (the log keeps all of it)


def cut(text: str, width: int = _WIDTH) -> str:
    """`text` on one line, cut to `width` characters."""
    one = " ".join(text.split())
    return one if len(one) <= width else one[: width - 1] + "…"


def event_line(item: StreamEvent, root_id: str, *, steering: bool = False) -> str | None:
    """The line the chat shows for one durable event, or None for events it does not show;
    `steering`: a message of the person's is not its turn's first (it joined the running turn).
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
        more = " ".join(str(reason[k]) for k in ("cause", "message") if k in reason)
        return f"  ⋯ {item.session_id} turn {e['turn']} {reason['kind']}" + (f" {cut(more, 120)}" if more else "")
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
        if kind == "user/message" and e["source"] == "user" and steering:
            return f"you (steering): {cut(e['text'])}"  # typed while the turn ran: it joined it
        if e["source"] in ("user", "model") or kind == "system/message":
            return None  # the person typed it; the system prompt is not news
        return f"{e['source']}: {cut(e['text'])}"
    if kind == "tool/call":
        arguments = e["arguments"]
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        return f"  → {e['name']}({cut(arguments)})"
    if kind == "tool/result":
        mark = "✗" if e.get("is_error") else "←"
        doubt = "in doubt: " if e.get("in_doubt") else ""  # cut by a crash, not run again
        return f"  {mark} {doubt}{cut(e['text'])}"
    if kind in ("subagent/catalog", "subagent/settled", "compaction/summary", "turn/continue"):
        lines = render([e])
        return lines[0] if lines else None
    return None


class ChatView:
    """Prints the event stream, and the root's answer text as it streams; knows how far the
    root session has been shown.

    A model call's text is shown live only once everything durable when it began answering is
    shown (its turn's start and input, the session's earlier replies): the stream may deliver
    those after a fast model has begun, and the text waits for them. The reply's
    durable `assistant/message` then only ends the line; a reply nothing was streamed for is
    printed whole from the record."""

    def __init__(
        self, console: Console, root_id: str, start: int, replies: int, durable_next: Callable[[], int]
    ) -> None:
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
        self.inputs = 0  # the root's user messages since its last turn/start (more than one: steering)
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
        if root and kind == "turn/start":
            self.inputs = 0
        try:
            line = event_line(item, self.root_id, steering=root and kind == "user/message" and self.inputs > 0)
        except StorageError as exc:
            line = f"  ! {item.session_id} seq {item.event.seq}: {exc}"
        if root and kind == "user/message":
            self.inputs += 1
        if line is not None:
            self.say(line, None if line.startswith(("assistant:", "you (steering):")) else "dim")
        if root:
            self._shown(item)

    def _shown(self, item: StreamEvent) -> None:
        self.shown = item.event.seq + 1
        self._changed.set()
        self._changed = trio.Event()
        self._release()

    async def consume(self, stream: AsyncIterable[StreamEvent]) -> None:
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
