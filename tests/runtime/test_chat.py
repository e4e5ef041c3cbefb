"""`subagents chat` (issue 15 item 1, SPEC §8) in a subprocess with a scripted model: lines piped
on stdin (the chat's plain mode), its output read as it comes. Each step waits for the line the
chat prints, never for time; the timeouts only guard against a hang.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chat_driver import TIMEOUT, Chat, Terminal, show_json
from cli_process import CLI, clean_env, write_script

BACKGROUND = {
    "agents": [
        {
            "responses": [
                {"text": "hello person", "usage": {"input_tokens": 10, "output_tokens": 3}},
                {
                    "tool_calls": [
                        {
                            "name": "subagent",
                            "arguments": {"description": "Bg", "prompt": "wait", "run_in_background": True},
                        }
                    ]
                },
                {"text": "started it", "usage": {"input_tokens": 20, "output_tokens": 2}},
                {"text": "noted the settlement"},
            ]
        },
        {"label": "Bg", "responses": [{"wait_for": {"steered": True}, "text": "heard"}, {"text": "child done"}]},
    ]
}

HANG = {
    "agents": [
        {
            "responses": [
                {"hang": True},
                {"text": "after the cancel"},
                {
                    "tool_calls": [
                        {
                            "name": "subagent",
                            "arguments": {"description": "Hang", "prompt": "hang", "run_in_background": True},
                        }
                    ]
                },
                {"text": "started"},
                {"text": "heard it was interrupted"},
            ]
        },
        {"label": "Hang", "responses": [{"hang": True}]},
    ]
}


@pytest.mark.slow
def test_chat_answers_lists_a_background_child_sends_to_it_and_shows_its_notice_turn(tmp_path: Path) -> None:
    chat = Chat(tmp_path, BACKGROUND)
    session = chat.expect(r"^session (\S+) \(/help for commands\)$").group(1)
    chat.line("hi")
    chat.expect(r"^assistant: hello person$")
    chat.line("start a child")
    chat.expect(r"^  → subagent\(")
    child = chat.expect(r"^  ← started subagent (\S+)$").group(1)
    chat.expect(r"^assistant: started it$")
    # The child is held on its script until it is sent a message: running, with its label.
    chat.line("/agents")
    chat.expect(rf"^{re.escape(child)} \[running\] — Bg$")
    chat.line("/usage")
    chat.expect(r"^turn 1: 10 in, 3 out tokens \(1 model call\)$")
    chat.expect(rf"^session {re.escape(session)}: 30 in, 5 out tokens")
    chat.expect(r"^with 1 subagent: ")
    chat.line("/bogus now")
    chat.expect(r"^unknown command /bogus \(try /help\)$")
    chat.line("/send")
    chat.expect(r"^usage: /send ID TEXT$")
    chat.line(f"/send {child} go on")
    chat.expect(rf"^sent to {re.escape(child)}$")
    # The child answers and settles; its notice starts a turn of the session, shown as it runs.
    chat.line("/wait")
    chat.expect(rf"subagent {re.escape(child)} settled: completed$")
    chat.expect(r"^── turn 3 \(notice\)$")
    chat.expect(r"^assistant: noted the settlement$")
    chat.line("/help")
    chat.expect(r"^  /quit ")
    chat.line("/quit")
    status, rest, stderr = chat.finish()
    assert status == 0, (rest, stderr)
    assert stderr == ""
    assert not any("Traceback" in line for line in chat.seen)
    # One line per bad command: nothing between it and the next command's answer.
    bogus = next(i for i, line in enumerate(chat.seen) if line.startswith("unknown command"))
    assert chat.seen[bogus + 1] == "usage: /send ID TEXT"


@pytest.mark.slow  # a real subagents process
def test_chat_watch_shows_a_child_in_place_of_the_session_until_watch_ends(tmp_path: Path) -> None:
    chat = Chat(tmp_path, BACKGROUND)
    session = chat.expect(r"^session (\S+) \(/help for commands\)$").group(1)
    chat.line("hi")
    chat.expect(r"^assistant: hello person$")
    chat.line("start a child")
    child = chat.expect(r"^  ← started subagent (\S+)$").group(1)
    chat.expect(r"^assistant: started it$")
    chat.line("/watch nobody")
    chat.expect(r"^/watch: nobody is not a subagent of this session \(/agents all lists them\)$")
    chat.line(f"/watch {child}")
    chat.expect(rf"^\(watching {re.escape(child)} — Bg: /watch to come back\)$")
    chat.expect(r"^\[Bg\] ── turn 1$")  # its current turn so far, from its log
    chat.line(f"/send {child} go on")
    chat.expect(r"^\[Bg\] assistant: heard$")  # live, in place of the session's lines
    chat.expect(r"^\[Bg\] assistant: child done$")
    chat.line("/wait")  # the session's notice turn runs meanwhile: its lines wait for the watch's end
    chat.line("/watch")
    chat.expect(rf"^\(back to {re.escape(session)}: meanwhile\)$")
    chat.expect(r"^── turn 3 \(notice\)$")
    chat.expect(r"^assistant: noted the settlement$")
    chat.line("/watch")
    chat.expect(r"^usage: /watch ID \(a subagent of this session: /agents all lists them\)$")
    status, rest, stderr = chat.finish()
    assert (status, stderr) == (0, ""), rest
    back = chat.seen.index(f"(back to {session}: meanwhile)")
    # Nothing of the session's was shown between the watch's start and its end.
    watched = chat.seen[chat.seen.index(f"(watching {child} — Bg: /watch to come back)") + 1 : back]
    assert watched and all(line.startswith("[Bg] ") or line.startswith(f"sent to {child}") for line in watched), watched
    # Each reply once, in the order of its log (its live text never shown twice).
    replies = [line for line in watched if line.startswith("[Bg] assistant: ")]
    assert replies == ["[Bg] assistant: heard", "[Bg] assistant: child done"], watched


@pytest.mark.slow
def test_chat_ctrl_c_cancels_the_turn_then_interrupts_a_child_and_resumes(tmp_path: Path) -> None:
    chat = Chat(tmp_path, HANG)
    session = chat.expect(r"^session (\S+) ").group(1)
    chat.line("this will hang")
    chat.expect(r"^── turn 1$")
    chat.proc.send_signal(signal.SIGINT)  # Ctrl-C mid-turn
    chat.expect(r"^── turn 1 ended: aborted user$")
    chat.line("again")
    chat.expect(r"^assistant: after the cancel$")
    chat.line("start a child")
    child = chat.expect(r"^  ← started subagent (\S+)$").group(1)
    chat.expect(r"^assistant: started$")
    chat.line(f"/interrupt {child}")
    chat.expect(rf"^interrupt requested for agent {re.escape(child)}$")  # the tool's words
    chat.line("/wait")
    chat.expect(r"^assistant: heard it was interrupted$")
    chat.line("/interrupt")
    chat.expect(r"^usage: /interrupt ID$")
    chat.line("/interrupt not-a-session")
    chat.expect(r"^/interrupt: ")
    status, rest, stderr = chat.finish()  # end of input at an idle prompt: leave
    assert status == 0, (rest, stderr)
    assert stderr == ""
    ends = [e for e in show_json(chat.root, session) if e["type"] == "turn/end"]
    assert ends[0]["reason"] == {"kind": "aborted", "cause": "user"}
    assert [e["reason"]["kind"] for e in ends[1:]] == ["completed"] * 3

    # Resuming shows the session's last turns, then answers as before.
    again = Chat(
        tmp_path, {"agents": [{"session": session, "responses": [{"text": "back again"}]}]}, "--session", session
    )
    again.expect(r"^assistant: heard it was interrupted$")
    again.expect(rf"^session {re.escape(session)} ")
    again.line("hello again")
    again.expect(r"^assistant: back again$")
    again.line("/quit")
    status, rest, stderr = again.finish()
    assert status == 0, (rest, stderr)
    # Its last three turns (2, 3 and the notice turn 4), not the first.
    assert "user: again" in again.seen
    assert not any("this will hang" in line for line in again.seen)


@pytest.mark.slow  # a real subagents process
def test_chat_ctrl_c_at_an_idle_prompt_leaves_cleanly(tmp_path: Path) -> None:
    chat = Chat(tmp_path, BACKGROUND)
    chat.expect(r"^session (\S+) ")
    chat.line("hi")
    chat.expect(r"^assistant: hello person$")
    chat.proc.send_signal(signal.SIGINT)
    assert chat.proc.wait(timeout=TIMEOUT) == 0


@pytest.mark.slow  # a real subagents process
def test_chat_ctrl_c_at_an_idle_prompt_asks_before_stopping_working_children(tmp_path: Path) -> None:
    chat = Chat(tmp_path, HANG)
    session = chat.expect(r"^session (\S+) ").group(1)
    chat.line("this will hang")
    chat.expect(r"^── turn 1$")
    chat.proc.send_signal(signal.SIGINT)
    chat.expect(r"^── turn 1 ended: aborted user$")
    chat.line("again")
    chat.expect(r"^assistant: after the cancel$")
    chat.line("start a child")
    child = chat.expect(r"^  ← started subagent (\S+)$").group(1)
    chat.expect(r"^assistant: started$")
    asked = rf"^1 subagent still working: {re.escape(child)} — \[s\]top them and leave, \[w\]ait for them"
    chat.proc.send_signal(signal.SIGINT)  # idle, but a child works: asked, not left
    chat.expect(asked)
    chat.line("")  # Enter: stay
    chat.line("/agents")  # the line the interrupted read was reading is not lost either
    chat.expect(rf"^{re.escape(child)} \[running\] — Hang$")
    chat.proc.send_signal(signal.SIGINT)
    chat.expect(asked)
    chat.line("w")
    chat.expect(r"^\(waiting for them; Ctrl-C stops them and leaves\)$")
    chat.proc.send_signal(signal.SIGINT)  # while waiting: stop them and leave
    status, rest, stderr = chat.finish()
    assert (status, stderr) == (0, ""), rest
    ends = [e for e in show_json(chat.root, child) if e["type"] == "turn/end"]
    assert [e["reason"] for e in ends] == [{"kind": "aborted", "cause": "disposed"}]
    assert [e["data"]["reason_kind"] for e in show_json(chat.root, session) if e["type"] == "subagent/settled"] == [
        "aborted"
    ]


@pytest.mark.slow  # a real subagents process
def test_chat_refuses_bad_arguments_in_one_line(tmp_path: Path) -> None:
    for args, message in (
        (["--session", "../escape"], "subagents: "),
        (["--model", "nope:x"], "subagents: "),
    ):
        done = subprocess.run(
            [*CLI, "chat", "--root", str(tmp_path / "root"), *args],
            input="hi\n",
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert done.returncode == 2
        assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr
        assert not (tmp_path / "root").exists()


@pytest.mark.slow  # a real subagents process
def test_only_the_terminal_prompt_imports_prompt_toolkit(tmp_path: Path) -> None:
    """Read-only commands (and piped chat) never load prompt-toolkit: it is imported inside
    `TerminalLines` only."""
    code = (
        "import sys; from subagents.runtime.hosts.cli import entry as cli; from subagents.runtime.hosts.chat import host as chat, terminal as t; "
        "(tmp := sys.argv[1]); __import__('os').makedirs(tmp + '/sessions'); "
        "assert cli.main(['sessions', '--root', tmp]) == 0; "
        "assert 'prompt_toolkit' not in sys.modules; "
        "assert 'prompt_toolkit' not in sys.modules; "
        "t.TerminalLines(t.TerminalOutput()); assert 'prompt_toolkit' in sys.modules"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "r")],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr


# --- on a terminal: prompt-toolkit's prompt in a pseudo-terminal ----------------------------------


@pytest.mark.slow
def test_chat_on_a_terminal_answers_cancels_with_ctrl_c_and_leaves(tmp_path: Path) -> None:
    script = {"agents": [{"responses": [{"text": "hello person"}, {"hang": True}, {"text": "after the cancel"}]}]}
    term = Terminal(tmp_path, script)
    session = term.expect(r"session (\S+) \(/help for commands\)").group(1)
    term.expect(r"^>")
    term.keys(b"hi\r")
    # Lines of a running turn are written above the `steer>` prompt (prompt-toolkit takes it off
    # the screen first), so in this raw byte stream they follow the erased prompt, not a newline.
    term.expect(r"assistant: hello person$")
    term.expect(r"^>")
    term.keys(b"this will hang\r")
    term.expect(r"── turn 2$")
    term.expect(r"steer>")
    term.keys(b"\x03")  # Ctrl-C mid-turn: a key at the steer prompt
    term.expect(r"── turn 2 ended: aborted user$")
    term.expect(r"^>")
    term.keys(b"/nope\r")
    term.expect(r"unknown command /nope \(try /help\)$")
    term.expect(r"^>")
    term.keys(b"again\r")
    term.expect(r"assistant: after the cancel$")
    term.expect(r"^>")
    term.keys(b"/quit\r")
    assert term.exit_status() == 0
    assert "Traceback" not in term.text()
    ends = [e for e in show_json(term.root, session) if e["type"] == "turn/end"]
    assert [e["reason"] for e in ends] == [
        {"kind": "completed"},
        {"kind": "aborted", "cause": "user"},
        {"kind": "completed"},
    ]


@pytest.mark.slow
def test_chat_on_a_terminal_ctrl_c_at_an_idle_prompt_leaves(tmp_path: Path) -> None:
    term = Terminal(tmp_path, {"agents": [{"responses": [{"text": "hello person"}]}]})
    term.expect(r"^>")
    term.keys(b"hi\r")
    term.expect(r"assistant: hello person$")
    term.expect(r"^>")
    term.keys(b"\x03")  # at the prompt prompt-toolkit reads it as a key
    assert term.exit_status() == 0


@pytest.mark.slow
def test_chat_on_a_terminal_shows_a_notice_turn_while_the_person_is_idle(tmp_path: Path) -> None:
    term = Terminal(tmp_path, BACKGROUND)
    term.expect(r"^>")
    term.keys(b"hi\r")
    term.expect(r"assistant: hello person$")
    term.keys(b"start a child\r")
    child = term.expect(r"← started subagent (\S+)$").group(1)
    term.expect(r"assistant: started it$")
    term.expect(r"^>")
    # The bottom toolbar: the session's status and its live tree.
    term.expect(r"· turn 2 · done · 1 child working")
    term.expect(rf"└── {re.escape(child)} \[running\] — Bg")
    term.keys(b"/agents\r")
    term.expect(rf"{re.escape(child)} \[running\] — Bg$")
    term.expect(r"^>")
    term.keys(f"/send {child} go on\r".encode())
    term.expect(rf"sent to {re.escape(child)}$")
    # Nothing more is typed: the child settles and its notice turn is shown at the idle prompt.
    term.expect(rf"subagent {re.escape(child)} settled: completed$")
    term.expect(r"── turn 3 \(notice\)$")
    term.expect(r"assistant: noted the settlement$")
    term.expect(r"^>")
    term.expect(rf"└── {re.escape(child)} \[settled: completed\] — Bg")
    term.keys(b"\x04")  # Ctrl-D at an idle prompt: leave
    assert term.exit_status() == 0


@pytest.mark.slow  # a real subagents process
def test_chat_refuses_a_session_another_chat_holds(tmp_path: Path) -> None:
    first = Chat(tmp_path, BACKGROUND)
    session = first.expect(r"^session (\S+) ").group(1)
    done = subprocess.run(
        [*CLI, "chat", "--root", first.root, "--session", session, "--model", f"scripted:{tmp_path / 's.json'}"],
        input="hi\n",
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 2, done
    assert done.stderr.startswith("subagents: ") and done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""
    first.line("/quit")
    assert first.finish()[0] == 0


# --- the view, in process: streamed text and the durable record -----------------------------------


def _view_events() -> list[Any]:
    from subagents.runtime import StreamEvent
    from subagents.storage import make_event

    def message(seq: int, role: str, text: str, source: str, **extra: Any) -> Any:
        data = {
            "turn": 1,
            "step": 1,
            "message": {
                "id": f"m{seq}",
                "role": role,
                "content": [{"type": "text", "text": text}],
                "source": {"kind": source, **extra},
            },
        }
        if role == "assistant":
            data["finish"] = "stop"
        return StreamEvent("root", make_event(seq, f"{role}/message", 1, data, surface_op="append"))

    return [
        StreamEvent("root", make_event(0, "turn/start", 1, {"turn": 1, "trigger": {"kind": "notice"}})),
        message(1, "user", "a child settled", "subagent-settled", sender_session_id="c1"),
        message(2, "assistant", "hello person", "model"),
        StreamEvent("root", make_event(3, "turn/end", 1, {"turn": 1, "reason": {"kind": "completed"}})),
    ]


def _view(durable: list[int]) -> tuple[Any, Any]:
    import io

    from rich.console import Console
    from subagents.runtime.hosts.chat.view import ChatView as _View

    out = io.StringIO()
    view = _View(Console(file=out, width=200), "root", 0, 0, lambda: durable[0])
    return view, out


def test_the_view_streams_text_after_what_came_before_it_and_ends_it_with_the_record() -> None:
    events = _view_events()
    durable = [2]  # the turn's start and input are durable when the model begins
    view, out = _view(durable)
    view.on_text("root", 0, "hello ")  # before its turn is shown: it waits
    view.on_text("child", 0, "not mine")  # another session's text is not shown
    assert out.getvalue() == ""
    view._show(events[0])
    assert out.getvalue() == "── turn 1 (notice)\n"
    view._show(events[1])
    assert out.getvalue().endswith("subagent-settled: a child settled\nassistant: hello ")
    view.on_text("root", 0, "person")  # live now
    assert out.getvalue().endswith("assistant: hello person")
    view._show(events[2])  # the record ends the line, without repeating the text
    view._show(events[3])
    assert out.getvalue() == "── turn 1 (notice)\nsubagent-settled: a child settled\nassistant: hello person\n"
    assert view.shown == 4 and view.replies == 1


def test_the_view_prints_a_reply_from_the_record_when_nothing_streamed() -> None:
    view, out = _view([0])
    for item in _view_events():
        view._show(item)
    assert "assistant: hello person\n" in out.getvalue()
    # Text of a call whose reply was already printed from the record is dropped, not shown late.
    view.on_text("root", 0, "late")
    view._show(_view_events()[3])
    assert "late" not in out.getvalue()


def test_a_watched_childs_text_streams_by_the_same_rules_and_the_roots_lines_wait() -> None:
    from subagents.runtime import StreamEvent

    view, out = _view([0])
    kid = [StreamEvent("kid", item.event) for item in _view_events()]  # the same events, the child's
    child_durable = [2]
    view.watch("kid", "Kid", [], 0, lambda: child_durable[0])
    assert out.getvalue() == "(watching kid — Kid: /watch to come back)\n"
    view.on_text("kid", 0, "hello ")  # before its turn is shown: it waits
    view.on_text("root", 0, "the root's")  # watching another: the root's text is not shown live
    view._show(_view_events()[0])  # the root's lines wait for the watch's end
    view._show(kid[0])
    view._show(kid[1])
    view.on_text("kid", 0, "person")
    view._show(kid[2])  # ends the streamed line
    view._show(kid[3])
    assert out.getvalue().splitlines()[1:] == [
        "[Kid] ── turn 1 (notice)",
        "[Kid] subagent-settled: a child settled",
        "[Kid] assistant: hello person",
    ]
    for item in _view_events()[1:]:
        view._show(item)
    view.on_text("root", 0, "late")  # its call was muted: its record prints it, once
    view.unwatch()
    assert out.getvalue().splitlines()[4:] == [
        "(back to root: meanwhile)",
        "── turn 1 (notice)",
        "subagent-settled: a child settled",
        "assistant: hello person",
    ]
    assert view.shown == 4 and view.replies == 1


@pytest.mark.slow  # a real subagents process
def test_chat_takes_bytes_that_are_not_utf8_as_a_line(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", {"agents": [{"responses": [{"text": "hello person"}]}]})
    done = subprocess.run(
        [*CLI, "chat", "--root", str(tmp_path / "root"), "--model", model],
        input=b"hi \xff\xfe\n/x\xff\n",
        env=clean_env(),
        capture_output=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    lines = done.stdout.decode().splitlines()
    assert "assistant: hello person" in lines
    assert "unknown command /x\ufffd (try /help)" in lines


@pytest.mark.slow
def test_chat_on_a_terminal_ctrl_c_at_the_prompt_cancels_a_running_notice_turn(tmp_path: Path) -> None:
    script = {
        "agents": [
            {
                "responses": [
                    {
                        "tool_calls": [
                            {
                                "name": "subagent",
                                "arguments": {"description": "Bg", "prompt": "wait", "run_in_background": True},
                            }
                        ]
                    },
                    {"text": "started it"},
                    {"hang": True},  # the notice turn
                ]
            },
            {"label": "Bg", "responses": [{"wait_for": {"steered": True}, "text": "heard"}, {"text": "child done"}]},
        ]
    }
    term = Terminal(tmp_path, script)
    session = term.expect(r"session (\S+) \(/help for commands\)").group(1)
    term.expect(r"^>")
    term.keys(b"start a child\r")
    child = term.expect(r"← started subagent (\S+)$").group(1)
    term.expect(r"assistant: started it$")
    term.expect(r"^>")
    term.keys(f"/send {child} go on\r".encode())
    term.expect(r"── turn 2 \(notice\)$")
    term.expect(r"^>")
    term.keys(b"\x03")  # at the prompt, while the notice turn runs: cancel it, stay
    term.expect(r"turn 2 ended: aborted user$")
    term.expect(r"^>")
    term.keys(b"/quit\r")
    assert term.exit_status() == 0
    ends = [e for e in show_json(term.root, session) if e["type"] == "turn/end"]
    assert [e["reason"] for e in ends] == [{"kind": "completed"}, {"kind": "aborted", "cause": "user"}]


@pytest.mark.slow  # two real chats on a pseudo-terminal
def test_the_line_history_outlives_the_chat(tmp_path: Path) -> None:
    first = Terminal(tmp_path, {"agents": [{"responses": [{"text": "one"}]}]})
    first.expect(r"^>")
    first.keys(b"remember this line\r")
    first.expect(r"assistant: one$")
    first.expect(r"^>")
    first.keys(b"\x04")
    assert first.exit_status() == 0
    assert "remember this line" in (tmp_path / "state" / "subagents" / "chat_history").read_text()

    second = Terminal(tmp_path, {"agents": [{"responses": [{"text": "two"}]}]})
    session = second.expect(r"session (\S+) \(/help for commands\)").group(1)
    second.expect(r"^>")
    second.keys(b"\x1b[A\r")  # up arrow: the last line of the last chat
    second.expect(r"assistant: two$")
    second.expect(r"^>")
    second.keys(b"\x04")
    assert second.exit_status() == 0
    users = [e for e in show_json(second.root, session) if e["type"] == "user/message"]
    assert [e["text"] for e in users] == ["remember this line"]


@pytest.mark.slow  # a chat on a pseudo-terminal
def test_chat_on_a_terminal_interrupts_a_child_and_shows_its_notice_turn(tmp_path: Path) -> None:
    script = {
        "agents": [
            {
                "responses": [
                    {
                        "tool_calls": [
                            {
                                "name": "subagent",
                                "arguments": {"description": "Hang", "prompt": "hang", "run_in_background": True},
                            }
                        ]
                    },
                    {"text": "started"},
                    {"text": "heard it was interrupted"},
                ]
            },
            {"label": "Hang", "responses": [{"hang": True}]},
        ]
    }
    term = Terminal(tmp_path, script)
    session = term.expect(r"session (\S+) \(/help for commands\)").group(1)
    term.expect(r"^>")
    term.keys(b"start a child\r")
    child = term.expect(r"← started subagent (\S+)$").group(1)
    term.expect(r"assistant: started$")  # above the steer prompt
    term.expect(r"^>")
    term.keys(f"/interrupt {child}\r".encode())
    term.expect(rf"interrupt requested for agent {re.escape(child)}")
    # The child's turn ends aborted; its settlement starts a notice turn at the idle prompt.
    term.expect(rf"subagent {re.escape(child)} settled: aborted")
    term.expect(r"assistant: heard it was interrupted")
    term.expect(r"^>")
    term.keys(b"/quit\r")
    assert term.exit_status() == 0
    assert "Traceback" not in term.text()
    child_ends = [e["reason"] for e in show_json(term.root, child) if e["type"] == "turn/end"]
    assert child_ends == [{"kind": "aborted", "cause": "parent"}]  # interrupted by its parent's session
    entries = show_json(term.root, session)
    notice = next(e for e in entries if e["type"] == "user/message" and e["source"] == "subagent-settled")
    assert notice["text"] == f"Background subagent {child} was stopped before it finished.\nIt left no closing message."
    starts = [e["trigger"] for e in entries if e["type"] == "turn/start"]
    assert starts == ["message", "notice"]


@pytest.mark.slow  # a chat on a pseudo-terminal
def test_chat_on_a_terminal_ctrl_c_at_the_prompt_asks_and_s_stops_the_children(tmp_path: Path) -> None:
    script = {
        "agents": [
            {
                "responses": [
                    {
                        "tool_calls": [
                            {
                                "name": "subagent",
                                "arguments": {"description": "Hang", "prompt": "hang", "run_in_background": True},
                            }
                        ]
                    },
                    {"text": "started"},
                ]
            },
            {"label": "Hang", "responses": [{"hang": True}]},
        ]
    }
    term = Terminal(tmp_path, script)
    term.expect(r"^>")
    term.keys(b"start a child\r")
    child = term.expect(r"← started subagent (\S+)$").group(1)
    term.expect(r"assistant: started$")  # above the steer prompt
    term.expect(r"^>")
    term.keys(b"\x1bOQ")  # F2: watch the next working subagent
    term.expect(rf"\(watching {re.escape(child)} — Hang: /watch to come back\)")
    term.expect(r"^>")
    term.keys(b"\x1bOQ")  # F2 past the last one: back to the session
    term.expect(r"\(back to ")
    term.expect(r"^>")
    term.keys(b"\x03")  # Ctrl-C at the prompt while the child works: a question, not a silent stop
    term.expect(rf"1 subagent still working: {re.escape(child)}")
    term.expect(r"leave\? \[s/w/Enter\]")
    term.keys(b"s\r")
    assert term.exit_status() == 0
    assert "Traceback" not in term.text()
    child_ends = [e["reason"] for e in show_json(term.root, child) if e["type"] == "turn/end"]
    assert child_ends == [{"kind": "aborted", "cause": "disposed"}]


@pytest.mark.slow  # a chat on a pseudo-terminal
def test_chat_on_a_terminal_steers_the_running_turn_and_esc_interrupts_it(tmp_path: Path) -> None:
    script = {
        "agents": [
            {
                "responses": [
                    {"wait_for": {"steered": True}, "text": "heard the first"},
                    {"text": "took the steer"},
                    {"hang": True},
                    {"text": "after esc"},
                ]
            }
        ]
    }
    term = Terminal(tmp_path, script)
    session = term.expect(r"session (\S+) \(/help for commands\)").group(1)
    term.expect(r"^>")
    term.keys(b"do the thing\r")
    term.expect(r"steer>")  # the turn runs; the prompt stays up for steering
    term.keys(b"also mind the tests\r")
    term.expect(r"you \(steering\): also mind the tests")
    term.expect(r"assistant: took the steer")
    term.expect(r"^>")
    term.keys(b"hang now\r")
    term.expect(r"── turn 2")
    term.expect(r"steer>")
    term.keys(b"\x1b")  # Esc: interrupts the running turn
    term.expect(r"── turn 2 ended: aborted user")
    term.expect(r"^>")
    term.keys(b"again\r")
    term.expect(r"assistant: after esc")
    term.expect(r"^>")
    term.keys(b"/quit\r")
    assert term.exit_status() == 0
    assert "Traceback" not in term.text()
    entries = show_json(term.root, session)
    users, turn = [], None
    for e in entries:
        if e["type"] == "turn/start":
            turn = e["turn"]
        elif e["type"] == "user/message":
            users.append((turn, e["text"]))
    assert users == [(1, "do the thing"), (1, "also mind the tests"), (2, "hang now"), (3, "again")]
    ends = [e["reason"] for e in entries if e["type"] == "turn/end"]
    assert ends == [{"kind": "completed"}, {"kind": "aborted", "cause": "user"}, {"kind": "completed"}]


def test_a_line_that_cuts_a_streamed_reply_short_leaves_its_record_printed_whole() -> None:
    view, out = _view([2])
    events = _view_events()
    view._show(events[0])
    view._show(events[1])
    view.on_text("root", 0, "hello ")
    view.say("  ⋯ c1 working (turn 1)", "dim")  # a descendant's line arrives meanwhile
    view.on_text("root", 0, "person")  # the rest of the cut reply is not shown in a new half
    view._show(events[2])
    assert out.getvalue().splitlines()[2:] == [
        "assistant: hello ",
        "  ⋯ c1 working (turn 1)",
        "assistant: hello person",
    ]
