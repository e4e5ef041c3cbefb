"""Damaged children never vanish (issue 13, item 1).

A child whose line 1 is damaged but still a JSON object naming its parent lists as
`diagnostic corrupt` (SPEC 5.4 step 3: "still parses" means JSON-parses); a child whose log is
gone, empty, not a regular file or not JSON at all is named by the parent's `subagent_catalog`
projection (its live cell, or its checkpoint row once the runtime has closed) and lists as
`unavailable` (gone) or `corrupt` (unreadable). Healthy siblings stay, in order, and a copied
session folder never shadows its original. The corpus is made by the runtime itself: a parent
starts four continuable children; the first starts a grandchild of its own.

Every test runs on files and on PostgreSQL (the `place` fixture; issue 18), where the same
damage is planted in rows (tests/helpers/pg_damage.py): line 1 edited or garbled, the log
emptied (an empty header row), deleted (every row gone) or copied under another id. A log that
is a directory or a FIFO, or a removed session folder, has no PostgreSQL form: those cases run
on files only. PostgreSQL adds its own: a torn header row, and a child's batch rows garbled,
cut by a seq gap or holding a bad zstd frame, whose checkpoint rows are garbled or gone (so
the listing must read the rows and report them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pg_damage
import pytest
import trio
from listing_rows import rows
from places import Place, open_place
from subagents.runtime import CountingIds, ScenarioClock, ScriptedModel, load_script
from subagents.runtime.hosts.cli import main
from subagents.storage.testing import FaultyLogStore

PARENT = "parent"
LABELS = ("alpha", "beta", "victim", "gamma")  # started in this order: c-1 .. (alpha's grandchild in between)

SCRIPT = {
    "agents": [
        {"session": PARENT, "responses": [{"text": "noted"}] * 12},
        {
            "label": "alpha",
            "responses": [
                {
                    "tool_calls": [
                        {
                            "name": "subagent",
                            "arguments": {"description": "grand", "prompt": "say hi", "run_in_background": True},
                        }
                    ]
                },
                {"text": "alpha started grand"},
                {"text": "alpha noted grand"},
            ],
        },
        {"label": "grand", "responses": [{"text": "hi"}]},
        {"label": "beta", "responses": [{"text": "beta done"}]},
        {"label": "victim", "responses": [{"text": "victim done"}]},
        {"label": "gamma", "responses": [{"text": "gamma done"}]},
    ]
}


async def build(place: Place) -> dict[str, str]:
    """The corpus, made by the runtime: ids by label (and `grand` for alpha's child)."""
    ids: dict[str, str] = {}
    async with place.open_runtime(
        model=ScriptedModel(load_script(json.dumps(SCRIPT))),
        clock=ScenarioClock(),
        id_factory=CountingIds("c"),
        compression="none",
        max_depth=2,
    ) as rt:
        parent = await rt.agents.create(session_id=PARENT)
        for label in LABELS:
            ids[label] = await rt.subagents.start_continuable(parent, "spawn", label, f"work as {label}")
            await rt.subagents.wait_tree_idle(parent)
        (grand,) = await rt.listing.list_children(ids["alpha"])
        ids["grand"] = grand.id
    return ids


@pytest.fixture
def corpus(request: pytest.FixtureRequest, place: Place) -> tuple[Place, dict[str, str]]:
    # On files built per test, never copied: a copied log is a new inode, which drops its
    # checkpoint rows. On PostgreSQL built once per module and its rows copied back for each
    # test: rows copied whole are the same rows (bytes, counts, generations, checkpoints).
    if place.url is None:
        return place, trio.run(build, place)
    ids: dict[str, str] = request.getfixturevalue("pg_corpus")
    pg_damage.restore_rows(place.url, "corpus")
    return place, ids


@pytest.fixture(scope="module")
def pg_corpus(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The corpus built once in the module's database, its rows kept (`pg_damage.save_rows`)."""
    from pg_server import reset_tables

    reset_tables(pg_url)
    place = Place("pg", tmp_path_factory.mktemp("corpus"), pg_url)
    ids = trio.run(build, place)
    pg_damage.save_rows(pg_url, "corpus")
    return ids


def edit_line1(edit: Callable[[dict[str, Any]], None]) -> Callable[[Place, str], str | None]:
    def edited(data: bytes) -> bytes:
        first, rest = data.split(b"\n", 1)
        header = json.loads(first)
        edit(header)
        return json.dumps(header).encode() + b"\n" + rest

    def damage(place: Place, sid: str) -> str | None:
        place.rewrite(sid, edited)
        return None

    return damage


def garbage_line1(place: Place, sid: str) -> str | None:
    place.overwrite(sid, lambda data: b"{not json at all\n" + data.split(b"\n", 1)[1])
    return None


def emptied(place: Place, sid: str) -> str | None:
    place.overwrite(sid, lambda data: b"")  # on PostgreSQL: an empty header row, no batch rows
    return None


def deleted(place: Place, sid: str) -> str | None:
    place.delete(sid)  # files: the folder (and its lock) stay
    return None


def folder_removed(place: Place, sid: str) -> str | None:
    shutil.rmtree(place.log_file(sid).parent)
    return None


def directory(place: Place, sid: str) -> str | None:
    place.log_file(sid).unlink()
    place.log_file(sid).mkdir()
    return None


def fifo(place: Place, sid: str) -> str | None:
    place.log_file(sid).unlink()
    os.mkfifo(place.log_file(sid))
    return None


def copied(place: Place, sid: str) -> str | None:
    """The folder (the rows) copied under another name: the copy's header names the original's id."""
    copy = f"{sid}-copy"
    place.copy(sid, copy)
    return copy


def torn_header(place: Place, sid: str) -> str | None:
    assert place.url is not None
    pg_damage.tear_header(place.url, sid, 25)  # line 1 cut inside its JSON, no newline
    return None


def _add(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda header: header.__setitem__(key, value)


def _self_parent(header: dict[str, Any]) -> None:
    header["parent_session"] = header["id"]


def _rename(key: str, to: str) -> Callable[[dict[str, Any]], None]:
    return lambda header: header.__setitem__(to, header.pop(key))


# (how, the reason the victim lists with; None: it stays healthy and the copy is the diagnostic)
DAMAGE: dict[str, tuple[Callable[[Place, str], str | None], str | None]] = {
    "unknown-header-key": (edit_line1(_add("colour", "blue")), "corrupt"),
    "wrong-type": (edit_line1(_add("delegation_depth", "1")), "corrupt"),
    "id-mismatch": (edit_line1(_add("id", "someone-else")), "corrupt"),
    "copied-folder": (copied, None),
    "header-not-json": (garbage_line1, "corrupt"),
    "log-emptied": (emptied, "corrupt"),
    "log-is-a-directory": (directory, "corrupt"),
    "log-is-a-fifo": (fifo, "corrupt"),
    "log-deleted": (deleted, "unavailable"),
    "folder-removed": (folder_removed, "unavailable"),
    "header-row-torn": (torn_header, "corrupt"),
    # Issue 28 ("nothing hidden"): a valid line 1 that names another parent, itself or no parent
    # (or a garbled `parent_session` key) disagrees with the catalog that names it: `corrupt`
    # under the catalog's owner, listed once, and never its own child.
    "names-another-parent": (edit_line1(_add("parent_session", "someone-else")), "corrupt"),
    "names-itself": (edit_line1(_self_parent), "corrupt"),
    "names-no-parent": (edit_line1(_add("parent_session", None)), "corrupt"),
    "parent-key-garbled": (edit_line1(_rename("parent_session", "parent_sessiom")), "corrupt"),
}
FILES_ONLY = {"log-is-a-directory", "log-is-a-fifo", "folder-removed"}  # no PostgreSQL form
PG_ONLY = {"header-row-torn"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`place` for every test here (this module's own fixture, below); with `how`, each damage
    on the stores it has a form on."""
    if "place" not in metafunc.fixturenames:
        return
    names = getattr(metafunc.function, "damage_cases", None)
    if names is None:
        pg = pytest.param("pg", marks=pytest.mark.pg)
        kinds = [pg] if getattr(metafunc.function, "pg_only", False) else ["file", pg]
        metafunc.parametrize("place", kinds, indirect=True)
        return
    pairs = []
    for kind in ("file", "pg"):
        for how in names:
            if how in (PG_ONLY if kind == "file" else FILES_ONLY):
                continue
            marks = [pytest.mark.pg] if kind == "pg" else []
            pairs.append(pytest.param(kind, how, id=f"{kind}-{how}", marks=marks))
    metafunc.parametrize(("place", "how"), pairs, indirect=["place"])


@pytest.fixture
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    """Files or PostgreSQL, as `pytest_generate_tests` says (conftest's `place`, parametrized here)."""
    yield from open_place(request, tmp_path, request.param)


def with_damage(*names: str) -> Callable[[Any], Any]:
    def mark(fn: Any) -> Any:
        fn.damage_cases = list(names) or list(DAMAGE)
        return fn

    return mark


def child_row(sid: str, label: str, *, has_children: bool = False, activity: str = "inactive") -> dict[str, Any]:
    return {
        "kind": "child",
        "id": sid,
        "activity": activity,
        "has_children": has_children,
        "mode": "continuable",
        "label": label,
    }


def diag(sid: str, reason: str) -> dict[str, Any]:
    return {"kind": "diagnostic", "id": sid, "reason": reason}


def expected(ids: dict[str, str], reason: str | None, extra: str | None) -> list[dict[str, Any]]:
    out = []
    for label in LABELS:
        sid = ids[label]
        if label == "victim" and reason is not None:
            out.append(diag(sid, reason))
            continue
        out.append(child_row(sid, label, has_children=label == "alpha"))
        if label == "victim" and extra is not None:
            out.append(diag(extra, "corrupt"))  # the copy: same created_at, its own folder id
    return out


def descendants(ids: dict[str, str], children: list[dict[str, Any]], grand: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for row in children:
        out.append({**row, "parent_id": PARENT, "depth": 1})
        if row["id"] == ids["alpha"]:
            out.append({**grand, "parent_id": ids["alpha"], "depth": 2})
    return out


@with_damage()
async def test_a_damaged_child_lists_as_a_diagnostic_live_and_cold(
    corpus: tuple[Place, dict[str, str]], how: str
) -> None:
    place, ids = corpus
    damage, reason = DAMAGE[how]
    extra = damage(place, ids["victim"])
    want = expected(ids, reason, extra)
    healthy_grand = child_row(ids["grand"], "grand")

    # Live parent: its catalog comes from its actor's cell.
    async with place.open_runtime() as rt:
        await rt.sessions.open(PARENT)
        assert rows(await rt.listing.list_children(PARENT)) == want
        assert rows(await rt.listing.list_descendants(PARENT)) == descendants(ids, want, healthy_grand)
        if extra is not None:  # the original is untouched by its copy
            assert rows(await rt.listing.list_children(PARENT))[2] == child_row(ids["victim"], "victim")

    # Cold parent: its catalog comes from its checkpoint row; no log is read at all.
    store = FaultyLogStore(place.store())
    async with place.open_runtime(log_store=store) as rt:
        assert rt.sessions.get(PARENT) is None
        assert rows(await rt.listing.list_children(PARENT)) == want
        assert rows(await rt.listing.list_descendants(PARENT)) == descendants(ids, want, healthy_grand)
        assert store.calls["read"] == 0 and store.calls["open_read"] == 0


@with_damage("unknown-header-key", "log-emptied", "log-deleted", "folder-removed", "header-row-torn")
async def test_a_damaged_grandchild_lists_under_its_parent(corpus: tuple[Place, dict[str, str]], how: str) -> None:
    place, ids = corpus
    damage, reason = DAMAGE[how]
    assert reason is not None
    damage(place, ids["grand"])
    children = expected(ids, None, None)
    want = descendants(ids, children, diag(ids["grand"], reason))
    async with place.open_runtime() as rt:  # alpha cold: its catalog from its checkpoint row
        assert rows(await rt.listing.list_descendants(PARENT)) == want
        assert rows(await rt.listing.list_children(ids["alpha"])) == [diag(ids["grand"], reason)]
        await rt.sessions.open(ids["alpha"])  # alpha live: its catalog from its cell
        live = [{**row, "activity": "running"} if row["id"] == ids["alpha"] else row for row in want]
        assert rows(await rt.listing.list_descendants(PARENT)) == live
        assert rows(await rt.listing.list_children(ids["alpha"])) == [diag(ids["grand"], reason)]


async def test_damage_while_the_runtime_that_made_the_children_is_open(place: Place) -> None:
    """The parent is the live agent that started the children; they settled and were released."""
    async with place.open_runtime(
        model=ScriptedModel(load_script(json.dumps(SCRIPT))),
        clock=ScenarioClock(),
        id_factory=CountingIds("c"),
        compression="none",
        max_depth=2,
    ) as rt:
        parent = await rt.agents.create(session_id=PARENT)
        ids = {}
        for label in LABELS:
            ids[label] = await rt.subagents.start_continuable(parent, "spawn", label, f"work as {label}")
            await rt.subagents.wait_tree_idle(parent)
        assert rt.sessions.get(ids["victim"]) is None and rt.sessions.get(ids["beta"]) is None
        edit_line1(_add("delegation_depth", "1"))(place, ids["victim"])
        deleted(place, ids["beta"])
        got = rows(await rt.listing.list_children(PARENT))
        assert [(r["id"], r["kind"], r.get("reason")) for r in got] == [
            (ids["alpha"], "child", None),
            (ids["beta"], "diagnostic", "unavailable"),
            (ids["victim"], "diagnostic", "corrupt"),
            (ids["gamma"], "child", None),
        ]


async def test_a_copy_never_shadows_its_original_anywhere(corpus: tuple[Place, dict[str, str]]) -> None:
    place, ids = corpus
    copy = copied(place, ids["beta"])
    assert copy is not None
    async with place.open_runtime() as rt:
        by_id = {record.id: record for record in await rt.query.list_sessions()}
        assert by_id[ids["beta"]].header is not None and by_id[ids["beta"]].damage is None
        assert by_id[copy].header is None and by_id[copy].damage == "corrupt"
        assert by_id[copy].claimed is not None and by_id[copy].claimed.parent_session == PARENT
        got = rows(await rt.listing.list_children(PARENT))
    assert got[1:3] == [child_row(ids["beta"], "beta"), diag(copy, "corrupt")]


def test_cli_children_and_agents_show_the_diagnostics(
    corpus: tuple[Place, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    place, ids = corpus
    edit_line1(_add("colour", "blue"))(place, ids["victim"])
    deleted(place, ids["gamma"])
    assert main(["children", PARENT, "--json", *place.cli()]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [(r["id"], r["kind"], r.get("reason")) for r in got] == [
        (ids["alpha"], "child", None),
        (ids["beta"], "child", None),
        (ids["victim"], "diagnostic", "corrupt"),
        (ids["gamma"], "diagnostic", "unavailable"),
    ]
    assert main(["agents", PARENT, *place.cli()]) == 0
    assert capsys.readouterr().out == (
        f"{ids['alpha']} [ready] — alpha\n"
        f"{ids['beta']} [ready] — beta\n"
        f"{ids['victim']} [diagnostic: corrupt]\n"
        f"{ids['gamma']} [diagnostic: unavailable]\n"
    )
    assert main(["agents", PARENT, "--descendants", *place.cli()]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"{ids['victim']} [diagnostic: corrupt] parent={PARENT} depth=1" in lines
    assert f"{ids['gamma']} [diagnostic: unavailable] parent={PARENT} depth=1" in lines
    assert len(lines) == 5  # alpha, grand, beta, victim, gamma


async def test_a_forks_inherited_catalog_never_names_the_parents_children(place: Place) -> None:
    script = {"agents": [*SCRIPT["agents"], {"label": "forky", "responses": [{"text": "forked"}]}]}
    async with place.open_runtime(
        model=ScriptedModel(load_script(json.dumps(script))),
        clock=ScenarioClock(),
        id_factory=CountingIds("c"),
        compression="none",
        max_depth=2,
    ) as rt:
        parent = await rt.agents.create(session_id=PARENT)
        beta = await rt.subagents.start_continuable(parent, "spawn", "beta", "work as beta")
        await rt.subagents.wait_tree_idle(parent)
        fork = await rt.subagents.start_continuable(parent, "fork", "forky", "work as a fork")
        await rt.subagents.wait_tree_idle(parent)
        record = next(r for r in await rt.query.list_sessions() if r.id == fork)
        assert record.inherited_event_count > 0  # its seed holds the parent's catalog of beta
        deleted(place, beta)
        assert rows(await rt.listing.list_children(fork)) == []
        assert [(r["id"], r.get("reason")) for r in rows(await rt.listing.list_children(PARENT))] == [
            (beta, "unavailable"),
            (fork, None),
        ]
    async with place.open_runtime() as rt:  # cold: from the checkpoint rows
        assert rows(await rt.listing.list_children(fork)) == []
        assert [(r["id"], r.get("reason")) for r in rows(await rt.listing.list_children(PARENT))] == [
            (beta, "unavailable"),
            (fork, None),
        ]


async def test_the_list_agents_tool_shows_the_diagnostics(corpus: tuple[Place, dict[str, str]]) -> None:
    import msgspec

    place, ids = corpus
    edit_line1(_add("id", "someone-else"))(place, ids["victim"])
    # A log that cannot be read: a FIFO in its place, or on PostgreSQL a header row that is no JSON.
    (fifo if place.kind == "file" else garbage_line1)(place, ids["beta"])
    script = {
        "agents": [
            {
                "session": PARENT,
                "responses": [{"tool_calls": [{"name": "list_agents", "arguments": {}}]}, {"text": "done"}],
            }
        ]
    }
    async with place.open_runtime(model=ScriptedModel(load_script(json.dumps(script))), clock=ScenarioClock()) as rt:
        parent = await rt.agents.resume(PARENT)
        await parent.send("list them")
        await parent.wait_idle()
        handle = rt.log_store.open_read(PARENT)
        events = list(rt.log_store.read(handle))
        rt.log_store.close(handle)
    (result,) = [msgspec.json.decode(e.data) for e in events if e.type == "tool/result"][-1:]
    assert result["message"]["content"][0]["content"][0]["text"] == (
        f"{ids['alpha']} [ready] — alpha\n"
        f"{ids['beta']} [diagnostic: corrupt]\n"
        f"{ids['victim']} [diagnostic: corrupt]\n"
        f"{ids['gamma']} [ready] — gamma"
    )


# --- PostgreSQL rows damaged behind checkpoints that cannot answer -----------------------------------


def _last_batch(url: str, sid: str) -> int:
    return pg_damage.batches(url, sid)[-1][0]


BODY_DAMAGE: dict[str, Callable[[str, str], None] | None] = {
    "healthy": None,
    "batch-garbled": lambda url, sid: pg_damage.garble_batch(url, sid, _last_batch(url, sid)),
    "seq-gap": lambda url, sid: pg_damage.drop_batch(url, sid, pg_damage.batches(url, sid)[1][0]),
    "bad-zstd-frame": lambda url, sid: pg_damage.zstd_batch(url, sid, _last_batch(url, sid)),
    "count-mismatch": lambda url, sid: pg_damage.sql(
        url, "UPDATE batches SET count = count + 1 WHERE session_id = %s AND first_seq = 0", (sid,)
    ),
}
CHECKPOINT_DAMAGE: dict[str, Callable[[str, str], None]] = {
    "value-garbled": lambda url, sid: pg_damage.garble_checkpoints(url, sid, value=b"{not json"),
    "lifecycle-garbled": lambda url, sid: pg_damage.garble_checkpoints(url, sid, lifecycle=b"\xff garbage"),
    "rows-deleted": lambda url, sid: pg_damage.sql(url, "DELETE FROM checkpoints WHERE session_id = %s", (sid,)),
}


def pg_only(fn: Any) -> Any:
    fn.pg_only = True
    return fn


# Each body damage once, behind each kind of unusable checkpoint in turn (not every pair: a corpus
# costs about a second).
CASES = [(body, list(CHECKPOINT_DAMAGE)[i % len(CHECKPOINT_DAMAGE)]) for i, body in enumerate(BODY_DAMAGE)]


@pg_only
@pytest.mark.parametrize(("body", "checkpoint"), CASES, ids=[f"{b}-behind-{c}" for b, c in CASES])
async def test_damaged_rows_behind_checkpoints_that_cannot_answer_list_as_corrupt(
    corpus: tuple[Place, dict[str, str]], body: str, checkpoint: str
) -> None:
    """The victim's checkpoint rows garbled or gone: the listing reads its
    batch rows, and damage there (a garbled batch, a seq gap, a bad zstd frame, a count that
    is not the batch's) lists it as `corrupt`; healthy rows list it as it is. Never a crash,
    never a vanished child; the siblings stay as they are."""
    place, ids = corpus
    assert place.url is not None
    victim = ids["victim"]
    assert len(pg_damage.batches(place.url, victim)) >= 2 and pg_damage.checkpoint_rows(place.url, victim)
    plant = BODY_DAMAGE[body]
    if plant is not None:
        plant(place.url, victim)
    CHECKPOINT_DAMAGE[checkpoint](place.url, victim)
    want = expected(ids, None if plant is None else "corrupt", None)
    healthy_grand = child_row(ids["grand"], "grand")
    async with place.open_runtime() as rt:
        await rt.sessions.open(PARENT)
        assert rows(await rt.listing.list_children(PARENT)) == want
        assert rows(await rt.listing.list_descendants(PARENT)) == descendants(ids, want, healthy_grand)
    store = FaultyLogStore(place.store())
    async with place.open_runtime(log_store=store) as rt:
        assert rows(await rt.listing.list_children(PARENT)) == want
        assert store.calls["read"] >= 1  # the victim's rows were read: its checkpoint could not answer


# --- issue 28: nothing hidden (the parent's catalog climbs the identity ladder) ----------------------


def _index_files(place: Place) -> list[Path]:
    return [place.root / name for name in ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm")]


def index_deleted(place: Place) -> None:
    """The index lost: on files the index file goes; on PostgreSQL (no index file) the parent's
    checkpoint rows, its part of what an index holds."""
    if place.url is not None:
        pg_damage.sql(place.url, "DELETE FROM checkpoints WHERE session_id = %s", (PARENT,))
        return
    for path in _index_files(place):
        path.unlink(missing_ok=True)


def index_damaged(place: Place) -> None:
    """The index garbled: on files a file that is no database; on PostgreSQL the parent's rows
    name no lifecycle (a garbled value is `test_damaged_rows_behind_checkpoints…`'s case)."""
    if place.url is not None:
        pg_damage.garble_checkpoints(place.url, PARENT, lifecycle=b"\xff garbage")
        return
    index_deleted(place)
    _index_files(place)[0].write_bytes(b"not a database at all\n" * 512)


def parent_edited_in_place(place: Place) -> None:
    """The parent's log written again in place, same bytes (an editor's save): on files a new
    mtime on the same inode, on PostgreSQL a rewrite: either way its checkpoint rows go."""
    place.overwrite(PARENT, lambda data: data)


LOST_ROWS: dict[str, Callable[[Place], None]] = {
    "index-deleted": index_deleted,
    "index-damaged": index_damaged,
    "parent-edited-in-place": parent_edited_in_place,
}


@pytest.mark.parametrize("lost", list(LOST_ROWS))
async def test_a_catalogued_child_is_never_hidden_by_lost_parent_rows(
    corpus: tuple[Place, dict[str, str]], lost: str
) -> None:
    """The victim's log is gone (only the parent's catalog names it) and the parent's checkpoint
    rows are gone too: the cold parent's log is observed for its catalog, once, and written back
    (the next listing reads no log at all)."""
    place, ids = corpus
    deleted(place, ids["victim"])
    LOST_ROWS[lost](place)
    want = expected(ids, "unavailable", None)
    healthy_grand = child_row(ids["grand"], "grand")
    store = FaultyLogStore(place.store())
    async with place.open_runtime(log_store=store) as rt:
        assert rt.sessions.get(PARENT) is None
        assert rows(await rt.listing.list_children(PARENT)) == want
        assert rows(await rt.listing.list_descendants(PARENT)) == descendants(ids, want, healthy_grand)
        assert store.calls["read"] >= 1  # the parent's log, at least: nothing else names the victim
    store = FaultyLogStore(place.store())
    async with place.open_runtime(log_store=store) as rt:  # the rows written back answer
        assert rows(await rt.listing.list_children(PARENT)) == want
        assert rows(await rt.listing.list_descendants(PARENT)) == descendants(ids, want, healthy_grand)
        assert store.calls["read"] == 0 and store.calls["open_read"] == 0


@with_damage("names-another-parent", "names-itself", "names-no-parent", "parent-key-garbled")
async def test_a_child_naming_another_parent_is_listed_once_and_never_its_own_child(
    corpus: tuple[Place, dict[str, str]], how: str
) -> None:
    place, ids = corpus
    victim = ids["victim"]
    DAMAGE[how][0](place, victim)
    if not place.is_pg:
        index_deleted(place)  # the parent's catalog from its log, too
    want = expected(ids, "corrupt", None)
    async with place.open_runtime() as rt:
        assert rows(await rt.listing.list_children(PARENT)) == want
        found = rows(await rt.listing.list_descendants(PARENT))
        assert [r["id"] for r in found].count(victim) == 1
        assert found == descendants(ids, want, child_row(ids["grand"], "grand"))
        assert rows(await rt.listing.list_children(victim)) == []  # never its own child
        assert [r["id"] for r in rows(await rt.listing.list_descendants(victim))] == []


def catalog_row_lost(place: Place, sid: str) -> None:
    """The session's catalog row alone gone (as a damaged index may lose it), its other rows kept."""
    if place.url is not None:
        pg_damage.sql(place.url, "DELETE FROM checkpoints WHERE session_id = %s AND unit = 'subagent_catalog'", (sid,))
        return
    import sqlite3

    with contextlib.closing(sqlite3.connect(place.root / "index.sqlite3")) as db, db:
        deleted = db.execute("DELETE FROM checkpoints WHERE session_id = ? AND unit_key = 'subagent_catalog'", (sid,))
        assert deleted.rowcount == 1


async def test_a_parents_lost_catalog_row_never_hides_a_catalogued_child(corpus: tuple[Place, dict[str, str]]) -> None:
    """Its identity and flags rows still cover the log, its catalog row is gone: no empty catalog
    is inferred for a parent that records name (issue 28)."""
    place, ids = corpus
    deleted(place, ids["victim"])
    catalog_row_lost(place, PARENT)
    want = expected(ids, "unavailable", None)
    async with place.open_runtime() as rt:
        assert rows(await rt.listing.list_children(PARENT)) == want
        assert rows(await rt.listing.list_descendants(PARENT)) == descendants(
            ids, want, child_row(ids["grand"], "grand")
        )


@pg_only
@pytest.mark.parametrize("checkpoint", list(CHECKPOINT_DAMAGE))
async def test_a_parents_unusable_rows_never_hide_a_catalogued_child(
    corpus: tuple[Place, dict[str, str]], checkpoint: str
) -> None:
    """The parent's checkpoint rows garbled (the catalog row holds no catalog) or gone, and the
    victim's log gone: the cold parent's log is read for its catalog (issue 28)."""
    place, ids = corpus
    assert place.url is not None
    deleted(place, ids["victim"])
    CHECKPOINT_DAMAGE[checkpoint](place.url, PARENT)
    want = expected(ids, "unavailable", None)
    async with place.open_runtime() as rt:
        assert rows(await rt.listing.list_children(PARENT)) == want
        assert rows(await rt.listing.list_descendants(PARENT)) == descendants(
            ids, want, child_row(ids["grand"], "grand")
        )
