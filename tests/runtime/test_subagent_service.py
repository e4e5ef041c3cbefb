"""The subagent service's refusals that need a hand on the runtime (SPEC 5.3): a child locked by
another writer, a live session that is not an Activation, a delivery aborted before the inbox
took it, a runtime that drains. Real files, ScenarioClock, no sleeps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import Abort
from subagents.runtime.app import open_runtime
from subagents.runtime.delegation.routing import Routing
from subagents.runtime.foundation.clock import ScenarioClock
from subagents.runtime.foundation.errors import SubagentError
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel
from subagents.storage import FileLogStore


def _model(*child_texts: str) -> ScriptedModel:
    return ScriptedModel(
        load_script(
            json.dumps(
                {
                    "agents": [
                        {"label": "worker", "responses": [{"text": t} for t in child_texts]},
                    ]
                }
            )
        )
    )


async def _settled_child(root: Path) -> str:
    async with open_runtime(
        root, model=_model("first"), clock=ScenarioClock(), id_factory=CountingIds("c"), compression="none"
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        child_id = await rt.subagents.start_continuable(parent, "spawn", "worker", "work")
        await rt.subagents.wait_tree_idle(parent)
        return child_id


async def test_a_child_locked_by_another_writer_is_not_resumable(tmp_path: Path) -> None:
    child_id = await _settled_child(tmp_path)
    other = FileLogStore(str(tmp_path), compression="none")
    handle = other.open_write(child_id)  # another writer (another process would do the same)
    try:
        async with open_runtime(tmp_path, model=_model("second"), clock=ScenarioClock(), compression="none") as rt:
            parent = await rt.agents.resume("parent")
            with pytest.raises(SubagentError) as exc:
                await rt.subagents.send_message(parent, child_id, "again")
            assert (exc.value.code, exc.value.message) == (
                "SUBAGENT_NOT_RESUMABLE",
                f'subagent "{child_id}" is unavailable',
            )
            assert rt.subagents.manager.get(child_id) is None  # no Activation was left behind
    finally:
        other.close(handle)


async def test_a_live_session_that_is_not_an_activation_is_refused(tmp_path: Path) -> None:
    child_id = await _settled_child(tmp_path)
    async with open_runtime(tmp_path, model=_model("second"), clock=ScenarioClock(), compression="none") as rt:
        parent = await rt.agents.resume("parent")
        await rt.sessions.open(child_id)  # live in this runtime, but nobody's Activation
        with pytest.raises(SubagentError) as exc:
            await rt.subagents.send_message(parent, child_id, "again")
        assert exc.value.code == "SUBAGENT_NOT_RESUMABLE"
        assert rt.agents.get(child_id) is None  # refused, not adopted


async def test_an_abort_set_before_delivery_delivers_nothing(tmp_path: Path) -> None:
    child_id = await _settled_child(tmp_path)
    before = (tmp_path / "sessions" / child_id / "session.jsonl").read_text()
    async with open_runtime(tmp_path, model=_model("second"), clock=ScenarioClock(), compression="none") as rt:
        parent = await rt.agents.resume("parent")
        abort = Abort()
        abort.set()
        with pytest.raises(SubagentError) as exc:
            await rt.subagents.send_message(parent, child_id, "again", abort)
        assert (exc.value.code, exc.value.message) == ("SUBAGENT_CANCELLED", "message delivery was cancelled")
        with pytest.raises(SubagentError) as exc:
            await rt.subagents.start_continuable(parent, "spawn", "worker", "work", abort)
        assert exc.value.code == "SUBAGENT_CANCELLED"
    assert (tmp_path / "sessions" / child_id / "session.jsonl").read_text() == before


async def test_a_draining_runtime_admits_nothing(tmp_path: Path) -> None:
    async with open_runtime(tmp_path, model=_model(), clock=ScenarioClock(), compression="none") as rt:
        parent = await rt.agents.create(session_id="parent")
        await rt.subagents.drain()
        with pytest.raises(SubagentError) as exc:
            await rt.subagents.start_continuable(parent, "spawn", "worker", "work")
        assert exc.value.code == "SUBAGENT_DRAINING"
        with pytest.raises(SubagentError) as exc:
            await rt.subagents.send_message(parent, "anyone", "hello")
        assert exc.value.code == "SUBAGENT_DRAINING"


async def test_depth_is_checked_before_anything_is_created(tmp_path: Path) -> None:
    async with open_runtime(tmp_path, model=_model(), clock=ScenarioClock(), compression="none", max_depth=0) as rt:
        parent = await rt.agents.create(session_id="parent")
        with pytest.raises(SubagentError) as exc:
            await rt.subagents.start_continuable(parent, "spawn", "worker", "work")
        assert (exc.value.code, exc.value.message) == (
            "SUBAGENT_DEPTH_EXCEEDED",
            "subagent depth 1 exceeds max_depth 0",
        )
        assert [r.id for r in await rt.query.list_sessions()] == ["parent"]


async def test_a_child_whose_log_fails_settles_as_failed_and_the_runtime_carries_on(tmp_path: Path) -> None:
    from subagents.storage.testing import FaultyLogStore

    faulty = FaultyLogStore(FileLogStore(str(tmp_path), compression="none"))
    model = ScriptedModel(
        load_script(
            json.dumps(
                {
                    "agents": [
                        {"session": "parent", "responses": [{"text": "noted the failure"}]},
                        {"label": "worker", "responses": [{"wait_for": {"steered": True}, "text": "never written"}]},
                    ]
                }
            )
        )
    )
    async with open_runtime(
        tmp_path, model=model, clock=ScenarioClock(), id_factory=CountingIds("c"), log_store=faulty
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        child_id = await rt.subagents.start_continuable(parent, "spawn", "worker", "work")
        faulty.fail("append", session_id=child_id, times=None)  # from now on its log cannot be written
        await rt.subagents.send_message(parent, child_id, "go on")  # releases the held model call
        result = await rt.subagents.wait_tree_idle(parent)
        assert result is not None and result.text == "noted the failure"
        assert rt.agents.get(child_id) is None and rt.subagents.manager.get(child_id) is None
    lines = [
        json.loads(line) for line in (tmp_path / "sessions" / "parent" / "session.jsonl").read_text().splitlines()[1:]
    ]
    [settled] = [e for e in lines if e["type"] == "subagent/settled"]
    assert settled["data"] == {"child_id": child_id, "reason_kind": "error"}
    notice = next(e for e in lines if e["type"] == "user/message" and e.get("source_event_seqs") == [settled["seq"]])
    assert (
        notice["data"]["message"]["content"][0]["text"] == f"Background subagent {child_id} failed before it finished."
    )


async def test_a_settlement_recorded_by_an_earlier_process_counts_for_wait_for_settled(tmp_path: Path) -> None:
    """The scripted `wait_for: {"settled": ...}` must not wait for a settlement that became
    durable before a restart (it would wait forever)."""
    import trio

    first = ScriptedModel(
        load_script(
            json.dumps(
                {
                    "agents": [
                        {
                            "session": "parent",
                            "responses": [
                                {
                                    "tool_calls": [
                                        {"name": "subagent", "arguments": {"description": "kid", "prompt": "work"}}
                                    ]
                                },
                                {"text": "spawned"},
                                {"text": "noticed"},
                            ],
                        },
                        {"label": "kid", "responses": [{"text": "kid done"}]},
                    ]
                }
            )
        )
    )
    async with open_runtime(
        tmp_path, model=first, clock=ScenarioClock(), id_factory=CountingIds("c"), compression="none"
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("go")
        await rt.subagents.wait_tree_idle(parent)
    second = ScriptedModel(
        load_script(
            json.dumps(
                {
                    "agents": [
                        {
                            "session": "parent",
                            "responses": [{"wait_for": {"settled": "kid"}, "text": "after the restart"}],
                        },
                    ]
                }
            )
        )
    )
    async with open_runtime(tmp_path, model=second, clock=ScenarioClock(), compression="none") as rt:
        parent = await rt.agents.resume("parent")
        await parent.send("next")
        with trio.fail_after(30):  # a guard only: without the fix this waits forever
            result = await rt.subagents.wait_tree_idle(parent)
    assert result is not None and result.text == "after the restart"


# --- a settled child's slot, held until it is disposed ------------------------------------------
#
# A settled child keeps its family's slot until its disposal (stop, release) ends, and its parent
# is given the settlement notice before that. A start or cold resume made on reading the notice
# must wait for that slot, not be refused: on a loaded machine a slow disposal refused the parent's
# next child (`test_subagents_e2e.py::test_activation_limit_and_interrupt_by_the_parent[pg]`).
# `_HeldDisposal` holds one child's disposal open so the window is there on every run.


class _HeldDisposal:
    """Holds the first disposal of `child_id` (`AgentRegistry.stop`, cause "disposed") until
    `release` is set; `entered` is set when it is held (the child is settled, not disposed)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, child_id: str) -> None:
        import trio
        from subagents.runtime.agent.registry import AgentRegistry

        self.entered = trio.Event()
        self.release = trio.Event()
        original = AgentRegistry.stop

        async def stop(registry: AgentRegistry, session_id: str, *, cause: str = "disposed") -> None:
            if session_id == child_id and cause == "disposed" and not self.entered.is_set():
                self.entered.set()
                await self.release.wait()
            await original(registry, session_id, cause=cause)

        monkeypatch.setattr(AgentRegistry, "stop", stop)


def _family_model() -> ScriptedModel:
    parent = {"session": "parent", "responses": [{"text": "NOTED"}] * 3}
    return ScriptedModel(
        load_script(json.dumps({"agents": [parent, {"label": "worker", "responses": [{"text": "done"}] * 3}]}))
    )


def _family_runtime(tmp_path: Path) -> Any:
    """A runtime whose families hold one resident child at a time."""
    return open_runtime(
        tmp_path,
        model=_family_model(),
        clock=ScenarioClock(),
        id_factory=CountingIds("c"),
        compression="none",
        max_active_subagents=1,
    )


async def test_a_start_made_while_a_settled_child_is_disposed_waits_for_its_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trio
    import trio.testing

    held = _HeldDisposal(monkeypatch, "c-1")
    async with _family_runtime(tmp_path) as rt:
        parent = await rt.agents.create(session_id="parent")
        assert await rt.subagents.start_continuable(parent, "spawn", "worker", "one") == "c-1"
        await held.entered.wait()
        assert rt.subagents.manager.get("c-1").closing  # settled (the notice is the parent's), not disposed
        reserved = await rt.subagents.reserve()  # no IO left before the admission
        started: list[str] = []

        async def start_second() -> None:
            started.append(await rt.subagents.start_continuable(parent, "spawn", "worker", "two", reserved=reserved))

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(start_second)
                await trio.testing.wait_all_tasks_blocked()
                assert started == []  # waiting for the slot (before the fix: refused, ACTIVATION_LIMIT_REACHED)
                held.release.set()
        finally:
            held.release.set()  # (also when it failed: the runtime's drain would wait for it)
        assert started == ["c-2"]
        await rt.subagents.wait_tree_idle(parent)
        assert rt.subagents.manager.resident == {}


async def test_a_cold_resume_made_while_a_settled_child_is_disposed_waits_for_its_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trio
    import trio.testing

    held = _HeldDisposal(monkeypatch, "c-2")
    async with _family_runtime(tmp_path) as rt:
        parent = await rt.agents.create(session_id="parent")
        await rt.subagents.start_continuable(parent, "spawn", "worker", "one")
        await rt.subagents.wait_tree_idle(parent)  # c-1 settled and disposed
        await rt.subagents.start_continuable(parent, "spawn", "worker", "two")
        await held.entered.wait()  # c-2 settled, its slot still held
        sent: list[bool] = []
        observed = trio.Event()
        observe = Routing.observe_child

        async def observed_child(service: Routing, *args: Any, **kwargs: Any) -> Any:
            try:
                return await observe(service, *args, **kwargs)
            finally:
                observed.set()  # its IO is done: the admission follows with no checkpoint before it

        monkeypatch.setattr(Routing, "observe_child", observed_child)

        async def wake_first() -> None:
            await rt.subagents.send_message(parent, "c-1", "again")
            sent.append(True)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wake_first)
                await observed.wait()
                assert sent == []  # waiting for the slot (before the fix: refused, ACTIVATION_LIMIT_REACHED)
                held.release.set()
        finally:
            held.release.set()  # (also when it failed: the runtime's drain would wait for it)
        assert sent == [True]
        await rt.subagents.wait_tree_idle(parent)
        assert rt.subagents.manager.resident == {}
    lines = [json.loads(line) for line in (tmp_path / "sessions" / "c-1" / "session.jsonl").read_text().splitlines()]
    last = [e["data"]["message"]["content"] for e in lines[1:] if e["type"] == "user/message"][-1]
    assert last[-1]["text"] == "again"  # the message reached it: resumed, not refused


async def test_the_service_is_bound_to_its_parts_once_and_refuses_use_before(tmp_path: Path) -> None:
    from subagents.runtime.delegation.service import SubagentService

    unbound = SubagentService()
    with pytest.raises(RuntimeError, match="before its parts were bound"):
        unbound.tools()
    with pytest.raises(RuntimeError, match="before its parts were bound"):
        await unbound.release_children_of("s")
    async with open_runtime(tmp_path, model=None) as rt:
        parts = rt.subagents.parts
        # Each part is its own object, built with the ones below it.
        assert parts.spawning.placement is parts.placement and parts.messaging.placement is parts.placement
        assert parts.placement.residency is parts.residency and parts.residency.settlement is parts.settlement
        assert parts.spawning.agents is rt.agents and rt.agents.hooks is rt.subagents
        with pytest.raises(RuntimeError, match="bound already"):
            rt.subagents.bind(parts, lambda extra: rt.subagents.tools(extra))
