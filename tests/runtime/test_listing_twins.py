"""Compacted and uncompacted twins list identically (issue 5): compaction replaces surface
nodes only, and the descriptor is log-only, so the identity a listing reads — live, from
checkpoint rows, or from one observation — is the same with or without a compaction. On files and
on PostgreSQL (issue 18): there the twins live in two databases, and the observation rung is
reached by deleting the checkpoint rows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pg_damage
import pytest
from log_lines import plain_records
from pg_server import drop_database, fresh_database
from places import Place
from subagents.runtime import AgentConfig, CompactionPolicy, CountingIds, ScenarioClock, ScriptedModel, load_script
from subagents.storage import LogStore

LONG = "x" * 300


def _script(n_turns: int) -> str:
    child = [{"text": f"answer {i} {LONG}"} for i in range(n_turns)]
    return json.dumps(
        {
            "agents": [{"label": "twin", "responses": child}],
            "summaries": ["the story so far"] * n_turns,
        }
    )


@pytest.fixture(params=["file", pytest.param("pg", marks=pytest.mark.pg)])
def twins(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Place, Place]]:
    """Two empty places of one kind: two folders, or two databases (the module's and another)."""
    plain, compacted = tmp_path / "plain", tmp_path / "compacted"
    if request.param == "file":
        yield Place("file", plain), Place("file", compacted)
        return
    from subagents.storage import PostgresLogStore

    admin = request.getfixturevalue("pg_server").url
    url = request.getfixturevalue("pg_url")
    first = Place("pg", plain, url, request.getfixturevalue("pg_store_factory"))
    name = "t_listing_twins_compacted"
    other_url = fresh_database(admin, name)
    made: list[PostgresLogStore] = []

    def make(**options: Any) -> LogStore:
        made.append(PostgresLogStore(other_url, **options))
        return made[-1]

    try:
        yield first, Place("pg", compacted, other_url, make)
    finally:
        for store in made:
            store.close_store()
        drop_database(admin, name)


async def _twin(place: Place, compacting: bool) -> None:
    """A parent and one continuable child that runs three turns (compacting or not)."""
    config = AgentConfig(compaction=CompactionPolicy(max_chars=400, keep_recent=1) if compacting else None)
    model = ScriptedModel(load_script(_script(3)))
    async with place.open_runtime(
        model=model, clock=ScenarioClock(), id_factory=CountingIds("c"), compression="none", agent_config=config
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        child_id = await rt.subagents.start_continuable(parent, "spawn", "twin", f"first {LONG}")
        for i in range(2):
            child = rt.agents.get(child_id)
            if child is not None:
                await child.wait_idle()
            await rt.subagents.send_message(parent, child_id, f"again {i} {LONG}")
        await rt.subagents.wait_tree_idle(parent)


def _types(place: Place, sid: str) -> list[str]:
    if place.url is not None:
        lines = pg_damage.plain_log(place.url, sid).splitlines()
        return [json.loads(line)["type"] for line in lines[1:]]
    return [record["type"] for record in plain_records(place.root, sid)[1:]]


async def _rows(place: Place, *, checkpoints: bool) -> list[dict[str, Any]]:
    root = place.root
    if not checkpoints and place.url is not None:
        pg_damage.sql(place.url, "DELETE FROM checkpoints")
    elif not checkpoints:
        (root / "index.sqlite3").unlink(missing_ok=True)
        for extra in ("index.sqlite3-wal", "index.sqlite3-shm"):
            (root / extra).unlink(missing_ok=True)
    async with place.open_runtime(log_store=place.store(use_index=checkpoints)) as rt:
        return [row.to_json() for row in await rt.listing.list_children("parent")]


@pytest.mark.parametrize("checkpoints", [True, False], ids=["checkpoint-rung", "observation-rung"])
async def test_compacted_and_uncompacted_twins_list_identically(twins: tuple[Place, Place], checkpoints: bool) -> None:
    plain, compacted = twins
    await _twin(plain, compacting=False)
    await _twin(compacted, compacting=True)
    assert "compaction/end" in _types(compacted, "c-1") and "compaction/end" not in _types(plain, "c-1")
    assert _types(compacted, "c-1")[0] == "subagent/descriptor"
    rows = await _rows(plain, checkpoints=checkpoints)
    assert rows == [
        {
            "kind": "child",
            "id": "c-1",
            "activity": "inactive",
            "has_children": False,
            "mode": "continuable",
            "label": "twin",
        }
    ]
    assert await _rows(compacted, checkpoints=checkpoints) == rows


async def test_a_live_compacted_child_lists_like_its_twin(place: Place) -> None:
    config = AgentConfig(compaction=CompactionPolicy(max_chars=400, keep_recent=1))
    model = ScriptedModel(load_script(_script(3)))
    async with place.open_runtime(
        model=model,
        clock=ScenarioClock(),
        id_factory=CountingIds("c"),
        compression="none",
        agent_config=config,
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        child_id = await rt.subagents.start_continuable(parent, "spawn", "twin", f"first {LONG}")
        child = rt.agents.get(child_id)
        assert child is not None
        await child.wait_idle()
        # Resident (idle, settling or not yet disposed) or released: either way it lists as the twin.
        rows = [row.to_json() for row in await rt.listing.list_children("parent")]
        assert [(r["id"], r["mode"], r["label"]) for r in rows] == [("c-1", "continuable", "twin")]
