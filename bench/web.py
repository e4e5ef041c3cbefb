"""The web console at 10,000 sessions (issue 31: "the overview and the first tree page each
answer in under 0.5 s"). A store of 100 roots with 99 continuable children each and one root
`long` of 5,500 events (written with the storage layer, bench/corpus.py), the console's app
over one read side, requests through httpx's ASGI transport (the app's own time: no socket, no
browser), and the tree feed's start over `fed`, a root with 99 catalogued children of 221
events each (the runtime's event stream, as the feed opens it). Reported per page: the first
request (the store's index built by it when `--no-index`, else already there), then the median
and the worst of `--reps` more.

Run: `.venv/bin/python bench/web.py` (`--reps N`, default 10; `--sessions` per root 100 by
default; `--dir` for the temporary store; `--store DIR` keeps one store between runs, so two
versions of the console can be measured on the same files). A measurement, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Sequence

import httpx
import trio
from corpus import (
    CREATED_AT,
    NoSyncFs,
    build_store,
    child_events,
    drop_index,
    events_of,
    header,
    root_events,
    write_log,
)
from subagents.runtime.hosts.web.app import WebSettings, build_app
from subagents.runtime.hosts.web.security import Access
from subagents.runtime.read_side import open_read_side
from subagents.storage import FileLogStore

PAGES = ("/", "/tree", "/tree/r000", "/session/r000-c00000", "/session/long")
LONG_TURNS = 500  # the root `long`: 500 turns, 5,500 events (~1.5 MB)
FED_CHILDREN, FED_TURNS = 99, 20  # the root `fed`: 99 catalogued children of 20 turns (221 events) each


async def measure(root: str, reps: int) -> dict[str, tuple[float, float, float]]:
    out = {}
    # As `subagents web` opens its store (with change notification: serve.py), and lists it once
    # before it says it is ready (serve.py `_warm`).
    async with open_read_side(root, watch=True) as side:
        start = time.perf_counter()
        await side.query.list_sessions(probe_locks=True)
        warmed = time.perf_counter() - start
        out["console start-up listing"] = (warmed, warmed, warmed)
        settings = WebSettings(root=root, access=Access("bench-token-long-enough"))
        transport = httpx.ASGITransport(app=build_app(side, settings))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765") as client:
            for path in PAGES:
                times = []
                for _ in range(reps + 1):
                    start = time.perf_counter()
                    response = await client.get(path)
                    times.append(time.perf_counter() - start)
                    assert response.status_code == 200, (path, response.status_code)
                out[path] = (times[0], statistics.median(times[1:]), max(times[1:]))
        out |= await _feed_start(side, reps)
    return out


async def _feed_start(side, reps: int) -> dict[str, tuple[float, float, float]]:  # noqa: ANN001  # a ReadSide
    """How long a tree feed over `fed` (99 catalogued children, 221 events each) takes from its open to every session
    read to its end (the stream finished at once, drained): as the console opens it — each
    session from the end its listing knows (`known`), when this version has it — and the
    stream's first way (the root's history read for its children, each child read whole)."""
    from subagents.runtime.event_stream import open_event_stream

    try:
        from subagents.runtime.hosts.web.feed_start import tree_ends
    except ImportError:  # a console before feed_start.py: the first way only
        tree_ends = None
    out = {}
    for label in ("tree feed start, read whole", "tree feed start, from known ends"):
        if tree_ends is None and "known" in label:
            continue
        times = []
        for _ in range(reps + 1):
            start = time.perf_counter()
            info, _held = await side.query.stat("fed")
            known = await tree_ends(side, "fed", info) if "known" in label and tree_ends is not None else None
            extra = {"known": known} if known is not None else {}
            async with open_event_stream(side.query, "fed", from_seq=int(info.event_count), **extra) as stream:
                stream.finish()
                async for _item in stream:
                    pass
            times.append(time.perf_counter() - start)
        out[label] = (times[0], statistics.median(times[1:]), max(times[1:]))
    return out


def _write_fed(store: FileLogStore, turns: int) -> None:
    """The root `fed` (a turn, then a `subagent/catalog` event per child, as a parent that
    spawned them writes) and its children `fed-cNN`, each with `turns` turns."""
    kids = [f"fed-c{i:02d}" for i in range(FED_CHILDREN)]
    catalogs = [
        (
            "subagent/catalog",
            {"version": 1, "child_id": kid, "child_created_at": CREATED_AT + 2_000_000 + i, "mode": "continuable"},
            False,
        )
        for i, kid in enumerate(kids)
    ]
    first = root_events()
    write_log(store, header("fed", 1_999_999, None), first + events_of(len(first), catalogs))
    events = child_events("a fed child", turns=turns)
    for i, kid in enumerate(kids):
        write_log(store, header(kid, 2_000_000 + i, "fed"), events, batch=11)


def corpus_options(parser: argparse.ArgumentParser) -> None:
    """The options this bench and bench/web_live.py share: repetitions, the corpus's roots and
    children per root, the folder for the temporary store."""
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--roots", type=int, default=100)
    parser.add_argument("--children", type=int, default=99, help="children per root")
    parser.add_argument("--dir", default=None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    corpus_options(parser)
    parser.add_argument("--fed-turns", type=int, default=FED_TURNS, help="turns of each of fed's children")
    parser.add_argument(
        "--store", default=None, help="a folder kept between runs (written when empty): before/after on one store"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        root = args.store or scratch
        roots = [f"r{i:03d}" for i in range(args.roots)]
        if not os.path.isdir(os.path.join(root, "sessions")):
            start = time.perf_counter()
            n = build_store(root, roots=roots, children=[(r, args.children) for r in roots])
            store = FileLogStore(fs=NoSyncFs(root), compression="zstd")  # type: ignore[arg-type]  # as build_store's
            try:
                write_log(store, header("long", 999_999, None), root_events(LONG_TURNS), batch=11)
                _write_fed(store, args.fed_turns)
            finally:
                store.close_store()
            print(f"store: {n + 2 + FED_CHILDREN} sessions written in {time.perf_counter() - start:.1f} s")
        for label, drop in (("no index (the first request builds it)", True), ("index in place", False)):
            if drop:
                drop_index(root)
            figures = trio.run(measure, root, args.reps)
            print(f"-- {label}")
            for path, (first, median, worst) in figures.items():
                print(
                    f"{path:34} first {first * 1000:8.1f} ms   median {median * 1000:7.1f} ms   worst {worst * 1000:7.1f} ms"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
