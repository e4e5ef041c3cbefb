"""The chat's view: one line per durable event of the session and its descendants, and the
session's answer text as the model streams it, in order with those events (the rules of
runtime/hosts/acp/live.py, on a console)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, Callable
from typing import TYPE_CHECKING

import attrs
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


@attrs.define(eq=False)
class _Live:
    """One session whose answer text the view shows as it streams (the root, or the watched
    child): how far its events are shown, and the text of its model calls not shown yet."""

    session_id: str
    tag: str  # what each of its lines starts with ("" for the root, "[label] " for a watched child)
    shown: int  # its next seq to show
    replies: int  # its `assistant/message` events shown (or before the view saw it)
    durable_next: Callable[[], int]  # its log's durable end now
    gates: dict[int, int] = attrs.field(factory=dict)  # by call: its durable end when the text began
    waiting: dict[int, list[str]] = attrs.field(factory=dict)  # text of calls not shown yet, by call
    muted: set[int] = attrs.field(factory=set)  # calls whose text went unseen: printed from the record

    @property
    def prefix(self) -> str:
        """What its streamed answer line starts with."""
        return f"{self.tag}assistant: "


class ChatView:
    """Prints the event stream, and the root's answer text as it streams; knows how far the
    root session has been shown.

    A model call's text is shown live only once everything durable when it began answering is
    shown (its turn's start and input, the session's earlier replies): the stream may deliver
    those after a fast model has begun, and the text waits for them. The reply's
    durable `assistant/message` then only ends the line; a reply nothing was streamed for is
    printed whole from the record.

    `/watch ID` (`watch`) shows a descendant's lines and live text, by the same rules, in place
    of the root's, which wait in `held` until `unwatch` (a root call whose text streamed
    meanwhile is printed from its record)."""

    def __init__(
        self, console: Console, root_id: str, start: int, replies: int, durable_next: Callable[[], int]
    ) -> None:
        self.console = console
        self.root_id = root_id
        self.root = _Live(root_id, "", start, replies, durable_next)
        self.ended = False
        self.streaming: _Live | None = None  # whose line of streamed answer text is open
        self.progress = RunProgress(root_id, activity="idle")  # the root's activity and its tree
        self.on_progress: Callable[[RunProgress], None] = lambda progress: None
        self.inputs = 0  # the root's user messages since its last turn/start (more than one: steering)
        self.watched: _Live | None = None
        # False while a steer prompt is up (the person's turn, on a terminal): the root's text is
        # then printed from its record, whole, never as a partial line a prompt could draw over.
        self.stream_root = True
        self.held: list[tuple[str, str | None]] = []
        self._changed = trio.Event()

    @property
    def shown(self) -> int:
        """The root's next seq to show."""
        return self.root.shown

    @property
    def replies(self) -> int:
        return self.root.replies

    @property
    def watching(self) -> str | None:
        return self.watched.session_id if self.watched is not None else None

    def say(self, text: str, style: str | None = None) -> None:
        if self.streaming is not None:
            # A line cuts a streamed reply short: the rest of its text is not shown, its record
            # is printed whole instead (never a reply in two halves).
            self.streaming.muted.add(self.streaming.replies)
        self.end_stream()
        self.console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)

    def on_text(self, session_id: str, call: int, text: str) -> None:
        """Answer text of `session_id`'s model call `call` as it streams (the root's, or the
        watched child's)."""
        live = self.watched if self.watched is not None else self.root
        if not text:
            return
        if session_id != live.session_id:
            if session_id == self.root_id:
                self.root.muted.add(call)  # watching another: the root's record prints it whole
            return
        if live is self.root and not self.stream_root:
            live.muted.add(call)
        if call in live.muted:
            return
        gate = live.gates.setdefault(call, live.durable_next())
        if call != live.replies or live.shown < gate:
            live.waiting.setdefault(call, []).append(text)
            return
        if self.streaming is not live:
            self.end_stream()
            self.console.print(live.prefix, end="", markup=False, highlight=False, soft_wrap=True)
            self.streaming = live
        self.console.print(text, end="", markup=False, highlight=False, soft_wrap=True)

    def end_stream(self, suffix: str = "") -> None:
        if self.streaming is not None:
            self.streaming = None
            self.console.print(suffix, markup=False, highlight=False, soft_wrap=True)

    def watch(
        self, session_id: str, name: str, events: list[StreamEvent], start: int, durable_next: Callable[[], int]
    ) -> None:
        """Show `session_id`'s lines and live text in place of the root's: its log's `events`
        so far, those from index `start` (its current turn) shown first."""
        self.unwatch(quiet=True)
        replies = sum(1 for item in events if item.event.type == "assistant/message")
        shown = events[-1].event.seq + 1 if events else 0
        self.say(f"(watching {session_id}{'' if name == session_id else ' — ' + name}: /watch to come back)", "dim")
        for item in events[start:]:
            line = self._line(item, session_id)
            if line is not None:
                self.say(f"[{name}] {line}", _style(line))
        self.watched = _Live(session_id, f"[{name}] ", shown, replies, durable_next)

    def unwatch(self, *, quiet: bool = False) -> None:
        """Back to the root: the lines it wrote meanwhile first."""
        if self.watched is None:
            return
        self.end_stream()
        self.watched = None
        if not quiet:
            self.say(f"(back to {self.root_id}{': meanwhile' if self.held else ''})", "dim")
        held, self.held = self.held, []
        for line, style in held:
            self.say(line, style)

    def _release(self, live: _Live) -> None:
        """Show the text waiting for the call whose reply comes next, if its turn is shown."""
        for call in [c for c in live.gates if c < live.replies]:
            live.gates.pop(call)
            live.waiting.pop(call, None)  # its reply was printed from the record
        if live.replies in live.waiting and live.shown >= live.gates[live.replies]:
            self.on_text(live.session_id, live.replies, "".join(live.waiting.pop(live.replies)))

    def _line(self, item: StreamEvent, own: str, *, steering: bool = False) -> str | None:
        try:
            return event_line(item, own, steering=steering)
        except StorageError as exc:
            return f"  ! {item.session_id} seq {item.event.seq}: {exc}"

    def _show(self, item: StreamEvent) -> None:
        self.progress.apply(item)
        self.on_progress(self.progress)
        sid = item.session_id
        kind = item.event.type
        watched = self.watched
        if watched is not None and sid == watched.session_id:
            if item.event.seq >= watched.shown:
                self._followed(watched, item)
            return
        if sid != self.root_id:
            line = self._line(item, self.root_id)
            if line is not None:
                self.say(line, "dim")
            return
        if kind == "turn/start":
            self.inputs = 0
        steering = kind == "user/message" and self.inputs > 0
        if kind == "user/message":
            self.inputs += 1
        if watched is None:
            self._followed(self.root, item, steering=steering)
            return
        if kind == "assistant/message":
            self.root.replies += 1
        line = self._line(item, self.root_id, steering=steering)
        if line is not None:
            self.held.append((line, _style(line)))  # shown when the watch ends
        self._shown(self.root, item)

    def _followed(self, live: _Live, item: StreamEvent, *, steering: bool = False) -> None:
        """One event of a session whose text streams: its line, or the end of its streamed one."""
        if item.event.type == "assistant/message":
            live.replies += 1
            if self.streaming is live:
                # Its text was shown as it streamed: the durable record only ends the line.
                self.end_stream(" [interrupted]" if _interrupted(item) else "")
                self._shown(live, item)
                return
        line = self._line(item, live.session_id, steering=steering)
        if line is not None:
            self.say(live.tag + line, _style(line))
        self._shown(live, item)

    def _shown(self, live: _Live, item: StreamEvent) -> None:
        live.shown = item.event.seq + 1
        if live is self.root:
            self._changed.set()
            self._changed = trio.Event()
        self._release(live)

    async def consume(self, stream: AsyncIterable[StreamEvent]) -> None:
        try:
            async for item in stream:
                self._show(item)
        finally:
            self.ended = True
            self._changed.set()

    async def caught_up(self, durable_next: int) -> None:
        """Until the root's events below `durable_next` have been shown."""
        while self.root.shown < durable_next and not self.ended:
            await self._changed.wait()


def _style(line: str) -> str | None:
    return None if line.startswith(("assistant:", "you (steering):")) else "dim"


def _interrupted(item: StreamEvent) -> bool:
    try:
        data = msgspec.json.decode(item.event.data)
    except msgspec.DecodeError:
        return False
    return isinstance(data, dict) and data.get("interrupted") is True
