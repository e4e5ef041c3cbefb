"""Listing write-back (issue 20 item 1): a second `subagents children` answers from the checkpoint
rows the first one's observations wrote.

Corpus: CHILDREN (200) subagent children of one parent, ~LOG_BYTES (256 KB) of realistic events
each (bench/storage.py's generator), half of them seeded (half inherited, the tagged seed marker,
then their own descriptor and events), written with the storage layer directly
(`FileLogStore.create` / `append`, the default zstd form): no runtime ever ran, so no checkpoint
rows exist. The same store holds a childless parent.

Every run is a new process: `subagents children <parent> --json --root <root>` (output checked).
One repetition:
- reset: the index as the first command finds it — `fresh`: no index at all (as written by
  hand); `indexed`: an index holding every log's session row and no checkpoint rows (a copy
  made once, so only the observations and their write-back differ);
- first: the command observes every child in full and writes back what it proved;
- second: the same command again: the checkpoint rung answers;
- empty: the same command on the childless parent (the fixed cost: interpreter, imports, the
  corpus from a warm index), placed between the pair or after it, alternately.
The second and empty runs are made PAIRS times each per repetition (the second changes nothing),
alternating. The listing cost of a run is its time minus the median empty run of the same
repetition; the headline ratio is median(first cost) / median(second cost) over the repetitions,
in CPU time (the process's user + system time, which the machine's other load moves much less
than wall time; wall time is printed as context). Target: >= 20x for both resets. After every first run the index must hold every child's checkpoint rows
(else the bench stops: it measured the wrong thing).

Run: `.venv/bin/python bench/listing_writeback.py` (about a minute); `--quick` a smoke run;
`--reps N`; `--dir PATH` for the temporary root.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import trio
from bench_common import bug, load
from listing import CREATED_AT, PARENT, child_header, load_storage_bench
from subagents.runtime.app import open_runtime
from subagents.runtime.delegation.descriptor import SubagentDescriptor, snapshot_descriptor
from subagents.runtime.delegation.listing import ChildRow
from subagents.storage import Batch, Event, FileLogStore, Offset, SessionHeader, make_event

TARGET = 20.0
PAIRS = 3  # second and childless runs per repetition
KB = 1_000
LONELY = "bench-lonely"  # the childless parent
_INDEX = ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm")
_SCRIPT = os.path.join(os.path.dirname(sys.executable), "subagents")
CLI = [_SCRIPT] if os.path.exists(_SCRIPT) else [sys.executable, "-m", "subagents.runtime.hosts.cli"]


@dataclass(frozen=True)
class Sizes:
    children: int
    log_bytes: int
    reps: int


STANDARD = Sizes(children=200, log_bytes=256 * KB, reps=7)
QUICK = Sizes(children=20, log_bytes=32 * KB, reps=3)


def events_of(rng: random.Random, first_seq: int, size: int) -> list[Event]:
    """Realistic events from `first_seq` on, about `size` bytes, ending with a whole turn."""
    sb = load_storage_bench()
    out: list[Event] = []
    total = 0
    for turn in itertools.count(1):
        for type_, data, surface in sb.turn_events(rng, turn):
            seq = first_seq + len(out)
            out.append(make_event(seq, type_, CREATED_AT + seq, data, surface_op="append" if surface else None))
            total += len(msgspec.json.encode(data)) + 60
        if total >= size:
            return out
    raise AssertionError("unreachable")


def descriptor(seq: int, i: int) -> Event:
    data = snapshot_descriptor(SubagentDescriptor(mode="continuable", provider="scripted", label=f"child-{i}"))
    return make_event(seq, "subagent/descriptor", CREATED_AT + seq, data)


def build(root: str, sizes: Sizes) -> None:
    """The corpus, written with the storage layer directly (no checkpoint rows anywhere)."""
    rng = random.Random(20261201)
    half = sizes.log_bytes // 2
    inherited = events_of(rng, 0, half)
    k = len(inherited)
    own_after_seed = events_of(rng, k + 2, half)  # after the seed marker and the descriptor
    own_full = events_of(rng, 1, sizes.log_bytes)  # after the descriptor
    store = FileLogStore(root)
    try:
        for sid, created in ((PARENT, CREATED_AT - 2), (LONELY, CREATED_AT - 1)):
            header = SessionHeader(id=sid, created_at=created, cwd="/work/bench")  # type: ignore[arg-type]  # plain strs
            handle = store.create(header)
            store.append(handle, [Batch(Offset(0), [make_event(0, "turn/start", created, {"turn": 1})])])
            store.close(handle)
        for i in range(sizes.children):
            seeded = i % 2 == 1
            if seeded:
                events = [*inherited, make_event(k, "session/end-seed", CREATED_AT, {"inherited": True})]
                events += [descriptor(k + 1, i), *own_after_seed]
            else:
                events = [descriptor(0, i), *own_full]
            handle = store.create(child_header(i, seeded), inherited_event_count=Offset(k if seeded else 0))
            store.append(handle, [Batch(Offset(0), events)])
            store.close(handle)
    finally:
        store.close_store()


def drop_index(root: str) -> None:
    for name in _INDEX:
        try:
            os.unlink(os.path.join(root, name))
        except FileNotFoundError:
            pass


def checkpointed(root: str) -> int:
    """How many sessions other than the parent have a `subagent` checkpoint row (a cold parent's
    own rows are written back too since issue 28 item 2: it is read for its catalog)."""
    with sqlite3.connect(os.path.join(root, "index.sqlite3")) as conn:
        query = "SELECT count(*) FROM checkpoints WHERE unit_key = 'subagent' AND session_id != ?"
        return conn.execute(query, (PARENT,)).fetchone()[0]


@dataclass(frozen=True)
class Run:
    wall: float  # seconds, start to exit
    cpu: float  # the process's user + system CPU seconds (less moved by other load on the machine)


def run(root: str, parent: str, expected: int) -> Run:
    command = [*CLI, "children", parent, "--json", "--root", root]
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "DEEPSEEK_API_KEY")}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if process.returncode != 0:
            raise bug(f"{' '.join(command)} failed: {err.read().decode(errors='replace')}")
        rows = json.loads(out.read())
    if len(rows) != expected or any(row["kind"] != "child" for row in rows):
        raise bug(f"{parent}: {len(rows)} rows, not {expected} child rows")
    return Run(wall=wall, cpu=usage.ru_utime + usage.ru_stime)


async def listing_time(root: str, parent: str, expected: int, spent: list[float] | None = None) -> float:
    """What a new process spends on the listing itself, without the interpreter and its imports:
    a new store and runtime, the corpus (`children` checks the parent exists), the listing.
    `spent`: gets the time of the listing's write-back."""
    start = time.perf_counter()
    async with open_runtime(root) as runtime:
        if spent is not None:
            query = runtime.query
            write = query.write_observed

            async def timed_write(observed: Sequence[Any]) -> int:
                began = time.perf_counter()
                written = await write(observed)
                spent.append(time.perf_counter() - began)
                if written != expected + 1:  # and the parent's, read for its catalog (issue 28 item 2)
                    raise bug(
                        f"the write-back wrote {written} sessions' rows, not {expected} children's and the parent's"
                    )
                return written

            query.write_observed = timed_write  # type: ignore[method-assign]  # a measurement seam
        corpus = await runtime.query.list_sessions()
        if not any(record.id == parent for record in corpus):
            raise bug(f"{parent} not found")
        rows = await runtime.listing.list_children(parent)
    elapsed = time.perf_counter() - start
    if len(rows) != expected or not all(isinstance(row, ChildRow) for row in rows):
        raise bug(f"{parent}: {len(rows)} rows, not {expected} child rows")
    return elapsed


async def in_process(root: str, snapshot: str, sizes: Sizes) -> bool:
    """The same cycle with the listing timed in this process (`indexed` reset), as context for
    the process figures: no interpreter start-up noise."""
    n = sizes.children
    firsts, seconds, empties = [], [], []
    writes: list[float] = []
    for rep in range(sizes.reps):
        drop_index(root)
        shutil.copyfile(snapshot, os.path.join(root, "index.sqlite3"))
        firsts.append(await listing_time(root, PARENT, n, writes))
        pair = [(seconds, PARENT, n), (empties, LONELY, 0)]
        for out, parent, expected in pair if rep % 2 == 0 else pair[::-1]:
            out.append(await listing_time(root, parent, expected))
    first = statistics.median(f - e for f, e in zip(firsts, empties, strict=True))
    second = statistics.median(s - e for s, e in zip(seconds, empties, strict=True))
    ratio = first / max(second, 1e-4)
    print(
        f"  in-process (indexed): first {statistics.median(firsts) * 1e3:.0f} ms, second "
        f"{statistics.median(seconds) * 1e3:.1f} ms, childless {statistics.median(empties) * 1e3:.1f} ms | listing "
        f"cost: first {first * 1e3:.0f} ms, second {second * 1e3:.1f} ms | first/second {ratio:.1f}x (context); "
        f"the first's write-back: {statistics.median(writes) * 1e3:.1f} ms ({statistics.median(writes) / first:.1%})"
    )
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 children of 32 KB")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 7)")
    parser.add_argument("--dir", default=None, help="where to put the temporary root")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else STANDARD
    if args.reps:
        sizes = Sizes(sizes.children, sizes.log_bytes, args.reps)
    workdir = tempfile.mkdtemp(prefix="subagents-writeback-bench-", dir=args.dir)
    root = os.path.join(workdir, "root")
    n = sizes.children
    try:
        started = time.perf_counter()
        build(root, sizes)
        on_disk = sum(e.stat().st_size for d in os.scandir(os.path.join(root, "sessions")) for e in os.scandir(d.path))
        print(
            f"listing write-back bench: {n} children of ~{sizes.log_bytes // KB} KB (half seeded, written by hand, "
            f"zstd: {on_disk / 1e6:.1f} MB on disk), {sizes.reps} reps, python {sys.version.split()[0]}, "
            f"{os.cpu_count()} cpus, {load()}; built in {time.perf_counter() - started:.1f} s"
        )
        # The `indexed` reset: session rows of every log, no checkpoint rows.
        store = FileLogStore(root)
        store.list()
        store.close_store()
        snapshot = os.path.join(workdir, "index-snapshot.sqlite3")
        shutil.copyfile(os.path.join(root, "index.sqlite3"), snapshot)
        if checkpointed(root):
            raise bug("the hand-written corpus has checkpoint rows")
        run(root, PARENT, n)  # warm the page cache and the interpreter's files (untimed)
        runs: dict[str, list[tuple[Run, list[Run], list[Run]]]] = {"fresh": [], "indexed": []}
        for rep in range(sizes.reps):
            resets = ("fresh", "indexed") if rep % 2 == 0 else ("indexed", "fresh")
            for reset in resets:
                drop_index(root)
                if reset == "indexed":
                    shutil.copyfile(snapshot, os.path.join(root, "index.sqlite3"))
                first = run(root, PARENT, n)
                if checkpointed(root) != n:
                    raise bug(f"the first run wrote {checkpointed(root)} children's rows, not {n}")
                # The second run changes nothing (the rung answers, nothing is written): it and
                # the childless run (which needs the warm index the first run left) alternate,
                # PAIRS times each, in an order that flips with every repetition.
                seconds: list[Run] = []
                empties: list[Run] = []
                for pair in range(PAIRS):
                    if (rep + pair) % 2:
                        empties.append(run(root, LONELY, 0))
                        seconds.append(run(root, PARENT, n))
                    else:
                        seconds.append(run(root, PARENT, n))
                        empties.append(run(root, LONELY, 0))
                runs[reset].append((first, seconds, empties))
        ok = True
        for reset, reps in runs.items():
            for clock in ("cpu", "wall"):

                def t(r: Run, clock: str = clock) -> float:
                    return getattr(r, clock)

                fixed = [statistics.median(map(t, empties)) for _, _, empties in reps]
                first_cost = [t(first) - e for (first, _, _), e in zip(reps, fixed, strict=True)]
                second_cost = [
                    statistics.median(map(t, seconds)) - e for (_, seconds, _), e in zip(reps, fixed, strict=True)
                ]
                first_med, second_med = statistics.median(first_cost), statistics.median(second_cost)
                # A second run's cost at or below zero is within the noise of the process's own
                # time: the ratio is then reported against 1 ms.
                ratio = first_med / max(second_med, 1e-3)
                if clock == "cpu":
                    ok &= ratio >= TARGET
                print(
                    f"  {reset:8} {clock:4}: first {statistics.median(t(f) for f, _, _ in reps) * 1e3:6.0f} ms, "
                    f"childless {statistics.median(fixed) * 1e3:5.0f} ms | listing cost: first {first_med * 1e3:6.0f} ms "
                    f"({min(first_cost) * 1e3:.0f}..{max(first_cost) * 1e3:.0f}), second {second_med * 1e3:6.1f} ms "
                    f"({min(second_cost) * 1e3:.1f}..{max(second_cost) * 1e3:.1f}) | first/second {ratio:6.1f}x"
                    + (
                        f" (target >= {TARGET:.0f}x) {'OK' if ratio >= TARGET else 'MISSED'}"
                        if clock == "cpu"
                        else " (context)"
                    )
                )
        ok &= trio.run(in_process, root, snapshot, sizes)
        print(f"  {load()}")
        return 0 if ok else 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
