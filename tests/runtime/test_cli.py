"""The console script exists and says what it is; unknown input is a clear error, not a traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from log_lines import header, persist_log
from subagents.runtime.hosts.cli import main


def test_help_names_the_product(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "durable background subagents" in out
    assert "--root" in out


def test_console_script_is_installed() -> None:
    exe = shutil.which("subagents", path=str(Path(sys.executable).parent))
    assert exe is not None
    done = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "usage: subagents" in done.stdout


def test_unknown_option_is_exit_2_without_traceback(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--no-such-option"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --no-such-option" in err
    assert "Traceback" not in err


def _root_with_children(tmp_path: Path, *, ended: bool = False) -> Path:
    """p with children c1 (continuable, with child g) and c2 (one-shot); with `ended`, every
    turn ended (else each log ends in an open turn nobody runs: orphaned)."""
    from descriptors import descriptor
    from events import turn_end_event
    from subagents.storage import FileLogStore, make_event

    store = FileLogStore(str(tmp_path))
    for sid, created, parent, label in (
        ("p", 1, None, None),
        ("c1", 2, "p", "first"),
        ("c2", 3, "p", None),
        ("g", 4, "c1", "deep"),
    ):
        session_header = header(sid, created, parent_session=parent, origin="subagent" if parent else None)
        at = _written(sid)
        events = [make_event(0, "turn/start", at, {"turn": 1})]
        if parent is not None:
            mode = "continuable" if label else "one-shot"
            data = descriptor(label, mode)
            events.insert(0, make_event(0, "subagent/descriptor", 1, data))
            events[1] = make_event(1, "turn/start", at, {"turn": 1})
        if ended:
            events.append(turn_end_event(len(events), at))
        persist_log(store, session_header, events)
    return tmp_path


def _written(sid: str) -> int:
    """The time of the last event of `sid` in `_root_with_children` (ms): what listings show as
    its last event (its log file's mtime is another time)."""
    return {"p": 1_001, "c1": 2_002, "c2": 3_003, "g": 4_004}[sid]


def test_children_prints_the_rows(tmp_path: Path, capsys) -> None:
    root = _root_with_children(tmp_path, ended=True)
    assert main(["children", "p", "--json", "--root", str(root)]) == 0
    import json

    assert json.loads(capsys.readouterr().out) == [
        {
            "kind": "child",
            "id": "c1",
            "activity": "inactive",
            "has_children": True,
            "mode": "continuable",
            "label": "first",
            "last_event": _written("c1"),  # issue 29: its last event's time
        },
        {
            "kind": "child",
            "id": "c2",
            "activity": "inactive",
            "has_children": False,
            "mode": "one-shot",
            "last_event": _written("c2"),
        },
    ]
    c1, c2, g = (iso_time(_written(sid)) for sid in ("c1", "c2", "g"))
    assert main(["children", "p", "--descendants", "--root", str(root)]) == 0
    # A table with a header and ISO-8601 creation times (UTC, milliseconds).
    assert capsys.readouterr().out.splitlines() == [
        "ID  PARENT  DEPTH  STATE  MODE         CREATED                   LAST EVENT                RUNNER  CHILDREN  LABEL",
        f"c1  p       1      ready  continuable  1970-01-01T00:00:00.002Z  {c1}  -       yes       first",
        f"g   c1      2      ready  continuable  1970-01-01T00:00:00.004Z  {g}  -       no        deep",
        f"c2  p       1      done   one-shot     1970-01-01T00:00:00.003Z  {c2}  -       no        -",
    ]
    assert main(["children", "p", "--root", str(root)]) == 0
    # The words `agents` uses (issue 29: not `inactive` here and `ready` there).
    assert capsys.readouterr().out.splitlines() == [
        "ID  STATE  MODE         CREATED                   LAST EVENT                RUNNER  CHILDREN  LABEL",
        f"c1  ready  continuable  1970-01-01T00:00:00.002Z  {c1}  -       yes       first",
        f"c2  done   one-shot     1970-01-01T00:00:00.003Z  {c2}  -       no        -",
    ]


def test_children_whose_runner_is_gone_mid_turn_are_orphaned(tmp_path: Path, capsys) -> None:
    """Issue 29: a log whose last turn has no end and whose lock nobody holds is `orphaned` in
    every listing (never running, never ready), the JSON saying `liveness`."""
    import json

    root = _root_with_children(tmp_path)  # every turn left open; no process runs them
    assert main(["children", "p", "--json", "--root", str(root)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["id"], r["activity"], r.get("liveness"), "runner" in r) for r in rows] == [
        ("c1", "inactive", "orphaned", False),
        ("c2", "inactive", "orphaned", False),
    ]
    assert main(["children", "p", "--root", str(root)]) == 0
    assert [line.split()[1] for line in capsys.readouterr().out.splitlines()[1:]] == ["orphaned", "orphaned"]
    assert main(["agents", "p", "--descendants", "--root", str(root)]) == 0
    assert capsys.readouterr().out == (
        "c1 [orphaned] parent=p depth=1 — first\ng [orphaned] parent=c1 depth=2 — deep\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["children", "nobody"], 'session "nobody" not found'),
        (["children", "bad\x01id"], "control character"),
        (["children", "p", "--root", "MISSING"], "not a subagents root:"),
    ],
)
def test_children_bad_input_is_exit_2_with_one_line(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    root = _root_with_children(tmp_path / "root")
    if "--root" not in args:
        args = [*args, "--root", str(root)]
    else:
        args = [str(tmp_path / "missing") if a == "MISSING" else a for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "missing").exists()  # read-only commands never create the root


def test_agents_renders_like_list_agents(tmp_path: Path, capsys) -> None:
    root = _root_with_children(tmp_path, ended=True)
    assert main(["agents", "p", "--root", str(root)]) == 0
    # c2 is an unlabeled one-shot child: list_agents never shows one-shot children.
    assert capsys.readouterr().out == "c1 [ready] — first\n"
    assert main(["agents", "p", "--descendants", "--root", str(root)]) == 0
    assert capsys.readouterr().out == "c1 [ready] parent=p depth=1 — first\ng [ready] parent=c1 depth=2 — deep\n"
    assert main(["agents", "c2", "--root", str(root)]) == 0
    assert capsys.readouterr().out == "(no subagents)\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["agents", "nobody"], 'session "nobody" not found'),
        (["agents", "x" * 81], "80"),
    ],
)
def test_agents_bad_input_is_exit_2(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    root = _root_with_children(tmp_path)
    assert main([*args, "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_sessions_lists_every_session(tmp_path: Path, capsys) -> None:
    root = _root_with_children(tmp_path)
    assert main(["sessions", "--json", "--root", str(root)]) == 0
    rows = __import__("json").loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == ["g", "c2", "c1", "p"]  # newest first
    assert rows[0] == {
        "id": "g",
        "created": 4,
        "origin": "subagent",
        "parent": "c1",
        "depth": 0,
        "events": 2,
        "live": False,
        "live_elsewhere": False,
        "persisted": True,
        "damage": None,
        "last_event": _written("g"),  # issue 29: its last event's time
        "runner": None,  # nobody runs it
        "liveness": "orphaned",  # ... and its turn is open (its timing row says so)
        # Usage (issue 15 item 4): hand-written logs with no model calls count zero.
        "usage": {"input_tokens": 0, "output_tokens": 0, "calls": 0, "reported": 0},
        "tree_usage": {"input_tokens": 0, "output_tokens": 0, "calls": 0, "reported": 0, "sessions": 1, "skipped": []},
    }
    assert main(["sessions", "--root", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    p = iso_time(_written("p"))
    assert (
        lines[0]
        == "ID  CREATED                   ORIGIN    PARENT  DEPTH  EVENTS  STATE      LAST EVENT                DAMAGE"
    )
    assert lines[-1] == f"p   1970-01-01T00:00:00.001Z  -         -       0      1       persisted  {p}  -"


def test_sessions_reports_damage(tmp_path: Path, capsys) -> None:
    root = _root_with_children(tmp_path)
    log = root / "sessions" / "c2" / "session.jsonl.zst"
    log.write_bytes(log.read_bytes()[:-3] + b"xyz")  # a checksum failure inside a complete frame
    assert main(["sessions", "--json", "--root", str(root)]) == 0
    rows = {r["id"]: r for r in __import__("json").loads(capsys.readouterr().out)}
    assert rows["c2"]["damage"] == "corrupt" and rows["c1"]["damage"] is None


def test_show_prints_a_transcript(tmp_path: Path, capsys) -> None:
    root = _root_with_children(tmp_path)
    assert main(["show", "c1", "--root", str(root)]) == 0
    assert capsys.readouterr().out == (
        "  ⋯ continuable subagent of provider spawn — first\n"
        "── turn 1\n"
        "── end of turn 1: interrupted\n"  # the closer a reader adds in memory for the open turn
    )
    assert main(["show", "c1", "--json", "--root", str(root)]) == 0
    entries = __import__("json").loads(capsys.readouterr().out)
    # The last entry is the session's usage (issue 15 item 4): none here, no model call was made.
    # Then its subtree's (c1 has a child): no model call either, and no line for it in the text.
    assert [e["type"] for e in entries] == ["subagent/descriptor", "turn/start", "turn/end", "usage", "tree-usage"]
    assert entries[-2] == {
        "type": "usage",
        "turns": [],
        "total": {"input_tokens": 0, "output_tokens": 0, "calls": 0, "reported": 0},
    }
    assert entries[-1] == {
        "type": "tree-usage",
        "sessions": 2,
        "skipped": [],
        "total": {"input_tokens": 0, "output_tokens": 0, "calls": 0, "reported": 0},
    }


@pytest.mark.parametrize(
    "args, message",
    [
        (["show", "nobody"], 'session "nobody" not found'),
        (["show", "x" * 81], "80"),
    ],
)
def test_show_bad_input_is_exit_2(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    root = _root_with_children(tmp_path)
    assert main([*args, "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize("command", [["sessions"], ["show", "p"], ["agents", "p"], ["children", "p"]])
def test_read_only_commands_never_create_the_root(tmp_path: Path, capsys, command: list[str]) -> None:
    root = tmp_path / "absent"
    assert main([*command, "--root", str(root)]) == 2
    assert capsys.readouterr().err == f"subagents: not a subagents root: {root}\n"
    assert not root.exists()


def iso_time(ms: int) -> str:
    """Epoch milliseconds as the CLI's tables print them (ISO 8601, UTC, milliseconds)."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"
