"""Stop means stop (issue 27, item 5), in process: the `stopped` projection (the last
`session/stopped` after the last explicit message), the notice text of a tree stop, and the
subagent service's tree stop of a family resident here — every session marked once, each
settled once, no notice turn in a stopped session — then the resume paths: a stopped session
resumed is given no redelivered notice and starts no turn; a cold one is marked under its lock; a
parent's `send_message` starts a stopped child again. Real files, ScenarioClock, no sleeps (the
hung model calls are waited for with `wait_all_tasks_blocked`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio.testing
from subagents.actors import EventDraft
from subagents.runtime import Agent, Runtime
from subagents.runtime.agent.mailbox_owner import new_envelope
from subagents.runtime.app import open_runtime
from subagents.runtime.delegation.stopping import stop_marker, stopped, tree_notice_tail
from subagents.runtime.foundation.clock import ScenarioClock
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel
from subagents.storage import Event, SessionHeader, SessionId, interrupted_closers, make_event

Json = dict[str, Any]


def _message(seq: int, kind: str, sender: str | None = None) -> Event:
    source: Json = {"kind": kind} if sender is None else {"kind": kind, "sender_session_id": sender}
    data = {
        "turn": 1,
        "step": 1,
        "message": {"id": f"m{seq}", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": source},
    }
    return make_event(seq, "user/message", 1000 + seq, data, surface_op="append")


def _marker(seq: int, by: str = "operator", tree: bool = True) -> Event:
    return make_event(seq, "session/stopped", 1000 + seq, {"by": by, "tree": tree})


# --- the projection ------------------------------------------------------------------------------


def test_a_session_is_stopped_from_its_marker_until_an_explicit_message() -> None:
    assert not stopped([])
    assert not stopped([_message(0, "user")])
    assert stopped([_message(0, "user"), _marker(1)])
    assert stop_marker([_message(0, "user"), _marker(1, "p", False)]) == {"by": "p", "tree": False}
    # A notice, a compaction summary: not explicit — it stays stopped.
    assert stopped([_marker(0), _message(1, "subagent-settled", "c")])
    assert stopped([_marker(0), _message(1, "compaction")])
    # A person's message or another agent's send_message clears it; a later stop sets it again.
    assert not stopped([_marker(0), _message(1, "user")])
    assert not stopped([_marker(0), _message(1, "agent-message", "p")])
    assert stopped([_marker(0), _message(1, "user"), _marker(2)])
    # A fork inherits its parent's history, not its parent's stop.
    assert stopped([_marker(0), _message(1, "user"), _marker(2)], inherited_event_count=0)
    assert not stopped([_message(0, "user"), _marker(1)], inherited_event_count=2)


def test_the_notice_of_a_tree_stop_names_each_descendant_once() -> None:
    assert tree_notice_tail([]) == "was stopped before it finished."
    assert tree_notice_tail(["a"]) == "was stopped before it finished, with its descendant a."
    assert tree_notice_tail(["a", "b", "a", "c"]) == "was stopped before it finished, with its descendants a, b, c."


# --- the tree stop of a family resident here ------------------------------------------------------


def _script(mid: list[Json] | None = None) -> ScriptedModel:
    """`mid` starts `leaf` and hangs, `leaf` hangs (or `mid` answers as given: a new process
    starts every entry at its first response)."""
    spawn = {"tool_calls": [{"name": "subagent", "arguments": {"description": "leaf", "prompt": "work"}}]}
    agents = [
        {"label": "mid", "responses": mid if mid is not None else [spawn, {"hang": True}]},
        {"label": "leaf", "responses": [{"hang": True}]},
        {"responses": [{"text": "noted"}]},  # the parent's notice turn (a restart redelivers it)
    ]
    return ScriptedModel(load_script(json.dumps({"agents": agents})))


def _open(root: Path, model: ScriptedModel) -> Any:
    return open_runtime(
        root, model=model, clock=ScenarioClock(), id_factory=CountingIds("s"), compression="none", max_depth=2
    )


async def _events(rt: Runtime, sid: str) -> list[Event]:
    return (await rt.query.read_from(sid, 0))[1]


def _data(event: Event) -> Json:
    data: Json = json.loads(bytes(event.data))
    return data


def _types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


async def _family(rt: Runtime) -> tuple[Agent, str, str]:
    """A parent, its background child `mid` and mid's background child `leaf`, both hung in a
    model call."""
    parent = await rt.agents.create(session_id="parent")
    mid = await rt.subagents.start_continuable(parent, "spawn", "mid", "work")
    while not (leaves := [a for a in rt.subagents.manager.resident.values() if a.parent_id == mid]):
        await rt.subagents.manager.wait_changed()
    leaf = leaves[0].child_id
    # Until both hang in their model calls (a task waiting on a worker thread counts as blocked:
    # looked at again after each round).
    while not all((a := rt.agents.get(sid)) is not None and a.status == "running" and a.quiet for sid in (mid, leaf)):
        await trio.testing.wait_all_tasks_blocked()
    await trio.testing.wait_all_tasks_blocked()
    return parent, mid, leaf


async def test_a_tree_stop_marks_and_settles_each_session_once_and_starts_no_turn(tmp_path: Path) -> None:
    async with _open(tmp_path, _script()) as rt:
        parent, mid, leaf = await _family(rt)
        done = await rt.subagents.stop_tree(mid, by="parent", cause="parent")
        assert done.sessions == ((mid, "live"), (leaf, "live")) and done.unconfirmed == ()
        await rt.subagents.wait_tree_idle(parent)
        for sid in (mid, leaf):
            events = await _events(rt, sid)
            assert [_data(e) for e in events if e.type == "session/stopped"] == [{"by": "parent", "tree": True}]
            assert stopped(events)
            # Its turn ended aborted once; no notice started another.
            assert _types(events).count("turn/start") == 1
        mid_events = await _events(rt, mid)
        assert [_data(e)["child_id"] for e in mid_events if e.type == "subagent/settled"] == [leaf]
        parent_events = await _events(rt, "parent")
        assert [_data(e)["child_id"] for e in parent_events if e.type == "subagent/settled"] == [mid]
        # The settlement names the descendants stopped with it, and so does its notice (the
        # parent is still running its hung model call: the notice waits in its inbox).
        (settled,) = [_data(e) for e in parent_events if e.type == "subagent/settled"]
        assert settled["reason_kind"] == "aborted"
        assert settled["reason_message"] == f"with its descendant {leaf}"
        notices = [
            _data(e)["message"]["content"][0]["text"]
            for e in parent_events
            if e.type == "user/message" and _data(e)["message"]["source"]["kind"] == "subagent-settled"
        ]
        assert notices == [f"Background subagent {mid} was stopped before it finished, with its descendant {leaf}."]
        # The leaf's own settlement (in mid) names nobody: it had no descendants.
        (leaf_settled,) = [_data(e) for e in mid_events if e.type == "subagent/settled"]
        assert "reason_message" not in leaf_settled
        # The notice text its settlement may give (the helper for the notice's builder).
        assert (
            await rt.subagents.stopping.tree_notice(mid)
            == f"was stopped before it finished, with its descendant {leaf}."
        )
        assert await rt.subagents.stopping.tree_notice("parent") is None  # not stopped
        # Stopping it again: nothing more is written.
        again = await rt.subagents.stop_tree(mid, by="parent")
        assert again.sessions == ((mid, "already"), (leaf, "already"))
        assert await _events(rt, mid) == mid_events


async def test_a_stopped_session_resumed_gets_no_notice_and_a_send_starts_it_again(tmp_path: Path) -> None:
    async with _open(tmp_path, _script()) as rt:
        parent, mid, leaf = await _family(rt)
        await rt.subagents.stop_tree(mid, by="parent")
        await rt.subagents.wait_tree_idle(parent)
    # A new runtime (a restart): the leaf's settlement in mid was recorded but never noticed.
    async with _open(tmp_path, _script(mid=[{"text": "back"}])) as rt:
        before = await _events(rt, mid)
        agent = await rt.agents.resume(mid)
        await trio.testing.wait_all_tasks_blocked()
        assert agent.status == "idle" and not len(agent.inbox)  # no notice redelivered, no turn
        assert await rt.subagents.is_stopped(mid)
        await rt.agents.stop(mid)
        assert await _events(rt, mid) == before
        # The parent's explicit message starts it again (and clears its marker).
        parent = await rt.agents.resume("parent")
        await rt.subagents.send_message(parent, mid, "go on")
        await rt.subagents.wait_tree_idle(parent)
        events = await _events(rt, mid)
        assert not stopped(events) and not await rt.subagents.is_stopped(mid)
        assert await rt.subagents.is_stopped(leaf)  # its child stays stopped
        new = events[len(before) :]
        assert [_data(e)["reason"] for e in new if e.type == "turn/end"] == [{"kind": "completed"}]


async def test_a_session_nobody_runs_is_marked_cold(tmp_path: Path) -> None:
    async with _open(tmp_path, _script()) as rt:
        parent, mid, leaf = await _family(rt)
        await rt.agents.stop("parent")  # the family let go: settled, released, nobody runs them
    async with _open(tmp_path, _script()) as rt:
        before = {sid: len(await _events(rt, sid)) for sid in (mid, leaf)}
        done = await rt.subagents.stop_tree(mid, by="operator")
        assert done.sessions == ((mid, "cold"), (leaf, "cold"))
        for sid in (mid, leaf):
            events = await _events(rt, sid)
            assert _types(events)[before[sid] :] == ["session/stopped"]
            assert rt.sessions.get(sid) is None  # released after the write


async def test_a_parent_stops_its_childs_tree_with_interrupt_agents_stop_option(tmp_path: Path) -> None:
    spawn = {"tool_calls": [{"name": "subagent", "arguments": {"description": "mid", "prompt": "work"}}]}
    spawn_leaf = {"tool_calls": [{"name": "subagent", "arguments": {"description": "leaf", "prompt": "work"}}]}
    held = {"wait_for": {"steered": True}, "text": "never"}
    stop = {"name": "interrupt_agent", "arguments": {"agent_id": "s-1", "stop": True}}
    script = {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    spawn,
                    {"wait_for": {"waiting": "s-2"}, "tool_calls": [stop]},  # once the leaf is held
                    {"text": "done"},
                    {"text": "noted"},  # the notice of mid's settlement
                ],
            },
            {"label": "mid", "responses": [spawn_leaf, held]},
            {"label": "leaf", "responses": [held]},
        ]
    }
    async with _open(tmp_path, ScriptedModel(load_script(json.dumps(script)))) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("go")
        await rt.subagents.wait_tree_idle(parent)
        events = await _events(rt, "parent")
        results = [_data(e)["message"]["content"][0]["content"][0]["text"] for e in events if e.type == "tool/result"]
        assert results[1] == "stopped agent s-1 with its descendants s-2 (2 stopped for good)"
        assert [_data(e)["child_id"] for e in events if e.type == "subagent/settled"] == ["s-1"]
        for sid in ("s-1", "s-2"):
            child = await _events(rt, sid)
            assert [_data(e) for e in child if e.type == "session/stopped"] == [{"by": "parent", "tree": True}]
            assert [_data(e)["reason"] for e in child if e.type == "turn/end"] == [
                {"kind": "aborted", "cause": "parent"}
            ]


async def test_the_stop_option_reaches_only_below_the_caller(tmp_path: Path) -> None:
    calls = [{"name": "interrupt_agent", "arguments": {"agent_id": sid, "stop": True}} for sid in ("parent", "other")]
    script = {"agents": [{"session": "parent", "responses": [{"tool_calls": calls}, {"text": "ok"}]}]}
    async with _open(tmp_path, ScriptedModel(load_script(json.dumps(script)))) as rt:
        await rt.agents.create(session_id="other")  # a root of its own, not below the caller
        parent = await rt.agents.create(session_id="parent")
        await parent.send("go")
        await rt.subagents.wait_tree_idle(parent)
        results = [_data(e)["message"]["content"][0] for e in await _events(rt, "parent") if e.type == "tool/result"]
        assert [(r["is_error"], r["content"][0]["text"]) for r in results] == [
            (True, f'Error: subagent "{sid}" is not a descendant of agent "parent"') for sid in ("parent", "other")
        ]
        assert not await rt.subagents.is_stopped("other")


async def test_a_plain_stop_delivery_marks_the_child_with_its_delivery_id(tmp_path: Path) -> None:
    """The owner's road (another process's `stop`): the marker, `tree: false`, with the
    envelope's delivery id, before its turn ends; then it settles as before."""
    async with _open(tmp_path, _script()) as rt:
        _parent, mid, leaf = await _family(rt)
        assert rt.mailbox is not None
        plain = new_envelope(rt.mailbox, "stop", {})
        await trio.to_thread.run_sync(rt.mailbox.deliver, leaf, plain)
        while rt.subagents.manager.get(leaf) is not None:
            await rt.subagents.manager.wait_changed()
        events = await _events(rt, leaf)
        assert [_data(e) for e in events if e.type == "session/stopped"] == [
            {"by": "operator", "tree": False, "delivery_id": plain.delivery_id}
        ]
        assert _types(events)[-3:] == ["session/stopped", "step/end", "turn/end"]  # marked before its turn ended
        assert [_data(e)["child_id"] for e in await _events(rt, mid) if e.type == "subagent/settled"] == [leaf]


async def test_a_tree_stop_delivery_stops_what_runs_below_it_here(tmp_path: Path) -> None:
    async with _open(tmp_path, _script()) as rt:
        parent, mid, leaf = await _family(rt)
        assert rt.mailbox is not None
        tree = new_envelope(rt.mailbox, "stop", {"tree": True}, sender="parent")
        await trio.to_thread.run_sync(rt.mailbox.deliver, mid, tree)
        await rt.subagents.wait_tree_idle(parent)
        assert [_data(e) for e in await _events(rt, mid) if e.type == "session/stopped"] == [
            {"by": "parent", "tree": True, "delivery_id": tree.delivery_id}
        ]
        assert [_data(e) for e in await _events(rt, leaf) if e.type == "session/stopped"] == [
            {"by": "parent", "tree": True}
        ]
        mid_events = await _events(rt, mid)
        assert [_data(e)["child_id"] for e in mid_events if e.type == "subagent/settled"] == [leaf]
        assert _types(mid_events).count("turn/start") == 1  # the leaf's settlement started no turn in it
        settled = [_data(e)["child_id"] for e in await _events(rt, "parent") if e.type == "subagent/settled"]
        assert settled == [mid]


async def test_a_cold_stop_closes_an_interrupted_turn_before_its_marker(tmp_path: Path) -> None:
    """A session whose process died mid-turn, stopped while nobody runs it: the closers of its
    open turn and the marker go in one write, so no resume finds a turn to continue."""
    async with _open(tmp_path, _script()) as rt:
        ref = await rt.sessions.create(SessionHeader(id=SessionId("crashed"), created_at=1))
        await ref.append(
            [
                EventDraft(type="turn/start", data={"turn": 1}),
                EventDraft(type="step/start", data={"turn": 1, "step": 1}),
            ]
        )
        await rt.sessions.release("crashed")  # as a dead process leaves it: the turn open
        assert interrupted_closers(await _events(rt, "crashed"))
        done = await rt.subagents.stop_tree("crashed", by="operator")
        assert done.sessions == (("crashed", "cold"),)
        events = await _events(rt, "crashed")
        assert _types(events) == ["turn/start", "step/start", "step/end", "turn/end", "session/stopped"]
        assert interrupted_closers(events) == [] and stopped(events)
