"""What `run` shows on a terminal while it works: a one-line status and the live child tree.

`RunProgress` is a pure fold over the event stream (`apply` one `StreamEvent` at a time; no
clock, no IO), so its states are tested with tables; `render` turns it into a rich renderable
(the spinner is the only thing that moves by itself). The live display that drives them is in
`run_output`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import msgspec

from ..event_stream import StreamEvent
from ..foundation.json_values import JsonValue

if TYPE_CHECKING:  # annotations: rich loads only when a display is drawn
    from rich.console import RenderableType
    from rich.spinner import Spinner

__all__ = ["STALL_AFTER_MS", "ChildStatus", "RunProgress", "ago", "child_line", "render_progress", "shown_state"]


@attrs.define(kw_only=True)
class ChildStatus:
    """One descendant as the tree shows it."""

    id: str
    parent: str
    label: str | None
    mode: str
    state: str = "starting"  # starting | running | idle | <turn end kind> | settled: <kind>
    last: str | None = None  # its last durable action, in a few words
    last_at: int | None = None  # that event's time (ms)


@attrs.define
class RunProgress:
    """The status of one `run`: the root's current activity and every descendant's state."""

    root_id: str
    turn: int | None = None
    activity: str = "starting"
    children: dict[str, ChildStatus] = attrs.field(factory=dict)
    stall_after_ms: int = 300_000  # subagents.toml's `stall_after` (default 5 minutes), in ms

    def apply(self, item: StreamEvent) -> None:
        """Fold one durable event (of the root or of a descendant)."""
        kind = item.event.type
        if kind not in _FOLDED:
            return
        data = _data(item)
        if data is None:
            return
        sid = item.session_id
        if kind == "subagent/catalog":
            child = data.get("child_id")
            if isinstance(child, str) and child not in self.children:
                label = data.get("label")
                self.children[child] = ChildStatus(
                    id=child,
                    parent=sid,
                    label=label if isinstance(label, str) else None,
                    mode=str(data.get("mode", "")),
                )
            return
        if kind == "subagent/settled":
            child_status = self.children.get(str(data.get("child_id")))
            if child_status is not None:
                child_status.state = f"settled: {data.get('reason_kind')}"
            return
        if sid == self.root_id:
            self._root(kind, data)
            return
        status = self.children.get(sid)
        if status is None:
            return
        status.last, status.last_at = _action(kind, data), item.event.time
        if status.state.startswith("settled"):
            return
        if kind == "turn/start":
            status.state = "running"
        elif kind == "turn/end":
            reason = _reason_kind(data)
            status.state = "idle" if reason == "completed" else reason

    def _root(self, kind: str, data: dict[str, JsonValue]) -> None:
        turn = data.get("turn")
        if type(turn) is int:
            self.turn = turn
        if kind in ("turn/start", "tool/result"):
            self.activity = "thinking"
        elif kind == "tool/call":
            self.activity = f"running {data.get('name')}"
        elif kind == "compaction/start":
            self.activity = "compacting"
        elif kind == "turn/end":
            reason = _reason_kind(data)
            cause = data["reason"].get("cause") if isinstance(data.get("reason"), dict) else None
            said = f" ({cause})" if isinstance(cause, str) else ""  # who aborted it: user, parent…
            self.activity = "done" if reason == "completed" else f"ended {reason}{said}"

    def running_children(self) -> int:
        return sum(1 for c in self.children.values() if c.state in ("starting", "running"))

    def status_line(self) -> str:
        """One line: the root's turn and activity, and how many descendants still work."""
        parts = [self.root_id]
        if self.turn is not None:
            parts.append(f"turn {self.turn}")
        parts.append(self.activity)
        running = self.running_children()
        if running:
            parts.append(f"{running} {'child' if running == 1 else 'children'} working")
        return " · ".join(parts)


_FOLDED = frozenset(
    {
        "subagent/catalog",
        "subagent/settled",
        "turn/start",
        "turn/end",
        "tool/call",
        "tool/result",
        "compaction/start",
        "assistant/message",  # a child's last action
    }
)


def _action(kind: str, data: dict[str, JsonValue]) -> str:
    """A descendant's last durable action, in a few words (the tree shows it)."""
    if kind == "tool/call":
        return f"called {data.get('name')}"
    if kind == "tool/result":
        return "got a tool result"
    if kind == "assistant/message":
        return "replied"
    if kind == "turn/start":
        return f"started turn {data.get('turn')}"
    if kind == "turn/end":
        return f"ended its turn ({_reason_kind(data)})"
    return "compacting" if kind == "compaction/start" else kind


def _data(item: StreamEvent) -> dict[str, JsonValue] | None:
    try:
        data = msgspec.json.decode(item.event.data)
    except msgspec.DecodeError:
        return None
    return data if isinstance(data, dict) else None


def _reason_kind(data: dict[str, JsonValue]) -> str:
    reason = data.get("reason")
    kind = reason.get("kind") if isinstance(reason, dict) else None
    return kind if isinstance(kind, str) else "error"


STALL_AFTER_MS = 300_000  # subagents.toml's `stall_after` default (5 minutes), in ms


def shown_state(child: ChildStatus, now_ms: int | None = None, stall_after_ms: int = STALL_AFTER_MS) -> str:
    """The state the tree shows: a running child whose last durable event is older than
    `stall_after_ms` at `now_ms` is `stalled` (issue 29), else its state."""
    if (
        child.state == "running"
        and now_ms is not None
        and child.last_at is not None
        and now_ms - child.last_at > stall_after_ms
    ):
        return "stalled"
    return child.state


def child_line(child: ChildStatus, now_ms: int | None = None, stall_after_ms: int = STALL_AFTER_MS) -> str:
    """`<id> [<state>] — <label>` (the label omitted when there is none); with `now_ms`, its
    last action and how long ago (`· called grep, 12s ago`), and `stalled` for a running child
    whose last durable event is older than `stall_after_ms`."""
    label = f" — {child.label}" if child.label else ""
    last = ""
    if now_ms is not None and child.last is not None and child.last_at is not None:
        last = f" · {child.last}, {ago(now_ms - child.last_at)}"
    return f"{child.id} [{shown_state(child, now_ms, stall_after_ms)}]{label}{last}"


def ago(ms: int) -> str:
    """A duration as a person reads it: `just now`, `12s ago`, `3m ago`, `2h ago`, `4d ago`."""
    seconds = max(0, ms) // 1000
    if seconds < 1:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def render_progress(progress: RunProgress, spinner: Spinner | None = None) -> RenderableType:
    """The status line (behind a spinner) above the child tree, as one rich renderable. Pass
    the same rich `Spinner` on every call to keep it turning (a new one starts over)."""
    from rich.console import Group
    from rich.spinner import Spinner
    from rich.text import Text
    from rich.tree import Tree

    status = Text(progress.status_line())
    if spinner is None:
        spinner = Spinner("dots", text=status)
    else:
        spinner.update(text=status)
    if not progress.children:
        return spinner
    tree = Tree(Text(progress.root_id), guide_style="dim")
    nodes = {progress.root_id: tree}
    for child in progress.children.values():
        parent = nodes.get(child.parent, tree)
        nodes[child.id] = parent.add(Text(child_line(child)))
    return Group(spinner, tree)
