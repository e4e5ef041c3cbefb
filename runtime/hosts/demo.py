"""`subagents demo`: a built-in keyless story with the scripted model (issue 8).

A parent starts three background children; they work (paced by real pauses), settle, and the
parent hears of each and lists them; the runtime closes and reopens on the same root; the
parent messages one child, which is cold-resumed from its log and answers. On a terminal a live
tree of statuses (rich) updates as it goes; otherwise a plain log is printed, ending with
`demo: <n> children settled`, `demo: restart`, `demo: <child-id> resumed`, `demo: ok`. The
store is left for `subagents sessions`, `show`, `children` and `agents` to inspect.

It writes the same logs on every run (issue 13 item 3): ids come from `CountingIds`, times
from a `ScenarioClock` frozen at one instant per runtime (a counting clock would give times
that depend on how the agents' tasks interleave), and the children take turns — each one's
model call is held until the parent waits for exactly that child — so the settlements, the
notices and the listing follow one order. The pauses pace the live tree only; no log sees them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any, TextIO, cast

import attrs
import trio
from trio_util import RepeatedEvent

from ..app import Runtime, open_runtime
from ..delegation.listing import ChildRow
from ..foundation.clock import ScenarioClock
from ..foundation.errors import CommandFailed
from ..foundation.ids import CountingIds
from ..models.base import Chunk, Model, ModelRequest, SessionBinding
from ..testing.script_format import load_script
from ..testing.scripted_model import ScriptedModel

__all__ = ["DEMO_CHILDREN", "demo_script", "run_demo"]

DEMO_START_MS = 1_789_000_000_000

DEMO_CHILDREN = (
    (
        "Survey the storage layer",
        "Read the storage layer and summarize its guarantees.",
        300,
        "Appends are fsynced before they are acknowledged; torn tails are cut, never guessed.",
    ),
    (
        "Check the listing rules",
        "Check how children are listed after a restart.",
        600,
        "Cold children list as ready from their checkpoints; damaged ones become diagnostics.",
    ),
    (
        "Draft release notes",
        "Draft two lines of release notes.",
        900,
        "trio-subagents: durable background subagents that survive restarts.",
    ),
)
_FIRST = DEMO_CHILDREN[0][0]


def demo_script() -> dict[str, Any]:
    parent = [
        {
            "tool_calls": [
                {"name": "subagent", "arguments": {"description": d, "prompt": p}} for d, p, _, _ in DEMO_CHILDREN
            ]
        },
        {"wait_for": {"settled": DEMO_CHILDREN[0][0]}, "text": "Three subagents are working; I will wait for them."},
        {"wait_for": {"settled": DEMO_CHILDREN[1][0]}, "text": "One is done."},
        {"wait_for": {"settled": DEMO_CHILDREN[2][0]}, "tool_calls": [{"name": "list_agents", "arguments": {}}]},
        {"text": "All three subagents finished: {{from_request:((?:\\S+ \\[\\w+\\] — .*\\n?){3})}}"},
        # After the restart:
        {
            "tool_calls": [
                {
                    "name": "send_message",
                    "arguments": {
                        "agent_id": "{{from_request:(\\S+) \\[ready\\] — " + _FIRST + "}}",
                        "message": "One more detail: what happens to a torn zstd frame?",
                    },
                }
            ]
        },
        {"wait_for": {"settled": _FIRST}, "text": "Asked the storage surveyor again."},
        {"text": "The surveyor answered: {{from_request:Its closing message:\\n(.*)}}"},
    ]
    agents: list[dict[str, Any]] = [{"responses": parent}]
    for label, _prompt, _pause, answer in DEMO_CHILDREN:
        responses: list[dict[str, Any]] = [{"text": answer}]
        if label == _FIRST:
            responses.append({"text": "Its complete lines are recovered and re-framed; nothing acknowledged is lost."})
        agents.append({"label": label, "responses": responses})
    return {"agents": agents}


# (label, its n-th model call) → (the parent's model call it waits for, the pause in ms): each
# child works only while the parent waits on its `wait_for: settled` for that very child.
_TURNS = {
    (DEMO_CHILDREN[0][0], 1): (2, DEMO_CHILDREN[0][2]),
    (DEMO_CHILDREN[1][0], 1): (3, DEMO_CHILDREN[1][2]),
    (DEMO_CHILDREN[2][0], 1): (4, DEMO_CHILDREN[2][2]),
    (_FIRST, 2): (7, 300),
}


class _TakingTurns:
    """The scripted model, holding each child's call until the parent's matching call has
    started (its step input is durable), then pausing for show (real time, `delay_scale`)."""

    def __init__(self, inner: ScriptedModel, delay_scale: float) -> None:
        self.inner = inner
        self.delay_scale = delay_scale
        self.parent_id: str | None = None
        self._calls: dict[str, int] = {}
        self._parent_calls = 0
        self._changed = RepeatedEvent()

    def bind(self, session: SessionBinding) -> Model:
        return _TurnTaker(self, session, self.inner.bind(session))

    def answer(self, session: SessionBinding, inner: Model, request: ModelRequest) -> AsyncGenerator[Chunk]:
        if request.purpose != "turn":
            return inner.stream(request)
        sid = session.session_id
        n = self._calls[sid] = self._calls.get(sid, 0) + 1
        if sid == self.parent_id:
            self._parent_calls = n
            self._changed.set()
        turn = _TURNS.get((session.label or "", n)) if sid != self.parent_id else None
        return self._held(turn, inner, request)

    async def _held(self, turn: tuple[int, int] | None, inner: Model, request: ModelRequest) -> AsyncGenerator[Chunk]:
        if turn is not None:
            after, pause_ms = turn
            while self._parent_calls < after:
                await self._changed.wait()
            await trio.sleep(pause_ms * self.delay_scale / 1000)
        async with aclosing(inner.stream(request)) as stream:
            async for chunk in stream:
                yield chunk


@attrs.frozen
class _TurnTaker:
    """`_TakingTurns` bound to one session."""

    turns: _TakingTurns
    session: SessionBinding
    inner: Model

    def stream(self, request: ModelRequest) -> AsyncGenerator[Chunk]:
        return self.turns.answer(self.session, self.inner, request)


class _Reporter:
    """Prints status transitions: a live rich tree on a terminal, plain lines otherwise."""

    def __init__(self, out: TextIO, live: bool) -> None:
        self.out = out
        self.live = live
        self.seen: dict[str, str] = {}
        self.quiet = False  # after the restart the plain log holds only the closing lines
        self.labels: dict[str, str] = {}
        self.created: dict[str, tuple[int, str]] = {}  # sort key: ids count up

    def line(self, text: str) -> None:
        if not self.quiet:
            print(f"demo: {text}", file=self.out, flush=True)

    def final(self, text: str) -> None:
        print(f"demo: {text}", file=self.out, flush=True)

    def tree(self, runtime: Runtime, parent_id: str) -> Any:
        from rich.tree import Tree

        root = Tree(f"[bold]{parent_id}[/] {runtime.agents.status(parent_id) or 'ready'}")
        for child_id, label in sorted(self.labels.items(), key=lambda item: self.created[item[0]]):
            status = runtime.agents.status(child_id) or "settled"
            style = {"running": "yellow", "idle": "cyan"}.get(status, "green")
            root.add(f"{child_id} [{style}]{status}[/] — {label}")
        return root

    def learn(self, rows: Any) -> None:
        """Children from a listing (in its order): a fast run may end before a poll saw them."""
        for row in rows:
            if isinstance(row, ChildRow) and row.label and row.id not in self.labels:
                self.labels[row.id] = row.label
                self.created[row.id] = (len(row.id), row.id)

    def poll(self, runtime: Runtime, parent_id: str) -> None:
        for agent in runtime.agents.list():
            if agent.session_id != parent_id and agent.session_id not in self.labels and agent.label:
                self.labels[agent.session_id] = agent.label
                self.created[agent.session_id] = (len(agent.session_id), agent.session_id)  # demo-2 < demo-10
        for child_id, label in sorted(self.labels.items(), key=lambda item: self.created[item[0]]):
            status = runtime.agents.status(child_id) or "settled"
            if self.seen.get(child_id) != status:
                self.seen[child_id] = status
                if not self.live:
                    self.line(f"{child_id} {status} — {label}")


async def _watch(runtime: Runtime, parent_id: str, reporter: _Reporter, render: Callable[[Any], None] | None) -> None:
    while True:
        reporter.poll(runtime, parent_id)
        if render is not None:
            render(reporter.tree(runtime, parent_id))
        await trio.sleep(0.05)


async def _phase(runtime: Runtime, parent_id: str, prompt: str, reporter: _Reporter, create: bool) -> Any:
    agent = await (runtime.agents.create(session_id=parent_id) if create else runtime.agents.resume(parent_id))
    if not reporter.live:
        reporter.line(f"parent {parent_id} {'started' if create else 'resumed'}: {prompt}")
    await agent.send(prompt)
    async with trio.open_nursery() as nursery:
        if reporter.live:
            from rich.console import Console
            from rich.live import Live

            live = Live(console=Console(file=reporter.out), refresh_per_second=20, transient=False)
            live.start()
            nursery.start_soon(_watch, runtime, parent_id, reporter, live.update)
        else:
            live = None
            nursery.start_soon(_watch, runtime, parent_id, reporter, None)
        try:
            result = await runtime.subagents.wait_tree_idle(agent)
        finally:
            nursery.cancel_scope.cancel()
            if live is not None:
                live.update(reporter.tree(runtime, parent_id))
                live.stop()
    reporter.poll(runtime, parent_id)
    if result is None or result.reason["kind"] != "completed":
        raise CommandFailed(f"the demo parent's turn ended {result.reason if result else 'without a turn'}")
    reporter.line(f"parent says: {(result.text or '').strip().replace(chr(10), '; ')}")
    return result


def _frozen() -> ScenarioClock:
    """Every reading at one instant (after the newest time a resumed log holds, which the
    registry makes the clock observe): deterministic however the agents interleave."""
    return ScenarioClock(start=DEMO_START_MS, step_ms=0)


async def run_demo(
    root: str,
    *,
    out: TextIO | None = None,
    live: bool | None = None,
    delay_scale: float = 1.0,
    store: str | None = None,
) -> int:
    """The demo on `root` (`store`: a log store URL instead, runtime/store_select.py)."""
    out = out or cast(TextIO, sys.stdout)  # None only without a console (pythonw), where no demo runs
    live = out.isatty() if live is None else live
    # One instance: script positions carry on across the restart.
    model = _TakingTurns(ScriptedModel(load_script(json.dumps(demo_script()))), delay_scale)
    ids = CountingIds("demo")
    reporter = _Reporter(out, live)
    async with open_runtime(root, model=model, clock=_frozen(), id_factory=ids, store=store) as runtime:
        parent_id = model.parent_id = await runtime.agents.new_id()
        await _phase(runtime, parent_id, "Delegate three tasks and report back.", reporter, create=True)
        rows = await runtime.listing.list_children(parent_id)
        reporter.learn(rows)
        reporter.poll(runtime, parent_id)
    settled = [cid for cid, status in reporter.seen.items() if status == "settled"]
    if len(rows) != len(DEMO_CHILDREN) or len(settled) != len(DEMO_CHILDREN):
        raise CommandFailed(f"expected {len(DEMO_CHILDREN)} settled children, listed {len(rows)}")
    reporter.final(f"{len(settled)} children settled")
    reporter.final("restart")
    reporter.quiet = not live
    first = next(cid for cid, label in reporter.labels.items() if label == _FIRST)
    async with open_runtime(root, model=model, clock=_frozen(), id_factory=ids, store=store) as runtime:
        result = await _phase(runtime, parent_id, "Ask the storage surveyor one more question.", reporter, create=False)
    if "recovered" not in (result.text or ""):
        raise CommandFailed(f"the resumed child did not answer: {result.text!r}")
    reporter.final(f"{first} resumed")
    reporter.final("ok")
    return 0
