"""A fresh-process driver for `test_subagents_e2e.py`: `python subagent_driver.py SPEC.json`.

The spec (JSON) says what one process does on a runtime root:

    {"root": str, "script": {...scripted-model script...}, "session": str,
     "create": bool,            # create the session, else resume it
     "prompt": str | null,      # sent as a follow-up after create/resume
     "clock_start": int,        # ScenarioClock start (each phase its own, so times keep rising)
     "max_depth": int, "max_active_subagents": int,
     "gates": [[session, n, after_session, after_n], ...],
         # hold `session`'s n-th model call until `after_session`'s `after_n`-th call has started
     "mark": [condition, ...] | null,
         # when every condition holds, print "MARK" and wait to be killed; conditions:
         #   {"model_call": [session, n]}  — that session's n-th model call has started
         #   {"settled": [parent, child]}  — `subagent/settled` of child (id or label) is durable
         #   {"idle": session}             — that agent is idle (no turn, no waking input)
     "hold_settlement": bool,  # print "MARK" when a settlement begins — after the child's
                               # last turn/end, before `subagent/settled` — and wait to be killed
     "on_interrupted_turn": "continue" | "close",  # open_runtime's (default: continue)
     "workspace_tools": [name, ...],  # these workspace tools (acting in root/../workspace), given
                                      # to every agent as they are (idempotent or not)
     "hold_tools": bool}  # a workspace tool call holds before it runs, for the mark
                          #   {"tool_started": name} — a call of that tool has started (durable)

Without `mark`/`hold_settlement` it waits until the session's tree is idle, prints
`RESULT {"reason": ..., "text": ...}` and exits 0. Model calls are counted per session (turn
calls only); a model call has started once the step's input is durable in the log.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from contextlib import aclosing
from typing import Any

import trio
from subagents.runtime.app import open_runtime
from subagents.runtime.delegation.residency import Residency
from subagents.runtime.foundation.clock import ScenarioClock
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel
from subagents.runtime.tools.workspace_tools import workspace_tools


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class HookedModel:
    """Delegates to a `ScriptedModel`; counts turn calls per session and can hold a call
    until another session's call has started (deterministic ordering without sleeps)."""

    def __init__(self, inner: ScriptedModel, gates: list[list[Any]]) -> None:
        self.inner = inner
        self.calls: dict[str, int] = defaultdict(int)
        self._events: dict[tuple[str, int], trio.Event] = {}
        self._gates = {(g[0], g[1]): (g[2], g[3]) for g in gates}

    def event(self, session: str, n: int) -> trio.Event:
        return self._events.setdefault((session, n), trio.Event())

    def bind(self, session: Any) -> Any:
        return _HookedSession(self, session.session_id, self.inner.bind(session))

    def answer(self, session_id: str, bound: Any, request: Any) -> Any:
        if request.purpose != "turn":
            return bound.stream(request)
        self.calls[session_id] += 1
        n = self.calls[session_id]
        self.event(session_id, n).set()
        gate = self._gates.get((session_id, n))
        inner = bound.stream(request)
        if gate is None:
            return inner
        return self._gated(self.event(*gate), inner)

    async def _gated(self, gate: trio.Event, inner: Any) -> Any:
        await gate.wait()
        async with aclosing(inner) as stream:
            async for chunk in stream:
                yield chunk


class _HookedSession:
    """`HookedModel` bound to one session."""

    def __init__(self, hooked: HookedModel, session_id: str, bound: Any) -> None:
        self.hooked = hooked
        self.session_id = session_id
        self.bound = bound

    def stream(self, request: Any) -> Any:
        return self.hooked.answer(self.session_id, self.bound, request)


class HeldTool:
    """A workspace tool as it is (name, schema, idempotent), whose calls say they started and,
    with `hold`, wait there to be killed."""

    def __init__(self, inner: Any, started: trio.Event, hold: bool) -> None:
        self.inner = inner
        self.name = inner.name
        self.description = inner.description
        self.parameters = inner.parameters
        self.parallel_safe = inner.parallel_safe
        self.idempotent = inner.idempotent
        self._started = started
        self._hold = hold

    async def run(self, args: Any, ctx: Any) -> Any:
        self._started.set()
        if self._hold:
            await trio.sleep_forever()
        return await self.inner.run(args, ctx)


def _tools(spec: dict[str, Any], started: dict[str, trio.Event]) -> list[Any]:
    names = spec.get("workspace_tools") or []
    if not names:
        return []
    import os

    folder = os.path.join(os.path.dirname(spec["root"]), "workspace")
    os.makedirs(folder, exist_ok=True)
    return [
        HeldTool(t, started.setdefault(t.name, trio.Event()), bool(spec.get("hold_tools")))
        for t in workspace_tools(folder)
        if t.name in names
    ]


async def _wait_mark(
    rt: Any, model: HookedModel, conditions: list[dict[str, Any]], started: dict[str, trio.Event]
) -> None:
    for cond in conditions:
        if "model_call" in cond:
            session, n = cond["model_call"]
            await model.event(session, n).wait()
        elif "settled" in cond:
            parent, child = cond["settled"]
            await model.inner.wait_settled(parent, child)
        elif "tool_started" in cond:
            await started.setdefault(cond["tool_started"], trio.Event()).wait()
        elif "idle" in cond:
            agent = rt.agents.get(cond["idle"])
            assert agent is not None, cond
            await agent.wait_idle()
        else:
            raise ValueError(f"unknown mark condition {cond!r}")


async def main(spec: dict[str, Any]) -> None:
    if spec.get("hold_settlement"):

        async def held(self: Any, activation: Any, child: Any) -> None:
            _say("MARK")
            await trio.sleep_forever()

        Residency._settle = held  # type: ignore[method-assign]  # the crash driver holds settlement at a marked point
    model = HookedModel(ScriptedModel(load_script(json.dumps(spec["script"]))), spec.get("gates", []))
    started: dict[str, trio.Event] = {}
    tools = _tools(spec, started)
    async with open_runtime(
        spec["root"],
        model=model,
        clock=ScenarioClock(start=spec.get("clock_start", 1_789_000_000_000)),
        id_factory=CountingIds("child"),
        compression="none",
        max_depth=spec.get("max_depth", 1),
        max_active_subagents=spec.get("max_active_subagents", 8),
        on_interrupted_turn=spec.get("on_interrupted_turn"),
        tools=lambda: list(tools),
    ) as rt:
        if spec["create"]:
            agent = await rt.agents.create(session_id=spec["session"])
        else:
            agent = await rt.agents.resume(spec["session"])
        if spec.get("prompt") is not None:
            await agent.send(spec["prompt"])
        if spec.get("mark") is not None:
            await _wait_mark(rt, model, spec["mark"], started)
            _say("MARK")
            await trio.sleep_forever()
        if spec.get("hold_settlement"):
            await trio.sleep_forever()
        result = await rt.subagents.wait_tree_idle(agent)
        _say(
            "RESULT "
            + json.dumps({"reason": result.reason if result else None, "text": result.text if result else None})
        )


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        trio.run(main, json.load(f))
