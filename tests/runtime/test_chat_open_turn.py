"""`chat --session` on a session whose last turn its process left open asks the person whether
the turn goes on (issue 27 item 1): "y" (or Enter) continues it — the lost model call issued again,
its answer shown — and "n" closes it as interrupted; a session with no open turn asks nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from chat_driver import Chat, show_json
from log_lines import header_line, json_line, new_log_file, plain_records

PROMPT = {"id": "m0", "role": "user", "content": [{"type": "text", "text": "summarise"}], "source": {"kind": "user"}}


def _cut_session(tmp_path: Path) -> None:
    """A root session whose turn 1 was cut while its model call was in flight."""
    path = new_log_file(tmp_path / "root", "s1", "none")
    with path.open("ab") as f:
        f.write(header_line("s1"))
        f.write(json_line(0, "turn/start", {"turn": 1}))
        f.write(json_line(1, "step/start", {"turn": 1, "step": 1}))
        f.write(json_line(2, "user/message", {"turn": 1, "step": 1, "message": PROMPT}, surface_op="append"))


SCRIPT = {"agents": [{"session": "s1", "responses": [{"text": "the summary, at last"}]}]}


@pytest.mark.slow  # a real chat process
@pytest.mark.parametrize("answer", ["y", ""])
def test_yes_continues_the_cut_turn(tmp_path: Path, answer: str) -> None:
    _cut_session(tmp_path)
    chat = Chat(tmp_path, SCRIPT, "--session", "s1")
    chat.expect(r"session s1: turn 1 was cut short when its process stopped \(its model call was in flight\)")
    chat.line(answer)
    chat.expect("the summary, at last")
    status, _rest, err = chat.finish()
    assert status == 0, err
    types = [r.get("type") for r in plain_records(tmp_path / "root", "s1")[1:]]
    assert types[3:] == ["turn/continue", "assistant/message", "step/end", "turn/end"]
    ends = [e for e in show_json(chat.root, "s1") if e["type"] == "turn/end"]
    assert [e["reason"]["kind"] for e in ends] == ["completed"]


@pytest.mark.slow  # a real chat process
def test_no_closes_it_as_interrupted_after_asking_again_on_nonsense(tmp_path: Path) -> None:
    _cut_session(tmp_path)
    chat = Chat(tmp_path, SCRIPT, "--session", "s1")
    chat.expect("was cut short")
    chat.line("perhaps")
    chat.expect(r"answer y \(go on with the turn\) or n \(close it as interrupted\)")
    chat.line("n")
    chat.expect("session s1 \\(/help for commands\\)")
    status, _rest, err = chat.finish()
    assert status == 0, err
    records = plain_records(tmp_path / "root", "s1")[1:]
    assert [r["type"] for r in records][3:] == ["step/end", "turn/end"]
    assert records[-1]["data"]["reason"] == {"kind": "interrupted"}


@pytest.mark.slow  # a real chat process
def test_enter_takes_the_configured_close_policy(tmp_path: Path) -> None:
    _cut_session(tmp_path)
    (tmp_path / "subagents.toml").write_text('on_interrupted_turn = "close"\n')
    chat = Chat(tmp_path, SCRIPT, "--session", "s1")
    chat.expect("was cut short")
    chat.line("")
    chat.expect("session s1 \\(/help for commands\\)")
    status, _rest, err = chat.finish()
    assert status == 0, err
    records = plain_records(tmp_path / "root", "s1")[1:]
    assert records[-1]["data"]["reason"] == {"kind": "interrupted"}
    assert "turn/continue" not in [r["type"] for r in records]


@pytest.mark.slow  # a real chat process
def test_a_session_without_an_open_turn_is_not_asked_about(tmp_path: Path) -> None:
    path = new_log_file(tmp_path / "root", "s1", "none")
    with path.open("ab") as f:
        f.write(header_line("s1"))
        f.write(json_line(0, "turn/start", {"turn": 1}))
        f.write(json_line(1, "turn/end", {"turn": 1, "reason": {"kind": "completed"}}))
    chat = Chat(tmp_path, SCRIPT, "--session", "s1")
    chat.expect("session s1 \\(/help for commands\\)")
    status, rest, err = chat.finish()
    assert status == 0, err
    assert "cut short" not in "\n".join(chat.seen) + rest
