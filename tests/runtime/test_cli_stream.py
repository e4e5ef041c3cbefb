"""`subagents run --stream` (issue 15 item 2, SPEC §8), in a subprocess: one JSON object per
line on stdout for every durable event of the session and its descendants, then the result
line. Parsed line by line and compared with the logs read back from disk. On Ctrl-C (SIGINT,
sent once a line shows the run has got that far) the stream goes on through the drain: the
closers, the `turn/end` and the result line with the run's reason.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_process import CLI, clean_env, write_script
from log_lines import log_file, plain_records
from scripts import BACKGROUND_CHILD

TIMEOUT = 60  # real seconds: only reached if a subprocess hangs


def run(tmp_path: Path, script: Any, *args: str) -> subprocess.CompletedProcess[str]:
    model = write_script(tmp_path / "s.json", script)
    return subprocess.run(
        [*CLI, "run", "--root", str(tmp_path / "root"), "--model", model, "--compression", "none", *args],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def parse(stdout: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every line is one JSON object; the last is the result, the others events."""
    assert stdout.endswith("\n")
    records = [json.loads(line) for line in stdout.splitlines()]
    assert all(isinstance(r, dict) for r in records)
    *events, result = records
    assert result["type"] == "result" and set(result) == {"type", "session_id", "output", "usage", "reason"}
    for event in events:
        assert set(event) >= {"session_id", "seq", "type", "time", "data"}
        assert event["type"] != "result"
    return events, result


def events_by_session(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        out.setdefault(event.pop("session_id"), []).append(event)
    return out


@pytest.mark.slow
def test_stream_prints_every_durable_event_of_the_tree_then_the_result(tmp_path: Path) -> None:
    done = run(tmp_path, BACKGROUND_CHILD, "--stream", "go")
    assert done.returncode == 0, done.stderr
    events, result = parse(done.stdout)
    parent = result["session_id"]
    assert done.stderr == f"session {parent}\n"  # not a terminal: nothing extra
    assert result["output"] == "NOTED" and result["reason"] == {"kind": "completed"}
    # The tree's usage during the run: the parent's three answers and the child's one.
    assert result["usage"] == {"input_tokens": 65, "output_tokens": 10, "calls": 4, "reported": 4}
    sessions = events_by_session(events)
    [child] = [sid for sid in sessions if sid != parent]
    for sid, streamed in sessions.items():
        seqs = [e["seq"] for e in streamed]
        assert seqs == list(range(len(seqs))), sid  # increasing, none missing, none twice
        _header, *logged = plain_records(tmp_path / "root", sid)
        assert streamed == logged, sid  # every durable event of it, as the log holds it
    catalog = next(i for i, e in enumerate(events) if e["type"] == "subagent/catalog")
    assert events[catalog]["data"]["child_id"] == child
    first_child = next(i for i, e in enumerate(parse(done.stdout)[0]) if e["session_id"] == child)
    assert first_child > catalog  # a child is streamed once its parent's catalog names it


@pytest.mark.slow
def test_stream_on_a_resumed_session_prints_only_the_new_run(tmp_path: Path) -> None:
    script = {"agents": [{"session": "s1", "responses": [{"text": "ONE"}, {"text": "TWO"}]}]}
    first = run(tmp_path, script, "--session", "s1", "first")
    assert first.returncode == 0, first.stderr
    _header, *before = plain_records(tmp_path / "root", "s1")
    script_2 = {"agents": [{"session": "s1", "responses": [{"text": "TWO"}]}]}
    done = run(tmp_path, script_2, "--session", "s1", "--stream", "second")
    assert done.returncode == 0, done.stderr
    events, result = parse(done.stdout)
    assert result == {
        "type": "result",
        "session_id": "s1",
        "output": "TWO",
        "usage": result["usage"],
        "reason": {"kind": "completed"},
    }
    assert [e["seq"] for e in events] == list(range(len(before), len(before) + len(events)))
    assert events[0]["type"] == "turn/start" and events[-1]["type"] == "turn/end"


@pytest.mark.slow
def test_stream_after_a_failed_turn_still_ends_with_the_result_and_exits_1(tmp_path: Path) -> None:
    script = {"agents": [{"responses": [{"error": {"status": 500, "message": "boom"}}]}]}
    done = run(tmp_path, script, "--stream", "go")
    assert done.returncode == 1
    events, result = parse(done.stdout)
    assert result["output"] == "" and events[-1]["type"] == "turn/end"
    assert events[-1]["data"]["reason"]["kind"] == "error"
    assert result["reason"] == events[-1]["data"]["reason"]  # how the run ended: the last turn/end's
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and lines[1].startswith("subagents: the turn ended error")


@pytest.mark.slow  # a real subagents process
def test_stream_and_json_together_are_refused_in_one_line(tmp_path: Path) -> None:
    done = run(tmp_path, BACKGROUND_CHILD, "--stream", "--json", "go")
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("subagents: ") and "not allowed with" in line
    assert not (tmp_path / "root").exists()


@pytest.mark.slow
def test_a_reader_that_goes_away_ends_nothing_but_its_lines(tmp_path: Path) -> None:
    # `subagents run --stream | head -1`: the run finishes its work quietly, no traceback.
    model = write_script(tmp_path / "s.json", BACKGROUND_CHILD)
    proc = subprocess.Popen(
        [*CLI, "run", "--root", str(tmp_path / "root"), "--model", model, "--compression", "none", "--stream", "go"],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = json.loads(proc.stdout.readline())
    assert first["seq"] == 0
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=TIMEOUT) == 0, stderr
    assert stderr == f"session {first['session_id']}\n"
    # The work was done all the same: the parent's turn completed after its child settled.
    _header, *logged = plain_records(tmp_path / "root", first["session_id"])
    assert logged[-1]["type"] == "turn/end" and logged[-1]["data"]["reason"]["kind"] == "completed"


@pytest.mark.slow
def test_stream_of_a_resumed_crashed_session_starts_with_its_closers(tmp_path: Path) -> None:
    # A crash left turn 1 open: the resume closes it durably (the `close` policy; since issue 27
    # the default continues it: the test below), and that is part of this run.
    from log_lines import header_line, json_line, log_file

    (tmp_path / "subagents.toml").write_text('on_interrupted_turn = "close"\n')
    log = log_file(tmp_path / "root", "s1")
    log.parent.mkdir(parents=True)
    log.write_bytes(header_line("s1") + json_line(0, "turn/start", {"turn": 1}))
    script = {"agents": [{"session": "s1", "responses": [{"text": "AGAIN"}]}]}
    done = run(tmp_path, script, "--session", "s1", "--stream", "again")
    assert done.returncode == 0, done.stderr
    events, result = parse(done.stdout)
    assert result["output"] == "AGAIN"
    assert events[0]["seq"] == 1 and events[0]["type"] == "turn/end"
    assert events[0]["data"]["reason"]["kind"] == "interrupted"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


@pytest.mark.slow
def test_stream_of_a_resumed_crashed_session_continues_its_turn_and_counts_the_lost_call(tmp_path: Path) -> None:
    # A crash cut turn 1's model call: the resume continues the turn (`turn/continue` durable
    # first, part of this run), issues the call again, then runs the new prompt's turn; the lost
    # call's usage is unknown, not zero.
    from log_lines import header_line, json_line, log_file

    log = log_file(tmp_path / "root", "s1")
    log.parent.mkdir(parents=True)
    user = {"id": "msg-1", "role": "user", "content": [{"type": "text", "text": "go"}], "source": {"kind": "user"}}
    log.write_bytes(
        header_line("s1")
        + json_line(0, "turn/start", {"turn": 1})
        + json_line(1, "step/start", {"turn": 1, "step": 1})
        + json_line(2, "user/message", {"turn": 1, "step": 1, "message": user}, surface_op="append")
    )
    script = {"agents": [{"session": "s1", "responses": [{"text": "CONTINUED"}, {"text": "AGAIN"}]}]}
    done = run(tmp_path, script, "--session", "s1", "--stream", "again")
    assert done.returncode == 0, done.stderr
    events, result = parse(done.stdout)
    assert result["output"] == "AGAIN"
    assert (events[0]["seq"], events[0]["type"]) == (3, "turn/continue")
    assert events[0]["data"] == {"turn": 1, "step": 1, "attempt": 2, "lost_model_call": True}
    assert events[1]["type"] == "assistant/message" and events[1]["data"]["attempt"] == 2
    assert result["usage"] == {"input_tokens": 0, "output_tokens": 0, "calls": 2, "reported": 0, "unknown_calls": 1}
    assert [e["seq"] for e in events] == list(range(3, len(events) + 3))


# -- Ctrl-C --------------------------------------------------------------------------------------

HANGS = {"agents": [{"responses": [{"hang": True}]}]}
# A parent that starts a background child and then waits on its model; the child's model hangs.
CHILD_HANGS = {
    "agents": [
        {
            "responses": [
                {"tool_calls": [{"name": "subagent", "arguments": {"description": "helper", "prompt": "do it"}}]},
                {"hang": True},
            ]
        },
        {"label": "helper", "responses": [{"hang": True}]},
    ]
}
ABORTED_USER = {"kind": "aborted", "cause": "user"}


class Running:
    """`subagents run --stream` in a subprocess whose stdout is read line by line, with SIGINT
    at its default (a child of a non-interactive shell may inherit it ignored) and a hang guard
    that kills it after TIMEOUT."""

    def __init__(self, tmp_path: Path, script: Any, *args: str) -> None:
        model = write_script(tmp_path / "s.json", script)
        self.proc = subprocess.Popen(
            [*CLI, "run", "--root", str(tmp_path / "root"), "--model", model, "--compression", "none"]
            + ["--stream", *args],
            cwd=tmp_path,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.guard = threading.Timer(TIMEOUT, self.proc.kill)
        self.guard.start()
        self.lines: list[bytes] = []

    def read_until(self, found: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """Read stdout lines until one (parsed) satisfies `found`; that record."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            record = json.loads(line)
            if found(record):
                return record
        raise AssertionError(f"stdout ended first: {b''.join(self.lines)!r}")

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)

    def finish(self) -> tuple[int, str, str]:
        """Read the rest; (exit status, all of stdout, stderr)."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        rest = self.proc.stdout.read()
        stderr = self.proc.stderr.read().decode()
        code = self.proc.wait()
        self.guard.cancel()
        return code, b"".join(self.lines).decode() + rest.decode(), stderr


def starts(session_id: str | None, kind: str) -> Callable[[dict[str, Any]], bool]:
    """A record of `kind` (of the session `session_id`; None: of any)."""
    return lambda r: r["type"] == kind and (session_id is None or r["session_id"] == session_id)


def assert_streamed_as_logged(root: Path, events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    sessions = events_by_session([dict(e) for e in events])
    for sid, streamed in sessions.items():
        assert [e["seq"] for e in streamed] == list(range(len(streamed))), sid  # increasing, no gap
        _header, *logged = plain_records(root, sid)
        assert streamed == logged, sid  # up to the end: nothing durable is left off the stream
    return sessions


@pytest.mark.slow
def test_ctrl_c_streams_the_closers_and_the_turn_end_then_the_result(tmp_path: Path) -> None:
    running = Running(tmp_path, HANGS, "--session", "s1", "go")
    running.read_until(starts("s1", "turn/start"))
    running.interrupt()
    code, stdout, stderr = running.finish()
    assert code == 130, stderr
    events, result = parse(stdout)
    assert stderr == "session s1\nsubagents: the turn ended aborted (user)\n"
    sessions = assert_streamed_as_logged(tmp_path / "root", events)
    assert list(sessions) == ["s1"]
    # The closers (SPEC 3.4): the open step's end, then the turn's, aborted by the person.
    assert [e["type"] for e in events][-2:] == ["step/end", "turn/end"]
    assert events[-1]["data"]["reason"] == ABORTED_USER
    assert result == {
        "type": "result",
        "session_id": "s1",
        "output": "",
        "usage": result["usage"],
        "reason": ABORTED_USER,
    }


@pytest.mark.slow
def test_ctrl_c_with_a_background_child_disposes_it_and_streams_both_to_the_end(tmp_path: Path) -> None:
    # The rule of a plain `run`: the root's turn is the person's (cause user); a running
    # descendant is stopped as the runtime's close stops it (cause disposed), its settlement is
    # recorded in the parent's log and starts no notice turn.
    running = Running(tmp_path, CHILD_HANGS, "--session", "p1", "go")
    child_id = running.read_until(lambda r: r["type"] == "user/message" and r["session_id"] != "p1")["session_id"]
    running.interrupt()
    code, stdout, stderr = running.finish()
    assert code == 130, stderr
    events, result = parse(stdout)
    assert stderr == "session p1\nsubagents: the turn ended aborted (user)\n"
    sessions = assert_streamed_as_logged(tmp_path / "root", events)
    assert set(sessions) == {"p1", child_id}
    child = sessions[child_id]
    assert child[-1]["type"] == "turn/end" and child[-1]["data"]["reason"] == {"kind": "aborted", "cause": "disposed"}
    parent = sessions["p1"]
    [end] = [i for i, e in enumerate(parent) if e["type"] == "turn/end"]
    assert parent[end]["data"]["reason"] == ABORTED_USER
    assert [e["type"] for e in parent[end + 1 :]] == ["subagent/settled"]  # no notice turn
    # `run_key`: the child's run it settles, named by its last turn/end (issue 27).
    run_key = f"{child_id}@{child[-1]['seq']}"
    assert parent[-1]["data"] == {"child_id": child_id, "reason_kind": "aborted", "run_key": run_key}
    assert result["reason"] == ABORTED_USER and result["session_id"] == "p1"
    # The parent's call that started the child was answered; usage covers the tree's replies.
    assert result["usage"]["calls"] == 1


@pytest.mark.slow
def test_ctrl_c_while_only_a_background_child_works_stops_it_and_says_so(tmp_path: Path) -> None:
    # The parent's turn has completed; `run` waits for its child. Ctrl-C stops the child
    # (disposed); its settlement is recorded and starts no notice turn. The parent's last
    # turn/end is `completed`, but the run ended as the person's abort: the result says so.
    script = {
        "agents": [
            {
                "responses": [
                    {"tool_calls": [{"name": "subagent", "arguments": {"description": "helper", "prompt": "do it"}}]},
                    {"text": "STARTED"},
                ]
            },
            {"label": "helper", "responses": [{"hang": True}]},
        ]
    }
    running = Running(tmp_path, script, "--session", "p1", "go")
    seen: set[tuple[bool, str]] = set()

    def both_seen(record: dict[str, Any]) -> bool:  # the parent's turn ended, the child's runs
        seen.add((record["session_id"] == "p1", record["type"]))
        return {(True, "turn/end"), (False, "user/message")} <= seen

    running.read_until(both_seen)
    running.interrupt()
    code, stdout, stderr = running.finish()
    assert code == 130, stderr
    events, result = parse(stdout)
    assert stderr == "session p1\nsubagents: interrupted while no turn ran (running subagents were stopped)\n"
    sessions = assert_streamed_as_logged(tmp_path / "root", events)
    [child_id] = [sid for sid in sessions if sid != "p1"]
    assert sessions[child_id][-1]["data"]["reason"] == {"kind": "aborted", "cause": "disposed"}
    parent = sessions["p1"]
    assert [e["type"] for e in parent[-2:]] == ["turn/end", "subagent/settled"]  # no notice turn
    assert parent[-2]["data"]["reason"] == {"kind": "completed"}
    assert result["output"] == "STARTED" and result["reason"] == ABORTED_USER


@pytest.mark.slow
def test_ctrl_c_after_the_reader_went_away_still_drains_quietly(tmp_path: Path) -> None:
    running = Running(tmp_path, HANGS, "--session", "s1", "go")
    running.read_until(starts("s1", "turn/start"))
    assert running.proc.stdout is not None
    running.proc.stdout.close()  # `run --stream | head -1`, then Ctrl-C
    running.interrupt()
    assert running.proc.stderr is not None
    stderr = running.proc.stderr.read().decode()
    code = running.proc.wait()
    running.guard.cancel()
    assert code == 130, stderr
    assert stderr == "session s1\nsubagents: the turn ended aborted (user)\n"  # no traceback
    _header, *logged = plain_records(tmp_path / "root", "s1")
    assert logged[-1]["type"] == "turn/end" and logged[-1]["data"]["reason"] == ABORTED_USER


@pytest.mark.slow
def test_a_second_ctrl_c_leaves_at_once_even_when_the_reader_stopped_reading(tmp_path: Path) -> None:
    # The prompt's line is larger than a pipe holds: while this test does not read, the stream
    # cannot finish, so after the first Ctrl-C has drained the runtime the run still waits for
    # its reader. A second Ctrl-C leaves at once: no result line, one line saying so, exit 130.
    running = Running(tmp_path, HANGS, "--session", "s1", "x" * 120_000)
    running.read_until(starts("s1", "turn/start"))
    running.interrupt()
    log = log_file(tmp_path / "root", "s1")
    while b'"reason":{"kind":"aborted","cause":"user"}' not in log.read_bytes():
        # Until the first Ctrl-C's drain is durable (a hang guard, not a wait on time).
        assert running.proc.poll() is None, "the run ended before its reader read"
        time.sleep(0.01)
    running.interrupt()
    code, stdout, stderr = running.finish()
    assert code == 130, stderr
    assert stderr == "session s1\nsubagents: interrupted again: stopped without waiting for the rest\n"
    *whole, cut = stdout.split("\n")  # the last line may be cut where the reader stopped
    records = [json.loads(line) for line in whole]
    assert all(r["type"] != "result" for r in records)
    assert '"type":"result"' not in cut
