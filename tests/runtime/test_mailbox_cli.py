"""The operator commands in-process (issue 17 item 3; runtime/hosts/cli/operator.py): a cold `send`
is queued in the mailbox, a cold `interrupt`/`stop` says "not running" and leaves nothing, `tail`
prints the durable events as JSON lines; bad input is one line with exit 2, a damaged session
exit 1. (Sessions live in another process: tests/runtime/test_mailbox_processes.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from log_lines import header_line, json_line, log_file, new_log_file
from mailboxes import rel_mailbox
from subagents.runtime.hosts.cli import main
from subagents.storage.envelope import decode_envelope


def _run(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own exits
        code = exc.code  # type: ignore[assignment]  # SystemExit.code is an int here
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    path = new_log_file(root, "main", "none")
    with path.open("ab") as f:
        f.write(header_line("main"))
        f.write(json_line(0, "turn/start", {"turn": 1}))
        f.write(json_line(1, "turn/end", {"turn": 1, "reason": {"kind": "completed"}}))
    return root


def _mailbox(root: Path, sid: str) -> list[Path]:
    folder = root / rel_mailbox(sid)
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def test_a_cold_send_with_queue_is_queued_for_the_next_host(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, ["send", "--root", str(root), "--queue", "main", "hello there"])
    assert (code, err) == (0, "")
    match = re.fullmatch(r"send ([0-9A-Z]{26}) delivered to session main \((.*)\)\n", out)
    assert match is not None and match.group(2) == "not running: the next host that resumes it records it"
    (path,) = _mailbox(root, "main")
    envelope = decode_envelope(path.read_bytes(), path.name)
    assert (envelope.delivery_id, envelope.kind, envelope.sender, envelope.body) == (
        match.group(1),
        "message",
        None,
        {"text": "hello there"},
    )


def test_a_cold_send_is_answered_here_as_run_session_would(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"agents": [{"session": "main", "responses": [{"text": "answered here"}]}]}))
    args = ["send", "--root", str(root), "--model", f"scripted:{script}", "main", "hello there"]
    code, out, err = _run(capsys, args)
    assert (code, out, err) == (0, "answered here\n", "session main\n")  # as `run` prints them
    assert _mailbox(root, "main") == []  # resumed here: nothing queued
    code, out, err = _run(capsys, ["tail", "--root", str(root), "main"])
    texts = [
        block["text"]
        for line in out.splitlines()
        if (event := json.loads(line))["type"] in ("user/message", "assistant/message")
        for block in event["data"]["message"]["content"]
    ]
    assert texts == ["hello there", "answered here"]


def test_a_cold_send_to_a_damaged_session_is_one_line(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"agents": [{"responses": [{"text": "never"}]}]}))
    log_file(root, "main").write_bytes(b"not a log\n")
    code, out, err = _run(capsys, ["send", "--root", str(root), "--model", f"scripted:{script}", "main", "hi"])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("subagents: session 'main' is corrupt")
    assert _mailbox(root, "main") == []


@pytest.mark.parametrize("command", ["interrupt", "stop"])
def test_a_cold_interrupt_or_stop_is_not_running(root: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, out, err = _run(capsys, [command, "--root", str(root), "main"])
    assert (code, out, err) == (0, f"session main is not running: nothing to {command}\n", "")
    assert _mailbox(root, "main") == []  # nothing left that could stop a later turn


def test_tail_prints_the_durable_events_as_json_lines(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, ["tail", "--root", str(root), "main"])
    assert (code, err) == (0, "")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(e["session_id"], e["seq"], e["type"]) for e in lines] == [
        ("main", 0, "turn/start"),
        ("main", 1, "turn/end"),
    ]


BAD_INPUT = {
    "send-unknown": (["send", "--root", "{root}", "nobody", "hi"], 2, "not found"),
    "interrupt-unknown": (["interrupt", "--root", "{root}", "nobody"], 2, "not found"),
    "stop-unknown": (["stop", "--root", "{root}", "nobody"], 2, "not found"),
    "tail-unknown": (["tail", "--root", "{root}", "nobody"], 2, "not found"),
    "send-invalid-id": (["send", "--root", "{root}", "bad\x01id", "hi"], 2, "control character"),
    "tail-invalid-id": (["tail", "--root", "{root}", "bad\x01id"], 2, "control character"),
    "send-bad-root": (["send", "--root", "{root}/absent", "main", "hi"], 2, "not a subagents root"),
    "send-missing-text": (["send", "--root", "{root}", "main"], 2, "TEXT"),
    "stop-missing-id": (["stop", "--root", "{root}"], 2, "ID"),
    "send-damaged": (["send", "--root", "{root}", "--queue", "main", "hi"], 1, "damaged"),
    "tail-damaged": (["tail", "--root", "{root}", "main"], 1, "main"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_one_line(root: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    args, status, word = BAD_INPUT[case]
    if "damaged" in case:
        log_file(root, "main").write_bytes(b"not a log\n")
    code, out, err = _run(capsys, [a.format(root=root) for a in args])
    assert code == status, (out, err)
    assert err.count("\n") == 1 and err.startswith("subagents: ") and word in err, err
    assert "Traceback" not in err
    assert _mailbox(root, "main") == [] and _mailbox(root, "nobody") == []
