"""The runtime, unchanged, on the PostgreSQL store: a parent starts a background child that
settles; the logs, the listing and a cold reopen give what the file store gives. (The suites of
the runtime run as a `pg` parameter later, issue 18; this is the smoke test that they can.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from log_lines import read_all
from subagents.runtime import CountingIds, ScenarioClock, ScriptedModel, load_script, open_runtime
from subagents.storage import FileLogStore, LogStore

pytestmark = pytest.mark.pg

GUARD = 15.0  # seconds: a hang fails the test instead of blocking the suite


def _run_key(child: str, events: list[dict[str, Any]]) -> str:
    """The run key of the child's settlement: `<child>@<seq of its last turn/end>` (issue 27)."""
    return f"{child}@{[e['seq'] for e in events if e['type'] == 'turn/end'][-1]}"


def _model(*child_texts: str) -> ScriptedModel:
    agents = [{"label": "worker", "responses": [{"text": t} for t in child_texts]}]
    return ScriptedModel(load_script(json.dumps({"agents": agents})))


async def _tree(root: Path, store: LogStore) -> tuple[str, list[dict[str, Any]]]:
    async with open_runtime(
        root, log_store=store, model=_model("first"), clock=ScenarioClock(), id_factory=CountingIds("c")
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        child_id = await rt.subagents.start_continuable(parent, "spawn", "worker", "work")
        await rt.subagents.wait_tree_idle(parent)
        rows = [row.to_json() for row in await rt.listing.list_children("parent")]
    return child_id, rows


async def _cold_rows(root: Path, store: LogStore) -> list[dict[str, Any]]:
    async with open_runtime(root, log_store=store, model=_model(), clock=ScenarioClock()) as rt:
        return [row.to_json() for row in await rt.listing.list_children("parent")]


async def test_a_background_child_runs_settles_and_lists_as_on_the_file_store(
    tmp_path: Path, pg_store_factory: Callable[..., Any], pg_url: str
) -> None:
    files = FileLogStore(str(tmp_path / "files"), compression="none")
    pg = pg_store_factory()
    with trio.fail_after(GUARD):
        child_on_files, rows_on_files = await _tree(tmp_path / "files", files)
        child_on_pg, rows_on_pg = await _tree(tmp_path / "pg", pg)
    assert child_on_pg == child_on_files
    assert rows_on_pg == rows_on_files and len(rows_on_pg) == 1
    for sid in ("parent", child_on_pg):
        assert read_all(pg, sid) == read_all(files, sid)
    assert {i.id for i in pg.list()} == {i.id for i in files.list()} == {"parent", child_on_pg}
    with psycopg.connect(pg_url) as db:  # the session actors checkpointed their projections there
        assert db.execute("SELECT count(DISTINCT session_id) FROM checkpoints").fetchone() == (2,)
    # A fresh store on the same database, a fresh runtime: the cold listing is the same.
    with trio.fail_after(GUARD):
        assert await _cold_rows(tmp_path / "pg", pg_store_factory()) == await _cold_rows(tmp_path / "files", files)
    files.close_store()


# --- the mailbox on PostgreSQL: the runtime and the operator commands route through its rows ---


def _reset(url: str) -> None:
    from pg_server import reset_tables

    reset_tables(url)
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(
            "DO $$ BEGIN IF to_regclass('mailbox') IS NOT NULL THEN "
            "DELETE FROM mailbox; DELETE FROM mailbox_rejected; END IF; END $$"
        )


def _rows(url: str, sql: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as db:
        return db.execute(sql, params).fetchall()  # type: ignore[arg-type]  # test SQL, literal


def _pending(url: str, sid: str) -> list[str]:
    return [r[0] for r in _rows(url, "SELECT delivery_id FROM mailbox WHERE session_id = %s", sid)]


def test_open_runtime_on_postgresql_delivers_through_the_postgresql_mailbox(tmp_path: Path, pg_url: str) -> None:
    from subagents.storage import PostgresMailbox

    _reset(pg_url)

    async def body() -> None:
        async with open_runtime(tmp_path / "mail", store=pg_url) as rt:
            assert isinstance(rt.mailbox, PostgresMailbox)

    trio.run(body)
    assert not (tmp_path / "mail").exists()  # nothing of the store under the root


def test_a_queued_send_is_a_row_and_a_cold_send_resumes_and_records_it(
    tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli_process import write_script
    from subagents.runtime.hosts.cli import main

    _reset(pg_url)
    model = write_script(tmp_path / "s.json", {"agents": [{"responses": [{"text": "first"}]}]})
    where = ["--store", pg_url, "--root", str(tmp_path / "mail")]
    assert main(["run", *where, "--model", model, "--session", "s1", "say hi"]) == 0
    capsys.readouterr()
    assert main(["send", "s1", "queued words", "--queue", *where]) == 0
    queued = capsys.readouterr().out.split()[1]
    assert _pending(pg_url, "s1") == [queued]  # a row of the store's mailbox, not a file
    assert not (tmp_path / "mail").exists()  # no mailbox file under the root
    answers = [{"text": "answered"}, {"text": "answered"}]
    again = write_script(tmp_path / "t.json", {"agents": [{"responses": answers}]})
    assert main(["send", "s1", "now", "--model", again, *where]) == 0  # nobody runs it: resumed here
    assert "answered" in capsys.readouterr().out
    assert main(["tail", "s1", *where]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    messages = [e["data"] for e in events if e["type"] == "user/message"]
    texts = [m["message"]["content"][0]["text"] for m in messages]
    # The host that resumes it takes in what waited first (issue 27: no sweep resumes a root,
    # so its next host records its mail; before, a run could end with it still queued), then
    # the cold send's own turn runs here.
    assert texts[:3] == ["say hi", "queued words", "now"]
    recorded = [m.get("delivery_id") for m in messages].count(queued)
    assert (recorded, _pending(pg_url, "s1")) == (1, [])


def _bg_script(child: list[dict[str, Any]]) -> dict[str, Any]:
    background = {"description": "Bg", "prompt": "wait", "run_in_background": True}
    parent = [
        {"tool_calls": [{"name": "subagent", "arguments": background}]},
        {"text": "started it"},
        {"text": "noted the settlement"},
    ]
    return {"agents": [{"responses": parent}, {"label": "Bg", "responses": child}]}


def _cli(url: str, *args: str) -> Any:
    import subprocess

    from chat_driver import TIMEOUT
    from cli_process import CLI, clean_env

    return subprocess.run(
        [*CLI, *args, "--store", url], env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT
    )


def _delivered(out: str, kind: str, sid: str) -> str:
    import re

    match = re.fullmatch(rf"{kind} ([0-9A-Z]{{26}}) delivered to session {re.escape(sid)} \((.*)\)\n", out)
    assert match is not None and match.group(2) == "live in another process, which records it", out
    return match.group(1)


def _until(holds: Callable[[], bool], host: Any) -> None:
    """A bounded poll of rows another process changes (an ack deletes one; nothing here can wait
    on another process's commit)."""
    import time

    from chat_driver import TIMEOUT

    deadline = time.monotonic() + TIMEOUT
    while not holds():
        assert host.proc.poll() is None, "the host ended first"
        assert time.monotonic() < deadline, "the host never acknowledged"
        time.sleep(0.02)


def _log_of(url: str, sid: str) -> list[dict[str, Any]]:
    done = _cli(url, "tail", sid)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


JUNK_ID = "01M24BB8G0041061050R3GG28A"


@pytest.mark.slow  # three processes: a chat host on PostgreSQL, tail -f, and the operator commands
def test_send_and_interrupt_reach_a_child_a_host_runs_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    from chat_driver import Chat, LineProcess
    from cli_process import CLI, clean_env

    _reset(pg_url)
    chat = Chat(
        tmp_path, _bg_script([{"wait_for": {"steered": True}, "text": "heard"}, {"hang": True}]), "--store", pg_url
    )
    session = chat.expect(r"^session (\S+) \(/help for commands\)$").group(1)
    chat.line("start a child")
    child = chat.expect(r"^  ← started subagent (\S+)$").group(1)
    chat.expect(r"^assistant: started it$")
    tail = LineProcess([*CLI, "tail", "-f", child, "--store", pg_url], tmp_path, clean_env())
    try:
        tail.expect(r'"type":"turn/start"')
        # A row no envelope: moved to mailbox_rejected by the owner's next drain, reported on
        # the host's stderr, and the delivery behind it still recorded.
        _rows(pg_url, "INSERT INTO mailbox VALUES (%s, %s, %s, 0) RETURNING 1", child, JUNK_ID, b'{"delivery_id": "01M')
        sent = _cli(pg_url, "send", child, "hello from outside")
        assert sent.returncode == 0 and sent.stderr == "", sent
        delivery = _delivered(sent.stdout, "send", child)
        tail.expect(rf'"type":"user/message".*"delivery_id":"{delivery}"')

        stopped = _cli(pg_url, "interrupt", child)
        assert stopped.returncode == 0 and stopped.stderr == "", stopped
        interrupt = _delivered(stopped.stdout, "interrupt", child)
        tail.expect(r'"type":"turn/end".*"reason":\{"kind":"aborted","cause":"user"\}')
        chat.expect(r"^assistant: noted the settlement$")
        _until(lambda: _pending(pg_url, child) == [], chat)  # every delivery acked (the junk moved)
    finally:
        tail.proc.terminate()
        tail.proc.wait()
    status, rest, stderr = chat.finish()
    assert status == 0, (rest, stderr)
    assert "Traceback" not in stderr
    assert f"mailbox entry '{JUNK_ID}' is not a delivery (moved aside as '{JUNK_ID}')" in stderr

    events = _log_of(pg_url, child)
    assert [e["data"].get("delivery_id") for e in events if e["type"] == "user/message"] == [None, delivery]
    assert [e["data"]["reason"] for e in events if e["type"] == "turn/end"] == [{"kind": "aborted", "cause": "user"}]
    assert interrupt not in json.dumps(events)
    assert _rows(pg_url, "SELECT name, session_id FROM mailbox_rejected") == [(JUNK_ID, child)]
    settled = [e["data"] for e in _log_of(pg_url, session) if e["type"] == "subagent/settled"]
    key = _run_key(child, events)
    assert settled == [{"child_id": child, "reason_kind": "aborted", "closing_text": "heard", "run_key": key}]
    assert not list(tmp_path.rglob("mailbox"))  # nothing of the mailbox under the root


@pytest.mark.slow  # two processes: a chat host on PostgreSQL and the operator's stop
def test_stop_settles_a_child_a_host_runs_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    from chat_driver import Chat

    _reset(pg_url)
    chat = Chat(tmp_path, _bg_script([{"hang": True}]), "--store", pg_url)
    session = chat.expect(r"^session (\S+) \(/help for commands\)$").group(1)
    chat.line("start a child")
    child = chat.expect(r"^  ← started subagent (\S+)$").group(1)
    chat.expect(r"^assistant: started it$")
    done = _cli(pg_url, "stop", child)
    assert done.returncode == 0 and done.stderr == "", done
    _delivered(done.stdout, "stop", child)
    chat.expect(r"^assistant: noted the settlement$")
    _until(lambda: _pending(pg_url, child) == [], chat)
    status, rest, stderr = chat.finish()
    assert status == 0, (rest, stderr)
    events = _log_of(pg_url, child)
    assert [e["data"]["reason"] for e in events if e["type"] == "turn/end"] == [{"kind": "aborted", "cause": "user"}]
    settled = [e["data"] for e in _log_of(pg_url, session) if e["type"] == "subagent/settled"]
    assert settled == [{"child_id": child, "reason_kind": "aborted", "run_key": _run_key(child, events)}]
    for command in ("interrupt", "stop"):  # nobody runs it now
        cold = _cli(pg_url, command, child)
        assert (cold.returncode, cold.stdout, cold.stderr) == (
            0,
            f"session {child} is not running: nothing to {command}\n",
            "",
        )
    assert _pending(pg_url, child) == []
