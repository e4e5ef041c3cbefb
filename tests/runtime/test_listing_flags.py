"""The listing's rows say a child is stopped or has results in doubt (issue 27, items 2 and 5):
`stopped: true` and `in_doubt: N` in a child row (only when set, so other rows keep the bytes of
SPEC 5.4), `[stopped]` and `(N in doubt)` in the `agents` / `list_agents` text — on every rung:
a live child's cell, a cold child's checkpoint rows, its observation (the index present, deleted,
holding rows written before the flags unit existed, or a tampered flags row)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from clocks import ticking_ms
from descriptors import descriptor
from drafts import descriptor_draft, turn_start
from events import turn_end_event, turn_start_event
from flag_events import (
    call_event,
    in_doubt_drafts,
    message_draft,
    message_event,
    result_event,
    stopped_draft,
    stopped_event,
)
from listing_rows import rows
from log_lines import header, persist_log
from subagents.runtime import SUBAGENT_UNITS, open_runtime
from subagents.runtime.hosts.cli import main
from subagents.storage import CheckpointRow, Event, FileLogStore, LogStore, ProjectionRegistry, make_event
from subagents.storage.testing import FaultyLogStore

now_ms = ticking_ms()
FLAGS = "subagent_flags"
Factory = Callable[[], LogStore]


@pytest.fixture(params=["file", "file-zstd", pytest.param("pg", marks=pytest.mark.pg)])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Stores over one root (or database): each call another store on the same data, as a new
    process would open it."""
    kind, _, form = request.param.partition("-")
    if kind == "pg":
        yield request.getfixturevalue("pg_store_factory")
        return
    opened: list[FileLogStore] = []

    def make() -> LogStore:
        store = FileLogStore(str(tmp_path), compression="zstd" if form else "none")
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close_store()


def child_events(kind: str) -> list[Event]:
    """A child's log: its descriptor, then one turn that `kind` shapes."""
    events = [make_event(0, "subagent/descriptor", 1, descriptor(kind)), turn_start_event(1, 2)]
    if kind == "stopped":
        events.append(stopped_event(2))
    elif kind == "doubt":
        events += [call_event(2, "a"), result_event(3, "a"), call_event(4, "b"), result_event(5, "b")]
    elif kind == "cleared":  # stopped, then its parent's new message started it again
        events += [stopped_event(2), turn_end_event(3, 4), message_event(4, "agent-message", 2)]
    return [*events, turn_end_event(len(events), 9, 2 if kind == "cleared" else 1)]


KINDS = ["stopped", "doubt", "plain", "cleared"]


def write_children(store: LogStore) -> None:
    persist_log(store, header("p", 1), [turn_start_event(0, 2)])
    # The parent's rows as its writer leaves them: its catalog answers from them, so the reads
    # counted below are the children's (a parent without rows is observed too: issue 28).
    write_rows(store, "p", ProjectionRegistry(SUBAGENT_UNITS))
    for i, kind in enumerate(KINDS):
        persist_log(store, header(kind, 10 + i, origin="subagent", parent_session="p"), child_events(kind))


def row(sid: str, activity: str = "inactive", **flags: Any) -> dict[str, Any]:
    out = {"kind": "child", "id": sid, "activity": activity, "has_children": False, "mode": "continuable", "label": sid}
    return out | flags


EXPECTED = [row("stopped", stopped=True), row("doubt", in_doubt=2), row("plain"), row("cleared")]
TEXT = (
    "stopped [stopped] — stopped\ndoubt [ready] — doubt (2 in doubt)\nplain [ready] — plain\ncleared [ready] — cleared"
)


async def list_once(root: Path, store: LogStore) -> tuple[list[dict[str, Any]], Any]:
    """One listing of "p" in a fresh runtime over `store` (as a new process would): its rows and
    the store's call counts."""
    faulty = FaultyLogStore(store)
    async with open_runtime(root, log_store=faulty, now_ms=now_ms) as runtime:
        found = rows(await runtime.listing.list_children("p"))
    return found, faulty.calls


def flags_rows(store: LogStore, ids: list[str]) -> dict[str, Any]:
    found = store.read_checkpoint_rows(ids, [FLAGS]) or {}
    return {sid: r.value() for sid, stored in found.items() for r in stored}


def write_rows(store: LogStore, sid: str, registry: ProjectionRegistry, **replace: Any) -> None:
    """Checkpoint rows of `sid` covering its log whole, as a writer with `registry` leaves them
    (`replace`: a unit's value put in its row instead, as a tampered index holds it)."""
    handle = store.open_write(sid)
    try:
        cells = registry.cells(handle.header, handle.inherited_event_count)
        cells.fold(store.read(handle))
        checkpoint = cells.checkpoint()
        for key, val in replace.items():
            checkpoint[key] = CheckpointRow(ver=checkpoint[key].ver, seq=checkpoint[key].seq, val=val)
        assert store.write_checkpoint(handle, checkpoint)
    finally:
        store.close(handle)


# --- cold: observed, then from the rows it wrote; with the index deleted --------------------------


async def test_cold_children_show_their_flags_observed_then_from_their_rows(
    tmp_path: Path, make_store: Factory
) -> None:
    write_children(make_store())
    first, calls = await list_once(tmp_path, make_store())
    assert first == EXPECTED
    assert calls["read"] == 4 and calls["write_observed"] == 1  # every child observed, rows written
    written = flags_rows(make_store(), KINDS)
    assert written["stopped"] == {"own_from": 0, "stopped": True, "in_doubt": 0}
    assert written["doubt"] == {"own_from": 0, "stopped": False, "in_doubt": 2}

    second, calls = await list_once(tmp_path, make_store())
    assert second == EXPECTED
    assert calls["read"] == 0 and calls["open_read"] == 0  # the checkpoint rung answers the flags too


async def test_cold_children_show_their_flags_with_the_index_deleted(tmp_path: Path) -> None:
    store = FileLogStore(str(tmp_path))
    write_children(store)
    assert (await list_once(tmp_path, FileLogStore(str(tmp_path))))[0] == EXPECTED  # rows written back
    store.close_store()
    for name in ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    found, calls = await list_once(tmp_path, FileLogStore(str(tmp_path)))
    # Every child, and the parent: no row answers for its catalog now (issue 28, "nothing hidden").
    assert found == EXPECTED and calls["read"] == 5


async def test_rows_written_before_the_flags_unit_never_hide_a_row_or_its_flags(
    tmp_path: Path, make_store: Factory
) -> None:
    """Checkpoint rows of a writer that had no flags unit (identity and catalog rows that cover
    the log whole, no flags row): the listing observes those children once and lists them with
    their flags; its write-back adds the flags rows beside the writer's rows of the same seq
    (they lack that unit), so the next listing reads no log. A next writer's rows answer too."""
    store = make_store()
    write_children(store)
    before = ProjectionRegistry([unit for unit in SUBAGENT_UNITS if unit.key != FLAGS])
    for sid in KINDS:
        write_rows(store, sid, before)
    assert flags_rows(store, KINDS) == {}

    found, calls = await list_once(tmp_path, make_store())
    assert found == EXPECTED and calls["read"] == 4
    assert set(flags_rows(make_store(), KINDS)) == set(KINDS)  # written back beside the old rows
    found, calls = await list_once(tmp_path, make_store())
    assert found == EXPECTED and calls["read"] == 0

    registry = ProjectionRegistry(SUBAGENT_UNITS)
    for sid in KINDS:
        write_rows(make_store(), sid, registry)  # as the session's next writer leaves them
    found, calls = await list_once(tmp_path, make_store())
    assert found == EXPECTED and calls["read"] == 0


@pytest.mark.parametrize("val", [None, [], {"own_from": 0, "stopped": "yes", "in_doubt": 0}, {"stopped": True}])
async def test_a_tampered_flags_row_never_breaks_the_listing(tmp_path: Path, make_store: Factory, val: Any) -> None:
    """A flags row holding no state the unit makes: those children are observed (their cold
    read folds from the start) and listed with their true flags, every time."""
    store = make_store()
    write_children(store)
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    for sid in KINDS:
        write_rows(store, sid, registry, subagent_flags=val)
    for _ in range(2):
        found, calls = await list_once(tmp_path, make_store())
        assert found == EXPECTED and calls["read"] == 4


async def test_descendants_keep_their_flags(tmp_path: Path) -> None:
    store = FileLogStore(str(tmp_path))
    write_children(store)
    grandchild = [make_event(0, "subagent/descriptor", 1, descriptor("g")), turn_start_event(1, 2), stopped_event(2)]
    persist_log(store, header("g", 20, origin="subagent", parent_session="doubt"), grandchild)
    async with open_runtime(tmp_path, log_store=store, now_ms=now_ms) as runtime:
        found = rows(await runtime.listing.list_descendants("p"))
    assert [(r["id"], r["depth"], r.get("stopped"), r.get("in_doubt")) for r in found] == [
        ("stopped", 1, True, None),
        ("doubt", 1, None, 2),
        ("g", 2, True, None),
        ("plain", 1, None, None),
        ("cleared", 1, None, None),
    ]
    store.close_store()


# --- live: the actor's cells -----------------------------------------------------------------------


async def test_live_children_show_their_flags_from_their_cells(tmp_path: Path) -> None:
    async with open_runtime(tmp_path, now_ms=now_ms) as runtime:
        refs = {}
        for i, kind in enumerate(KINDS[:3]):
            ref = refs[kind] = await runtime.sessions.create(
                header(kind, 10 + i, origin="subagent", parent_session="p")
            )
            drafts = [descriptor_draft(kind), turn_start(1)]
            if kind == "stopped":
                drafts.append(stopped_draft())
            elif kind == "doubt":
                drafts += in_doubt_drafts("a") + in_doubt_drafts("b")
            await ref.append(drafts)
        assert rows(await runtime.listing.list_children("p")) == [{**r, "activity": "running"} for r in EXPECTED[:3]]

        # The parent's new message starts the stopped child again; its next turn clears the doubt.
        await refs["stopped"].append([message_draft("user", 2)])
        await refs["doubt"].append([turn_start(2)])
        assert rows(await runtime.listing.list_children("p")) == [
            row(sid, "running") for sid in ("stopped", "doubt", "plain")
        ]


async def test_a_live_child_whose_flags_cell_holds_a_tampered_state_still_lists(tmp_path: Path) -> None:
    """An actor restored from a tampered flags row: its view is None, so its row has no flags —
    never a diagnostic, never omitted."""
    store = FileLogStore(str(tmp_path))
    write_children(store)
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    write_rows(store, "stopped", registry, subagent_flags={"stopped": "yes"})
    async with open_runtime(tmp_path, log_store=store, now_ms=now_ms) as runtime:
        await runtime.sessions.open("stopped")
        found = rows(await runtime.listing.list_children("p"))
    assert found == [row("stopped", "running"), *EXPECTED[1:]]
    store.close_store()


# --- the CLI ---------------------------------------------------------------------------------------


def test_children_and_agents_commands_show_the_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = FileLogStore(str(tmp_path))
    write_children(store)
    store.close_store()
    assert main(["children", "p", "--json", "--root", str(tmp_path)]) == 0
    assert _without_last_event(capsys.readouterr().out) == EXPECTED
    assert main(["agents", "p", "--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out == TEXT + "\n"
    assert main(["children", "p", "--root", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    # The table's STATE column says so too.
    assert [line.split()[1:3] for line in lines] == [
        ["STATE", "MODE"],
        ["stopped", "continuable"],
        ["ready,", "2"],
        ["ready", "continuable"],
        ["ready", "continuable"],
    ]
    assert "ready, 2 in doubt  continuable" in lines[2]


# --- end to end: a real stop, listed live and then by a new process ------------------------------


async def test_a_child_stopped_for_real_lists_as_stopped_live_and_cold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import trio
    import trio.testing
    from subagents.runtime import CountingIds, ScenarioClock, ScriptedModel, load_script

    agents = [{"label": "kid", "responses": [{"hang": True}]}, {"responses": [{"text": "noted"}]}]
    model = ScriptedModel(load_script(json.dumps({"agents": agents})))
    async with open_runtime(
        tmp_path, model=model, clock=ScenarioClock(), id_factory=CountingIds("s"), compression="none"
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        kid = await rt.subagents.start_continuable(parent, "spawn", "kid", "work")
        while not ((a := rt.agents.get(kid)) is not None and a.status == "running" and a.quiet):
            await trio.testing.wait_all_tasks_blocked()
        (running,) = rows(await rt.listing.list_children("parent"))
        assert "stopped" not in running
        await rt.subagents.stop_tree(kid, by="parent")
        await rt.subagents.wait_tree_idle(parent)
        (live,) = rows(await rt.listing.list_children("parent"))
        assert live["id"] == kid and live["stopped"] is True and "in_doubt" not in live
    # A new process lists it stopped too (the commands run Trio of their own: in a thread).
    root = str(tmp_path)
    assert await trio.to_thread.run_sync(main, ["children", "parent", "--json", "--root", root]) == 0
    assert _without_last_event(capsys.readouterr().out) == [{**live, "activity": "inactive"}]
    assert await trio.to_thread.run_sync(main, ["agents", "parent", "--root", root]) == 0
    assert capsys.readouterr().out == f"{kid} [stopped] — kid\n"


def _without_last_event(out: str) -> list[dict[str, Any]]:
    """The rows `children --json` printed, each without `last_event` (issue 29: its last event's
    time; tests/runtime/test_listing_liveness.py checks it), which must be an int."""
    found = json.loads(out)
    assert all(type(row.pop("last_event")) is int for row in found if row["kind"] == "child")
    return found
