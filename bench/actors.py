"""Actor benchmarks: session actors and the session store against baselines measured in the same run.

1. snapshot fan-out: 1,000 live session actors (a `MemoryLogStore`, the `SUBAGENT_UNITS`
   registry, each session published with a `subagent/descriptor` event) are all asked
   `snapshot(["subagent"])` at once, from one nursery, against 1,000 sequential bare Trio asks:
   a hand-written actor task reading a bounded memory channel and answering each request by
   setting its `trio.Event`. Target: fan-out time <= 1.5x the baseline's.
2. group commit at N = 1, 10, 100 and 1,000 concurrent appenders per session: 10,000 one-event
   appends in all (100 sessions; 10 at N = 1,000), each appender awaiting its appends one after
   another, so N = 100 is 100 sessions x 100 appenders of one event each, the figure this part
   printed before issue 28. Each timed part runs in a fresh child process and is measured in
   it: wall time (events/s) and the process's CPU time, user + sys of every thread (µs per
   event). Context rows: the appender side alone (the same tasks and drafts asking bare actors
   that answer at once), whose CPU the actors' figure is also given net of; at N = 100 the
   synchronous `FileLogStore.append` of the same events, one event (one fsync) per call, and the
   actors and the bare asks with the cyclic GC paused. `--baseline-tree DIR` also runs the actors of another tree,
   alternating with this one (before/after in one run). Target (issue 28 item 3): the actors'
   CPU per event at N = 100, net of the appender side, <= 25 µs.
3. resume: `SessionStore.open` of a ~10 MB (uncompressed) zstd log whose checkpoint lies 100
   events before its end (written by the actors at turn ends and at release, with the index row
   of the log as they left it; the last 100 events are appended afterwards by a plain
   `FileLogStore` handle, which never checkpoints) against the honest cold path over the same
   files and index: `open_write`, `read` of every event and a fold of every unit from the
   start. Each run starts from the index as the actors left it: their row and checkpoint rows,
   which the tail is a pure append of (the store's rule: checkpoint rows answer for the
   revision they were written at or a pure append of it), so both paths scan the 100-event
   tail. Target: open >= 5x faster. Checked: both give the same snapshot views, and
   `last_open_folds` is 100 x the number of units. Context rows: the open with the row the tail
   writer left (at the log's revision: no scan), and with no index row at all (a whole-log
   scan, which forgets the checkpoint rows: it folds every event).

As in bench/storage.py, each headline figure is a median of repetitions in which the baseline
and the subject alternate (their order reverses on every repetition), and each ratio is the
median of the per-repetition ratios. The realistic events come from bench/storage.py's
generator, loaded with importlib from this folder.
Run: `.venv/bin/python bench/actors.py`; `--quick` for a smoke run of a few seconds,
`--breakdown` to always show where time goes, `--profile` for cProfile listings, `--only 1,3`
to run some of the measurements, `--baseline-tree DIR` for part 2's before/after. See bench/README.md for what is measured and the figures.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import importlib.util
import io
import itertools
import json
import os
import pstats
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import msgspec
import trio
import zstandard
from bench_common import BareRequest, bare_actor, bare_ask, bug, load, per_rep, spread
from subagents.actors import EventDraft, SessionRef, SessionStore, open_session_store, snapshot_all
from subagents.runtime.delegation.descriptor import SubagentDescriptor, snapshot_descriptor
from subagents.runtime.delegation.units import SUBAGENT_UNITS
from subagents.storage import (
    Batch,
    FileLogStore,
    Lifecycle,
    Offset,
    ProjectionCells,
    ProjectionRegistry,
    SessionHeader,
    WriteHandle,
    make_event,
)
from subagents.storage._codec import encode_events
from subagents.storage.file_store import _LOG_NAMES
from subagents.storage.index import INDEX_NAME, SessionIndex
from subagents.storage.testing import MemoryLogStore

FANOUT_TARGET = 1.5  # fan-out time at most this many times the sequential bare asks
RESUME_TARGET = 5.0  # open from the checkpoint at least this many times faster than a full fold
SNAPSHOT_KEYS = ("subagent",)
SMALL_EVENT = "step/start"  # what each group-commit appender appends: {"turn": 1, "step": n}
MAILBOX_CAPACITY = 64  # a session mailbox's bound (the session store's default), for the bare asks
BATCH_LIMIT = 64  # requests one group commit takes (the actor's default), for the bare asks
BUILD_IN_FLIGHT = 8  # turns appended concurrently when the actors write the resume log
TAIL_BATCH = 11  # events per append of the plain handle (one turn's worth)
CREATED_AT = 1_789_000_000_000
EVENT_GAP_MS = 250  # between consecutive events of the resume log
SEED = 20261130
MB = 1_000_000


@dataclass(frozen=True)
class Sizes:
    sessions: int  # live actors asked at once (1)
    fanout_reps: int
    commit_sessions: int  # sessions of the group-commit runs (2), fewer at 1,000 appenders
    commit_events: int  # events appended in each group-commit run
    commit_reps: int
    log_bytes: int  # event bytes (uncompressed) of the resumed log (3)
    tail_events: int  # events after the checkpoint
    resume_reps: int


FULL = Sizes(
    sessions=1000,
    fanout_reps=21,
    commit_sessions=100,
    commit_events=10_000,
    commit_reps=5,
    log_bytes=10 * MB,
    tail_events=100,
    resume_reps=9,
)
QUICK = Sizes(
    sessions=100,
    fanout_reps=5,
    commit_sessions=10,
    commit_events=1_000,
    commit_reps=2,
    log_bytes=1 * MB,
    tail_events=100,
    resume_reps=3,
)


# --- shared helpers -----------------------------------------------------------------------------


def load_storage_bench() -> ModuleType:
    """bench/storage.py as a module (for its event generator); this folder is not a package."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "storage.py")
    spec = importlib.util.spec_from_file_location("bench_storage", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def header(sid: str) -> SessionHeader:
    return SessionHeader(id=sid, created_at=CREATED_AT, cwd="/work/bench")  # type: ignore[arg-type]  # a plain str where the header takes a SessionId


def descriptor_data(label: str) -> dict[str, object]:
    return snapshot_descriptor(SubagentDescriptor(mode="continuable", provider="scripted", label=label))


def descriptor_draft(label: str) -> EventDraft:
    return EventDraft(type="subagent/descriptor", data=descriptor_data(label), time=CREATED_AT)


def registry() -> ProjectionRegistry:
    return ProjectionRegistry(SUBAGENT_UNITS)


_clock = itertools.count(CREATED_AT)


def now_ms() -> int:
    return next(_clock)


def actor_of(ref: SessionRef) -> Any:
    """The actor behind a ref: the bench reads its `fsyncs` and `checkpoints` counters."""
    return ref._actor  # noqa: SLF001 - a measurement, not an API


async def atimed(fn: Callable[[], Awaitable[object]], *, gc_off: bool = False) -> float:
    """Seconds one await of `fn()` takes, after a full collection; `gc_off` pauses the cyclic GC."""
    gc.collect()
    if gc_off:
        gc.disable()
    try:
        start = time.perf_counter()
        await fn()
        return time.perf_counter() - start
    finally:
        gc.enable()


async def interleaved(reps: int, runs: dict[str, Callable[[int], Awaitable[float]]]) -> dict[str, list[float]]:
    """Seconds of every run, `reps` times, in an order that reverses on every repetition."""
    out: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            out[name].append(await runs[name](rep))
    return out


def print_profile(title: str, prof: cProfile.Profile, limit: int = 16) -> None:
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(limit)
    print(f"\n--- cProfile: {title} (by own time; worker threads not included) ---")
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip()))


# --- 1. snapshot fan-out ------------------------------------------------------------------------


@dataclass
class FanoutResult:
    runs: dict[str, list[float]]

    def median(self, name: str) -> float:
        return statistics.median(self.runs[name])

    def factor(self, name: str, under: str = "baseline") -> list[float]:
        return per_rep(self.runs[name], self.runs[under])


FANOUT_ROWS = {
    "baseline": "bare asks, sequential, one bare actor (baseline)",
    "subject": "session actors: snapshot_all (posted from one task)",
    "task per ask": "session actors: snapshot, one task per ask (context)",
    "bare fan-out": "bare asks, all at once, one bare actor each",
    "session sequential": "session actors: snapshot, sequential",
    "bare posted": "bare asks posted from one task, then awaited",
}


async def create_published(store: SessionStore, count: int, prefix: str) -> list[SessionRef]:
    refs = []
    for i in range(count):
        ref = await store.create(header(f"{prefix}-{i:05d}"))
        await ref.append([descriptor_draft(f"child-{i}")])
        refs.append(ref)
    for ref in refs:
        await ref.flush()  # served after the publication's checkpoint, which follows the ack
    return refs


async def bench_fanout(sizes: Sizes, profiling: bool) -> FanoutResult:
    n = sizes.sessions
    expected = [{"subagent": {"mode": "continuable", "label": f"child-{i}", "seq": 0}} for i in range(n)]
    async with open_session_store(MemoryLogStore(), registry(), now_ms=now_ms) as store:
        refs = await create_published(store, n, "fan")
        async with trio.open_nursery() as nursery:
            capacity = store.mailbox_capacity  # the same bound as a session mailbox
            one_send, one_receive = trio.open_memory_channel[BareRequest](capacity)
            await nursery.start(bare_actor, one_receive, expected[0])
            many: list[trio.MemorySendChannel[BareRequest]] = []
            for i in range(n):
                send, receive = trio.open_memory_channel[BareRequest](capacity)
                await nursery.start(bare_actor, receive, expected[i])
                many.append(send)

            got: list[object] = [None] * n

            async def snap(i: int) -> None:
                got[i] = await refs[i].snapshot(SNAPSHOT_KEYS)

            async def fan_out() -> None:
                async with trio.open_nursery() as inner:
                    for i in range(n):
                        inner.start_soon(snap, i)

            async def bare_one(i: int) -> None:
                got[i] = await bare_ask(many[i])

            async def bare_fan_out() -> None:
                async with trio.open_nursery() as inner:
                    for i in range(n):
                        inner.start_soon(bare_one, i)

            async def sequential_bare() -> None:
                for i in range(n):
                    got[i] = await bare_ask(one_send)

            async def sequential_session() -> None:
                for i in range(n):
                    got[i] = await refs[i].snapshot(SNAPSHOT_KEYS)

            async def bare_posted() -> None:
                requests = []
                for send in many:
                    request = BareRequest()
                    send.send_nowait(request)  # the mailboxes are empty: never WouldBlock here
                    requests.append(request)
                for i, request in enumerate(requests):
                    if not request.done.is_set():  # a set Event's wait() would still yield once
                        await request.done.wait()
                    got[i] = request.value
                await trio.lowlevel.checkpoint()

            async def session_snapshot_all() -> None:
                got[:] = await snapshot_all(refs, SNAPSHOT_KEYS)

            def checked(fn: Callable[[], Awaitable[None]], want: list[object]) -> Callable[[int], Awaitable[float]]:
                async def run(rep: int) -> float:
                    got[:] = [None] * n
                    elapsed = await atimed(fn)
                    if got != want:
                        raise bug(f"{fn.__name__} answered wrongly")
                    return elapsed

                return run

            same = [expected[0]] * n
            await sequential_bare()  # warm-up: every code path once, untimed
            await fan_out()
            runs = await interleaved(
                sizes.fanout_reps,
                {
                    "baseline": checked(sequential_bare, same),  # type: ignore[arg-type]  # a per-rep runner where the table types a plain one
                    "subject": checked(session_snapshot_all, expected),  # type: ignore[arg-type]  # a per-rep runner where the table types a plain one
                    "task per ask": checked(fan_out, expected),  # type: ignore[arg-type]  # a per-rep runner where the table types a plain one
                    "bare fan-out": checked(bare_fan_out, expected),  # type: ignore[arg-type]  # a per-rep runner where the table types a plain one
                    "session sequential": checked(sequential_session, expected),  # type: ignore[arg-type]  # a per-rep runner where the table types a plain one
                    "bare posted": checked(bare_posted, expected),  # type: ignore[arg-type]  # a per-rep runner where the table types a plain one
                },
            )
            if profiling:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(5):
                    await session_snapshot_all()
                prof.disable()
                print_profile(f"snapshot fan-out of {n} actors x5", prof)
            one_send.close()
            for send in many:
                send.close()
    return FanoutResult(runs)


def print_fanout(result: FanoutResult, sizes: Sizes) -> None:
    n = sizes.sessions
    print(
        f"\n1. snapshot fan-out: {n} live session actors, snapshot({list(SNAPSHOT_KEYS)}); "
        f"ms per {n} asks, medians of {sizes.fanout_reps} interleaved runs"
    )
    print(f"{'':<54} {'ms':>8} {'µs/ask':>7} {'x baseline':>10} {'range':>11}")
    for name, label in FANOUT_ROWS.items():
        if name not in result.runs:
            continue
        med = result.median(name)
        factors = result.factor(name)
        print(
            f"{label:<54} {med * 1e3:>8.2f} {med / n * 1e6:>7.1f} "
            f"{statistics.median(factors):>10.2f} {spread(factors):>11}"
        )
    bare = result.factor("subject", "bare posted")
    print(
        f"{'snapshot_all / bare asks posted the same way':<54} {'':>8} {'':>7} "
        f"{statistics.median(bare):>10.2f} {spread(bare):>11}"
    )


# --- 2. group commit ----------------------------------------------------------------------------

# Concurrent appenders per session. Each run appends `commit_events` events in all: 100 sessions
# (10 at 1,000 appenders), each appender awaiting its one-event appends one after another, so
# 100 appenders append one event each: the figure this part has always printed.
APPENDER_COUNTS = (1, 10, 100, 1000)
HEADLINE_APPENDERS = 100  # the target's point, and the only one with the GC-paused context row
PER_EVENT_TARGET_US = 25.0  # issue 28 item 3: the actors' CPU per event at 100 appenders


@dataclass(frozen=True)
class Shape:
    sessions: int
    appenders: int  # per session
    per_appender: int  # one-event appends each appender awaits in turn

    @property
    def events(self) -> int:
        return self.sessions * self.appenders * self.per_appender


def commit_shape(sizes: Sizes, appenders: int) -> Shape:
    sessions = min(sizes.commit_sessions, max(1, sizes.commit_events // appenders))
    return Shape(sessions, appenders, max(1, sizes.commit_events // (sessions * appenders)))


@dataclass(frozen=True)
class Measured:
    """One timed part, as a child process measured it."""

    wall: float  # seconds
    cpu: float  # seconds of the process's CPU, user + sys, every thread (`time.process_time`)
    fsyncs: int = 0  # log appends (the actors' `fsyncs` counters, or one per synchronous call)
    checkpoints: int = 0


def small_data(step: int) -> dict[str, int]:
    return {"turn": 1, "step": step}


async def timed_part(fn: Callable[[], Awaitable[None]], gc_off: bool = False) -> tuple[float, float]:
    """(wall, CPU) seconds of one await of `fn()`, after a full collection."""
    gc.collect()
    if gc_off:
        gc.disable()
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        await fn()
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        gc.enable()


def sync_appends(root: str, shape: Shape) -> Measured:
    """The same events by synchronous `FileLogStore.append` calls, one event (one fsync) each."""
    store = FileLogStore(root)
    handles: list[WriteHandle] = []
    per = shape.appenders * shape.per_appender
    try:
        for i in range(shape.sessions):
            handle = store.create(header(f"sync-{i:04d}"))
            handles.append(handle)
            store.append(
                handle,
                [Batch(Offset(0), [make_event(0, "subagent/descriptor", CREATED_AT, descriptor_data(f"child-{i}"))])],
            )

        async def loop() -> None:
            for handle in handles:
                for step in range(1, per + 1):
                    seq = handle.next_seq
                    event = make_event(seq, SMALL_EVENT, CREATED_AT + step, small_data(step))
                    store.append(handle, [Batch(seq, [event])])

        wall, cpu = trio.run(timed_part, loop)
        if any(h.next_seq != 1 + per for h in handles):
            raise bug("a synchronous session did not end at the expected seq")
        return Measured(wall, cpu, shape.events)
    finally:
        for handle in handles:
            store.close(handle)
        store.close_store()


async def actor_appends(root: str, shape: Shape, profiling: bool = False, gc_off: bool = False) -> Measured:
    """`shape`'s appends through the actors: every appender of every session at once."""
    store_ = FileLogStore(root)
    try:
        async with open_session_store(store_, registry(), now_ms=now_ms) as store:
            refs = await create_published(store, shape.sessions, "actor")
            actors = [actor_of(r) for r in refs]
            fsyncs0 = sum(a.fsyncs for a in actors)
            checkpoints0 = sum(a.checkpoints for a in actors)
            firsts: list[list[int]] = [[] for _ in refs]
            per = shape.per_appender

            async def appender(i: int, a: int) -> None:
                ref, got = refs[i], firsts[i]
                for k in range(per):
                    step = a * per + k + 1
                    drafts = [EventDraft(type=SMALL_EVENT, data=small_data(step), time=CREATED_AT + step)]
                    got.append((await ref.append(drafts)).first_seq)

            async def all_appends() -> None:
                async with trio.open_nursery() as nursery:
                    for a in range(shape.appenders):
                        for i in range(len(refs)):
                            nursery.start_soon(appender, i, a)

            prof = cProfile.Profile() if profiling else None
            if prof is not None:
                prof.enable()
            wall, cpu = await timed_part(all_appends, gc_off)
            if prof is not None:
                prof.disable()
                print_profile(f"{shape.sessions} sessions x {shape.appenders} appenders through the actors", prof)
            fsyncs = sum(a.fsyncs for a in actors) - fsyncs0
            checkpoints = sum(a.checkpoints for a in actors) - checkpoints0
            want = list(range(1, shape.appenders * per + 1))
            for ref, seqs in zip(refs, firsts):
                if sorted(seqs) != want or await ref.flush() != 1 + len(want):
                    raise bug("an actor acknowledged the wrong seqs")
        return Measured(wall, cpu, fsyncs, checkpoints)
    finally:
        store_.close_store()


async def bare_appends(shape: Shape, gc_off: bool = False) -> Measured:
    """The appender side alone: the same tasks build the same drafts and ask a bare actor per
    session (a bounded channel as deep as a session mailbox, drained up to a group commit's
    worth at a time, every request answered at once: no storage, no fold, no thread hop)."""
    per = shape.per_appender
    answered = [0]

    async def bare_session(
        receive: trio.MemoryReceiveChannel[BareRequest],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        task_status.started()
        async for request in receive:
            taken = [request]
            while len(taken) < BATCH_LIMIT:
                try:
                    taken.append(receive.receive_nowait())
                except trio.WouldBlock:
                    break
            for each in taken:
                each.value = answered[0] = answered[0] + 1
                each.done.set()

    async with trio.open_nursery() as sessions:
        sends: list[trio.MemorySendChannel[BareRequest]] = []
        for _ in range(shape.sessions):
            send, receive = trio.open_memory_channel[BareRequest](MAILBOX_CAPACITY)
            await sessions.start(bare_session, receive)
            sends.append(send)

        async def appender(i: int, a: int) -> None:
            send = sends[i]
            for k in range(per):
                step = a * per + k + 1
                request = BareRequest()
                request.value = [EventDraft(type=SMALL_EVENT, data=small_data(step), time=CREATED_AT + step)]
                await send.send(request)
                await request.done.wait()

        async def all_asks() -> None:
            async with trio.open_nursery() as nursery:
                for a in range(shape.appenders):
                    for i in range(len(sends)):
                        nursery.start_soon(appender, i, a)

        wall, cpu = await timed_part(all_asks, gc_off)
        for send in sends:
            send.close()
    if answered[0] != shape.events:
        raise bug(f"the bare actors answered {answered[0]} asks, not {shape.events}")
    return Measured(wall, cpu)


def commit_child(argv: Sequence[str]) -> None:
    """One timed part in this (fresh) process, printed as JSON: `kind sessions appenders
    per_appender gc_off workdir`."""
    kind, sessions, appenders, per, gc_off, workdir = argv
    shape = Shape(int(sessions), int(appenders), int(per))
    root = tempfile.mkdtemp(prefix=f"commit-{kind}-", dir=workdir)
    try:
        if kind == "sync":
            measured = sync_appends(root, shape)
        elif kind == "bare":
            measured = trio.run(bare_appends, shape, gc_off == "1")
        else:
            measured = trio.run(actor_appends, root, shape, False, gc_off == "1")
    finally:
        shutil.rmtree(root)
    print(json.dumps(dataclasses.asdict(measured)))


# A child process runs this bench file's `commit_child`, with the storage, actors and runtime
# packages of another tree when one is named (`--baseline-tree`, e.g. `git archive OLD storage
# actors runtime | tar -x -C DIR`): the editable install's map of packages is pointed there
# before anything imports them, so before and after run alternately in one bench run.
_CHILD = """
import runpy, sys
tree, bench = sys.argv[1], sys.argv[2]
if tree:
    finder = next(m for n, m in sys.modules.items() if n.startswith("__editable__") and hasattr(m, "MAPPING"))
    finder.MAPPING.update({f"subagents.{p}": f"{tree}/{p}" for p in ("storage", "actors", "runtime")})
sys.path.insert(0, bench.rsplit("/", 1)[0])
runpy.run_path(bench)["commit_child"](sys.argv[3:])
"""


def run_child(tree: str, kind: str, shape: Shape, workdir: str, gc_off: bool = False) -> Measured:
    argv = [kind, str(shape.sessions), str(shape.appenders), str(shape.per_appender), "1" if gc_off else "0", workdir]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, tree, os.path.abspath(__file__), *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise bug(f"a commit child ({kind}, {shape}, tree {tree or 'this one'}) failed:\n{done.stderr}")
    return Measured(**json.loads(done.stdout.strip().splitlines()[-1]))


@dataclass
class CommitResult:
    shapes: dict[int, Shape]
    # Per appender count, per subject: each repetition's measurement.
    runs: dict[int, dict[str, list[Measured]]]

    def median(self, appenders: int, subject: str, what: str) -> float:
        values = [getattr(m, what) for m in self.runs[appenders][subject]]
        return statistics.median(values)

    def cpu_us(self, appenders: int, subject: str) -> float:
        return self.median(appenders, subject, "cpu") / self.shapes[appenders].events * 1e6

    def net_us(self, appenders: int, subject: str) -> list[float]:
        """Per repetition: the subject's CPU per event less the appender side's (bare asks)."""
        events = self.shapes[appenders].events
        runs = self.runs[appenders]
        bare = runs["bare gc off" if subject == "gc off" else "bare"]
        return [(m.cpu - b.cpu) / events * 1e6 for m, b in zip(runs[subject], bare, strict=True)]

    def rate(self, appenders: int, subject: str) -> float:
        return self.shapes[appenders].events / self.median(appenders, subject, "wall")


def bench_commit(workdir: str, sizes: Sizes, baseline_tree: str | None) -> CommitResult:
    shapes = {a: commit_shape(sizes, a) for a in APPENDER_COUNTS}
    runs: dict[int, dict[str, list[Measured]]] = {a: {} for a in APPENDER_COUNTS}
    for rep in range(sizes.commit_reps):
        for a, shape in shapes.items():
            subjects: dict[str, Callable[[], Measured]] = {
                "actors": lambda shape=shape: run_child("", "actors", shape, workdir),
                "bare": lambda shape=shape: run_child("", "bare", shape, workdir),
            }
            if baseline_tree is not None:
                subjects["before"] = lambda shape=shape: run_child(baseline_tree, "actors", shape, workdir)
            if a == HEADLINE_APPENDERS:
                subjects["sync"] = lambda shape=shape: run_child("", "sync", shape, workdir)
                subjects["gc off"] = lambda shape=shape: run_child("", "actors", shape, workdir, gc_off=True)
                subjects["bare gc off"] = lambda shape=shape: run_child("", "bare", shape, workdir, gc_off=True)
            names = list(subjects)
            for name in names if rep % 2 == 0 else names[::-1]:
                runs[a].setdefault(name, []).append(subjects[name]())
        print(f"   2: repetition {rep + 1} of {sizes.commit_reps} done ({load()})", flush=True)
    return CommitResult(shapes, runs)


COMMIT_ROWS = {
    "actors": "session actors (this tree)",
    "before": "session actors (--baseline-tree)",
    "bare": "bare asks: the appender side alone (context)",
    "gc off": "session actors, GC paused during the run (context)",
    "bare gc off": "bare asks, GC paused during the run (context)",
    "sync": "FileLogStore.append, 1 event per call (baseline)",
}


def print_commit(result: CommitResult, sizes: Sizes, baseline_tree: str | None) -> None:
    print(
        f"\n2. group commit: N appenders per session, one-event '{SMALL_EVENT}' appends, zstd form; "
        f"medians of {sizes.commit_reps} interleaved runs, each in a fresh process; CPU = user + sys of "
        f"every thread of the process during the timed part; net = CPU less the bare asks' (same repetition, "
        f"GC paused for both in the GC-paused row)"
    )
    print(
        f"{'N':>5} {'sessions x appenders x appends':>30} {'':<46} {'events/s':>9} {'CPU µs/ev':>9} "
        f"{'net µs/ev':>9} {'events/fsync':>12}"
    )
    for a, shape in result.shapes.items():
        for name, label in COMMIT_ROWS.items():
            if name not in result.runs[a]:
                continue
            fsyncs = result.median(a, name, "fsyncs")
            net = statistics.median(result.net_us(a, name)) if name in ("actors", "before", "gc off") else None
            print(
                f"{a:>5} {f'{shape.sessions} x {shape.appenders} x {shape.per_appender}':>30} {label:<46} "
                f"{result.rate(a, name):>9.0f} {result.cpu_us(a, name):>9.1f} "
                f"{'' if net is None else f'{net:.1f}':>9} {f'{shape.events / fsyncs:.1f}' if fsyncs else '':>12}"
            )
        if "before" in result.runs[a]:
            ratios = per_rep([m.wall for m in result.runs[a]["before"]], [m.wall for m in result.runs[a]["actors"]])
            cpu = per_rep([m.cpu for m in result.runs[a]["actors"]], [m.cpu for m in result.runs[a]["before"]])
            print(
                f"{'':>5} {'':>30} {'after / before: events/s, CPU per event':<46} {statistics.median(ratios):>9.2f} "
                f"{statistics.median(cpu):>9.2f}   ranges {spread(ratios)}, {spread(cpu)}"
            )
    for name in ("actors", "before", "gc off"):
        if name in result.runs[HEADLINE_APPENDERS]:
            nets = ", ".join(f"{net:.1f}" for net in result.net_us(HEADLINE_APPENDERS, name))
            print(f"net µs/event at {HEADLINE_APPENDERS} appenders, each repetition, {COMMIT_ROWS[name]}: {nets}")
    sync = result.runs[HEADLINE_APPENDERS]["sync"]
    ratios = per_rep([m.wall for m in sync], [m.wall for m in result.runs[HEADLINE_APPENDERS]["actors"]])
    checkpoints = [m.checkpoints for a in result.runs for m in result.runs[a]["actors"]]
    print(
        f"actors / synchronous appends at {HEADLINE_APPENDERS} appenders (events/s): {statistics.median(ratios):.2f} "
        f"(range {spread(ratios)}); checkpoints in the timed parts: {max(checkpoints)} at most"
        + ("" if baseline_tree is None else f"; before = {baseline_tree}")
    )


# --- 3. resume from a checkpoint ----------------------------------------------------------------


Item = tuple[str, dict[str, Any], bool]  # (type, data, is_surface) as bench/storage.py yields them


@dataclass
class ResumeLog:
    root: str
    sid: str
    head: int  # events the actors wrote (descriptor included)
    events: int  # all events
    plain_bytes: int
    file_bytes: int
    actor_fsyncs: int
    actor_checkpoints: int
    checkpoint_seq: int
    reset: Callable[[str], None]  # restore the index to one of INDEX_STATES before a run
    close: Callable[[], None]


# The index state a resume run starts from (`ResumeLog.reset`). The checkpoint rows answer only
# while the stored row is at the revision they were written at or a pure append of it (a log
# rescanned whole forgets them: docs/format.md, "The index"), so each state is one the store
# itself leaves, never checkpoint rows without the row that vouches for them.
INDEX_STATES = {
    "stale": "the actors' row and checkpoint rows, as release left them: the tail makes the row stale",
    "current": "the row the tail writer left (at the log's revision) and the actors' checkpoint rows",
    "none": "no row and no checkpoint rows (as after a rescan of an edited log)",
}


def resume_items(storage_bench: ModuleType, target: int, tail: int) -> tuple[list[list[Item]], list[Item]]:
    """Whole turns of about `target` event bytes, then `tail` more events (the tail may end inside a turn)."""
    rng = random.Random(SEED)
    turns: list[list[Item]] = []
    size = 0
    turn = 1
    while size < target:
        items = list(storage_bench.turn_events(rng, turn))
        size += sum(len(msgspec.json.encode(data)) + 80 for _, data, _ in items)  # ~ the envelope
        turns.append(items)
        turn += 1
    rest: list[Item] = []
    while len(rest) < tail:
        rest += storage_bench.turn_events(rng, turn)
        turn += 1
    return turns, rest[:tail]


def item_time(index: int) -> int:
    return CREATED_AT + index * EVENT_GAP_MS


async def build_resume_log(workdir: str, sizes: Sizes, storage_bench: ModuleType) -> ResumeLog:
    root = tempfile.mkdtemp(prefix="resume-", dir=workdir)
    sid = "resumed"
    turns, tail = resume_items(storage_bench, sizes.log_bytes, sizes.tail_events)
    counter = itertools.count(1)
    drafts = [
        [
            EventDraft(type=t, data=d, time=item_time(next(counter)), surface_op="append" if s else None)
            for t, d, s in items
        ]
        for items in turns
    ]
    # The actors write the head: a descriptor, then whole turns, several in flight, so group
    # commit writes a few turns per frame and checkpoints at each group that ends a turn.
    log_store = FileLogStore(root)
    try:
        async with open_session_store(log_store, registry(), now_ms=now_ms) as store:
            ref = await store.create(header(sid))
            await ref.append([descriptor_draft("resumed-child")])
            work = iter(drafts)

            async def writer() -> None:
                for turn in work:
                    await ref.append(turn)

            async with trio.open_nursery() as nursery:
                for _ in range(BUILD_IN_FLIGHT):
                    nursery.start_soon(writer)
            head = int(await ref.flush())
            actor = actor_of(ref)
            await store.release(sid)  # the final checkpoint, at the last seq, with the log's index row
            fsyncs, checkpoints = actor.fsyncs, actor.checkpoints
    finally:
        log_store.close_store()
    if head != 1 + sum(map(len, turns)):
        raise bug("the actors wrote the wrong number of events")
    log_file = os.path.join(root, "sessions", sid, _LOG_NAMES["zstd"])
    head_size = os.path.getsize(log_file)

    # The index as the actors left it: their row at the log's revision and the checkpoint rows
    # at its end (a writer records its row whenever it checkpoints).
    index = SessionIndex(os.path.join(root, INDEX_NAME))
    loaded = index.load()
    if not loaded or sid not in loaded:
        raise bug("the actors left no index row")
    actors_row = loaded[sid]
    if actors_row.revision.size != head_size or actors_row.scan_end != head_size:
        raise bug(f"the actors' index row is not at the log's revision: {actors_row.revision}, {head_size} bytes")

    # Another writer appends the tail and never checkpoints. Its open_write finds the actors'
    # row at the log's revision (no scan), and it keeps the row in step with its appends (saved
    # when its store closes): the row it leaves is at the final revision.
    plain = FileLogStore(root)
    handle = plain.open_write(sid)
    try:
        first = handle.next_seq
        index0 = next(counter)
        events = [
            make_event(first + i, t, item_time(index0 + i), d, surface_op="append" if s else None)
            for i, (t, d, s) in enumerate(tail)
        ]
        for i in range(0, len(events), TAIL_BATCH):
            plain.append(handle, [Batch(Offset(first + i), events[i : i + TAIL_BATCH])])
        every = plain.read(handle)
    finally:
        plain.close(handle)
    found = plain.read_checkpoint(sid, header(sid), 0)
    plain.close_store()
    if found is None:
        raise bug("the actors left no checkpoint")
    rows, offset = found
    if set(rows) != {u.key for u in SUBAGENT_UNITS} or {r.seq for r in rows.values()} != {head - 1}:
        raise bug(f"the checkpoint should cover every unit at seq {head - 1}: {rows}")
    if offset != head_size:
        raise bug(f"the checkpoint should start over at the end of the actors' log ({head_size}), not {offset}")

    loaded = index.load()
    if not loaded or sid not in loaded:
        raise bug("the tail writer left no index row")
    tail_row = loaded[sid]
    if tail_row.revision.size != os.path.getsize(log_file):
        raise bug(f"the tail writer's index row is not at the log's revision: {tail_row.revision}")
    lifecycle = Lifecycle.of(header(sid), 0)

    def reset(state: str) -> None:
        # Every open refreshes the row (and the actor's release rewrites the checkpoint): put
        # back one of INDEX_STATES, so every repetition starts from the same state. The row is
        # saved before the checkpoint rows (a row saved as a rescan's would forget them).
        if state == "none":
            index.save([], [sid])  # dropping a row drops its checkpoint rows
            return
        index.save([actors_row if state == "stale" else tail_row], [])
        if not index.save_checkpoint(sid, lifecycle, rows, offset):
            raise bug("restoring the checkpoint failed")

    return ResumeLog(
        root=root,
        sid=sid,
        head=head,
        events=len(every),
        plain_bytes=len(encode_events(every)),
        file_bytes=os.path.getsize(log_file),
        actor_fsyncs=fsyncs,
        actor_checkpoints=checkpoints,
        checkpoint_seq=head - 1,
        reset=reset,
        close=index.close,
    )


def full_load(store: FileLogStore, sid: str) -> tuple[WriteHandle, ProjectionCells, int]:
    """The cold path without checkpoints: claim the log, read every event, fold every unit."""
    handle = store.open_write(sid)
    try:
        cells = registry().cells(handle.header, handle.inherited_event_count)
        return handle, cells, cells.fold(store.read(handle))
    except BaseException:
        store.close(handle)
        raise


@dataclass
class ResumeResult:
    runs: dict[str, list[float]]

    def median(self, name: str) -> float:
        return statistics.median(self.runs[name])

    def speedup(self, name: str = "subject") -> list[float]:
        return per_rep(self.runs["baseline"], self.runs[name])


RESUME_ROWS = {
    "baseline": "open_write + read all + fold all units (baseline)",
    "subject": "SessionStore.open: checkpoint + fold of the tail",
    "row current": "SessionStore.open, row at the log's revision (context)",
    "no row": "SessionStore.open, no index row: folds all (context)",
}


async def bench_resume(log: ResumeLog, sizes: Sizes, profiling: bool) -> tuple[ResumeResult, dict[str, Any]]:
    units = len(SUBAGENT_UNITS)
    views: dict[str, Any] = {}

    async def baseline(rep: int) -> float:
        log.reset("stale")
        store = FileLogStore(log.root)
        try:
            gc.collect()
            start = time.perf_counter()
            handle, cells, folds = await trio.to_thread.run_sync(full_load, store, log.sid)
            elapsed = time.perf_counter() - start
            try:
                view = cells.snapshot()
            finally:
                store.close(handle)
        finally:
            store.close_store()
        if folds != log.events * units:
            raise bug(f"the full fold ran {folds} folds, not {log.events * units}")
        views.setdefault("baseline", view)
        if view != views["baseline"]:
            raise bug("the full fold's views changed between runs")
        return elapsed

    def opener(state: str, prof: cProfile.Profile | None = None) -> Callable[[int], Awaitable[float]]:
        # With no index row the open's whole-log scan forgets the checkpoint rows: it folds all.
        want = log.events * units if state == "none" else sizes.tail_events * units

        async def run(rep: int) -> float:
            log.reset(state)
            store = FileLogStore(log.root)
            try:
                async with open_session_store(store, registry(), now_ms=now_ms) as sessions:
                    gc.collect()
                    if prof is not None:
                        prof.enable()
                    start = time.perf_counter()
                    ref = await sessions.open(log.sid)
                    elapsed = time.perf_counter() - start
                    if prof is not None:
                        prof.disable()
                    folds = sessions.last_open_folds
                    view = await ref.snapshot()
                    # leaving the store releases the session (a checkpoint): untimed, reset next time
            finally:
                store.close_store()
            if folds != want:
                raise bug(
                    f"open ({INDEX_STATES[state]}) folded {folds} (event, unit) pairs, not {want // units} x {units}"
                )
            views.setdefault("subject", view)
            if view != views["subject"]:
                raise bug("the resumed views changed between runs")
            return elapsed

        return run

    await baseline(-1)  # warm-up (page cache, imports), untimed
    await opener("stale")(-1)
    runs = await interleaved(
        sizes.resume_reps,
        {
            "baseline": baseline,
            "subject": opener("stale"),
            "row current": opener("current"),
            "no row": opener("none"),
        },
    )
    if views["subject"] != views["baseline"]:
        raise bug(f"resumed views differ from the full fold's: {views['subject']} != {views['baseline']}")
    if profiling:
        prof = cProfile.Profile()
        for _ in range(5):
            await opener("stale", prof)(-1)
        print_profile("SessionStore.open from the checkpoint x5 (the store's work runs in a thread)", prof)
    return ResumeResult(runs), views["subject"]


def resume_breakdown(log: ResumeLog, reps: int) -> list[tuple[str, float]]:
    """The steps of both paths, called directly (no thread hop), each the best of `reps` runs."""
    sid = log.sid
    names = [
        "open_write, row stale by the tail (tail scan)",
        "read_checkpoint (index rows)",
        "read_after (the tail: pread + frame scan + decode)",
        "cells from the rows + fold of the tail",
        "open_write, no index row (whole-log scan)",
        "read of every event (whole-log parse)",
        "fold of every event, every unit",
    ]
    best = [float("inf")] * len(names)
    clock = time.perf_counter
    for _ in range(reps):
        laps: list[float] = []
        log.reset("stale")
        store = FileLogStore(log.root)
        try:
            gc.collect()
            t0 = clock()
            handle = store.open_write(sid)
            t1 = clock()
            found = store.read_checkpoint(sid, handle.header, handle.inherited_event_count)
            t2 = clock()
            assert found is not None
            rows, offset = found
            seq = max(r.seq for r in rows.values())
            tail = store.read_after(handle, offset, seq + 1)
            t3 = clock()
            assert tail is not None
            cells = registry().cells(handle.header, handle.inherited_event_count, rows)
            cells.fold(tail)
            t4 = clock()
            laps += [t1 - t0, t2 - t1, t3 - t2, t4 - t3]
            store.close(handle)
        finally:
            store.close_store()
        log.reset("none")
        store = FileLogStore(log.root)
        try:
            gc.collect()
            t0 = clock()
            handle = store.open_write(sid)
            t1 = clock()
            events = store.read(handle)
            t2 = clock()
            registry().cells(handle.header, handle.inherited_event_count).fold(events)
            t3 = clock()
            laps += [t1 - t0, t2 - t1, t3 - t2]
            store.close(handle)
        finally:
            store.close_store()
        best = [min(b, lap) for b, lap in zip(best, laps)]
    return list(zip(names, best))


def print_resume(log: ResumeLog, result: ResumeResult, view: Any, sizes: Sizes) -> None:
    print(
        f"\n3. resume: {log.plain_bytes / MB:.1f} MB uncompressed ({log.file_bytes / MB:.2f} MB zstd file), "
        f"{log.events} events; the actors wrote {log.head} ({log.actor_fsyncs} appends, "
        f"{log.actor_checkpoints} checkpoints, the last at seq {log.checkpoint_seq}); a plain handle "
        f"wrote the last {log.events - log.head}; ms, medians of {sizes.resume_reps} interleaved runs"
    )
    print(f"{'':<54} {'ms':>8} {'speedup':>8} {'range':>11}")
    for name, label in RESUME_ROWS.items():
        speedups = result.speedup(name)
        print(
            f"{label:<54} {result.median(name) * 1e3:>8.2f} {statistics.median(speedups):>8.2f} {spread(speedups):>11}"
        )
    print(f"   both ways: {view}; open folded {sizes.tail_events} events x {len(SUBAGENT_UNITS)} units")


def print_resume_breakdown(log: ResumeLog, stages: list[tuple[str, float]]) -> None:
    print("\n   where the time goes (each step called directly, best of the runs):")
    print(f"   {'step':<54} {'ms':>8}")
    for i, (name, seconds) in enumerate(stages):
        if i == 4:
            print("   cold path:")
        print(f"   {name:<54} {seconds * 1e3:>8.2f}")


# --- main ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run of a few seconds")
    parser.add_argument("--dir", default=None, help="where to put temporary logs (default: the system temp dir)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of each measurement")
    parser.add_argument("--only", default="1,2,3", help="which measurements to run, e.g. 1,3")
    parser.add_argument("--breakdown", action="store_true", help="print the breakdowns even when on target")
    parser.add_argument("--profile", action="store_true", help="also print cProfile listings of the subjects")
    parser.add_argument(
        "--baseline-tree",
        default=None,
        help="part 2 also runs the actors of this tree (storage, actors, runtime), alternating with this one",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sizes = QUICK if args.quick else FULL
    if args.reps:
        sizes = dataclasses.replace(sizes, fanout_reps=args.reps, commit_reps=args.reps, resume_reps=args.reps)
    only = {part.strip() for part in args.only.split(",")}
    workdir = tempfile.mkdtemp(prefix="subagents-actors-bench-", dir=args.dir)
    print(
        f"actors bench ({'quick' if args.quick else 'full'}): {sizes}, python {sys.version.split()[0]}, "
        f"trio {trio.__version__}, msgspec {msgspec.__version__}, zstandard {zstandard.__version__}, "
        f"{os.cpu_count()} cpus, {load()}, logs in {workdir}"
    )
    verdicts: list[str] = []
    started = time.perf_counter()
    try:
        if "1" in only:
            fanout = trio.run(bench_fanout, sizes, args.profile)
            print_fanout(fanout, sizes)
            factor = statistics.median(fanout.factor("subject"))
            verdicts.append(
                f"snapshot fan-out target <= {FANOUT_TARGET}x sequential bare asks: "
                f"{'PASS' if factor <= FANOUT_TARGET else 'BELOW'} ({factor:.2f}x)"
            )
        if "2" in only:
            commit = bench_commit(workdir, sizes, args.baseline_tree)
            if args.profile:
                root = tempfile.mkdtemp(prefix="commit-profile-", dir=workdir)
                trio.run(actor_appends, root, commit.shapes[HEADLINE_APPENDERS], True)
            print_commit(commit, sizes, args.baseline_tree)
            net = statistics.median(commit.net_us(HEADLINE_APPENDERS, "actors"))
            verdicts.append(
                f"group commit, the actors' CPU per event at {HEADLINE_APPENDERS} appenders (net of the appender "
                f"side) <= {PER_EVENT_TARGET_US:.0f} µs: {'PASS' if net <= PER_EVENT_TARGET_US else 'BELOW'} "
                f"({net:.1f} µs; {commit.cpu_us(HEADLINE_APPENDERS, 'actors'):.1f} µs with the appenders')"
            )
        if "3" in only:
            storage_bench = load_storage_bench()
            log = trio.run(build_resume_log, workdir, sizes, storage_bench)
            try:
                resume, view = trio.run(bench_resume, log, sizes, args.profile)
                print_resume(log, resume, view, sizes)
                speedup = statistics.median(resume.speedup())
                if args.breakdown or args.profile or speedup < RESUME_TARGET:
                    print_resume_breakdown(log, resume_breakdown(log, sizes.resume_reps))
            finally:
                log.close()
            verdicts.append(
                f"resume target >= {RESUME_TARGET:.0f}x faster than open_write + read + full fold: "
                f"{'PASS' if speedup >= RESUME_TARGET else 'BELOW'} ({speedup:.2f}x)"
            )
        print(
            f"\nafter the run ({time.perf_counter() - started:.0f} s): {load()} "
            f"(a load above the cpu count makes every figure noisier)\n"
        )
        print("\n".join(verdicts))
    finally:
        shutil.rmtree(workdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
