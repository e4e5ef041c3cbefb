"""The mailbox across processes (issue 17, "Show"): a `chat` hosts a parent with a background
child; `subagents send` / `interrupt` / `stop` / `tail -f` run in other processes; the child
reacts and its log records each delivery once. A host SIGKILLed after a delivery and before its
ack records it exactly once after the restart.

Every wait is on another process's output (a line of the chat, of `tail -f`, of `run --stream`),
bounded by `TIMEOUT` real seconds that only a hang reaches."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from chat_driver import TIMEOUT, Chat, LineProcess
from cli_process import CLI, clean_env, write_script
from mailboxes import rel_mailbox

Json = dict[str, Any]


def _script(child: list[Json]) -> Json:
    background = {"description": "Bg", "prompt": "wait", "run_in_background": True}
    return {
        "agents": [
            {
                "responses": [
                    {"tool_calls": [{"name": "subagent", "arguments": background}]},
                    {"text": "started it"},
                    {"text": "noted the settlement"},
                ]
            },
            {"label": "Bg", "responses": child},
        ]
    }


def _cli(root: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args[:1], "--root", root, *args[1:]],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


class _Lines(LineProcess):
    """A subprocess whose stdout lines are read in a thread (`expect`), stopped by a signal."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        super().__init__(argv, cwd, clean_env())

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=TIMEOUT)


def _log(root: str, sid: str) -> list[Json]:
    done = _cli(root, "tail", sid)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _run_key(child: str, events: list[Json]) -> str:
    """The run key of the child's settlement: `<child>@<seq of its last turn/end>` (issue 27)."""
    return f"{child}@{[e['seq'] for e in events if e['type'] == 'turn/end'][-1]}"


def _pending(root: str, sid: str) -> list[str]:
    folder = Path(root) / rel_mailbox(sid)
    return sorted(p.name for p in folder.glob("*.json")) if folder.is_dir() else []


def _wait_for_files(holds: Callable[[], bool], process: subprocess.Popen[str]) -> None:
    """Until `holds()`: a bounded poll of files another process changes (an ack removes a file;
    there is no event to wait on across processes)."""
    deadline = time.monotonic() + TIMEOUT
    while not holds():
        assert process.poll() is None, "the host ended first"
        assert time.monotonic() < deadline, "the host never acknowledged"
        time.sleep(0.02)


def _delivered(out: str, kind: str, sid: str) -> str:
    match = re.fullmatch(rf"{kind} ([0-9A-Z]{{26}}) delivered to session {re.escape(sid)} \((.*)\)\n", out)
    assert match is not None, out
    assert match.group(2) == "live in another process, which records it"
    return match.group(1)


@pytest.mark.slow  # three processes: a chat host, tail -f, and the operator commands
def test_send_and_interrupt_reach_a_child_another_process_hosts(tmp_path: Path) -> None:
    child_script = [{"wait_for": {"steered": True}, "text": "heard"}, {"hang": True}]
    chat = Chat(tmp_path, _script(child_script))
    session = chat.expect(r"^session (\S+) \(/help for commands\)$").group(1)
    chat.line("start a child")
    child = chat.expect(r"^  ← started subagent (\S+)$").group(1)
    chat.expect(r"^assistant: started it$")
    tail = _Lines([*CLI, "tail", "--root", chat.root, "-f", child], tmp_path)
    try:
        tail.expect(r'"type":"turn/start"')  # what was written before it started is printed too

        sent = _cli(chat.root, "send", child, "hello from outside")
        assert sent.returncode == 0 and sent.stderr == "", sent
        delivery = _delivered(sent.stdout, "send", child)
        # The child's owner steers it in: its scripted wait ends, and the next step records it.
        tail.expect(rf'"type":"user/message".*"delivery_id":"{delivery}"')

        stopped = _cli(chat.root, "interrupt", child)
        assert stopped.returncode == 0 and stopped.stderr == "", stopped
        interrupt = _delivered(stopped.stdout, "interrupt", child)
        tail.expect(r'"type":"turn/end".*"reason":\{"kind":"aborted","cause":"user"\}')
        # Interrupted and with nothing queued, the child settles; its notice reaches the parent.
        chat.expect(r"^assistant: noted the settlement$")
    finally:
        tail.stop()
    status, rest, stderr = chat.finish()
    assert status == 0, (rest, stderr)
    assert "Traceback" not in stderr

    events = _log(chat.root, child)
    assert [e["data"].get("delivery_id") for e in events if e["type"] == "user/message"] == [None, delivery]
    assert [e["data"]["reason"] for e in events if e["type"] == "turn/end"] == [{"kind": "aborted", "cause": "user"}]
    assert interrupt not in json.dumps(events)  # an interrupt is recorded by the turn/end it caused
    assert _pending(chat.root, child) == []  # both acked
    settled = [e["data"] for e in _log(chat.root, session) if e["type"] == "subagent/settled"]
    key = _run_key(child, events)
    assert settled == [{"child_id": child, "reason_kind": "aborted", "closing_text": "heard", "run_key": key}]


@pytest.mark.slow  # two processes: a chat host and the operator's stop
def test_stop_ends_the_childs_turn_aborted_and_settles_it(tmp_path: Path) -> None:
    chat = Chat(tmp_path, _script([{"hang": True}]))
    session = chat.expect(r"^session (\S+) \(/help for commands\)$").group(1)
    chat.line("start a child")
    child = chat.expect(r"^  ← started subagent (\S+)$").group(1)
    chat.expect(r"^assistant: started it$")
    done = _cli(chat.root, "stop", child)
    assert done.returncode == 0 and done.stderr == "", done
    _delivered(done.stdout, "stop", child)
    chat.expect(r"^assistant: noted the settlement$")
    status, rest, stderr = chat.finish()
    assert status == 0, (rest, stderr)
    events = _log(chat.root, child)
    assert [e["data"]["reason"] for e in events if e["type"] == "turn/end"] == [{"kind": "aborted", "cause": "user"}]
    settled = [e["data"] for e in _log(chat.root, session) if e["type"] == "subagent/settled"]
    assert settled == [{"child_id": child, "reason_kind": "aborted", "run_key": _run_key(child, events)}]
    assert _pending(chat.root, child) == []
    # Now nobody runs it: interrupt and stop say so, and leave nothing behind.
    for command in ("interrupt", "stop"):
        cold = _cli(chat.root, command, child)
        assert (cold.returncode, cold.stdout, cold.stderr) == (
            0,
            f"session {child} is not running: nothing to {command}\n",
            "",
        )
    assert _pending(chat.root, child) == []


@pytest.mark.slow  # a host SIGKILLed mid-turn, then restarted twice
def test_a_delivery_survives_a_sigkilled_host_and_is_recorded_exactly_once(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    # The killed turn is closed on resume (since issue 27 the default continues it).
    (tmp_path / "subagents.toml").write_text('on_interrupted_turn = "close"\n')

    def run(script: Json, *prompt: str) -> _Lines:
        model = write_script(tmp_path / "s.json", script)
        argv = [*CLI, "run", "--root", root, "--session", "main", "--model", model, "--stream", *prompt]
        return _Lines(argv, tmp_path)

    host = run({"agents": [{"responses": [{"hang": True}]}]}, "hang here")
    host.expect(r'"type":"user/message"')  # its turn is in its (hung) model call
    sent = _cli(root, "send", "main", "are you there")
    assert sent.returncode == 0, sent
    delivery = _delivered(sent.stdout, "send", "main")
    envelope = (Path(root) / rel_mailbox("main") / f"{delivery}.json").read_bytes()
    host.stop(signal.SIGKILL)  # after the delivery, before any record or ack: its step never ends

    # The restarted host (a chat, which stays) records it in a turn of its own, then acks it.
    again = Chat(tmp_path, {"agents": [{"responses": [{"text": "ONE"}]}]}, "--session", "main")
    # Since issue 27 a chat asks about the turn the kill left open; Enter takes the policy (close).
    again.expect(r"was cut short when its process stopped")
    again.line("")
    again.expect(r"^assistant: ONE$")
    _wait_for_files(lambda: _pending(root, "main") == [], again.proc)
    status, rest, stderr = again.finish()
    assert status == 0, (rest, stderr)

    # The state a crash between the record and its ack leaves: the envelope is back. Junk
    # beside it never stops the session: moved aside, with a reason.
    folder = Path(root) / rel_mailbox("main")
    (folder / f"{delivery}.json").write_bytes(envelope)
    (folder / "notes.txt").write_text("not an envelope")
    (folder / "01M24BB8G0041061050R3GG28A.json").write_bytes(b'{"delivery_id": "01M24BB8G00')  # torn
    third = Chat(tmp_path, {"agents": [{"responses": []}]}, "--session", "main")
    third.expect(r"^session main ")
    _wait_for_files(lambda: _pending(root, "main") == [], third.proc)
    status, rest, stderr = third.finish()
    assert status == 0, (rest, stderr)

    events = _log(root, "main")
    recorded = [e for e in events if e["type"] == "user/message" and e["data"].get("delivery_id") == delivery]
    assert len(recorded) == 1
    assert recorded[0]["data"]["message"]["content"] == [{"type": "text", "text": "are you there"}]
    ends = [e["data"]["reason"]["kind"] for e in events if e["type"] == "turn/end"]
    assert ends == ["interrupted", "completed"]  # the killed turn closed on resume; the message's
    assert sorted(p.name for p in (folder / "rejected").iterdir()) == [
        "01M24BB8G0041061050R3GG28A.json",
        "01M24BB8G0041061050R3GG28A.json.reason",
        "notes.txt",
        "notes.txt.reason",
    ]


@pytest.mark.slow  # five `send` processes at once, then `tail`
def test_concurrent_sends_to_a_session_nobody_runs_are_each_recorded_once(tmp_path: Path) -> None:
    """Issue 27: five `send`s at once to a session nobody runs. One resumes it and runs the
    turn; each of the others either found it held or lost the race for its open (not a usage
    error): it goes through the mailbox and waits until its message is recorded — resuming the
    session itself if the holder let go first. All exit 0; each message is recorded once."""
    root = str(tmp_path / "root")
    model = write_script(tmp_path / "s.json", {"agents": [{"session": "main", "responses": [{"text": "ok"}] * 40}]})
    made = _cli(root, "run", "--model", model, "--session", "main", "hello")
    assert made.returncode == 0, made.stderr
    texts = [f"message {i}" for i in range(5)]
    sends = [
        subprocess.Popen(
            [*CLI, "send", "--root", root, "--model", model, "main", text],
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for text in texts
    ]
    outcomes = [(p.wait(timeout=TIMEOUT), *p.communicate()) for p in sends]
    assert [code for code, _out, _err in outcomes] == [0] * 5, outcomes
    assert all("Traceback" not in err and "already owned" not in err for _c, _o, err in outcomes), outcomes
    recorded = [
        block["text"]
        for e in _log(root, "main")
        if e["type"] == "user/message"
        for block in e["data"]["message"]["content"]
    ]
    assert sorted(t for t in recorded if t.startswith("message ")) == texts, recorded
    assert _pending(root, "main") == []


def _run_with_a_hung_child(tmp_path: Path, child: list[Json]) -> tuple[str, _Lines, str]:
    """A `run --stream` whose parent starts a background child, ends its turn and waits for the
    child, which is in its (hung) model call; the root, the run and the child's id."""
    root = str(tmp_path / "root")
    model = write_script(tmp_path / "s.json", _script(child))
    run = _Lines([*CLI, "run", "--root", root, "--model", model, "--stream", "start a child"], tmp_path)
    child_id = run.expect(r'"type":"subagent/catalog".*"child_id":"([^"]+)"').group(1)
    run.expect(rf'"session_id":"{re.escape(child_id)}".*"type":"user/message"')  # its model call is next
    return root, run, child_id


@pytest.mark.slow  # a run hosting a parent and its child; the operator's send and interrupt
def test_a_message_sent_before_an_interrupt_is_recorded_and_answered(tmp_path: Path) -> None:
    """Issue 27: `send CHILD` to a running child, then `interrupt CHILD`: the turn ends aborted,
    and the message — parked before, unrecorded, with nothing to wake the child: the parent's
    `run` hung — starts the child's next turn, which answers it; the child settles and the run
    ends."""
    root, run, child = _run_with_a_hung_child(tmp_path, [{"hang": True}, {"text": "answered it"}])
    sent = _cli(root, "send", child, "do this instead")
    assert sent.returncode == 0, sent
    delivery = _delivered(sent.stdout, "send", child)
    stopped = _cli(root, "interrupt", child)
    assert stopped.returncode == 0, stopped
    assert run.proc.wait(timeout=TIMEOUT) == 0, run.seen
    events = _log(root, child)
    assert [e["data"]["reason"] for e in events if e["type"] == "turn/end"] == [
        {"kind": "aborted", "cause": "user"},
        {"kind": "completed"},
    ]
    (message,) = [e for e in events if e["type"] == "user/message" and e["data"].get("delivery_id") == delivery]
    assert message["data"]["turn"] == 2
    parent = json.loads(run.seen[0])["session_id"]
    settled = [e["data"] for e in _log(root, parent) if e["type"] == "subagent/settled"]
    assert settled == [
        {
            "child_id": child,
            "reason_kind": "completed",
            "closing_text": "answered it",
            "run_key": _run_key(child, events),
        }
    ]
    assert _pending(root, child) == []


@pytest.mark.slow  # a run hosting a parent and its child; the operator's send and stop
def test_a_message_sent_before_a_stop_is_recorded_before_the_settlement(tmp_path: Path) -> None:
    """Issue 27: `send CHILD` to a running child, then `stop CHILD`: the message — orphaned in
    the mailbox for good before — is recorded in the child's log (no model answers it), the
    child settles `aborted` once, the parent is noticed and the run ends."""
    root, run, child = _run_with_a_hung_child(tmp_path, [{"hang": True}, {"text": "NEVER"}])
    sent = _cli(root, "send", child, "one more thing")
    assert sent.returncode == 0, sent
    delivery = _delivered(sent.stdout, "send", child)
    stopped = _cli(root, "stop", child)
    assert stopped.returncode == 0, stopped
    assert run.proc.wait(timeout=TIMEOUT) == 0, run.seen
    events = _log(root, child)
    assert len([e for e in events if e["type"] == "user/message" and e["data"].get("delivery_id") == delivery]) == 1
    assert {e["data"]["reason"]["kind"] for e in events if e["type"] == "turn/end"} == {"aborted"}
    assert "NEVER" not in json.dumps(events)
    message_at = next(i for i, e in enumerate(events) if e["data"].get("delivery_id") == delivery)
    assert max(i for i, e in enumerate(events) if e["type"] == "session/stopped") > message_at  # still stopped
    parent = json.loads(run.seen[0])["session_id"]
    parent_events = _log(root, parent)
    settled = [e for e in parent_events if e["type"] == "subagent/settled"]
    assert [e["data"] for e in settled] == [
        {"child_id": child, "reason_kind": "aborted", "run_key": _run_key(child, events)}
    ]
    # Recorded before the settlement: the run key names the child's last turn/end, which
    # follows the message.
    assert int(settled[0]["data"]["run_key"].rsplit("@", 1)[1]) > events.index(
        next(e for e in events if e["data"].get("delivery_id") == delivery)
    )
    notices = [
        e
        for e in parent_events
        if e["type"] == "user/message" and e["data"]["message"]["source"]["kind"] == "subagent-settled"
    ]
    assert len(notices) == 1
    assert _pending(root, child) == []
