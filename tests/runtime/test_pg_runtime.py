"""The runtime, unchanged, on the PostgreSQL store: a parent starts a background child that
settles; the logs, the listing and a cold reopen give what the file store gives. (The suites of
the runtime run as a `pg` parameter later, issue 18; this is the smoke test that they can.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from log_lines import read_all
from subagents.runtime.app import open_runtime
from subagents.runtime.clock import ScenarioClock
from subagents.runtime.ids import CountingIds
from subagents.runtime.models.script_format import load_script
from subagents.runtime.models.scripted_model import ScriptedModel
from subagents.storage import FileLogStore, LogStore

pytestmark = pytest.mark.pg

GUARD = 15.0  # seconds: a hang fails the test instead of blocking the suite


def _model(*child_texts: str) -> ScriptedModel:
    agents = [{"label": "worker", "responses": [{"text": t} for t in child_texts]}]
    return ScriptedModel(load_script(json.dumps({"agents": agents})))


async def _tree(root: Path, store: LogStore) -> tuple[str, list[dict[str, Any]]]:
    async with open_runtime(
        root, log_store=store, model=_model("first"), clock=ScenarioClock(), id_factory=CountingIds("c")
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        child_id = await rt.subagents.start_continuable(parent, "spawn", "worker", "work")
        await rt.subagents.wait_tree_idle(parent)
        rows = [row.to_json() for row in await rt.listing.list_children("parent")]
    return child_id, rows


async def _cold_rows(root: Path, store: LogStore) -> list[dict[str, Any]]:
    async with open_runtime(root, log_store=store, model=_model(), clock=ScenarioClock()) as rt:
        return [row.to_json() for row in await rt.listing.list_children("parent")]


async def test_a_background_child_runs_settles_and_lists_as_on_the_file_store(
    tmp_path: Path, pg_store_factory: Callable[..., Any], pg_url: str
) -> None:
    files = FileLogStore(str(tmp_path / "files"), compression="none")
    pg = pg_store_factory()
    with trio.fail_after(GUARD):
        child_on_files, rows_on_files = await _tree(tmp_path / "files", files)
        child_on_pg, rows_on_pg = await _tree(tmp_path / "pg", pg)
    assert child_on_pg == child_on_files
    assert rows_on_pg == rows_on_files and len(rows_on_pg) == 1
    for sid in ("parent", child_on_pg):
        assert read_all(pg, sid) == read_all(files, sid)
    assert {i.id for i in pg.list()} == {i.id for i in files.list()} == {"parent", child_on_pg}
    with psycopg.connect(pg_url) as db:  # the session actors checkpointed their projections there
        assert db.execute("SELECT count(DISTINCT session_id) FROM checkpoints").fetchone() == (2,)
    # A fresh store on the same database, a fresh runtime: the cold listing is the same.
    with trio.fail_after(GUARD):
        assert await _cold_rows(tmp_path / "pg", pg_store_factory()) == await _cold_rows(tmp_path / "files", files)
    files.close_store()
