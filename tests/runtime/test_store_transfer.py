"""Issue 18 item 2: `subagents store init`, `export` and `import` between a file store and a
PostgreSQL store — every event line round-trips byte for byte, plain and zstd; clashes and bad
targets are refused before anything is written."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import trio
from log_lines import plain_logs
from pg_server import reset_tables
from subagents.runtime.hosts.cli import main
from subagents.runtime.hosts.demo import run_demo
from subagents.storage import FileLogStore

pytestmark = pytest.mark.pg


def _demo_root(tmp_path: Path) -> Path:
    """A file store (zstd) with the demo's four sessions: a parent, three settled children."""
    root = tmp_path / "demo"
    trio.run(lambda: run_demo(str(root), out=io.StringIO(), live=False, delay_scale=0.0))
    return root


def _plain_copy(source: Path, target: Path) -> None:
    """The same sessions as plain files, through the export path's own copier."""
    from subagents.runtime.hosts.cli.transfer import copy_sessions

    target.mkdir()
    src, dst = FileLogStore(str(source)), FileLogStore(str(target), compression="none")
    try:
        copy_sessions(src, dst)
    finally:
        src.close_store()
        dst.close_store()


def _event_lines(logs: dict[str, bytes]) -> dict[str, list[bytes]]:
    return {name: data.splitlines(keepends=True) for name, data in logs.items()}


@pytest.mark.parametrize("form", ["zstd", "none"])
def test_import_then_export_gives_every_line_back_byte_identical(
    tmp_path: Path, pg_url: str, form: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from subagents.runtime.hosts.cli import transfer

    monkeypatch.setattr(transfer, "CHUNK", 3)  # every session goes as several batches of its one append
    reset_tables(pg_url)
    original = _demo_root(tmp_path)
    if form == "none":
        _plain_copy(original, tmp_path / "plain")
        original = tmp_path / "plain"
    assert main(["import", str(original), "--store", pg_url]) == 0
    out = capsys.readouterr().out
    assert "import: 4 sessions" in out and "demo-1" in out
    target = tmp_path / "out"
    assert main(["export", "--store", pg_url, "--to", str(target), "--compression", form]) == 0
    assert "export: 4 sessions" in capsys.readouterr().out
    before, after = _event_lines(plain_logs(original)), _event_lines(plain_logs(target))
    assert len(before) == 4 and before.keys() == after.keys()
    for name, lines in before.items():
        assert len(lines) > 2
        assert after[name] == lines  # the header line and every event line, byte for byte
    suffix = ".jsonl.zst" if form == "zstd" else ".jsonl"
    assert all(p.name.endswith(suffix) for p in target.rglob("session.jsonl*"))


def test_export_refuses_a_non_empty_target_unless_told(
    tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    reset_tables(pg_url)
    assert main(["import", str(_demo_root(tmp_path)), "--store", pg_url]) == 0
    target = tmp_path / "busy"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["export", "--store", pg_url, "--to", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not empty" in err
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]
    assert main(["export", "--store", pg_url, "--to", str(target), "--into-existing"]) == 0
    assert (target / "sessions").is_dir()


def test_import_refuses_sessions_already_there_and_names_them(
    tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    reset_tables(pg_url)
    root = _demo_root(tmp_path)
    assert main(["import", str(root), "--store", pg_url]) == 0
    capsys.readouterr()
    assert main(["import", str(root), "--store", pg_url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "already in the target" in err and "demo-1, demo-2, demo-3, demo-4" in err
    # and export into a store holding the same sessions is refused the same way
    again = tmp_path / "again"
    assert main(["export", "--store", pg_url, "--to", str(root), "--into-existing"]) == 2
    assert "demo-1" in capsys.readouterr().err
    assert not again.exists()


def test_store_init_creates_the_schema_and_says_so(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    reset_tables(pg_url)
    assert main(["store", "init", pg_url]) == 0
    out = capsys.readouterr().out
    assert out.startswith("store init: ") and out.rstrip().endswith("schema ready (0 sessions)")


def test_children_after_export_lists_the_same_rows_as_on_postgresql(
    tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    reset_tables(pg_url)
    assert main(["import", str(_demo_root(tmp_path)), "--store", pg_url]) == 0
    capsys.readouterr()
    assert main(["children", "demo-1", "--json", "--store", pg_url, "--root", str(tmp_path / "mail")]) == 0
    on_pg = json.loads(capsys.readouterr().out)
    assert main(["export", "--store", pg_url, "--to", str(tmp_path / "files")]) == 0
    capsys.readouterr()
    assert main(["children", "demo-1", "--json", "--root", str(tmp_path / "files")]) == 0
    on_files = json.loads(capsys.readouterr().out)
    # Issue 29: `last_event` is the last event's own time on either store (not when the export
    # wrote the files), so the rows are the same, times included.
    assert len(on_pg) == 3 and on_files == on_pg
    assert all(type(row["last_event"]) is int and row["last_event"] > 0 for row in on_pg)
