"""Permission questions in `chat`: asked during the person's turn on a pipe, and from a background
child while the person is idle at a terminal prompt (the prompt steps aside for the question and
comes back); the answers decide the durable tool results."""

from __future__ import annotations

from pathlib import Path

import pytest
from chat_driver import Chat, Terminal, show_json


def tool_results(root: str, session_id: str) -> list[str]:
    return [e["text"] for e in show_json(root, session_id) if e["type"] == "tool/result"]


WRITE_THEN_RUN = {
    "agents": [
        {
            "responses": [
                {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi\n"}}]},
                {"text": "wrote it"},
                {"tool_calls": [{"name": "run_command", "arguments": {"command": "rm a.txt"}}]},
                {"text": "tried"},
            ]
        }
    ]
}


@pytest.mark.slow  # a real subagents process
def test_on_a_pipe_the_next_line_answers_the_question(tmp_path: Path) -> None:
    # Unconfined, run_command asks (with the sandbox on, a boxed command is allowed: test_sandbox*).
    (tmp_path / "subagents.toml").write_text('[sandbox]\nmode = "off"\n')
    chat = Chat(tmp_path, WRITE_THEN_RUN)
    session = chat.expect(r"^session (\S+) ").group(1)
    chat.line("write it")
    chat.expect(r"^permission \(this session\): write_file\(\{\"path\":\"a.txt\",\"content\":\"hi\\n\"\}\)$")
    chat.line("y")
    chat.expect(r"^\(allowed: write_file\)$")
    chat.expect(r"^assistant: wrote it$")
    chat.line("remove it")
    chat.expect(r"^permission \(this session\): run_command")
    chat.line("no")
    chat.expect(r"^\(denied: run_command\)$")
    chat.expect(r"^assistant: tried$")
    status, _, stderr = chat.finish()
    assert status == 0, stderr
    assert (tmp_path / "a.txt").read_text() == "hi\n"  # the rm was never run
    assert tool_results(chat.root, session) == [
        "created a.txt (3 bytes)",
        "Error: the person declined the permission request",
    ]


CHILD_WRITES = {
    "agents": [
        {
            "responses": [
                {
                    "tool_calls": [
                        {
                            "name": "subagent",
                            "arguments": {"description": "Writer", "prompt": "write", "run_in_background": True},
                        }
                    ]
                },
                {"text": "started it"},
                {"text": "noted the settlement"},
            ]
        },
        {
            "label": "Writer",
            "responses": [
                {
                    "wait_for": {"steered": True},
                    "tool_calls": [{"name": "write_file", "arguments": {"path": "b.txt", "content": "from the child"}}],
                },
                {"text": "child done"},
            ],
        },
    ]
}


@pytest.mark.slow  # a chat on a pseudo-terminal
def test_a_child_asks_while_the_person_is_idle_at_the_terminal_prompt(tmp_path: Path) -> None:
    term = Terminal(tmp_path, CHILD_WRITES)
    term.expect(r"^>")
    term.keys(b"start a writer\r")
    child = term.expect(r"← started subagent (\S+)$").group(1)
    term.expect(r"assistant: started it$")
    term.expect(r"^>")
    term.keys(f"/send {child} go\r".encode())  # the child's held call goes on: it asks to write
    term.expect(rf"permission \(subagent {child}\): write_file\(\{{\"path\":\"b.txt\"")
    term.expect(r"allow\? \[y\]es / \[a\]lways / \[N\]o")
    term.keys(b"a\r")
    term.expect(r"\(allowed: write_file\)")
    term.expect(rf"subagent {child} settled: completed")
    term.expect(r"assistant: noted the settlement")
    term.expect(r"^>")
    term.keys(b"/quit\r")
    assert term.exit_status() == 0
    assert "Traceback" not in term.text()
    assert (tmp_path / "b.txt").read_text() == "from the child"
    assert tool_results(term.root, child) == ["created b.txt (14 bytes)"]
