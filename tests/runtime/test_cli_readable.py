"""A CLI a person can read (issue 13, item 7): ISO times, located damage with exit status 1, a
fork's inherited prefix marked, help for every positional, and every exit-2 error on one line.
(`run` naming its session on stderr and the table headers are checked in test_cli_run.py and
test_cli.py.)"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

import pytest
from events import seed_marker, turn_end_event
from log_lines import header
from subagents.runtime.hosts.cli import build_parser, iso_time, main
from subagents.runtime.hosts.cli import entry as cli
from subagents.storage import Batch, FileLogStore, make_event

HEADER = '{"type":"session","format":1,"id":"%s","created_at":1796131041123,"is_seeded":false,"inherited_event_count":0,"delegation_depth":0}'


def _plain_log(root: Path, sid: str, *lines: str) -> Path:
    folder = root / "sessions" / sid
    folder.mkdir(parents=True)
    log = folder / "session.jsonl"
    log.write_text("\n".join([HEADER % sid, *lines]) + "\n")
    return log


def _run(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own exits
        code = exc.code  # type: ignore[assignment]  # argparse exits with an int code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_times_are_iso_8601_in_utc() -> None:
    assert iso_time(1796131041123) == "2026-12-01T13:17:21.123Z"
    assert iso_time(0) == "1970-01-01T00:00:00.000Z"
    assert iso_time(None) == "-"
    assert iso_time(2**62) == str(2**62)  # beyond any calendar: the number as it is


def test_sessions_table_shows_iso_times(tmp_path: Path, capsys) -> None:
    _plain_log(tmp_path, "a", '{"seq":0,"type":"turn/start","time":1796131042456,"data":{"turn":1}}')
    # LAST EVENT (issue 29): the last event's own time, not when its file was last written.
    log = tmp_path / "sessions" / "a" / "session.jsonl"
    os.utime(log, ns=(1796131099999_000_000, 1796131099999_000_000))
    code, out, err = _run(capsys, ["sessions", "--root", str(tmp_path)])
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "ID  CREATED                   ORIGIN  PARENT  DEPTH  EVENTS  STATE      LAST EVENT                DAMAGE",
        "a   2026-12-01T13:17:21.123Z  -       -       0      1       persisted  2026-12-01T13:17:22.456Z  -",
    ]


# --- damage: exit 1, one line, located -----------------------------------------------------


def test_show_of_a_damaged_log_names_where_and_exits_1(tmp_path: Path, capsys) -> None:
    _plain_log(
        tmp_path,
        "torn-inside",
        '{"seq":0,"type":"turn/start","time":1,"data":{"turn":1}}',
        '{"seq":1,"type":"turn/start","time":1,"data":{"tu',  # a complete line that is not JSON
        '{"seq":2,"type":"turn/start","time":1,"data":{"turn":2}}',
    )
    code, out, err = _run(capsys, ["show", "torn-inside", "--root", str(tmp_path)])
    assert (code, out) == (1, "")
    [line] = err.splitlines()
    assert line.startswith("subagents: ") and "torn-inside" in line and "corrupt" in line
    assert "seq " in line or "byte offset " in line, line
    assert "Traceback" not in err


def test_show_of_a_malformed_payload_names_its_seq_and_exits_1(tmp_path: Path, capsys) -> None:
    # A user/message whose message has no id: the envelope is fine, the payload is not.
    message = '{"role":"user","content":[{"type":"text","text":"hi"}],"source":{"kind":"user"}}'
    _plain_log(
        tmp_path,
        "bad-payload",
        '{"seq":0,"type":"turn/start","time":1,"data":{"turn":1}}',
        '{"seq":1,"type":"user/message","time":1,"data":{"message":' + message + "}}",
    )
    code, out, err = _run(capsys, ["show", "bad-payload", "--root", str(tmp_path)])
    assert (code, out) == (1, "")
    [line] = err.splitlines()
    assert "bad-payload" in line and "seq 1" in line, line


def test_unknown_session_stays_exit_2(tmp_path: Path, capsys) -> None:
    _plain_log(tmp_path, "a")
    code, _, err = _run(capsys, ["show", "nobody", "--root", str(tmp_path)])
    assert (code, err) == (2, 'subagents: session "nobody" not found\n')


# --- a fork's inherited prefix --------------------------------------------------------------


def test_show_marks_a_forks_inherited_prefix(tmp_path: Path, capsys) -> None:
    store = FileLogStore(str(tmp_path))
    fork_header = header("fork", 5, is_seeded=True, parent_session="origin", origin="subagent")
    handle = store.create(fork_header, inherited_event_count=2)
    store.append(
        handle,
        [
            Batch(
                0,
                [
                    make_event(0, "turn/start", 1, {"turn": 1}),
                    turn_end_event(1, 2, 1),
                    seed_marker(2, 3),
                    make_event(3, "turn/start", 4, {"turn": 2}),
                    turn_end_event(4, 5, 2),
                ],
            )
        ],
    )
    store.close(handle)
    store.close_store()
    code, out, err = _run(capsys, ["show", "fork", "--root", str(tmp_path)])
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "--- inherited from origin (events 0..1) ---",
        "── turn 1",
        "── end of turn 1: completed",
        "--- own (from event 2) ---",
        "── turn 2",
        "── end of turn 2: completed",
    ]
    code, out, _ = _run(capsys, ["show", "fork", "--json", "--root", str(tmp_path)])
    entries = json.loads(out)
    assert entries[0] == {"type": "inherited", "from": "origin", "first_seq": 0, "last_seq": 1}
    assert {"type": "own", "first_seq": 2} in entries


# --- help and one-line usage errors ---------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_positional_argument_has_a_help_text(capsys) -> None:
    commands = _subparsers(build_parser())
    seen = 0
    for name, sub in commands.items():
        for action in sub._actions:
            if action.option_strings:
                continue
            seen += 1
            assert action.help, (name, action.dest)
            code, out, _ = _run(capsys, [name, "--help"])
            assert code == 0
            assert action.help.split(":")[0] in " ".join(out.split()), (name, action.help)
    assert (
        seen == 15
    )  # children, agents, scenario (2), show, run, resume, send (2), interrupt, stop, tail, store (2), import
    top = [a for a in build_parser()._actions if not a.option_strings]
    assert [a.help for a in top] == ["what to do (each takes --help)"]  # COMMAND
    code, out, _ = _run(capsys, ["--help"])
    assert code == 0 and "what to do" in out


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    _plain_log(tmp_path / "root", "p", '{"seq":0,"type":"turn/start","time":1,"data":{"turn":1}}')
    return tmp_path / "root"


BAD_INPUT = {
    "unknown-session": (["show", "nobody", "--root", "{root}"], "not found"),
    "unknown-parent": (["children", "nobody", "--root", "{root}"], "not found"),
    "invalid-id": (["agents", "bad\x01id", "--root", "{root}"], "control character"),
    "bad-root": (["sessions", "--root", "{tmp}/absent"], "not a subagents root"),
    "bad-script": (["run", "--root", "{tmp}/new", "--model", "scripted:{tmp}/none.json", "hi"], "none.json"),
    "unknown-model-scheme": (["run", "--root", "{tmp}/new", "--model", "mistral:x", "hi"], "mistral"),
    "missing-key": (["run", "--root", "{tmp}/new", "--model", "openai:m", "hi"], "OPENAI_API_KEY"),
    "missing-anthropic-key": (["run", "--root", "{tmp}/new", "--model", "anthropic:m", "hi"], "ANTHROPIC_API_KEY"),
    "bad-anthropic-option": (["run", "--root", "{tmp}/new", "--model", "anthropic:m,thinking=x", "hi"], "thinking"),
    "bad-compression": (["run", "--root", "{tmp}/new", "--compression", "xz", "hi"], "xz"),
    "missing-prompt": (["run", "--root", "{tmp}/new"], "PROMPT"),
    "missing-parent": (["children"], "PARENT_ID"),
    "missing-scenario-args": (["scenario"], "required"),
    "bad-scenario-action": (["scenario", "walk", "x"], "walk"),
    "bad-scenario-path": (["scenario", "run", "{tmp}/no-such-scenario"], "no-such-scenario"),
    "unknown-command": (["frobnicate"], "frobnicate"),
    "unknown-option": (["sessions", "--frobnicate"], "--frobnicate"),
    "no-command": ([], "command"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_every_exit_2_error_is_one_line(case: str, store_root: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    for key in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "DEEPSEEK_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    args, word = BAD_INPUT[case]
    args = [a.format(root=store_root, tmp=tmp_path) for a in args]
    code, out, err = _run(capsys, args)
    assert code == 2, (out, err)
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("subagents: ") and word in err, err
    assert "Traceback" not in err and "usage:" not in err
    assert not (tmp_path / "new").exists() and not (tmp_path / "absent").exists()


# --- log records ----------------------------------------------------------------------------


def test_read_only_commands_print_no_storage_warnings(store_root: Path, capsys, monkeypatch) -> None:
    """A warning storage logs (say, about a damaged index) never reaches a read-only
    command's stderr; other commands get one line per record, never a traceback."""
    inner = FileLogStore.list

    def noisy_list(self: FileLogStore) -> object:
        try:
            raise ValueError("garbled\nindex")
        except ValueError:
            logging.getLogger("subagents.storage.index").warning("index unusable:\nrebuilt", exc_info=True)
        return inner(self)

    monkeypatch.setattr(FileLogStore, "list", noisy_list)
    code, out, err = _run(capsys, ["sessions", "--root", str(store_root)])
    assert (code, err) == (0, "")
    with cli._logging(logging.WARNING):
        try:
            raise ValueError("boom\nmore")
        except ValueError:
            logging.getLogger("subagents.storage.index").warning("index unusable:\nrebuilt", exc_info=True)
    assert capsys.readouterr().err == "subagents: warning: index unusable: rebuilt\n"
