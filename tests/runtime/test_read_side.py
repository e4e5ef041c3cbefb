"""One read side (docs/design.md, "One read side"): one actors-level reader owns the index slot,
stat batching, checkpoint rows and read grouping; listing reads only through the session query;
a resume reuses the events the session store read to open the session; the registry gets its
hooks at construction."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import attrs
from clocks import fixed_ms
from drafts import descriptor_draft
from log_lines import header
from registries import subagent_registry
from subagents.actors import EventDraft, StoreReader, open_session_store
from subagents.runtime import app as app_module
from subagents.runtime.agent.registry import AgentRegistry
from subagents.runtime.app import open_runtime
from subagents.runtime.delegation import listing as listing_module
from subagents.runtime.delegation.listing import ListingService
from subagents.runtime.foundation.clock import ScenarioClock
from subagents.runtime.query import SessionQuery
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel
from subagents.storage import FileLogStore
from subagents.storage.testing import FaultyLogStore


def idle_model() -> ScriptedModel:
    return ScriptedModel(load_script(json.dumps({"agents": [{"responses": []}]})))


def test_listing_is_built_from_the_query_alone() -> None:
    # (`now_ms` and `stall_after` only say which running children are `stalled`: issue 29.)
    assert list(inspect.signature(ListingService).parameters) == [
        "registry",
        "sessions",
        "query",
        "now_ms",
        "stall_after",
    ]
    source = inspect.getsource(listing_module)
    # No thread hops, index slot or log store of its own: the query (and its reader) does those.
    assert "to_thread" not in source and "index_limiter" not in source and "log_store" not in source


def test_no_runtime_module_stats_the_store_behind_the_readers_back() -> None:
    """An index call outside the store reader would run beside its one worker slot: `stat`
    (and `list`) go through `StoreReader`, never straight to the log store."""
    root = Path(inspect.getfile(app_module)).parent
    found = [
        f"{path.relative_to(root)}:{n}"
        for path in sorted(root.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"log_store\.(stat|list)\b", line)
    ]
    assert found == []


async def test_the_runtime_has_one_reader_and_one_index_slot(tmp_path: Path) -> None:
    async with open_runtime(tmp_path, model=None) as rt:
        reader = rt.query._reader  # white-box: the query keeps its reader to itself
        assert isinstance(reader, StoreReader)
        assert rt.agents.reader is reader and rt.subagents.query is rt.query
        assert rt.query.index_limiter is reader.index_limiter and rt.query.cold_reader is reader.cold
        assert rt.listing.query is rt.query


async def test_the_registry_gets_its_hooks_at_construction(tmp_path: Path) -> None:
    names = {field.name for field in attrs.fields(AgentRegistry)}
    assert not names & {"on_resume", "on_interrupted", "before_release", "resume_setup", "offer", "wait_settled"}
    async with open_runtime(tmp_path, model=None) as rt:
        assert rt.agents.hooks is rt.subagents
        assert [spec.name for spec in rt.agents.tools().specs()] == [spec.name for spec in rt.subagents.tools().specs()]
    # Nothing in the composition root assigns to the registry after building it.
    source = inspect.getsource(app_module)
    assert not re.search(r"\bagents\.\w+\s*=[^=]", source)


async def persisted(root: Path, store: Any) -> None:
    """A session `s` with one closed turn and an open one (closed in memory on resume)."""
    async with open_session_store(store, subagent_registry(), now_ms=fixed_ms(1)) as sessions:
        ref = await sessions.create(header("s", created_at=1))
        await ref.append(
            [
                EventDraft(type="turn/start", data={"turn": 1, "trigger": {"kind": "message"}}),
                EventDraft(type="turn/end", data={"turn": 1, "reason": {"kind": "completed"}}),
                EventDraft(type="turn/start", data={"turn": 2, "trigger": {"kind": "message"}}),
            ]
        )


async def resume_counting(tmp_path: Path, *, use_index: bool) -> FaultyLogStore:
    base = FileLogStore(str(tmp_path), use_index=use_index)
    try:
        await persisted(tmp_path, base)
        faulty = FaultyLogStore(base)
        # The close policy: the resume closes the open turn and the agent is idle at once.
        async with open_runtime(
            tmp_path, model=idle_model(), clock=ScenarioClock(), log_store=faulty, on_interrupted_turn="close"
        ) as rt:
            agent = await rt.agents.resume("s")
            assert agent.status == "idle" and agent.turn == 2
            reads = faulty.calls["read"]
        # The interrupted turn 2 was closed durably on resume.
        handle = base.open_read("s")
        try:
            assert [e.type for e in base.read(handle)][-1] == "turn/end"
        finally:
            base.close(handle)
        faulty.calls["read"] = reads
        return faulty
    finally:
        base.close_store()


async def test_a_resume_reads_the_log_once(tmp_path: Path) -> None:
    # No checkpoint rows: the open folds the whole log, and the resume reuses that read.
    faulty = await resume_counting(tmp_path, use_index=False)
    assert faulty.calls["read"] == 1


async def test_a_resume_from_a_checkpoint_reads_the_log_once(tmp_path: Path) -> None:
    faulty = await resume_counting(tmp_path, use_index=True)
    assert faulty.calls["read"] == 1 and faulty.calls["read_checkpoint"] >= 1


async def test_a_listing_without_an_abort_makes_none_to_group_its_reads(tmp_path: Path, monkeypatch: Any) -> None:
    """Its observations read in one `ReadGroup`; no never-set `Abort` stands in for one."""
    from subagents.actors import abort as abort_module
    from subagents.actors import cold_reader as cold_reader_module

    base = FileLogStore(str(tmp_path), use_index=False)  # no checkpoint rows: every child is observed
    registry = subagent_registry()
    try:
        async with open_session_store(base, registry, now_ms=fixed_ms(1)) as sessions:
            for i in range(3):
                ref = await sessions.create(header(f"c{i}", i, origin="subagent", parent_session="p"))
                await ref.append([descriptor_draft(f"child {i}")])
                await sessions.release(f"c{i}")
            made: list[object] = []
            init = abort_module.Abort.__init__

            def counting(self: Any) -> None:
                made.append(self)
                init(self)

            monkeypatch.setattr(abort_module.Abort, "__init__", counting)
            groups: list[object] = []
            read_many = cold_reader_module.ColdReader.read_many

            async def spy(self: Any, ids: Any, abort: Any = None, **kwargs: Any) -> Any:
                groups.append(kwargs.get("group"))
                return await read_many(self, ids, abort, **kwargs)

            monkeypatch.setattr(cold_reader_module.ColdReader, "read_many", spy)
            query = SessionQuery(base, sessions, registry)
            rows = await ListingService(registry=registry, sessions=sessions, query=query).list_children("p")
        assert [row.id for row in rows] == ["c0", "c1", "c2"]
        assert made == []
        assert len(groups) == 3 and groups[0] is not None and all(g is groups[0] for g in groups)
    finally:
        base.close_store()
