"""A budget shared down the tree survives a takeover on PostgreSQL (issue 30 item 4): two
runtimes on one PostgreSQL store, one after the other — two hosts, the second taking the tree
over from what the first wrote. What the tree spent on the first host (the root's own calls and
its child's, the child's read back from its `usage` checkpoint row) still counts against the
root's limit when the second host runs the child on."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
from subagents.runtime import Budget, CountingIds, ScenarioClock, ScriptedModel, load_script, open_runtime
from subagents.storage import PostgresLogStore

pytestmark = pytest.mark.pg

Json = dict[str, Any]


def _model(agents: list[Json]) -> ScriptedModel:
    return ScriptedModel(load_script(json.dumps({"agents": agents})))


def _usage(n: int) -> Json:
    return {"input_tokens": n, "output_tokens": 0}


def _events(url: str, sid: str) -> list[tuple[str, Json]]:
    store = PostgresLogStore(url)
    try:
        handle = store.open_read(sid)
        try:
            return [(e.type, msgspec.json.decode(e.data)) for e in store.read(handle)]
        finally:
            store.close(handle)
    finally:
        store.close_store()


def _ends(events: list[tuple[str, Json]]) -> list[Json]:
    return [d["reason"] for t, d in events if t == "turn/end"]


async def test_a_trees_spending_before_a_takeover_counts_against_the_root_after_it(tmp_path: Path, pg_url: str) -> None:
    """Root 2,000 tokens. Host A: the root spends 100 + 300 + 400 and its worker (reserved
    1,900) 600: 1,400. Host B takes the tree over: the worker spends 590 more (1,990 of the
    root's 2,000; 1,190 of its own 1,900), and its next call is refused for the root's limit —
    which it would not be if host B had counted only what was spent on it."""
    from pg_server import reset_tables

    reset_tables(pg_url)
    budget = Budget(max_tokens=2000)
    first = _model(
        [
            {
                "session": "parent",
                "responses": [
                    {
                        "tool_calls": [
                            {
                                "name": "subagent",
                                "arguments": {"description": "worker", "prompt": "work", "max_tokens": 5000},
                            }
                        ],
                        "usage": _usage(100),
                    },
                    {"text": "started", "usage": _usage(300)},
                    {"text": "noted", "usage": _usage(400)},
                ],
            },
            {"label": "worker", "responses": [{"text": "part one", "usage": _usage(600)}]},
        ]
    )
    options: dict[str, Any] = {"clock": ScenarioClock(), "store": pg_url, "budget": budget}
    async with open_runtime(tmp_path / "a", model=first, id_factory=CountingIds("c"), **options) as rt:
        parent = await rt.agents.create(session_id="parent")
        await parent.send("go")
        await rt.subagents.wait_tree_idle(parent)
    worker = _events(pg_url, "c-1")
    assert next(d for t, d in worker if t == "subagent/descriptor")["budget"] == {"max_tokens": 1900}
    with psycopg.connect(pg_url) as db:  # the worker's usage is in its checkpoint row: host B seeds from it
        assert db.execute("SELECT count(*) FROM checkpoints WHERE session_id = 'c-1'").fetchone() != (0,)

    second = _model(
        [
            {"session": "parent", "responses": [{"text": "noted again"}] * 3},
            {"session": "c-1", "responses": [{"text": "part two", "usage": _usage(590)}, {"text": "never sent"}]},
        ]
    )
    async with open_runtime(tmp_path / "b", model=second, **options) as rt:  # another host
        parent = await rt.agents.resume("parent")
        for text in ("more", "and more"):
            await rt.subagents.send_message(parent, "c-1", text)
            await rt.subagents.wait_tree_idle(parent)
    ends = _ends(_events(pg_url, "c-1"))
    assert ends[:2] == [{"kind": "completed"}, {"kind": "completed"}]
    assert len(ends) == 3 and ends[2]["kind"] == "budget", ends
    assert re.fullmatch(
        r"ancestor parent's max_tokens 2000 would be crossed: 1990 used, this call ~\d+", ends[2]["message"]
    ), ends[2]
    texts = [d["message"]["content"][0]["text"] for t, d in _events(pg_url, "c-1") if t == "assistant/message"]
    assert texts == ["part one", "part two"]  # the refused call was never sent
