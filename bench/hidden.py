"""Hidden children over randomly damaged stores (issue 28 item 2, "nothing hidden").

Each store is made afresh by the runtime itself (a parent that starts CHILDREN continuable
children, each named by its `subagent/catalog`; the runtime closes, so every log is checkpointed),
then damaged at random: one to three damages drawn from DAMAGES (the index deleted, garbled or
cut; the parent's log written again in place; a child's log deleted, emptied or its folder
removed; a child's line 1 made garbage, naming another parent, itself or no parent, a garbled
`parent_session` key, an unknown key). Then a fresh runtime lists the parent's children and
descendants, cold: as a runtime does, and as the CLI does (a store focused on the parent, or on
its subtree). A store *hides* a child when a catalogued child is not listed (as a row or a
diagnostic) by `list_children`, or not exactly once by `list_descendants`, or when a session
lists itself as its own child; a listing that raises counts as a failure. Printed: the stores
that hid a child (0 expected), by the damages they drew, and the failures.

Run: `.venv/bin/python bench/hidden.py [--stores 1000] [--seed N]`. To count for another tree
(the "before" of bench/README.md), put a directory holding a `subagents` link to that tree
first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import subagents.runtime
import trio
from subagents.runtime import CountingIds, ScenarioClock, ScriptedModel, load_script, open_runtime
from subagents.runtime.read_side import open_read_side

PARENT = "parent"
CHILDREN = 5
SCRIPT = {
    "agents": [
        {"session": PARENT, "responses": [{"text": "noted"}] * (CHILDREN + 2)},
        *({"label": f"c{i}", "responses": [{"text": f"c{i} done"}]} for i in range(CHILDREN)),
    ]
}
SCRIPT_TEXT = json.dumps(SCRIPT)


async def build(root: Path) -> list[str]:
    ids = []
    async with open_runtime(
        root,
        model=ScriptedModel(load_script(SCRIPT_TEXT)),
        clock=ScenarioClock(),
        id_factory=CountingIds("c"),
        compression="none",
    ) as rt:
        parent = await rt.agents.create(session_id=PARENT)
        for i in range(CHILDREN):
            ids.append(await rt.subagents.start_continuable(parent, "spawn", f"c{i}", "work"))
            await rt.subagents.wait_tree_idle(parent)
    return ids


def log(root: Path, sid: str) -> Path:
    return root / "sessions" / sid / "session.jsonl"


def _index(root: Path) -> list[Path]:
    return [root / name for name in ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm")]


def index_deleted(root: Path, rng: random.Random, ids: list[str]) -> None:
    for path in _index(root):
        path.unlink(missing_ok=True)


def index_garbled(root: Path, rng: random.Random, ids: list[str]) -> None:
    path = _index(root)[0]
    if not path.exists():
        return
    data = bytearray(path.read_bytes())
    for _ in range(rng.randint(1, 64)):
        at = rng.randrange(len(data))
        data[at] = rng.randrange(256)
    path.write_bytes(bytes(data))


def index_cut(root: Path, rng: random.Random, ids: list[str]) -> None:
    path = _index(root)[0]
    if path.exists():
        data = path.read_bytes()
        path.write_bytes(data[: rng.randrange(len(data) + 1)])


def parent_in_place(root: Path, rng: random.Random, ids: list[str]) -> None:
    path = log(root, PARENT)
    path.write_bytes(path.read_bytes())  # same bytes, same inode, a new mtime


def _child(fn: Callable[[Path], None]) -> Callable[[Path, random.Random, list[str]], None]:
    def damage(root: Path, rng: random.Random, ids: list[str]) -> None:
        path = log(root, rng.choice(ids))
        if path.is_file():
            fn(path)

    return damage


def _line1(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def edited(path: Path) -> None:
        first, _, rest = path.read_bytes().partition(b"\n")
        try:
            header = json.loads(first)
        except ValueError:
            return
        if type(header) is dict:
            edit(header)
            path.write_bytes(json.dumps(header).encode() + b"\n" + rest)

    return edited


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda header: header.__setitem__(key, value)


def _self(header: dict[str, Any]) -> None:
    header["parent_session"] = header.get("id")


def _garble_key(header: dict[str, Any]) -> None:
    if "parent_session" in header:
        header["parent_sessiom"] = header.pop("parent_session")


DAMAGES: dict[str, Callable[[Path, random.Random, list[str]], None]] = {
    "index-deleted": index_deleted,
    "index-garbled": index_garbled,
    "index-cut": index_cut,
    "parent-in-place": parent_in_place,
    "log-deleted": _child(lambda path: path.unlink()),
    "log-emptied": _child(lambda path: path.write_bytes(b"")),
    "folder-removed": _child(lambda path: shutil.rmtree(path.parent)),
    "line1-garbage": _child(lambda path: path.write_bytes(b"{garbage\n" + path.read_bytes().partition(b"\n")[2])),
    "other-parent": _child(_line1(_set("parent_session", "someone-else"))),
    "self-parent": _child(_line1(_self)),
    "no-parent": _child(_line1(_set("parent_session", None))),
    "parent-key-garbled": _child(_line1(_garble_key)),
    "unknown-key": _child(_line1(_set("colour", "blue"))),
}


async def check(root: Path, ids: list[str]) -> list[str]:
    """What the cold listings got wrong (empty: nothing hidden)."""
    wrong = []
    async with open_runtime(root) as rt:
        children = [row.id for row in await rt.listing.list_children(PARENT)]
        below = [row.id for row in await rt.listing.list_descendants(PARENT)]
        for sid in ids:
            if sid not in children:
                wrong.append(f"{sid} not in children")
            if below.count(sid) != 1:
                wrong.append(f"{sid} {below.count(sid)}x in descendants")
            if sid in [row.id for row in await rt.listing.list_children(sid)]:
                wrong.append(f"{sid} its own child")
        if PARENT in children:
            wrong.append("the parent its own child")
    return wrong


async def check_focused(root: Path, ids: list[str]) -> list[str]:
    """The same, as the CLI lists them: `children P` on a store focused on P, and
    `children P --descendants` on one focused on P's subtree (each on its own copy of the
    damaged store, since each writes back its own index rows)."""
    wrong = []
    for subtree in (False, True):
        with tempfile.TemporaryDirectory(prefix="hidden-copy-") as tmp:
            copy = Path(tmp) / "store"
            shutil.copytree(root, copy)
            async with open_read_side(copy, focus=PARENT, subtree=subtree) as side:
                if subtree:
                    rows = [row.id for row in await side.listing.list_descendants(PARENT)]
                else:
                    rows = [row.id for row in await side.listing.list_children(PARENT)]
        what = "focused descendants" if subtree else "focused children"
        wrong += [f"{sid} {rows.count(sid)}x in {what}" for sid in ids if rows.count(sid) != 1]
        if PARENT in rows:
            wrong.append(f"the parent in its own {what}")
    return wrong


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stores", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=20261202)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    hid = 0
    failed = 0
    by_damage: collections.Counter[str] = collections.Counter()
    drawn: collections.Counter[str] = collections.Counter()
    started = time.perf_counter()
    for n in range(args.stores):
        with tempfile.TemporaryDirectory(prefix="hidden-") as tmp:
            root = Path(tmp)
            ids = await build(root)
            names = rng.sample(sorted(DAMAGES), rng.randint(1, 3))
            drawn.update(names)
            for name in names:
                DAMAGES[name](root, rng, ids)
            try:
                wrong = await check_focused(root, ids)
                wrong += await check(root, ids)
            except Exception as exc:  # a listing that raises: counted, shown
                failed += 1
                print(f"store {n} {names}: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            if wrong:
                hid += 1
                by_damage.update(names)
                if hid <= 5:
                    print(f"store {n} {names}: {'; '.join(wrong)}", file=sys.stderr)
    took = time.perf_counter() - started
    print(f"subagents from {Path(str(subagents.runtime.__file__)).parent.parent}")
    print(f"{args.stores} damaged stores (seed {args.seed}, {took:.0f} s): {hid} hid a child, {failed} failed")
    if hid:
        print("damages drawn by the stores that hid one (of all drawn):")
        for name, count in by_damage.most_common():
            print(f"  {name}: {count} of {drawn[name]}")


if __name__ == "__main__":
    trio.run(main)
