"""Subagents end to end: scripted models, real files, restarts in fresh processes, SIGKILL.

Every assertion is made against the logs read back from disk (`compression="none"`: plain
jsonl). Restarts run `subagent_driver.py` (next to this file) with `sys.executable` in a new
process; crash tests kill it with SIGKILL when it prints `MARK` (the state is reached: the
driver waits on runtime events, never on a clock). Agents are ordered with the scripted
`wait_for` and the driver's model-call gates, never with delays; ids are deterministic
(`CountingIds("child")`: child-1, child-2, … in creation order).

Where a child's settlement races its parent's steps, a gate holds the child's model call until
the parent's waiting call has started, so each notice lands at a known step; after an
interrupt (which cannot be gated) only text responses follow, and nothing asserts where the
notice landed. Real IO (fsync, threads) → the real Trio clock; `trio.fail_after` only guards
against hangs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from log_lines import header, plain_records
from subagents.actors import SessionStore
from subagents.runtime.app import Runtime, open_runtime
from subagents.runtime.foundation.clock import ScenarioClock
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel

DRIVER = Path(__file__).with_name("subagent_driver.py")
GUARD = 15.0  # seconds: a hang fails the test instead of blocking the suite
SUMMARY_DONE = "finished and will do no further work unless you send it more."
SUMMARY_STOPPED = "was stopped before it finished."

Json = dict[str, Any]


# --- reading logs back from disk ----------------------------------------------------------------


# --- the store: files, or PostgreSQL as a parameter (issue 18) ------------------------------------
#
# The in-process tests (async, on `runtime(...)`, reading logs with `read_log`/`events_of`) run on
# both stores: for `pg`, `runtime` opens the runtime with `store=<the module's database>` (the
# mailbox stays files under the root) and `read_log` reads the same records back through the
# PostgreSQL store. The tests that drive fresh processes or write files themselves stay on files.
_FILES_ONLY = {
    "test_a_one_shot_child_held_by_another_process_is_skipped_not_an_error",
    "test_a_catalog_naming_a_session_that_is_not_its_child_closes_nothing",
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    import inspect

    if inspect.iscoroutinefunction(metafunc.function) and metafunc.function.__name__ not in _FILES_ONLY:
        metafunc.parametrize("e2e_store", ["file", pytest.param("pg", marks=pytest.mark.pg)], indirect=True)


@pytest.fixture(autouse=True)
def e2e_store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which store this test runs on (see above); `pg` swaps `runtime` and `read_log`."""
    kind = getattr(request, "param", "file")
    if kind == "pg":
        from pg_server import reset_tables

        url = request.getfixturevalue("pg_url")
        reset_tables(url)
        on_files = runtime

        def on_pg(root: Path, script: Json, **options: Any) -> Any:
            return on_files(root, script, store=url, **options)

        monkeypatch.setattr(sys.modules[__name__], "runtime", on_pg)
        monkeypatch.setattr(sys.modules[__name__], "_records", lambda root, sid: _pg_records(url, sid))
        monkeypatch.setattr(sys.modules[__name__], "_ids", lambda root: _pg_ids(url))
    return kind


def _pg_records(url: str, session_id: str) -> list[Json]:
    """The header record and the events of a session in the PostgreSQL store, as `plain_records`
    gives them from a file."""
    from subagents.storage import PostgresLogStore
    from subagents.storage._codec import encode_event
    from subagents.storage._records import HeaderRecord, encode_header_line

    store = PostgresLogStore(url, pool_size=1)
    try:
        handle = store.open_read(session_id)
        try:
            events = store.read(handle)
            record = HeaderRecord(header=handle.header, inherited_event_count=handle.inherited_event_count)
        finally:
            store.close(handle)
    finally:
        store.close_store()
    return [json.loads(encode_header_line(record)), *(json.loads(encode_event(e)) for e in events)]


def _pg_ids(url: str) -> set[str]:
    from subagents.storage import PostgresLogStore

    store = PostgresLogStore(url, pool_size=1)
    try:
        return {info.id for info in store.list()}
    finally:
        store.close_store()


def _records(root: Path, session_id: str) -> list[Json]:
    return plain_records(root, session_id)


def read_log(root: Path, session_id: str) -> tuple[Json, list[Json]]:
    header, *events = _records(root, session_id)
    assert [e["seq"] for e in events] == list(range(len(events))), f"{session_id}: seqs not contiguous"
    return header, events


def events_of(root: Path, session_id: str) -> list[Json]:
    return read_log(root, session_id)[1]


def session_ids(root: Path) -> set[str]:
    return _ids(root)


def _ids(root: Path) -> set[str]:
    return {p.name for p in (root / "sessions").iterdir() if any(p.glob("session.jsonl*"))}


def texts(message: Json) -> list[str]:
    return [b["text"] for b in message["content"] if b["type"] == "text"]


def tool_results(events: list[Json]) -> list[Json]:
    """Every tool outcome, in log order: `{name, arguments, text, is_error, error}`."""
    calls = {e["data"]["call_id"]: e["data"] for e in events if e["type"] == "tool/call"}
    out = []
    for e in events:
        if e["type"] != "tool/result":
            continue
        (block,) = e["data"]["message"]["content"]
        call = calls[block["call_id"]]
        out.append(
            {
                "name": call["name"],
                "arguments": json.loads(call["arguments"]),
                "text": "".join(texts(block)),
                "is_error": block["is_error"],
                "error": e["data"].get("error"),
            }
        )
    return out


def results_named(events: list[Json], name: str) -> list[Json]:
    return [r for r in tool_results(events) if r["name"] == name]


def assert_refused(result: Json, text: str, code: str) -> None:
    """A refused call: the `Error: ...` render and the durable `error: {name, code}`."""
    assert result["text"] == f"Error: {text}", result
    assert result["is_error"] is True
    assert result["error"] == {"name": "SubagentError", "code": code}


def assert_ok(result: Json, text: str) -> None:
    assert result["text"] == text, result
    assert result["is_error"] is False and result["error"] is None


def user_messages(events: list[Json], kind: str) -> list[Json]:
    return [e for e in events if e["type"] == "user/message" and e["data"]["message"]["source"]["kind"] == kind]


def notices(events: list[Json]) -> list[Json]:
    return user_messages(events, "subagent-settled")


def settled_records(events: list[Json], child_id: str | None = None) -> list[Json]:
    return [
        e for e in events if e["type"] == "subagent/settled" and (child_id is None or e["data"]["child_id"] == child_id)
    ]


def assert_each_settlement_noticed_once(events: list[Json]) -> None:
    """At least once, recorded once: every `subagent/settled` is referenced by exactly one notice,
    and every notice references a settlement of the child it names."""
    for record in settled_records(events):
        refs = [n for n in notices(events) if record["seq"] in n.get("source_event_seqs", [])]
        assert len(refs) == 1, (record, refs)
        assert refs[0]["seq"] > record["seq"]
        assert refs[0]["data"]["message"]["source"]["sender_session_id"] == record["data"]["child_id"]
    for n in notices(events):
        (seq,) = n["source_event_seqs"]
        assert events[seq]["type"] == "subagent/settled"


def notice_texts(child_id: str, summary: str, closing: str | None) -> list[str]:
    head = f"Background subagent {child_id} {summary}"
    return [head, "It left no closing message."] if closing is None else [head, "Its closing message:", closing]


def run_key(child_id: str, child_events: list[Json]) -> str:
    """The `run_key` a settlement of the child's last run carries: `<child_id>@<seq of its last
    turn/end>` (issue 27, settled once)."""
    return f"{child_id}@{[e['seq'] for e in child_events if e['type'] == 'turn/end'][-1]}"


def turn_end(events: list[Json], turn: int) -> Json:
    (end,) = [e for e in events if e["type"] == "turn/end" and e["data"]["turn"] == turn]
    return end["data"]["reason"]


def assistant_texts(events: list[Json]) -> list[str]:
    return ["".join(texts(e["data"]["message"])) for e in events if e["type"] == "assistant/message"]


def assert_child_header(header: Json, child_id: str, parent: str, depth: int = 1) -> None:
    assert header["id"] == child_id
    assert header["origin"] == "subagent"
    assert header["parent_session"] == parent
    assert header["delegation_depth"] == depth


# --- in-process runtime ---------------------------------------------------------------------------


def _load_driver() -> Any:
    spec = importlib.util.spec_from_file_location("subagent_driver", DRIVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HookedModel = _load_driver().HookedModel


@asynccontextmanager
async def runtime(
    root: Path, script: Json, *, gates: Sequence[Sequence[Any]] = (), **options: Any
) -> AsyncIterator[Runtime]:
    """`gates`: `[session, n, after_session, after_n]` — hold that session's n-th model call until
    the other session's call has started (its step input is durable), as in the driver."""
    model = HookedModel(ScriptedModel(load_script(json.dumps(script))), list(gates))
    async with open_runtime(
        root, model=model, clock=ScenarioClock(), id_factory=CountingIds("child"), compression="none", **options
    ) as rt:
        yield rt


def call(name: str, **arguments: Any) -> Json:
    return {"name": name, "arguments": arguments}


def delegate(description: str, prompt: str = "do the task", *, tool: str = "subagent", **more: Any) -> Json:
    return {"tool_calls": [call(tool, description=description, prompt=prompt, **more)]}


# --- fresh processes --------------------------------------------------------------------------


class Driver:
    """Runs `subagent_driver.py` in a new process per phase."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.root = tmp_path / "root"
        self.phase = 0

    def _spawn(self, spec: Json) -> tuple[subprocess.Popen[str], Path]:
        self.phase += 1
        spec = {"root": str(self.root), "clock_start": 1_789_000_000_000 + self.phase * 1_000_000, **spec}
        spec_path = self.tmp / f"phase-{self.phase}.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        err_path = self.tmp / f"phase-{self.phase}.stderr"
        with err_path.open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, str(DRIVER), str(spec_path)],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                cwd=self.tmp,
            )
        return proc, err_path

    def run(self, spec: Json) -> Json:
        """Run a phase to the end (tree idle); its final turn result."""
        proc, err_path = self._spawn(spec)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"driver phase {self.phase} hung; stderr:\n{err_path.read_text()}")
        assert proc.returncode == 0, f"phase {self.phase} exited {proc.returncode}:\n{err_path.read_text()}"
        (line,) = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        return json.loads(line.removeprefix("RESULT "))

    def run_and_kill(self, spec: Json) -> None:
        """Run a phase until it prints `MARK`, then SIGKILL it."""
        proc, err_path = self._spawn(spec)
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 30)
            line = proc.stdout.readline() if ready else ""
            assert line == "MARK\n", f"phase {self.phase}: {line!r}\n{err_path.read_text()}"
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL


# === restart in fresh processes: settle → notice → restart → ready → cold resume → notice =========


@pytest.mark.slow
def test_continuable_child_survives_restart_and_is_cold_resumed(tmp_path: Path) -> None:
    d = Driver(tmp_path)
    label = "Reply with CHILD_OK"
    first = d.run(
        {
            "session": "parent",
            "create": True,
            "prompt": "start a child",
            "gates": [["child-1", 1, "parent", 2]],
            "script": {
                "agents": [
                    {
                        "session": "parent",
                        "responses": [
                            delegate(label, "Reply with exactly CHILD_OK"),
                            {"wait_for": {"settled": label}, "text": "STARTED"},
                            {"text": "SUBAGENT_SETTLED_NOTED"},
                        ],
                    },
                    {"label": label, "responses": [{"text": "CHILD_OK"}]},
                ]
            },
        }
    )
    assert first == {"reason": {"kind": "completed"}, "text": "SUBAGENT_SETTLED_NOTED"}

    header, child = read_log(d.root, "child-1")
    assert_child_header(header, "child-1", "parent")
    assert child[0]["type"] == "subagent/descriptor"
    assert child[0]["data"] == {"version": 2, "mode": "continuable", "provider": "spawn", "label": label}
    assert turn_end(child, 1) == {"kind": "completed"}
    parent = events_of(d.root, "parent")
    assert_ok(results_named(parent, "subagent")[0], "started subagent child-1")
    (catalog,) = [e for e in parent if e["type"] == "subagent/catalog"]
    assert catalog["data"] == {
        "version": 1,
        "child_id": "child-1",
        "child_created_at": header["created_at"],
        "mode": "continuable",
        "label": label,
        "call_id": "call_1_1",  # the `subagent` call that started it (issue 27)
    }
    (settled,) = settled_records(parent)
    assert settled["data"] == {
        "child_id": "child-1",
        "reason_kind": "completed",
        "closing_text": "CHILD_OK",
        "run_key": run_key("child-1", child),
    }
    (notice,) = notices(parent)
    assert notice["source_event_seqs"] == [settled["seq"]]
    assert texts(notice["data"]["message"]) == notice_texts("child-1", SUMMARY_DONE, "CHILD_OK")
    assert assistant_texts(parent)[-1] == "SUBAGENT_SETTLED_NOTED"

    # A new process: the child exists only on disk.
    second = d.run(
        {
            "session": "parent",
            "create": False,
            "prompt": "list and message",
            "gates": [["child-1", 1, "parent", 3]],
            "script": {
                "agents": [
                    {
                        "session": "parent",
                        "responses": [
                            {"tool_calls": [call("list_agents")]},
                            {
                                "tool_calls": [
                                    call(
                                        "send_message",
                                        agent_id="{{from_request:(\\S+) \\[ready\\]}}",
                                        message="again please",
                                    )
                                ]
                            },
                            {"wait_for": {"settled": label}, "text": "SENT"},
                            {"text": "GOT_SECOND_NOTICE"},
                        ],
                    },
                    {"label": label, "responses": [{"text": "CHILD_OK_2"}]},
                ]
            },
        }
    )
    assert second == {"reason": {"kind": "completed"}, "text": "GOT_SECOND_NOTICE"}

    parent = events_of(d.root, "parent")
    assert_ok(results_named(parent, "list_agents")[0], f"child-1 [ready] — {label}")
    assert_ok(results_named(parent, "send_message")[0], "message delivered to agent child-1")
    _, child = read_log(d.root, "child-1")
    assert [e["data"]["reason"] for e in child if e["type"] == "turn/end"] == [{"kind": "completed"}] * 2
    (message,) = user_messages(child, "agent-message")
    assert message["data"]["turn"] == 2
    assert message["data"]["message"]["source"] == {"kind": "agent-message", "sender_session_id": "parent"}
    assert texts(message["data"]["message"]) == ["Agent parent sent a message: ", "again please"]
    assert assistant_texts(child) == ["CHILD_OK", "CHILD_OK_2"]
    assert [e for e in child if e["type"] == "subagent/descriptor"] == [child[0]]  # no provider re-dispatch

    first_settled, second_settled = settled_records(parent, "child-1")
    assert second_settled["data"] == {
        "child_id": "child-1",
        "reason_kind": "completed",
        "closing_text": "CHILD_OK_2",
        "run_key": run_key("child-1", child),  # another run than the first's: recorded too
    }
    assert first_settled["data"]["run_key"] != second_settled["data"]["run_key"]
    assert_each_settlement_noticed_once(parent)
    last_notice = notices(parent)[-1]
    assert last_notice["source_event_seqs"] == [second_settled["seq"]]
    assert texts(last_notice["data"]["message"]) == notice_texts("child-1", SUMMARY_DONE, "CHILD_OK_2")
    assert assistant_texts(parent)[-1] == "GOT_SECOND_NOTICE"
    assert session_ids(d.root) == {"parent", "child-1"}


# === crashes (SIGKILL) ==========================================================================


@pytest.mark.slow
def test_sigkill_after_settlement_before_the_notice_is_consumed(tmp_path: Path) -> None:
    d = Driver(tmp_path)
    # The parent's second model call hangs; the child may answer only once that call has started,
    # so the notice can only land in a step that never comes. Killed once `subagent/settled` is durable.
    d.run_and_kill(
        {
            "session": "parent",
            "create": True,
            "prompt": "start quick",
            "gates": [["child-1", 1, "parent", 2]],
            "mark": [{"settled": ["parent", "quick"]}],
            "script": {
                "agents": [
                    {"session": "parent", "responses": [delegate("quick"), {"hang": True}]},
                    {"label": "quick", "responses": [{"text": "QUICK_DONE"}]},
                ]
            },
        }
    )
    parent = events_of(d.root, "parent")
    (settled,) = settled_records(parent, "child-1")
    assert settled["data"]["closing_text"] == "QUICK_DONE"
    assert notices(parent) == []  # not consumed before the crash
    assert turn_end(events_of(d.root, "child-1"), 1) == {"kind": "completed"}

    result = d.run(
        {
            "session": "parent",
            "create": False,
            "on_interrupted_turn": "close",  # the closers' behaviour (continuing: test_continued_runs.py)
            "prompt": "after restart",
            "script": {
                "agents": [{"session": "parent", "responses": [{"text": "NOTICE_SEEN"}, {"text": "PROMPT_SEEN"}]}]
            },
        }
    )
    assert result["text"] == "PROMPT_SEEN"
    parent = events_of(d.root, "parent")
    assert turn_end(parent, 1) == {"kind": "interrupted"}  # the hung turn, closed on resume
    (notice,) = notices(parent)
    assert notice["source_event_seqs"] == [settled["seq"]]
    assert texts(notice["data"]["message"]) == notice_texts("child-1", SUMMARY_DONE, "QUICK_DONE")
    starts = {e["data"]["turn"]: e["data"].get("trigger") for e in parent if e["type"] == "turn/start"}
    assert notice["data"]["turn"] == 2 and starts[2] == {"kind": "resume"}  # first, in its own turn
    (prompt,) = [m for m in user_messages(parent, "user") if texts(m["data"]["message"]) == ["after restart"]]
    assert prompt["data"]["turn"] == 3 and starts[3] == {"kind": "message"}
    assert_each_settlement_noticed_once(parent)

    # Another restart delivers nothing again; the child is resumable.
    d.run(
        {
            "session": "parent",
            "create": False,
            "on_interrupted_turn": "close",  # the closers' behaviour (continuing: test_continued_runs.py)
            "prompt": "once more",
            "script": {
                "agents": [
                    {"session": "parent", "responses": [{"tool_calls": [call("list_agents")]}, {"text": "DONE"}]}
                ]
            },
        }
    )
    parent = events_of(d.root, "parent")
    assert len(notices(parent)) == 1
    assert_each_settlement_noticed_once(parent)
    assert_ok(results_named(parent, "list_agents")[0], "child-1 [ready] — quick")


@pytest.mark.slow
def test_sigkill_between_the_childs_turn_end_and_its_settlement_record(tmp_path: Path) -> None:
    """Only the notice is lost: no record, no notice after restart, the child lists as ready and
    answers a message."""
    d = Driver(tmp_path)
    d.run_and_kill(
        {
            "session": "parent",
            "create": True,
            "prompt": "start it",
            "hold_settlement": True,
            "script": {
                "agents": [
                    {"session": "parent", "responses": [delegate("lost notice"), {"text": "STARTED"}]},
                    {"label": "lost notice", "responses": [{"text": "ANSWER_1"}]},
                ]
            },
        }
    )
    assert turn_end(events_of(d.root, "child-1"), 1) == {"kind": "completed"}
    assert settled_records(events_of(d.root, "parent")) == []

    d.run(
        {
            "session": "parent",
            "create": False,
            "prompt": "check",
            "gates": [["child-1", 1, "parent", 3]],
            "script": {
                "agents": [
                    {
                        "session": "parent",
                        "responses": [
                            {"tool_calls": [call("list_agents")]},
                            {"tool_calls": [call("send_message", agent_id="child-1", message="again")]},
                            {"wait_for": {"settled": "child-1"}, "text": "SENT"},
                            {"text": "NOTED"},
                        ],
                    },
                    {"label": "lost notice", "responses": [{"text": "ANSWER_2"}]},
                ]
            },
        }
    )
    parent = events_of(d.root, "parent")
    assert_ok(results_named(parent, "list_agents")[0], "child-1 [ready] — lost notice")
    (settled,) = settled_records(parent)
    assert settled["data"]["closing_text"] == "ANSWER_2"
    assert [n["source_event_seqs"] for n in notices(parent)] == [[settled["seq"]]]
    assert assistant_texts(events_of(d.root, "child-1")) == ["ANSWER_1", "ANSWER_2"]


@pytest.mark.slow
def test_sigkill_while_the_child_is_mid_turn(tmp_path: Path) -> None:
    d = Driver(tmp_path)
    d.run_and_kill(
        {
            "session": "parent",
            "create": True,
            "prompt": "start hanger",
            "mark": [{"model_call": ["child-1", 1]}, {"idle": "parent"}],
            "script": {
                "agents": [
                    {"session": "parent", "responses": [delegate("hanger"), {"text": "STARTED"}]},
                    {"label": "hanger", "responses": [{"hang": True}]},
                ]
            },
        }
    )
    _, child = read_log(d.root, "child-1")
    assert child[-1]["type"] == "user/message"  # mid-turn: the step's input is durable, no turn/end
    assert [e for e in child if e["type"] == "turn/end"] == []
    crashed_len = len(child)

    d.run(
        {
            "session": "parent",
            "create": False,
            "on_interrupted_turn": "close",  # the closers' behaviour (continuing: test_continued_runs.py)
            "prompt": "check on it",
            "gates": [["child-1", 1, "parent", 3]],
            "script": {
                "agents": [
                    {
                        "session": "parent",
                        "responses": [
                            {"tool_calls": [call("list_agents")]},
                            {"tool_calls": [call("send_message", agent_id="child-1", message="are you there?")]},
                            {"wait_for": {"settled": "hanger"}, "text": "SENT"},
                            {"text": "NOTED"},
                        ],
                    },
                    {"label": "hanger", "responses": [{"text": "BACK"}]},
                ]
            },
        }
    )
    _, child = read_log(d.root, "child-1")
    # The interrupted turn is closed on disk by the closers, before the new turn.
    closers = child[crashed_len : crashed_len + 2]
    assert [e["type"] for e in closers] == ["step/end", "turn/end"]
    assert closers[1]["data"] == {"turn": 1, "reason": {"kind": "interrupted"}}
    assert child[crashed_len + 2]["type"] == "turn/start"
    assert child[crashed_len + 2]["data"]["turn"] == 2
    (message,) = user_messages(child, "agent-message")
    assert texts(message["data"]["message"]) == ["Agent parent sent a message: ", "are you there?"]
    assert message["data"]["turn"] == 2
    assert turn_end(child, 2) == {"kind": "completed"}
    assert assistant_texts(child) == ["BACK"]

    parent = events_of(d.root, "parent")
    # Listed before the child was resumed: its cut turn is open and nobody runs it (issue 29 item 4).
    assert_ok(results_named(parent, "list_agents")[0], "child-1 [orphaned] — hanger")
    assert_ok(results_named(parent, "send_message")[0], "message delivered to agent child-1")
    (notice,) = notices(parent)
    assert texts(notice["data"]["message"]) == notice_texts("child-1", SUMMARY_DONE, "BACK")
    assert_each_settlement_noticed_once(parent)


@pytest.mark.slow
def test_sigkill_while_the_childs_model_call_is_in_flight_continues_its_turn(tmp_path: Path) -> None:
    """Issue 27: the child's turn a crash cut is continued on resume (its lost model call issued
    again, attempt 2), completes with its answer, settles `completed` once, noticed once."""
    d = Driver(tmp_path)
    d.run_and_kill(
        {
            "session": "parent",
            "create": True,
            "prompt": "start hanger",
            "mark": [{"model_call": ["child-1", 1]}, {"idle": "parent"}],
            "script": {
                "agents": [
                    {"session": "parent", "responses": [delegate("hanger"), {"text": "STARTED"}]},
                    {"label": "hanger", "responses": [{"hang": True}]},
                ]
            },
        }
    )
    _, child = read_log(d.root, "child-1")
    assert child[-1]["type"] == "user/message"  # mid-turn: the step's input is durable
    crashed_len = len(child)

    # The parent is resumed and nothing is sent: its resume takes its cut child up again.
    result = d.run(
        {
            "session": "parent",
            "create": False,
            "prompt": None,
            "script": {
                "agents": [
                    {"session": "parent", "responses": [{"text": "NOTED"}]},
                    {"label": "hanger", "responses": [{"text": "BACK"}]},
                ]
            },
        }
    )
    assert result["text"] == "NOTED"  # the notice turn the child's settlement started
    _, child = read_log(d.root, "child-1")
    resumed = child[crashed_len:]
    assert resumed[0] == {**resumed[0], "type": "turn/continue"}
    assert resumed[0]["data"] == {"turn": 1, "step": 1, "attempt": 2, "lost_model_call": True}
    reply = resumed[1]
    assert reply["type"] == "assistant/message" and reply["data"]["attempt"] == 2
    assert turn_end(child, 1) == {"kind": "completed"}
    assert [e for e in child if e["type"] == "turn/end" and e["data"]["reason"]["kind"] == "interrupted"] == []
    assert assistant_texts(child) == ["BACK"]
    parent = events_of(d.root, "parent")
    (settled,) = settled_records(parent, "child-1")
    assert settled["data"]["reason_kind"] == "completed"
    (notice,) = notices(parent)
    assert texts(notice["data"]["message"]) == notice_texts("child-1", SUMMARY_DONE, "BACK")
    assert_each_settlement_noticed_once(parent)


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["read_file", "run_command"])
def test_sigkill_while_the_childs_tool_call_is_in_flight(tmp_path: Path, tool: str) -> None:
    """Issue 27: an idempotent tool (read_file) a crash cut runs again when the child's turn is
    continued; run_command is not run again: its result is in doubt."""
    d = Driver(tmp_path)
    args = {"path": "notes.txt"} if tool == "read_file" else {"command": "echo ran > ran.txt"}
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "notes.txt").write_text("NOTES\n")
    d.run_and_kill(
        {
            "session": "parent",
            "create": True,
            "prompt": "start worker",
            "workspace_tools": [tool],
            "hold_tools": True,
            "mark": [{"tool_started": tool}, {"idle": "parent"}],
            "script": {
                "agents": [
                    {"session": "parent", "responses": [delegate("worker"), {"text": "STARTED"}]},
                    {"label": "worker", "responses": [{"tool_calls": [call(tool, **args)]}]},
                ]
            },
        }
    )
    _, child = read_log(d.root, "child-1")
    assert child[-1]["type"] == "tool/call"  # cut while its tool ran
    crashed_len = len(child)

    # The parent is resumed and nothing is sent: its resume takes its cut child up again.
    d.run(
        {
            "session": "parent",
            "create": False,
            "prompt": None,
            "workspace_tools": [tool],
            "script": {
                "agents": [
                    {"session": "parent", "responses": [{"text": "NOTED"}]},
                    {"label": "worker", "responses": [{"text": "WORKED"}]},
                ]
            },
        }
    )
    _, child = read_log(d.root, "child-1")
    resumed = child[crashed_len:]
    assert resumed[0]["type"] == "turn/continue"
    assert resumed[0]["data"] == {"turn": 1, "step": 1, "attempt": 2, "lost_model_call": False}
    (result,) = [e for e in child if e["type"] == "tool/result"]
    if tool == "read_file":
        assert [e["type"] for e in resumed[1:3]] == ["tool/call", "tool/result"]  # run again
        assert "in_doubt" not in result["data"] and "NOTES" in json.dumps(result["data"]["message"])
    else:
        assert resumed[1] == result  # recorded at once, not run
        assert result["data"]["in_doubt"] is True
        assert result["data"]["error"] == {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"}
        assert not (tmp_path / "workspace" / "ran.txt").exists()
    assert turn_end(child, 1) == {"kind": "completed"}
    assert assistant_texts(child) == ["", "WORKED"]  # the tool call's, then step 2's
    parent = events_of(d.root, "parent")
    assert [r["data"]["reason_kind"] for r in settled_records(parent, "child-1")] == ["completed"]
    assert_each_settlement_noticed_once(parent)


# === in-process scenarios (real files, scripted models) ==========================================


async def test_steering_a_running_child_lands_in_its_next_step(tmp_path: Path) -> None:
    root = tmp_path / "root"
    script = {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    delegate("steerable"),
                    {
                        "tool_calls": [
                            call(
                                "send_message",
                                agent_id="{{from_request:started subagent (\\S+)}}",
                                message="change of plan",
                            )
                        ]
                    },
                    {"wait_for": {"settled": "steerable"}, "text": "SENT"},
                    {"text": "NOTED"},
                ],
            },
            # The child's first model call is held until its inbox receives the parent's message.
            {
                "label": "steerable",
                "responses": [{"wait_for": {"steered": True}, "text": "WORKING"}, {"text": "STEERED_OK"}],
            },
        ]
    }
    with trio.fail_after(GUARD):
        async with runtime(root, script, gates=[["child-1", 2, "parent", 3]]) as rt:
            parent = await rt.agents.create(session_id="parent")
            await parent.send("go")
            await rt.subagents.wait_tree_idle(parent)

    child = events_of(root, "child-1")
    assert [e["data"]["turn"] for e in child if e["type"] == "turn/start"] == [1]
    (message,) = user_messages(child, "agent-message")
    assert (message["data"]["turn"], message["data"]["step"]) == (1, 2)
    assert texts(message["data"]["message"]) == ["Agent parent sent a message: ", "change of plan"]
    (first_reply,) = [e for e in child if e["type"] == "assistant/message" and e["data"]["step"] == 1]
    assert message["seq"] > first_reply["seq"]
    assert assistant_texts(child) == ["WORKING", "STEERED_OK"]
    assert turn_end(child, 1) == {"kind": "completed"}
    parent_events = events_of(root, "parent")
    assert_ok(results_named(parent_events, "send_message")[0], "message delivered to agent child-1")
    (notice,) = notices(parent_events)
    assert texts(notice["data"]["message"]) == notice_texts("child-1", SUMMARY_DONE, "STEERED_OK")
    assert_each_settlement_noticed_once(parent_events)


async def test_foreground_one_shot_returns_text_and_a_failure_is_an_error(tmp_path: Path) -> None:
    root = tmp_path / "root"
    script = {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    delegate("fg ok", "answer now", run_in_background=False),
                    delegate("fg fail", "fail now", run_in_background=False),
                    {"tool_calls": [call("list_agents")]},
                    {"tool_calls": [call("send_message", agent_id="child-1", message="more?")]},
                    {"text": "DONE"},
                ],
            },
            {
                "label": "fg ok",
                "responses": [
                    {"tool_calls": [call("send_message", agent_id="parent", message="from a one-shot")]},
                    {"text": "FOREGROUND_TEXT"},
                ],
            },
            {"label": "fg fail", "responses": [{"error": {"status": 500, "message": "boom"}}]},
        ]
    }
    with trio.fail_after(GUARD):
        async with runtime(root, script) as rt:
            parent = await rt.agents.create(session_id="parent")
            await parent.send("go")
            result = await rt.subagents.wait_tree_idle(parent)
    assert result is not None and result.text == "DONE"

    events = events_of(root, "parent")
    ok, failed = results_named(events, "subagent")
    assert_ok(ok, "FOREGROUND_TEXT")
    assert failed["text"].startswith("Error: subagent run failed"), failed
    assert "boom" in failed["text"]
    assert failed["is_error"] is True
    assert failed["error"]["name"] == "SubagentError" and isinstance(failed["error"]["code"], str)
    assert_ok(results_named(events, "list_agents")[0], "(no subagents)")  # one-shot children are not listed
    assert_refused(
        results_named(events, "send_message")[0],
        'subagent "child-1" has no supported continuation state and cannot be resumed; choose a different target',
        "NOT_RESUMABLE",
    )
    assert_refused(
        results_named(events_of(root, "child-1"), "send_message")[0],
        'agent "child-1" is not a resident continuable child and cannot send to parent "parent"',
        "UNAUTHORIZED",
    )
    assert user_messages(events, "agent-message") == []
    assert settled_records(events) == [] and notices(events) == []
    catalogs = [e["data"] for e in events if e["type"] == "subagent/catalog"]
    assert [(c["child_id"], c["mode"], c["label"]) for c in catalogs] == [
        ("child-1", "one-shot", "fg ok"),
        ("child-2", "one-shot", "fg fail"),
    ]
    for child_id, label in (("child-1", "fg ok"), ("child-2", "fg fail")):
        header, child = read_log(root, child_id)
        assert_child_header(header, child_id, "parent")
        assert child[0]["data"] == {"version": 2, "mode": "one-shot", "provider": "spawn", "label": label}
    assert turn_end(events_of(root, "child-1"), 1) == {"kind": "completed"}
    assert turn_end(events_of(root, "child-2"), 1)["kind"] == "error"


async def test_fork_children_inherit_the_prefix_up_to_the_last_turn_end(tmp_path: Path, monkeypatch: Any) -> None:
    root = tmp_path / "root"
    # The fork provider seeds the child through `SessionStore.fork` (no read of its own).
    forks: list[tuple[str, int, str]] = []
    fork_with_events = SessionStore.fork_with_events

    async def spy(self: SessionStore, source: Any, prefix: int, header: Any) -> Any:
        forks.append((source.session_id, prefix, header.id))
        return await fork_with_events(self, source, prefix, header)

    monkeypatch.setattr(SessionStore, "fork_with_events", spy)
    script = {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    delegate("fork-empty", tool="subagent_fork"),  # first turn: no turn/end yet
                    {"wait_for": {"settled": "fork-empty"}, "text": "T1"},
                    {"text": "NOTED1"},
                    delegate("fork-seeded", tool="subagent_fork"),
                    {"wait_for": {"settled": "fork-seeded"}, "text": "T2"},
                    {"text": "NOTED2"},
                ],
            },
            {"label": "fork-empty", "responses": [{"text": "EMPTY_DONE"}]},
            {"label": "fork-seeded", "responses": [{"text": "SEEDED_DONE"}]},
        ]
    }
    with trio.fail_after(GUARD):
        async with runtime(root, script, gates=[["child-1", 1, "parent", 2], ["child-2", 1, "parent", 5]]) as rt:
            parent = await rt.agents.create(session_id="parent")
            await parent.send("one")
            await rt.subagents.wait_tree_idle(parent)
            await parent.send("two")
            await rt.subagents.wait_tree_idle(parent)

    parent_events = events_of(root, "parent")
    assert_ok(results_named(parent_events, "subagent_fork")[0], "started subagent child-1")
    assert_ok(results_named(parent_events, "subagent_fork")[1], "started subagent child-2")

    header, empty = read_log(root, "child-1")
    assert_child_header(header, "child-1", "parent")
    assert header["is_seeded"] is False and header["inherited_event_count"] == 0
    assert empty[0]["data"] == {"version": 2, "mode": "continuable", "provider": "fork", "label": "fork-empty"}
    assert [e for e in empty if e["type"] == "session/end-seed"] == []

    header, seeded = read_log(root, "child-2")
    assert_child_header(header, "child-2", "parent")
    turn1_end = next(e for e in parent_events if e["type"] == "turn/end" and e["data"]["turn"] == 1)
    k = turn1_end["seq"] + 1
    assert header["is_seeded"] is True and header["inherited_event_count"] == k
    assert forks == [("parent", 0, "child-1"), ("parent", k, "child-2")]
    assert seeded[:k] == parent_events[:k]  # the parent's events up to its last turn/end
    assert seeded[k]["type"] == "session/end-seed" and seeded[k]["data"] == {"inherited": True}
    assert seeded[k + 1]["type"] == "subagent/descriptor"
    assert seeded[k + 1]["data"] == {"version": 2, "mode": "continuable", "provider": "fork", "label": "fork-seeded"}
    own = seeded[k + 2 :]
    assert own[0]["type"] == "turn/start"
    assert [e for e in own if e["type"] == "subagent/descriptor"] == []
    assert assistant_texts(own) == ["SEEDED_DONE"]
    assert_each_settlement_noticed_once(parent_events)
    assert len(notices(parent_events)) == 2


async def test_depth_limit_and_unavailable_targets_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    script = {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    delegate("deep"),
                    {
                        "tool_calls": [
                            call("send_message", agent_id="nobody", message="hi"),
                            call("send_message", agent_id="bad\u0007id", message="hi"),
                        ]
                    },
                    {"wait_for": {"settled": "deep"}, "text": "WAITED"},
                    {"text": "NOTED"},
                ],
            },
            {
                "label": "deep",
                "responses": [
                    {
                        "tool_calls": [
                            call("subagent", description="deeper", prompt="x"),
                            call("subagent_fork", description="deeper fork", prompt="x"),
                        ]
                    },
                    {"text": "C_DONE"},
                ],
            },
        ]
    }
    with trio.fail_after(GUARD):
        async with runtime(root, script, max_depth=1, gates=[["child-1", 2, "parent", 3]]) as rt:
            parent = await rt.agents.create(session_id="parent")
            await parent.send("go")
            await rt.subagents.wait_tree_idle(parent)

    child = events_of(root, "child-1")
    spawn, fork = tool_results(child)
    # At the depth limit the delegation tools are not offered at all (issue 13 item 6): a
    # model that calls them anyway hears they do not exist.
    assert (spawn["text"], spawn["error"]) == (
        'Error: unknown tool "subagent"',
        {"name": "ToolNotFoundError", "code": "UNKNOWN_TOOL"},
    )
    assert (fork["text"], fork["error"]) == (
        'Error: unknown tool "subagent_fork"',
        {"name": "ToolNotFoundError", "code": "UNKNOWN_TOOL"},
    )
    assert session_ids(root) == {"parent", "child-1"}  # nothing was created
    parent_events = events_of(root, "parent")
    unknown, invalid = results_named(parent_events, "send_message")
    assert_refused(unknown, 'subagent "nobody" is unavailable', "NOT_RESUMABLE")
    assert_refused(invalid, 'subagent "bad\u0007id" is unavailable', "NOT_RESUMABLE")
    (notice,) = notices(parent_events)
    assert texts(notice["data"]["message"]) == notice_texts("child-1", SUMMARY_DONE, "C_DONE")


async def test_activation_limit_and_interrupt_by_the_parent(tmp_path: Path) -> None:
    root = tmp_path / "root"
    limit = (
        "subagent limit reached (active child limit: 1); wait for an existing child to finish or "
        "complete this work with the current agents"
    )
    script = {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    # turn 1: a child that settles (its slot is freed)
                    delegate("first"),
                    {"wait_for": {"settled": "first"}, "text": "P1"},
                    {"text": "NOTED_1"},
                    # turn 2: a running child holds the family's only slot
                    delegate("second"),
                    delegate("third"),
                    {"tool_calls": [call("send_message", agent_id="child-1", message="wake up")]},  # a cold resume
                    {"text": "P2"},
                    # turn 3: interrupt it (text only from here: the notice may land in any later step)
                    {"tool_calls": [call("interrupt_agent", agent_id="child-2")]},
                    {"text": "P3"},
                    {"text": "NOTED_2"},
                    {"text": "SPARE"},
                ],
            },
            {"label": "first", "responses": [{"text": "FIRST_DONE"}]},
            {"label": "second", "responses": [{"hang": True}]},
        ]
    }
    with trio.fail_after(GUARD):
        async with runtime(root, script, max_active_subagents=1, gates=[["child-1", 1, "parent", 2]]) as rt:
            parent = await rt.agents.create(session_id="parent")
            for prompt in ("one", "two"):
                await parent.send(prompt)
                await parent.wait_idle()
            assert rt.agents.status("child-2") == "running"
            cold_len = len(events_of(root, "child-1"))
            await parent.send("three")
            await rt.subagents.wait_tree_idle(parent)

    events = events_of(root, "parent")
    first, second, third = results_named(events, "subagent")
    assert_ok(first, "started subagent child-1")
    assert_ok(second, "started subagent child-2")
    assert_refused(third, limit, "ACTIVATION_LIMIT_REACHED")
    assert_refused(results_named(events, "send_message")[0], limit, "ACTIVATION_LIMIT_REACHED")
    assert_ok(results_named(events, "interrupt_agent")[0], "interrupt requested for agent child-2")
    assert session_ids(root) == {"parent", "child-1", "child-2"}  # the refused start created nothing
    assert len(events_of(root, "child-1")) == cold_len  # the refused cold resume wrote nothing

    assert turn_end(events_of(root, "child-2"), 1) == {"kind": "aborted", "cause": "parent"}
    done, stopped = settled_records(events)
    assert done["data"] == {
        "child_id": "child-1",
        "reason_kind": "completed",
        "closing_text": "FIRST_DONE",
        "run_key": run_key("child-1", events_of(root, "child-1")),
    }
    assert stopped["data"] == {
        "child_id": "child-2",
        "reason_kind": "aborted",
        "run_key": run_key("child-2", events_of(root, "child-2")),
    }
    assert [texts(n["data"]["message"]) for n in notices(events)] == [
        notice_texts("child-1", SUMMARY_DONE, "FIRST_DONE"),
        notice_texts("child-2", SUMMARY_STOPPED, None),
    ]
    assert_each_settlement_noticed_once(events)


async def test_an_interrupt_of_a_resident_child_between_turns_says_nothing_was_running(tmp_path: Path) -> None:
    """A child whose turn ended stays resident while its own child works: interrupting it stops
    nothing, and the outcome says so (issue 29 item 6); its running child is interrupted as ever."""
    root = tmp_path / "root"
    script = {
        "agents": [
            {"session": "parent", "responses": [delegate("mid"), {"text": "P_STARTED"}, {"text": "P_NOTED"}]},
            {"label": "mid", "responses": [delegate("deep"), {"text": "MID_DONE"}, {"text": "MID_NOTED"}]},
            {"label": "deep", "responses": [{"hang": True}]},
        ]
    }
    with trio.fail_after(GUARD):
        async with runtime(root, script, max_depth=2) as rt:
            parent = await rt.agents.create(session_id="parent")
            await parent.send("start")
            await parent.wait_idle()
            mid = rt.agents.get("child-1")
            assert mid is not None
            await mid.wait_idle()  # its turn ended; its child still runs, so it stays resident
            assert rt.agents.status("child-2") == "running"
            assert await rt.subagents.interrupt("child-1", parent) == "idle"
            assert rt.agents.status("child-2") == "running"  # an idle child's interrupt reaches no further
            assert await rt.subagents.interrupt("child-2", parent) == "requested"
            await rt.subagents.wait_tree_idle(parent)
    assert turn_end(events_of(root, "child-2"), 1) == {"kind": "aborted", "cause": "parent"}
    assert [turn_end(events_of(root, "child-1"), n)["kind"] for n in (1, 2)] == ["completed", "completed"]


async def test_interrupt_and_message_authority(tmp_path: Path) -> None:
    """Self, a resident sibling and a resident stranger are refused; a non-resident target is an
    accepted no-op that never resumes it; a stranger cannot message another parent's child."""
    root = tmp_path / "root"
    script = {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    delegate("one"),
                    delegate("two"),
                    {"tool_calls": [call("send_message", agent_id="child-1", message="go")]},
                    {"wait_for": {"settled": "one"}, "text": "P1"},
                    {"text": "NOTED_ONE"},
                    {
                        "tool_calls": [
                            call("interrupt_agent", agent_id="child-1"),  # settled: not resident
                            call("interrupt_agent", agent_id="ghost"),
                            call("interrupt_agent", agent_id="child-2"),
                        ]
                    },
                    {"wait_for": {"settled": "two"}, "text": "P2"},
                    {"text": "NOTED_TWO"},
                ],
            },
            {
                "session": "stranger",
                "responses": [
                    {
                        "tool_calls": [
                            call("interrupt_agent", agent_id="child-2"),
                            call("send_message", agent_id="child-2", message="hi"),
                            call("send_message", agent_id="child-1", message="hi"),
                        ]
                    },
                    {"text": "S_DONE"},
                ],
            },
            {
                "label": "one",
                "responses": [
                    {
                        "wait_for": {"steered": True},
                        "tool_calls": [
                            call("interrupt_agent", agent_id="child-1"),
                            call("interrupt_agent", agent_id="child-2"),
                        ],
                    },
                    {"text": "ONE_DONE"},
                ],
            },
            {"label": "two", "responses": [{"hang": True}]},
        ]
    }
    with trio.fail_after(GUARD):
        async with runtime(root, script, gates=[["child-1", 2, "parent", 4]]) as rt:
            parent = await rt.agents.create(session_id="parent")
            stranger = await rt.agents.create(session_id="stranger")
            await parent.send("start")
            await parent.wait_idle()  # child-1 settled and noticed; child-2 still running
            # Its Activation is disposed after the settlement is durable, with IO of its own
            # (stop, release), which may still be under way when the parent's notice turn ends.
            while rt.subagents.manager.get("child-1") is not None:
                await rt.subagents.manager.wait_changed()
            assert rt.agents.status("child-2") == "running"
            settled_len = len(events_of(root, "child-1"))
            await stranger.send("poke")
            await stranger.wait_idle()
            assert rt.agents.status("child-2") == "running"  # the stranger's interrupt did nothing
            await parent.send("finish")
            await rt.subagents.wait_tree_idle(parent)
            assert rt.subagents.manager.get("child-1") is None

    one = events_of(root, "child-1")
    assert len(one) == settled_len  # never cold-resumed, neither by the interrupt nor the stranger
    own, sibling = results_named(one, "interrupt_agent")
    assert_refused(own, 'agent "child-1" cannot interrupt itself', "UNAUTHORIZED")
    assert_refused(sibling, 'subagent "child-2" is not a live descendant of agent "child-1"', "UNAUTHORIZED")

    strange = tool_results(events_of(root, "stranger"))
    assert_refused(strange[0], 'subagent "child-2" is not a live descendant of agent "stranger"', "UNAUTHORIZED")
    assert_refused(strange[1], 'subagent "child-2" belongs to another parent session', "UNAUTHORIZED")  # resident
    assert_refused(strange[2], 'subagent "child-1" belongs to another parent session', "UNAUTHORIZED")  # cold
    assert user_messages(events_of(root, "child-2"), "agent-message") == []

    events = events_of(root, "parent")
    settled_one, ghost, running_two = results_named(events, "interrupt_agent")
    # Tools tell the truth (issue 13 item 6): a settled child is accepted but not running; an
    # id no session has is unavailable.
    assert_ok(settled_one, "interrupt requested for agent child-1 (it is not running)")
    assert_refused(ghost, 'subagent "ghost" is unavailable', "NOT_RESUMABLE")
    assert_ok(running_two, "interrupt requested for agent child-2")
    assert turn_end(events_of(root, "child-2"), 1) == {"kind": "aborted", "cause": "parent"}
    assert [texts(n["data"]["message"]) for n in notices(events)] == [
        notice_texts("child-1", SUMMARY_DONE, "ONE_DONE"),
        notice_texts("child-2", SUMMARY_STOPPED, None),
    ]
    assert_each_settlement_noticed_once(events)
    assert not (root / "sessions" / "ghost").exists()


async def test_grandparent_interrupts_and_a_child_messages_its_parent(tmp_path: Path) -> None:
    root = tmp_path / "root"
    script = {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    delegate("mid", "start a leaf and tell me its id"),
                    {"wait_for": {"steered": True}, "text": "P_WAIT"},
                    {"tool_calls": [call("interrupt_agent", agent_id="{{from_request:leaf is (\\S+)}}")]},
                    {"text": "P_AFTER"},
                    {"text": "P_NOTED"},
                ],
            },
            {
                "label": "mid",
                "responses": [
                    delegate("leaf"),
                    {
                        "tool_calls": [
                            call(
                                "send_message",
                                agent_id='{{from_request:Your parent agent id is "([^"]+)"}}',
                                message="leaf is {{from_request:started subagent (\\S+)}}",
                            )
                        ]
                    },
                    {"text": "MID_IDLE"},
                    {"text": "MID_SAW_LEAF"},
                ],
            },
            {"label": "leaf", "responses": [{"hang": True}]},
        ]
    }
    with trio.fail_after(GUARD):
        async with runtime(root, script, max_depth=2, gates=[["child-1", 2, "parent", 2]]) as rt:
            parent = await rt.agents.create(session_id="parent")
            await parent.send("go")
            await rt.subagents.wait_tree_idle(parent)

    header, leaf = read_log(root, "child-2")
    assert_child_header(header, "child-2", "child-1", depth=2)
    assert turn_end(leaf, 1) == {"kind": "aborted", "cause": "parent"}

    mid = events_of(root, "child-1")
    assert_ok(results_named(mid, "subagent")[0], "started subagent child-2")
    assert_ok(results_named(mid, "send_message")[0], "message delivered to agent parent")
    (leaf_settled,) = settled_records(mid, "child-2")
    assert leaf_settled["data"] == {
        "child_id": "child-2",
        "reason_kind": "aborted",
        "run_key": run_key("child-2", leaf),
    }
    (leaf_notice,) = notices(mid)
    assert texts(leaf_notice["data"]["message"]) == notice_texts("child-2", SUMMARY_STOPPED, None)
    assert_each_settlement_noticed_once(mid)

    events = events_of(root, "parent")
    (message,) = user_messages(events, "agent-message")
    assert message["data"]["message"]["source"] == {"kind": "agent-message", "sender_session_id": "child-1"}
    assert texts(message["data"]["message"]) == ["Agent child-1 sent a message: ", "leaf is child-2"]
    assert message["data"]["turn"] == 1  # steered into the running turn
    assert_ok(results_named(events, "interrupt_agent")[0], "interrupt requested for agent child-2")
    (notice,) = notices(events)
    assert texts(notice["data"]["message"]) == notice_texts("child-1", SUMMARY_DONE, "MID_SAW_LEAF")
    assert settled_records(events, "child-2") == []  # a grandchild settles into its own parent
    assert_each_settlement_noticed_once(events)


async def test_interrupt_stops_only_the_current_turn_and_descendants_keep_running(tmp_path: Path) -> None:
    root = tmp_path / "root"
    script = {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    delegate("mid", "start a leaf"),
                    {"wait_for": {"steered": True}, "text": "W"},
                    {"tool_calls": [call("list_agents", scope="descendants")]},
                    {"tool_calls": [call("interrupt_agent", agent_id="child-1")]},
                    {"text": "P1"},
                    {"tool_calls": [call("list_agents", scope="descendants")]},
                    {"tool_calls": [call("send_message", agent_id="child-2", message="hi")]},  # not a direct child
                    {"tool_calls": [call("interrupt_agent", agent_id="child-2")]},  # by the grandparent
                    {"wait_for": {"settled": "mid"}, "text": "P2"},
                    {"text": "P_NOTED"},
                ],
            },
            {
                "label": "mid",
                "responses": [
                    delegate("leaf"),
                    {"tool_calls": [call("send_message", agent_id="parent", message="leaf started")]},
                    {"hang": True},
                    {"text": "MID_NOTED"},
                ],
            },
            {"label": "leaf", "responses": [{"hang": True}]},
        ]
    }
    with trio.fail_after(GUARD):
        async with runtime(root, script, max_depth=2, gates=[["child-1", 2, "parent", 2]]) as rt:
            parent = await rt.agents.create(session_id="parent")
            await parent.send("go")
            await parent.wait_idle()
            mid = rt.agents.get("child-1")
            assert mid is not None
            await mid.wait_turn_closed()
            assert rt.agents.status("child-1") == "idle"  # resident: it owns a running child
            assert rt.agents.status("child-2") == "running"
            await parent.send("again")
            await rt.subagents.wait_tree_idle(parent)

    events = events_of(root, "parent")
    before, after = results_named(events, "list_agents")
    assert_ok(before, "child-1 [running] parent=parent depth=1 — mid\nchild-2 [running] parent=child-1 depth=2 — leaf")
    assert_ok(after, "child-1 [idle] parent=parent depth=1 — mid\nchild-2 [running] parent=child-1 depth=2 — leaf")
    assert_refused(
        results_named(events, "send_message")[0], 'subagent "child-2" belongs to another parent session', "UNAUTHORIZED"
    )
    assert [r["text"] for r in results_named(events, "interrupt_agent")] == [
        "interrupt requested for agent child-1",
        "interrupt requested for agent child-2",
    ]

    mid_events = events_of(root, "child-1")
    assert turn_end(mid_events, 1) == {"kind": "aborted", "cause": "parent"}
    assert turn_end(mid_events, 2) == {"kind": "completed"}
    (leaf_notice,) = notices(mid_events)
    assert leaf_notice["data"]["turn"] == 2
    assert texts(leaf_notice["data"]["message"]) == notice_texts("child-2", SUMMARY_STOPPED, None)
    leaf = events_of(root, "child-2")
    assert [e["type"] for e in leaf].count("turn/start") == 1
    assert turn_end(leaf, 1) == {"kind": "aborted", "cause": "parent"}
    assert user_messages(leaf, "agent-message") == []
    (notice,) = notices(events)
    assert texts(notice["data"]["message"]) == notice_texts("child-1", SUMMARY_DONE, "MID_NOTED")
    assert_each_settlement_noticed_once(events)


async def test_interrupt_keeps_queued_messages_parked_until_a_later_send(tmp_path: Path) -> None:
    """SPEC 5.3 / the `interrupt_agent` description: only the current turn stops; messages already
    queued for the agent stay parked until a later send_message (which then delivers them)."""
    root = tmp_path / "root"
    spare = [{"text": "SPARE"}] * 3  # so that a wrong behaviour fails an assertion instead of hanging
    script = {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    delegate("busy"),
                    {"tool_calls": [call("send_message", agent_id="child-1", message="queued")]},
                    {"tool_calls": [call("interrupt_agent", agent_id="child-1")]},
                    {"text": "P1"},
                    {"tool_calls": [call("send_message", agent_id="child-1", message="wake")]},
                    {"wait_for": {"settled": "busy"}, "text": "P2"},
                    {"text": "NOTED"},
                    *spare,
                ],
            },
            {"label": "busy", "responses": [{"hang": True}, {"text": "ANSWER"}, *spare]},
        ]
    }
    with trio.fail_after(GUARD):
        async with runtime(root, script) as rt:
            parent = await rt.agents.create(session_id="parent")
            await parent.send("go")
            await parent.wait_idle()
            await parent.send("wake it")
            await rt.subagents.wait_tree_idle(parent)

    child = events_of(root, "child-1")
    assert turn_end(child, 1) == {"kind": "aborted", "cause": "parent"}
    # Parked through the interrupt, then claimed together with the next send: same turn, same step.
    where = {
        texts(m["data"]["message"])[1]: (m["data"]["turn"], m["data"]["step"])
        for m in user_messages(child, "agent-message")
    }
    assert where == {"queued": (2, 1), "wake": (2, 1)}, where
    assert len(settled_records(events_of(root, "parent"))) == 1


async def test_releasing_a_parent_drains_its_running_children_first(tmp_path: Path) -> None:
    """SPEC 4: `release` of a session that owns running continuable children drains them first,
    so their settlement is recorded in the parent's log (delivered at the parent's next resume)."""
    root = tmp_path / "root"
    script = {
        "agents": [
            {"session": "parent", "responses": [delegate("worker"), {"text": "P_DONE"}, {"text": "SAW"}]},
            {"label": "worker", "responses": [{"hang": True}]},
        ]
    }
    with trio.fail_after(GUARD):
        async with runtime(root, script) as rt:
            parent = await rt.agents.create(session_id="parent")
            await parent.send("go")
            await parent.wait_idle()
            assert rt.agents.status("child-1") == "running"
            await rt.agents.stop("parent")
            assert rt.subagents.manager.get("child-1") is None, "the child outlived its parent's release"
            events = events_of(root, "parent")
            (settled,) = settled_records(events, "child-1")
            assert settled["data"]["reason_kind"] == "aborted"
            assert notices(events) == []  # a parent being disposed is never woken
            parent = await rt.agents.resume("parent")
            await rt.subagents.wait_tree_idle(parent)

    events = events_of(root, "parent")
    (notice,) = notices(events)
    assert texts(notice["data"]["message"]) == notice_texts("child-1", SUMMARY_STOPPED, None)
    assert_each_settlement_noticed_once(events)


async def test_a_draining_runtime_records_settlements_for_the_next_resume(tmp_path: Path) -> None:
    root = tmp_path / "root"
    script = {
        "agents": [
            {"session": "parent", "responses": [delegate("worker"), {"text": "P_DONE"}]},
            {"label": "worker", "responses": [{"hang": True}]},
        ]
    }
    with trio.fail_after(GUARD):
        async with runtime(root, script) as rt:
            parent = await rt.agents.create(session_id="parent")
            await parent.send("go")
            await parent.wait_idle()
    # Shutdown stopped the child; its settlement is durable but did not wake the parent.
    assert turn_end(events_of(root, "child-1"), 1) == {"kind": "aborted", "cause": "disposed"}
    events = events_of(root, "parent")
    (settled,) = settled_records(events, "child-1")
    assert settled["data"] == {
        "child_id": "child-1",
        "reason_kind": "aborted",
        "run_key": run_key("child-1", events_of(root, "child-1")),
    }
    assert settled["seq"] == len(events) - 1 and notices(events) == []

    script = {"agents": [{"session": "parent", "responses": [{"text": "SAW"}, {"text": "ANSWERED"}]}]}
    with trio.fail_after(GUARD):
        async with runtime(root, script) as rt:
            parent = await rt.agents.resume("parent")
            await parent.send("next")
            await rt.subagents.wait_tree_idle(parent)
    events = events_of(root, "parent")
    (notice,) = notices(events)
    assert notice["source_event_seqs"] == [settled["seq"]]
    assert texts(notice["data"]["message"]) == notice_texts("child-1", SUMMARY_STOPPED, None)
    starts = {e["data"]["turn"]: e["data"]["trigger"] for e in events if e["type"] == "turn/start"}
    assert notice["data"]["turn"] == 2 and starts[2] == {"kind": "resume"}
    assert starts[3] == {"kind": "message"} and assistant_texts(events)[-2:] == ["SAW", "ANSWERED"]


async def test_a_cold_resumed_child_gets_its_pending_notices_first_in_their_own_turn(tmp_path: Path) -> None:
    """SPEC 5.3: on resume, every own-suffix `subagent/settled` no notice references is delivered
    again, first (its own turn, trigger resume); new input follows in its own turn. Here the
    resumed agent is a continuable child, cold-resumed by its parent's message."""
    root = tmp_path / "root"
    script = {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    delegate("mid", "start a leaf"),
                    {"wait_for": {"steered": True}, "text": "W"},
                    {"text": "P1"},
                ],
            },
            {
                "label": "mid",
                "responses": [
                    delegate("leaf"),
                    {"tool_calls": [call("send_message", agent_id="parent", message="leaf started")]},
                    {"text": "MID_IDLE"},
                ],
            },
            {"label": "leaf", "responses": [{"hang": True}]},
        ]
    }
    with trio.fail_after(GUARD):
        async with runtime(root, script, max_depth=2, gates=[["child-1", 2, "parent", 2]]) as rt:
            parent = await rt.agents.create(session_id="parent")
            await parent.send("go")
            await parent.wait_idle()
            mid = rt.agents.get("child-1")
            assert mid is not None
            await mid.wait_turn_closed()
    # The drain stopped the leaf first: its settlement waits in mid's log, unnoticed.
    mid_events = events_of(root, "child-1")
    (leaf_settled,) = settled_records(mid_events, "child-2")
    assert notices(mid_events) == []

    spare = [{"text": "SPARE"}] * 3
    script = {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    {"text": "SAW_MID"},
                    {"tool_calls": [call("send_message", agent_id="child-1", message="status?")]},
                    {"wait_for": {"settled": "mid"}, "text": "P2"},
                    {"text": "P3"},
                    *spare,
                ],
            },
            {"label": "mid", "responses": [{"text": "M1"}, {"text": "M2"}, *spare]},
        ]
    }
    with trio.fail_after(GUARD):
        async with runtime(root, script, max_depth=2) as rt:
            parent = await rt.agents.resume("parent")
            await parent.send("ask mid")
            await rt.subagents.wait_tree_idle(parent)

    mid_events = events_of(root, "child-1")
    (leaf_notice,) = notices(mid_events)
    assert leaf_notice["source_event_seqs"] == [leaf_settled["seq"]]
    (message,) = user_messages(mid_events, "agent-message")
    starts = {e["data"]["turn"]: e["data"]["trigger"] for e in mid_events if e["type"] == "turn/start"}
    assert starts[leaf_notice["data"]["turn"]] == {"kind": "resume"}
    resume_turn = [
        e for e in mid_events if e["type"] == "user/message" and e["data"]["turn"] == leaf_notice["data"]["turn"]
    ]
    assert resume_turn == [leaf_notice], [texts(m["data"]["message"]) for m in resume_turn]
    assert message["data"]["turn"] == leaf_notice["data"]["turn"] + 1
    assert starts[message["data"]["turn"]] == {"kind": "message"}


@pytest.mark.slow
def test_a_one_shot_child_killed_mid_turn_is_closed_when_its_parent_resumes(tmp_path: Path) -> None:
    """Issue 13 item 2d: nobody resumes a one-shot child, so its parent's resume closes it —
    durably, in the child's own log, exactly once however often the parent resumes."""
    d = Driver(tmp_path)
    d.run_and_kill(
        {
            "session": "parent",
            "create": True,
            "prompt": "ask a helper",
            "mark": [{"model_call": ["child-1", 1]}],
            "script": {
                "agents": [
                    {"session": "parent", "responses": [delegate("helper", run_in_background=False)]},
                    {"label": "helper", "responses": [{"hang": True}]},
                ]
            },
        }
    )
    child = events_of(d.root, "child-1")
    assert child[-1]["type"] == "user/message"  # killed inside its first model call: the turn is open

    again = {
        "session": "parent",
        "create": False,
        "on_interrupted_turn": "close",  # the closers' behaviour (continuing: test_continued_runs.py)
        "prompt": "after restart",
        "script": {"agents": [{"session": "parent", "responses": [{"text": "BACK"}]}]},
    }
    assert d.run(again)["text"] == "BACK"
    closed = events_of(d.root, "child-1")  # a fresh reader sees the closers on disk
    assert closed[: len(child)] == child
    closers = closed[len(child) :]
    assert [e["type"] for e in closers] == ["step/end", "turn/end"]
    assert closers[-1]["data"] == {"turn": 1, "reason": {"kind": "interrupted"}}
    parent = events_of(d.root, "parent")
    assert turn_end(parent, 1) == {"kind": "interrupted"}
    (result,) = results_named(parent, "subagent")
    assert result["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"

    assert d.run(again)["text"] == "BACK"  # a second resume: nothing more is appended
    assert events_of(d.root, "child-1") == closed


async def test_a_one_shot_child_held_by_another_process_is_skipped_not_an_error(tmp_path: Path) -> None:
    from subagents.storage import FileLogStore

    d = Driver(tmp_path)
    d.run_and_kill(
        {
            "session": "parent",
            "create": True,
            "prompt": "ask a helper",
            "mark": [{"model_call": ["child-1", 1]}],
            "script": {
                "agents": [
                    {"session": "parent", "responses": [delegate("helper", run_in_background=False)]},
                    {"label": "helper", "responses": [{"hang": True}]},
                ]
            },
        }
    )
    child = events_of(d.root, "child-1")
    holder = FileLogStore(str(d.root), compression="none")  # another owner of the child's lock
    handle = holder.open_write("child-1")
    try:
        with trio.fail_after(GUARD):
            async with runtime(
                d.root,
                {"agents": [{"session": "parent", "responses": [{"text": "BACK"}]}]},
                on_interrupted_turn="close",
            ) as rt:
                parent = await rt.agents.resume("parent")
                await parent.send("after restart")
                result = await parent.wait_idle()
                assert result is not None and result.text == "BACK"
    finally:
        holder.close(handle)
    assert events_of(d.root, "child-1") == child  # left to its owner, who closes it on its resume
    assert turn_end(events_of(d.root, "parent"), 1) == {"kind": "interrupted"}


@pytest.mark.slow
def test_nested_one_shot_children_killed_mid_turn_are_all_closed(tmp_path: Path) -> None:
    d = Driver(tmp_path)
    d.run_and_kill(
        {
            "session": "parent",
            "create": True,
            "prompt": "ask a helper",
            "max_depth": 2,
            "mark": [{"model_call": ["child-2", 1]}],
            "script": {
                "agents": [
                    {"session": "parent", "responses": [delegate("helper", run_in_background=False)]},
                    {"label": "helper", "responses": [delegate("inner", run_in_background=False)]},
                    {"label": "inner", "responses": [{"hang": True}]},
                ]
            },
        }
    )
    before = {sid: events_of(d.root, sid) for sid in ("child-1", "child-2")}
    assert (
        d.run(
            {
                "session": "parent",
                "create": False,
                "on_interrupted_turn": "close",  # the closers' behaviour (continuing: test_continued_runs.py)
                "prompt": "after restart",
                "max_depth": 2,
                "script": {"agents": [{"session": "parent", "responses": [{"text": "BACK"}]}]},
            }
        )["text"]
        == "BACK"
    )
    for sid, old in before.items():
        after = events_of(d.root, sid)
        assert after[: len(old)] == old
        assert after[-1]["type"] == "turn/end" and after[-1]["data"]["reason"] == {"kind": "interrupted"}, sid


async def test_a_catalog_naming_a_session_that_is_not_its_child_closes_nothing(tmp_path: Path) -> None:
    """A catalog is data: an interrupted turn whose `subagent/catalog` names a session of another
    parent (tampered, or a fork's inherited record) must not make the resume write closers there."""
    from subagents.storage import Batch, FileLogStore, make_event

    store = FileLogStore(str(tmp_path), compression="none")
    t = 1789000000000
    other = store.create(header("other", t, origin="subagent", parent_session="elsewhere", delegation_depth=1))
    store.append(other, [Batch(0, [make_event(0, "turn/start", t + 1, {"turn": 1})])])
    store.close(other)
    parent = store.create(header("parent", t))
    store.append(
        parent,
        [
            Batch(
                0,
                [
                    make_event(0, "turn/start", t + 2, {"turn": 1}),
                    make_event(
                        1,
                        "subagent/catalog",
                        t + 3,
                        {"version": 1, "child_id": "other", "child_created_at": t, "mode": "one-shot"},
                    ),
                ],
            )
        ],
    )
    store.close(parent)
    before = events_of(tmp_path, "other")
    with trio.fail_after(GUARD):
        async with runtime(
            tmp_path, {"agents": [{"session": "parent", "responses": [{"text": "BACK"}]}]}, on_interrupted_turn="close"
        ) as rt:
            await rt.agents.resume("parent")
    assert events_of(tmp_path, "other") == before  # still open: not this parent's to close
    assert turn_end(events_of(tmp_path, "parent"), 1) == {"kind": "interrupted"}
