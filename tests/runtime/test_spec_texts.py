"""Exact texts and codes of runtime rules no other test pins (SPEC 5.1, 5.3, 5.7; reference-notes
§5.5, §5.6, §6.4): `PARENT_UNAVAILABLE`, `SESSION_QUERY_SOURCE_CONFLICT`, the one-shot foreground
failure headlines, the settlement notice summaries, and the CLI's open-file limit. Real files,
ScenarioClock, ordering by the scripted model and by tools, never by sleeps."""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path
from typing import Any

import pytest
import trio
from log_lines import header, plain_records
from subagents.actors import Abort, open_session_store
from subagents.runtime.agent.loop import AgentConfig
from subagents.runtime.app import open_runtime
from subagents.runtime.delegation.service import notice_blocks
from subagents.runtime.delegation.units import SUBAGENT_UNITS
from subagents.runtime.foundation.clock import ScenarioClock
from subagents.runtime.foundation.errors import AgentStopped, SessionQueryError, SubagentError
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.hosts.cli import common
from subagents.runtime.hosts.cli import entry as cli
from subagents.runtime.query import SessionQuery
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel
from subagents.runtime.tools.base import FunctionTool, ToolContext
from subagents.storage import Batch, FileLogStore, make_event
from subagents.storage.projection import ProjectionRegistry
from subagents.storage.testing import FaultyLogStore

Json = dict[str, Any]
GUARD = 10.0  # seconds: a hang fails the test instead of blocking the suite (never a sleep)


def _model(*agents: Json) -> ScriptedModel:
    return ScriptedModel(load_script(json.dumps({"agents": list(agents)})))


def _log(root: Path, session_id: str) -> list[Json]:
    return plain_records(root, session_id)[1:]


def _text(text: str) -> Json:
    return {"type": "text", "text": text}


# --- 1. send_message from a resident continuable child whose parent is not live -----------------


async def test_a_child_cannot_message_a_parent_that_is_not_live(tmp_path: Path) -> None:
    faulty = FaultyLogStore(FileLogStore(str(tmp_path), compression="none"))
    model = _model({"label": "worker", "responses": [{"wait_for": {"steered": True}, "text": "never sent"}]})
    async with open_runtime(
        tmp_path, model=model, clock=ScenarioClock(), id_factory=CountingIds("c"), log_store=faulty
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        child_id = await rt.subagents.start_continuable(parent, "spawn", "worker", "work")
        # The parent's log can no longer be written: its next turn stops its agent, while the
        # child (held by the script) stays resident under its Activation.
        faulty.fail("append", session_id="parent", times=None)
        await parent.send("go")
        with pytest.raises(AgentStopped), trio.fail_after(GUARD):
            await parent.wait_idle()
        assert rt.agents.get("parent") is None
        assert rt.subagents.manager.get(child_id) is not None
        child = rt.agents.get(child_id)
        assert child is not None

        with pytest.raises(SubagentError) as exc:
            await rt.subagents.send_message(child, "parent", "my result")
        assert (exc.value.code, exc.value.message) == (
            "SUBAGENT_PARENT_UNAVAILABLE",
            "direct parent is not live; the message was not delivered",
        )
        assert not any(
            e["type"] == "user/message" and e["data"]["message"]["source"]["kind"] == "agent-message"
            for e in _log(tmp_path, "parent")
        )


# --- 2. SESSION_QUERY_SOURCE_CONFLICT ----------------------------------------------------------


async def test_an_index_header_that_differs_from_the_log_is_a_source_conflict(tmp_path: Path) -> None:
    store = FileLogStore(str(tmp_path), compression="none")
    handle = store.create(header("s", 10, origin="subagent", parent_session="pa", delegation_depth=1))
    store.append(handle, [Batch(0, [make_event(0, "turn/start", 2, {"turn": 1})])])
    store.close(handle)
    info = store.stat("s")  # the index now holds the header with parent "pa"
    assert info is not None and info.header is not None and info.header.parent_session == "pa"

    # Rewrite line 1 in place (same size, same inode, same mtime): the index row still matches
    # the log's revision, so stat() answers the stale header while a read parses the new one.
    log = tmp_path / "sessions" / "s" / "session.jsonl"
    before = log.stat()
    data = log.read_bytes()
    edited = data.replace(b'"parent_session":"pa"', b'"parent_session":"pb"', 1)
    assert edited != data and len(edited) == len(data)
    with open(log, "r+b") as f:
        f.write(edited)
    os.utime(log, ns=(before.st_atime_ns, before.st_mtime_ns))
    stale = store.stat("s")
    assert stale is not None and stale.header is not None and stale.header.parent_session == "pa"

    registry = ProjectionRegistry(SUBAGENT_UNITS)
    async with open_session_store(store, registry, now_ms=lambda: 100) as sessions:
        query = SessionQuery(store, sessions, registry)
        for _ in range(2):  # failures are never cached
            with pytest.raises(SessionQueryError) as exc:
                async with query.observe_session("s"):
                    raise AssertionError("observed")
            assert (exc.value.code, exc.value.message) == (
                "QUERY_SOURCE_CONFLICT",
                "session source headers conflict for session 's'",
            )


# --- 3. one-shot foreground failure headlines ---------------------------------------------------

NOOP = {"name": "noop", "arguments": {}}
TRIP = {"name": "trip", "arguments": {}}  # sets the start() abort, as a parent's cancel would
UPSTREAM = {"error": {"status": 500, "message": "upstream exploded"}}
PARTIAL = "\nPartial output before the run ended:\n"


@pytest.mark.parametrize(
    ("responses", "max_steps", "kind", "expected"),
    [
        pytest.param(
            [{"text": "half an answ", "finish": "max-tokens"}],
            64,
            "max-tokens",
            "subagent run hit its token limit before finishing" + PARTIAL + "half an answ",
            id="max-tokens",
        ),
        pytest.param(
            [{"finish": "max-tokens"}],
            64,
            "max-tokens",
            "subagent run hit its token limit before finishing",
            id="max-tokens-no-text",
        ),
        pytest.param([UPSTREAM], 64, "error", "subagent run failed\nDiagnostic: upstream exploded", id="error"),
        pytest.param(
            [{"text": "step one done", "tool_calls": [NOOP]}, UPSTREAM],
            64,
            "error",
            "subagent run failed\nDiagnostic: upstream exploded" + PARTIAL + "step one done",
            id="error-after-text",
        ),
        pytest.param(
            [{"text": "looked around", "tool_calls": [TRIP]}, {"hang": True}],
            64,
            "aborted",
            "subagent run was cancelled" + PARTIAL + "looked around",
            id="aborted",
        ),
        pytest.param(
            [{"tool_calls": [TRIP]}, {"hang": True}], 64, "aborted", "subagent run was cancelled", id="aborted-no-text"
        ),
        pytest.param(
            [{"text": "first step", "tool_calls": [NOOP]}],
            1,
            "blocked",
            "subagent run ended abnormally (blocked)\nDiagnostic: the turn reached its step limit (1)"
            + PARTIAL
            + "first step",
            id="blocked",
        ),
    ],
)
async def test_a_foreground_run_that_did_not_complete_raises_its_headline(
    tmp_path: Path, responses: list[Json], max_steps: int, kind: str, expected: str
) -> None:
    abort = Abort()

    async def noop(args: Json, ctx: ToolContext) -> str:
        return "ok"

    async def trip(args: Json, ctx: ToolContext) -> str:
        abort.set()
        return "tripped"

    tools = [
        FunctionTool(name="noop", description="does nothing", fn=noop),
        FunctionTool(name="trip", description="stops the run", fn=trip),
    ]
    async with open_runtime(
        tmp_path,
        model=_model({"label": "fg", "responses": responses}),
        clock=ScenarioClock(),
        id_factory=CountingIds("c"),
        compression="none",
        tools=lambda: tools,
        agent_config=AgentConfig(max_steps=max_steps),
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        with pytest.raises(SubagentError) as exc, trio.fail_after(GUARD):
            await rt.subagents.start(parent, "spawn", "do it", label="fg", abort=abort)
        assert (exc.value.code, exc.value.message) == ("SUBAGENT_RUN_NOT_COMPLETED", expected)
        [child_id] = [e["data"]["child_id"] for e in _log(tmp_path, "parent") if e["type"] == "subagent/catalog"]
        assert rt.agents.get(child_id) is None  # the one-shot child is always disposed
    [end] = [e["data"]["reason"] for e in _log(tmp_path, child_id) if e["type"] == "turn/end"]
    assert end["kind"] == kind


async def test_a_foreground_child_whose_log_fails_raises_the_failed_headline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A child agent that stops (its log cannot be written) did not complete: the caller gets
    the `subagent run failed` SubagentError, not the agent's internal AgentStopped; and the
    agent logs a stop, not a bug with a traceback."""
    faulty = FaultyLogStore(FileLogStore(str(tmp_path), compression="none"))

    async def break_log(args: Json, ctx: ToolContext) -> str:
        faulty.fail("append", session_id=ctx.session_id, times=None)
        return "from now on this log cannot be written"

    tools = [FunctionTool(name="break_log", description="breaks the caller's log", fn=break_log)]
    model = _model(
        {
            "label": "fg",
            "responses": [{"text": "x", "tool_calls": [{"name": "break_log", "arguments": {}}]}, {"text": "never"}],
        }
    )
    with trio.fail_after(GUARD):
        async with open_runtime(
            tmp_path,
            model=model,
            clock=ScenarioClock(),
            id_factory=CountingIds("c"),
            log_store=faulty,
            tools=lambda: tools,
        ) as rt:
            parent = await rt.agents.create(session_id="parent")
            with pytest.raises(SubagentError) as exc:
                await rt.subagents.start(parent, "spawn", "do it", label="fg")
            assert exc.value.code == "SUBAGENT_RUN_NOT_COMPLETED"
            assert exc.value.message.split("\n")[0] == "subagent run failed"
            assert "Diagnostic: agent 'c-1' stopped" in exc.value.message
    loop_records = [r for r in caplog.records if r.name.endswith("agent.loop")]
    assert any("stopped" in r.getMessage() for r in loop_records)
    assert not any(r.exc_info for r in loop_records)  # no "failed" traceback: a stop is no bug


async def test_a_foreground_run_that_completed_returns_its_result(tmp_path: Path) -> None:
    async with open_runtime(
        tmp_path,
        model=_model({"label": "fg", "responses": [{"text": "all done"}]}),
        clock=ScenarioClock(),
        id_factory=CountingIds("c"),
        compression="none",
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        result = await rt.subagents.start(parent, "spawn", "do it", label="fg")
        assert (result.reason, result.text) == ({"kind": "completed"}, "all done")


# --- 4. settlement notice summaries --------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "summary"),
    [
        ("completed", "finished and will do no further work unless you send it more."),
        ("aborted", "was stopped before it finished."),
        ("max-tokens", "ran out of room before it finished."),
        ("error", "failed before it finished."),
        ("blocked", "ended abnormally (blocked) before it finished."),
        ("some-future-kind", "ended abnormally (some-future-kind) before it finished."),
    ],
)
def test_notice_blocks_name_every_reason(kind: str, summary: str) -> None:
    headline = _text(f"Background subagent c-7 {summary}")
    assert notice_blocks("c-7", kind, None) == [headline, _text("It left no closing message.")]
    assert notice_blocks("c-7", kind, "line one\nline two") == [
        headline,
        _text("Its closing message:"),
        _text("line one\nline two"),
    ]


async def test_a_child_that_ran_out_of_room_tells_its_parent_so(tmp_path: Path) -> None:
    model = _model(
        {"session": "parent", "responses": [{"text": "noted"}]},
        {"label": "worker", "responses": [{"text": "I got halfway through", "finish": "max-tokens"}]},
    )
    async with open_runtime(
        tmp_path, model=model, clock=ScenarioClock(), id_factory=CountingIds("c"), compression="none"
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        child_id = await rt.subagents.start_continuable(parent, "spawn", "worker", "work")
        result = await rt.subagents.wait_tree_idle(parent)
        assert result is not None and result.text == "noted"
    events = _log(tmp_path, "parent")
    [settled] = [e for e in events if e["type"] == "subagent/settled"]
    last_end = [e["seq"] for e in _log(tmp_path, child_id) if e["type"] == "turn/end"][-1]
    assert settled["data"] == {
        "child_id": child_id,
        "reason_kind": "max-tokens",
        "closing_text": "I got halfway through",
        "run_key": f"{child_id}@{last_end}",  # the run it settles (issue 27: settled once per run)
    }
    [notice] = [e for e in events if e["type"] == "user/message" and e.get("source_event_seqs") == [settled["seq"]]]
    message = notice["data"]["message"]
    assert message["source"] == {"kind": "subagent-settled", "sender_session_id": child_id}
    assert message["content"] == [
        _text(f"Background subagent {child_id} ran out of room before it finished."),
        _text("Its closing message:"),
        _text("I got halfway through"),
    ]


# --- 5. the CLI raises the open-file soft limit ----------------------------------------------------


def _limits(monkeypatch: pytest.MonkeyPatch, soft: int, hard: int, fail: BaseException | None = None) -> list[Any]:
    calls: list[Any] = []

    def getrlimit(which: int) -> tuple[int, int]:
        calls.append(("get", which))
        return soft, hard

    def setrlimit(which: int, limits: tuple[int, int]) -> None:
        calls.append(("set", which, limits))
        if fail is not None:
            raise fail

    monkeypatch.setattr(common.resource, "getrlimit", getrlimit)
    monkeypatch.setattr(common.resource, "setrlimit", setrlimit)
    return calls


def test_the_soft_open_file_limit_is_raised_to_the_hard_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _limits(monkeypatch, 1024, 524288)
    common.raise_open_file_limit()
    assert calls == [("get", resource.RLIMIT_NOFILE), ("set", resource.RLIMIT_NOFILE, (524288, 524288))]


def test_a_soft_limit_already_at_the_hard_limit_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _limits(monkeypatch, 4096, 4096)
    common.raise_open_file_limit()
    assert calls == [("get", resource.RLIMIT_NOFILE)]


@pytest.mark.parametrize("error", [ValueError("not allowed"), OSError(1, "Operation not permitted")])
def test_a_refused_raise_keeps_the_soft_limit_and_does_not_crash(
    monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    calls = _limits(monkeypatch, 256, 10240, fail=error)
    common.raise_open_file_limit()
    assert calls == [("get", resource.RLIMIT_NOFILE), ("set", resource.RLIMIT_NOFILE, (10240, 10240))]


def test_commands_raise_the_limit_but_bad_input_does_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _limits(monkeypatch, 256, 10240, fail=OSError(1, "Operation not permitted"))
    assert cli.main(["sessions", "--root", str(tmp_path / "missing")]) == 2
    assert calls == []  # arguments are validated before anything else
    (tmp_path / "sessions").mkdir()
    assert cli.main(["sessions", "--json", "--root", str(tmp_path)]) == 0
    assert calls == [("get", resource.RLIMIT_NOFILE), ("set", resource.RLIMIT_NOFILE, (10240, 10240))]
    assert json.loads(capsys.readouterr().out) == []
