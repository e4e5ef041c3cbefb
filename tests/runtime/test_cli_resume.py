"""`subagents resume ID` and `run --session ID` without a prompt (issue 27 item 1): a session is
resumed and what waited for it runs; one with nothing waiting says so (exit 0) and writes nothing;
an unknown session, a missing prompt and a bad id are one line and exit 2, creating nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_process import write_script
from subagents.runtime.hosts.cli import main


def _run(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own exits
        code = exc.code  # type: ignore[assignment]  # SystemExit.code is an int here
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _log_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "sessions").rglob("session.jsonl*"))}


@pytest.fixture
def done_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, str]:
    model = write_script(tmp_path / "s.json", {"agents": [{"session": "s1", "responses": [{"text": "hello"}]}]})
    root = tmp_path / "root"
    code, out, err = _run(capsys, ["run", "--root", str(root), "--model", model, "--session", "s1", "hi"])
    assert (code, out) == (0, "hello\n"), err
    return root, model


@pytest.mark.parametrize("form", ["resume", "run"])
def test_a_session_with_nothing_waiting_is_left_as_it_was(
    done_session: tuple[Path, str], capsys: pytest.CaptureFixture[str], form: str
) -> None:
    root, model = done_session
    before = _log_bytes(root)
    args = ["resume", "s1"] if form == "resume" else ["run", "--session", "s1"]
    code, out, err = _run(capsys, [*args, "--root", str(root), "--model", model, "--json"])
    assert code == 0, err
    assert json.loads(out) == {"session_id": "s1", "output": ""}
    assert "session s1 had nothing to resume" in err
    assert _log_bytes(root) == before


def test_queued_mail_is_taken_up_by_a_resume(
    tmp_path: Path, done_session: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = done_session
    model = write_script(tmp_path / "t.json", {"agents": [{"session": "s1", "responses": [{"text": "got it"}]}]})
    code, _out, err = _run(capsys, ["send", "s1", "later", "--queue", "--root", str(root), "--model", model])
    assert code == 0, err
    code, out, err = _run(capsys, ["resume", "s1", "--root", str(root), "--model", model])
    assert (code, out) == (0, "got it\n"), err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["resume", "nobody"], "session 'nobody' not found"),
        (["run", "--session", "nobody"], "session 'nobody' not found"),
        (["run"], "run needs a PROMPT (or --session ID to resume a session)"),
        (["resume", "../x"], "../x"),
    ],
)
def test_bad_resumes_are_one_line_and_create_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    model = write_script(tmp_path / "s.json", {"agents": [{"responses": [{"text": "x"}]}]})
    root = tmp_path / "root"
    (root / "sessions").mkdir(parents=True)
    code, out, err = _run(capsys, [*args, "--root", str(root), "--model", model])
    assert code == 2
    assert out == ""
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert list((root / "sessions").iterdir()) == []
