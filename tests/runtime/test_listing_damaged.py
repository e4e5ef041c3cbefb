"""Damaged children never vanish (issue 13, item 1).

A child whose line 1 is damaged but still a JSON object naming its parent lists as
`diagnostic corrupt` (SPEC 5.4 step 3: "still parses" means JSON-parses); a child whose log is
gone, empty, not a regular file or not JSON at all is named by the parent's `subagent_catalog`
projection (its live cell, or its checkpoint row once the runtime has closed) and lists as
`unavailable` (gone) or `corrupt` (unreadable). Healthy siblings stay, in order, and a copied
session folder never shadows its original. The corpus is made by the runtime itself: a parent
starts four continuable children; the first starts a grandchild of its own.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from listing_rows import rows
from subagents.runtime.app import open_runtime
from subagents.runtime.cli import main
from subagents.runtime.clock import ScenarioClock
from subagents.runtime.ids import CountingIds
from subagents.runtime.models.script_format import load_script
from subagents.runtime.models.scripted_model import ScriptedModel
from subagents.storage import FileLogStore
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


async def build(root: Path) -> dict[str, str]:
    """The corpus, made by the runtime: ids by label (and `grand` for alpha's child)."""
    ids: dict[str, str] = {}
    async with open_runtime(
        root,
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
def corpus(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    # Built per test, never copied: a copied log is a new inode, which drops its checkpoint rows.
    root = tmp_path / "root"
    return root, trio.run(build, root)


def log_of(root: Path, sid: str) -> Path:
    return root / "sessions" / sid / "session.jsonl"  # these ids encode to themselves


def edit_line1(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path, str], str | None]:
    def damage(root: Path, sid: str) -> str | None:
        path = log_of(root, sid)
        first, rest = path.read_bytes().split(b"\n", 1)
        header = json.loads(first)
        edit(header)
        tmp = path.with_name("edited.tmp")
        tmp.write_bytes(json.dumps(header).encode() + b"\n" + rest)
        os.replace(tmp, path)
        return None

    return damage


def garbage_line1(root: Path, sid: str) -> str | None:
    path = log_of(root, sid)
    rest = path.read_bytes().split(b"\n", 1)[1]
    path.write_bytes(b"{not json at all\n" + rest)
    return None


def emptied(root: Path, sid: str) -> str | None:
    log_of(root, sid).write_bytes(b"")
    return None


def deleted(root: Path, sid: str) -> str | None:
    log_of(root, sid).unlink()  # the folder (and its lock) stay
    return None


def folder_removed(root: Path, sid: str) -> str | None:
    shutil.rmtree(log_of(root, sid).parent)
    return None


def directory(root: Path, sid: str) -> str | None:
    log_of(root, sid).unlink()
    log_of(root, sid).mkdir()
    return None


def fifo(root: Path, sid: str) -> str | None:
    log_of(root, sid).unlink()
    os.mkfifo(log_of(root, sid))
    return None


def copied(root: Path, sid: str) -> str | None:
    """The folder copied under another name: the copy's header names the original's id."""
    copy = f"{sid}-copy"
    shutil.copytree(log_of(root, sid).parent, log_of(root, copy).parent)
    return copy


def _add(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda header: header.__setitem__(key, value)


# (how, the reason the victim lists with; None: it stays healthy and the copy is the diagnostic)
DAMAGE: dict[str, tuple[Callable[[Path, str], str | None], str | None]] = {
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
}


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


@pytest.mark.parametrize("how", list(DAMAGE))
async def test_a_damaged_child_lists_as_a_diagnostic_live_and_cold(
    corpus: tuple[Path, dict[str, str]], how: str
) -> None:
    root, ids = corpus
    damage, reason = DAMAGE[how]
    extra = damage(root, ids["victim"])
    want = expected(ids, reason, extra)
    healthy_grand = child_row(ids["grand"], "grand")

    # Live parent: its catalog comes from its actor's cell.
    async with open_runtime(root) as rt:
        await rt.sessions.open(PARENT)
        assert rows(await rt.listing.list_children(PARENT)) == want
        assert rows(await rt.listing.list_descendants(PARENT)) == descendants(ids, want, healthy_grand)
        if extra is not None:  # the original is untouched by its copy
            assert rows(await rt.listing.list_children(PARENT))[2] == child_row(ids["victim"], "victim")

    # Cold parent: its catalog comes from its checkpoint row; no log is read at all.
    store = FaultyLogStore(FileLogStore(str(root)))
    async with open_runtime(root, log_store=store) as rt:
        assert rt.sessions.get(PARENT) is None
        assert rows(await rt.listing.list_children(PARENT)) == want
        assert rows(await rt.listing.list_descendants(PARENT)) == descendants(ids, want, healthy_grand)
        assert store.calls["read"] == 0 and store.calls["open_read"] == 0


@pytest.mark.parametrize("how", ["unknown-header-key", "log-emptied", "log-deleted", "folder-removed"])
async def test_a_damaged_grandchild_lists_under_its_parent(corpus: tuple[Path, dict[str, str]], how: str) -> None:
    root, ids = corpus
    damage, reason = DAMAGE[how]
    assert reason is not None
    damage(root, ids["grand"])
    children = expected(ids, None, None)
    want = descendants(ids, children, diag(ids["grand"], reason))
    async with open_runtime(root) as rt:  # alpha cold: its catalog from its checkpoint row
        assert rows(await rt.listing.list_descendants(PARENT)) == want
        assert rows(await rt.listing.list_children(ids["alpha"])) == [diag(ids["grand"], reason)]
        await rt.sessions.open(ids["alpha"])  # alpha live: its catalog from its cell
        live = [{**row, "activity": "running"} if row["id"] == ids["alpha"] else row for row in want]
        assert rows(await rt.listing.list_descendants(PARENT)) == live
        assert rows(await rt.listing.list_children(ids["alpha"])) == [diag(ids["grand"], reason)]


async def test_damage_while_the_runtime_that_made_the_children_is_open(tmp_path: Path) -> None:
    """The parent is the live agent that started the children; they settled and were released."""
    async with open_runtime(
        tmp_path,
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
        edit_line1(_add("delegation_depth", "1"))(tmp_path, ids["victim"])
        deleted(tmp_path, ids["beta"])
        got = rows(await rt.listing.list_children(PARENT))
        assert [(r["id"], r["kind"], r.get("reason")) for r in got] == [
            (ids["alpha"], "child", None),
            (ids["beta"], "diagnostic", "unavailable"),
            (ids["victim"], "diagnostic", "corrupt"),
            (ids["gamma"], "child", None),
        ]


async def test_a_copy_never_shadows_its_original_anywhere(corpus: tuple[Path, dict[str, str]]) -> None:
    root, ids = corpus
    copy = copied(root, ids["beta"])
    assert copy is not None
    async with open_runtime(root) as rt:
        by_id = {record.id: record for record in await rt.query.list_sessions()}
        assert by_id[ids["beta"]].header is not None and by_id[ids["beta"]].damage is None
        assert by_id[copy].header is None and by_id[copy].damage == "corrupt"
        assert by_id[copy].claimed is not None and by_id[copy].claimed.parent_session == PARENT
        got = rows(await rt.listing.list_children(PARENT))
    assert got[1:3] == [child_row(ids["beta"], "beta"), diag(copy, "corrupt")]


def test_cli_children_and_agents_show_the_diagnostics(
    corpus: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, ids = corpus
    edit_line1(_add("colour", "blue"))(root, ids["victim"])
    deleted(root, ids["gamma"])
    assert main(["children", PARENT, "--json", "--root", str(root)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [(r["id"], r["kind"], r.get("reason")) for r in got] == [
        (ids["alpha"], "child", None),
        (ids["beta"], "child", None),
        (ids["victim"], "diagnostic", "corrupt"),
        (ids["gamma"], "diagnostic", "unavailable"),
    ]
    assert main(["agents", PARENT, "--root", str(root)]) == 0
    assert capsys.readouterr().out == (
        f"{ids['alpha']} [ready] — alpha\n"
        f"{ids['beta']} [ready] — beta\n"
        f"{ids['victim']} [diagnostic: corrupt]\n"
        f"{ids['gamma']} [diagnostic: unavailable]\n"
    )
    assert main(["agents", PARENT, "--descendants", "--root", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"{ids['victim']} [diagnostic: corrupt] parent={PARENT} depth=1" in lines
    assert f"{ids['gamma']} [diagnostic: unavailable] parent={PARENT} depth=1" in lines
    assert len(lines) == 5  # alpha, grand, beta, victim, gamma


async def test_a_forks_inherited_catalog_never_names_the_parents_children(tmp_path: Path) -> None:
    script = {"agents": [*SCRIPT["agents"], {"label": "forky", "responses": [{"text": "forked"}]}]}
    async with open_runtime(
        tmp_path,
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
        deleted(tmp_path, beta)
        assert rows(await rt.listing.list_children(fork)) == []
        assert [(r["id"], r.get("reason")) for r in rows(await rt.listing.list_children(PARENT))] == [
            (beta, "unavailable"),
            (fork, None),
        ]
    async with open_runtime(tmp_path) as rt:  # cold: from the checkpoint rows
        assert rows(await rt.listing.list_children(fork)) == []
        assert [(r["id"], r.get("reason")) for r in rows(await rt.listing.list_children(PARENT))] == [
            (beta, "unavailable"),
            (fork, None),
        ]


async def test_the_list_agents_tool_shows_the_diagnostics(corpus: tuple[Path, dict[str, str]]) -> None:
    import msgspec

    root, ids = corpus
    edit_line1(_add("id", "someone-else"))(root, ids["victim"])
    fifo(root, ids["beta"])
    script = {
        "agents": [
            {
                "session": PARENT,
                "responses": [{"tool_calls": [{"name": "list_agents", "arguments": {}}]}, {"text": "done"}],
            }
        ]
    }
    async with open_runtime(root, model=ScriptedModel(load_script(json.dumps(script))), clock=ScenarioClock()) as rt:
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
