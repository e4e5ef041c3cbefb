"""Scale curves (issue 20, item 5): how the cost of the read-only commands, of reading one big log
and of group commit grows with size.

1. `subagents children P --json` of a parent with N = 100 / 1,000 / 10,000 children (a
   descriptor and one ~3 KB turn each, zstd), each run a new process: **cold** (the store's
   index, a cache, removed first: every child is read and observed) and **warm** (the next run,
   over the index that run left).
2. `subagents sessions` of a store of 10,000 and 50,000 sessions, cold and warm as in 1.
3. Peak RSS of a new process: the cold listing of 10,000 children (1), and (3b) reading a 500 MB
   (uncompressed) zstd log through the storage layer — `open_read` + `read` (every event in a
   list), `read_chunks` (the stream, each chunk dropped once counted), and the cold reader
   folding the runtime's projection units over it (`ColdReader.read_many` with the runtime's
   registry, as an observation reads a session: every event kept; and with
   `keep_events=False`: only the cells) — against a process that only opens it (`open_read`:
   the imports and the header; with the actors and runtime imported for the cold reader).
4. Group commit: one session, A = 1 / 10 / 100 / 1,000 concurrent appenders through its actor
   (`SessionRef.append`, one event per call, fsynced before it is acknowledged): events/s and
   events per fsync.

Linearity: for 1 and 2, the cost per item added on each step of the curve (between consecutive
sizes; with two sizes, from a store of one session to the first, then to the second); a curve
is *linear* when its last step costs 0.67-1.5x its first per item, *super-linear* above,
*sub-linear* below. The verdict is on CPU time (user + system, all threads: the work, which a
loaded machine disturbs least); the wall-clock steps are printed beside it. The tables also show
(time - the same command in a one-session store) / N per size, which is noisy at small N.
For 3, the peak above the `open_read`-only process as a multiple of the log's plain size; for
4, µs per event at 1,000 appenders against 1 (below 1: batching pays).

Every store is written with the storage layer directly (bench/corpus.py: the store's own
`create` + `append`, fsyncs skipped); the commands run with the bytecode cache on (as
bench/startup.py). Run: `.venv/bin/python bench/scale.py` (10-15 minutes on 2 busy cores, then
a few more to remove the 51,000 session folders; `--quick`: tiny sizes, a smoke run of about
half a minute with no verdicts; `--only 1,4` some curves (`3b`: only the big log of 3, without
1's stores); `--dir` for the temporary stores;
`--log-mb N` the size of 3's log; `--baseline-tree DIR` also reads it with the storage, actors and
runtime packages in DIR, e.g. an older commit's `git archive`: before and after in one run).
It always exits 0: a measurement, not a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec
import trio
from bench_common import bug, load
from corpus import (
    CREATED_AT,
    Run,
    build_store,
    bytecode_env,
    cli_command,
    drop_index,
    run_process,
    storage_bench,
)
from subagents.actors import EventDraft, open_session_store
from subagents.runtime.read_side import runtime_registry
from subagents.storage import Batch, FileLogStore, Offset, SessionHeader

MB = 1_000_000
LINEAR = (0.67, 1.5)  # the per-item cost ratio (largest / smallest size) called linear


@dataclass(frozen=True)
class Sizes:
    children: tuple[int, ...]
    children_reps: tuple[int, ...]  # repetitions per size (cold and warm each)
    sessions: tuple[int, int]  # the 2nd store extends the 1st (the largest children store + others)
    sessions_reps: int
    log_mb: int
    log_reps: int
    appenders: tuple[int, ...]
    commit_events: int  # events per group-commit run (at least five per appender)
    commit_reps: int
    fixed_reps: int  # runs of each command in the one-session store


FULL = Sizes(
    children=(100, 1_000, 10_000),
    children_reps=(5, 5, 3),
    sessions=(10_000, 50_000),
    sessions_reps=3,
    log_mb=500,
    log_reps=2,
    appenders=(1, 10, 100, 1_000),
    commit_events=2_000,
    commit_reps=3,
    fixed_reps=7,
)
QUICK = Sizes(
    children=(5, 50),
    children_reps=(1, 1),
    sessions=(51, 120),
    sessions_reps=1,
    log_mb=2,
    log_reps=1,
    appenders=(1, 10),
    commit_events=20,
    commit_reps=1,
    fixed_reps=1,
)

# Peak RSS of a process: its children's maximum, read by a small wrapper that starts it (the
# wrapper forks it from its own small memory, so the figure is the command's, not this bench's).
_RSS_WRAPPER = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)
if done.returncode:
    sys.exit(done.returncode)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""

_READ_LOG = """
import sys
from subagents.storage import FileLogStore
store = FileLogStore(sys.argv[1])
sid, mode = sys.argv[2], sys.argv[3]
if mode.startswith("cold"):
    import trio
    from subagents.actors import ColdReader
    from subagents.runtime.read_side import runtime_registry
    async def cold():
        keep = {"keep_events": False} if mode == "cold-fold" else {}
        (read,) = await ColdReader(store).read_many([sid], registry=runtime_registry(), **keep)
        assert read.cells is not None
        return read.logged if mode == "cold-fold" else len(read.events) - read.closers
    print(trio.run(cold) if mode != "cold-open" else 0)
handle = store.open_read(sid)
if mode == "read":
    print(len(store.read(handle)))
elif mode == "stream":
    print(sum(len(chunk) for chunk in store.read_chunks(handle)))
store.close(handle)
store.close_store()
"""

# The same read with the storage, actors and runtime packages of another tree (`--baseline-tree`,
# e.g. `git archive OLD storage actors runtime | tar -x -C DIR`): the editable install's map of
# packages is pointed there before anything imports them, so before and after run in one bench.
_READ_LOG_FROM = (
    """
import sys
tree = sys.argv.pop(1)
finder = next(m for n, m in sys.modules.items() if n.startswith("__editable__") and hasattr(m, "MAPPING"))
finder.MAPPING.update({f"subagents.{p}": f"{tree}/{p}" for p in ("storage", "actors", "runtime")})
"""
    + _READ_LOG
)


def peak_rss(argv: list[str], env: dict[str, str]) -> int:
    run = run_process([sys.executable, "-c", _RSS_WRAPPER, *argv], env=env)
    return int(run.stdout)


def verdict(ratio: float, quick: bool = False) -> str:
    if quick or not math.isfinite(ratio) or ratio == 0.0:
        return "no verdict (quick sizes)"
    if ratio > LINEAR[1]:
        return "SUPER-LINEAR"
    return "linear" if ratio >= LINEAR[0] else "sub-linear"


def median_ms(runs: list[Run]) -> float:
    return statistics.median(r.wall for r in runs) * 1e3


def cpu_ms(runs: list[Run]) -> float:
    return statistics.median(r.cpu for r in runs) * 1e3


@dataclass
class Curve:
    """Median wall and CPU ms per size, and the fixed costs (a one-session store) under them."""

    name: str
    sizes: list[int]
    walls: list[float]
    cpus: list[float]
    fixed_wall: float
    fixed_cpu: float
    quick: bool  # a smoke run's tiny sizes: no verdict

    @staticmethod
    def _per_item(values: list[float], fixed: float, sizes: list[int]) -> list[float]:
        return [max(v - fixed, 0.0) / n * 1e3 for v, n in zip(values, sizes, strict=True)]

    def per_item_wall(self) -> list[float]:
        return self._per_item(self.walls, self.fixed_wall, self.sizes)

    def per_item_cpu(self) -> list[float]:
        return self._per_item(self.cpus, self.fixed_cpu, self.sizes)

    def steps(self, values: list[float], fixed: float) -> list[float]:
        """µs per item added on each step of the curve: between consecutive sizes, and from the
        one-session store to the first size when there are only two sizes (each step then
        adds thousands of items: well above the noise of a fixed cost)."""
        points = list(zip(self.sizes, values, strict=True))
        if len(points) < 3:
            points = [(1, fixed), *points]
        return [(v1 - v0) / (n1 - n0) * 1e3 for (n0, v0), (n1, v1) in zip(points, points[1:], strict=False)]

    def summary(self) -> str:
        """The verdict on CPU time (the work; what a loaded machine disturbs least): the last
        step's cost per item against the first's; the wall-clock steps beside it as context."""
        parts = []
        for what, values, fixed in (("cpu", self.cpus, self.fixed_cpu), ("wall", self.walls, self.fixed_wall)):
            steps = self.steps(values, fixed)
            ratio = steps[-1] / steps[0] if steps[0] > 0 else float("inf")
            shown = f"{what} {' / '.join(f'{p:.0f}' for p in steps)} µs, {ratio:.2f}x"
            parts.append(f"{shown}: {verdict(ratio, self.quick)}" if what == "cpu" else f"({shown})")
        sizes = [1, *self.sizes] if len(self.sizes) < 3 else self.sizes
        shown_sizes = " -> ".join(f"{n:,}" for n in sizes)
        return f"{self.name}, µs per item added on each step {shown_sizes}, last/first: " + " ".join(parts)


def print_points(label: str, curve: Curve, extra: list[str]) -> None:
    print(f"   {label:<40} {'N':>7} {'wall ms':>9} {'cpu ms':>9} {'wall µs/item':>13} {'cpu µs/item':>12}")
    rows = zip(curve.sizes, curve.walls, curve.cpus, curve.per_item_wall(), curve.per_item_cpu(), extra, strict=True)
    for n, wall, cpu, per_wall, per_cpu, more in rows:
        print(f"   {'':<40} {n:>7,} {wall:>9.0f} {cpu:>9.0f} {per_wall:>13.0f} {per_cpu:>12.0f}  {more}")


# --- 1 and 2: commands over growing stores -------------------------------------------------------


def cold_and_warm(
    argv: list[str], root: str, env: dict[str, str], reps: int, check: Callable[[bytes], bool]
) -> tuple[list[Run], list[Run]]:
    """`reps` pairs: the index dropped then the command (cold), then the command again (warm)."""
    cold: list[Run] = []
    warm: list[Run] = []
    for _ in range(reps):
        drop_index(root)
        cold.append(run_process(argv, env=env))
        warm.append(run_process(argv, env=env))
    for run in cold + warm:
        if not check(run.stdout):
            raise bug(f"{' '.join(argv[-4:])} printed {run.stdout[:300]!r}")
    return cold, warm


def children_check(n: int) -> Callable[[bytes], bool]:
    def check(out: bytes) -> bool:
        rows = json.loads(out)
        return len(rows) == n and all(row["kind"] == "child" and row["activity"] == "inactive" for row in rows)

    return check


def sessions_check(n: int) -> Callable[[bytes], bool]:
    def check(out: bytes) -> bool:
        return out.count(b"\n") == n + 1  # the header line and one row per session

    return check


@dataclass
class ColdWarm:
    """One command's cold and warm runs over a growing store: the median wall and CPU ms at each
    size, and a note per size."""

    cold_wall: list[float] = field(default_factory=list)
    cold_cpu: list[float] = field(default_factory=list)
    warm_wall: list[float] = field(default_factory=list)
    warm_cpu: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, cold: list[Run], warm: list[Run], note: str) -> None:
        self.cold_wall.append(median_ms(cold))
        self.warm_wall.append(median_ms(warm))
        self.cold_cpu.append(cpu_ms(cold))
        self.warm_cpu.append(cpu_ms(warm))
        self.notes.append(note)

    def report(self, heading: str, name: str, sizes: list[int], fixed: list[Run], quick: bool) -> tuple[Curve, Curve]:
        """The cold and the warm curve (over `fixed`, the command in a one-session store), printed."""
        fixed_ms, fixed_cpu = median_ms(fixed), cpu_ms(fixed)
        cold = Curve(f"{name}, cold", sizes, self.cold_wall, self.cold_cpu, fixed_ms, fixed_cpu, quick)
        warm = Curve(f"{name}, warm", sizes, self.warm_wall, self.warm_cpu, fixed_ms, fixed_cpu, quick)
        print(
            f"\n{heading}, new processes; medians; fixed cost (one-session store) "
            f"{fixed_ms:.0f} ms wall, {fixed_cpu:.0f} ms cpu"
        )
        print_points("cold (index removed before each run)", cold, self.notes)
        print_points("warm (the next run)", warm, [""] * len(self.notes))
        print(f"   {cold.summary()}")
        print(f"   {warm.summary()}")
        return cold, warm


@dataclass
class CommandCurves:
    children_cold: Curve | None = None
    children_warm: Curve | None = None
    sessions_cold: Curve | None = None
    sessions_warm: Curve | None = None
    rss_cold_10k: int | None = None
    rss_floor: int | None = None


def bench_commands(workdir: str, sizes: Sizes, env: dict[str, str], only: set[str], quick: bool) -> CommandCurves:
    cli = cli_command()
    out = CommandCurves()
    # The fixed cost: the same commands in a store of one session.
    tiny = os.path.join(workdir, "tiny")
    build_store(tiny, roots=["lonely"])
    children_fixed = [*cli, "children", "--root", tiny, "lonely", "--json"]
    sessions_fixed = [*cli, "sessions", "--root", tiny]
    for argv in (children_fixed, sessions_fixed):
        run_process(argv, env=env)  # untimed: writes the bytecode cache
    fixed: dict[str, list[Run]] = {"children": [], "sessions": []}
    for _ in range(sizes.fixed_reps):
        fixed["children"].append(run_process(children_fixed, env=env))
        fixed["sessions"].append(run_process(sessions_fixed, env=env))
    biggest = os.path.join(workdir, f"children-{sizes.children[-1]}")
    if "1" in only or "2" in only or "3" in only:
        children = ColdWarm()
        for n, reps in zip(sizes.children, sizes.children_reps, strict=True):
            root = os.path.join(workdir, f"children-{n}")
            started = time.perf_counter()
            build_store(root, roots=["p"], children=[("p", n)])
            built = time.perf_counter() - started
            argv = [*cli, "children", "--root", root, "p", "--json"]
            if "1" in only:
                cold, warm = cold_and_warm(argv, root, env, reps, children_check(n))
                children.add(cold, warm, f"built in {built:.1f} s; cold {'/'.join(f'{r.wall:.2f}' for r in cold)} s")
            if "3" in only and n == sizes.children[-1]:
                drop_index(root)
                out.rss_cold_10k = peak_rss(argv, env)
                out.rss_floor = peak_rss(children_fixed, env)
        if "1" in only:
            out.children_cold, out.children_warm = children.report(
                "1. children P --json", "children", list(sizes.children), fixed["children"], quick
            )
    if "2" in only:
        counts: list[int] = []
        sessions = ColdWarm()
        if not os.path.isdir(biggest):
            build_store(biggest, roots=["p"], children=[("p", sizes.children[-1])])
        have = 1 + sizes.children[-1]
        for target in sizes.sessions:
            if target > have:
                started = time.perf_counter()
                build_store(biggest, others=target - have, first_other=have)
                notes_built = f"+{target - have:,} sessions built in {time.perf_counter() - started:.1f} s"
                have = target
            else:
                notes_built = f"the {sizes.children[-1]:,}-children store"
            argv = [*cli, "sessions", "--root", biggest]
            counts.append(have)
            sessions.add(*cold_and_warm(argv, biggest, env, sizes.sessions_reps, sessions_check(have)), notes_built)
        out.sessions_cold, out.sessions_warm = sessions.report(
            "2. sessions", "sessions", counts, fixed["sessions"], quick
        )
    return out


# --- 3: reading one big log ------------------------------------------------------------------------


def build_big_log(root: str, size_mb: int) -> tuple[int, int]:
    """One zstd session of `size_mb` MB of events (plain form), in batches of 256 events (one
    frame each). Returns (events, plain bytes)."""
    sb = storage_bench()
    block = [event for event, _ in zip(sb.event_stream(random.Random(7)), range(4_096), strict=False)]
    block_bytes = sum(len(msgspec.json.encode(e)) + 1 for e in block)
    blocks = max(1, round(size_mb * MB / block_bytes))
    store = FileLogStore(root)
    handle = store.create(SessionHeader(id="big", created_at=CREATED_AT, cwd="/work/bench"))  # type: ignore[arg-type]  # a plain str id
    try:
        for b in range(blocks):
            shift = b * len(block)
            events = [msgspec.structs.replace(e, seq=e.seq + shift) for e in block] if shift else block
            batches = [Batch(Offset(shift + i), events[i : i + 256]) for i in range(0, len(events), 256)]
            store.append(handle, batches)
    finally:
        store.close(handle)
        store.close_store()
    return blocks * len(block), blocks * block_bytes


@dataclass
class BigLogPeaks:
    """Peak RSS of each way of reading the big log (bytes, one entry per repetition); `old_*`
    with the baseline tree's packages (empty without one)."""

    events: int
    plain: int
    peaks: dict[str, list[int]] = field(default_factory=dict)


# What each mode measures, and the mode it is measured above (the same imports, no read).
BIG_LOG_MODES = {
    "read": ("open_read + read (every event in a list)", "open"),
    "stream": ("open_read + read_chunks (each chunk dropped)", "open"),
    "cold": ("cold reader + runtime registry, events kept (an observation)", "cold-open"),
    "cold-fold": ("cold reader + runtime registry, keep_events=False", "cold-open"),
}
OLD_MODES = ("read", "cold")  # what a tree without read_chunks can run


def bench_big_log(workdir: str, sizes: Sizes, env: dict[str, str], baseline_tree: str | None = None) -> BigLogPeaks:
    root = os.path.join(workdir, "big")
    started = time.perf_counter()
    events, plain = build_big_log(root, sizes.log_mb)
    on_disk = sum(e.stat().st_size for e in os.scandir(os.path.join(root, "sessions", "big")) if e.is_file())
    print(
        f"\n3b. one zstd log of {events:,} events, {plain / MB:.0f} MB plain, {on_disk / MB:.0f} MB on disk "
        f"(frames of 256 events), built in {time.perf_counter() - started:.0f} s"
    )

    def argv(mode: str, old: bool = False) -> list[str]:
        if old:
            return [sys.executable, "-c", _READ_LOG_FROM, baseline_tree or "", root, "big", mode]
        return [sys.executable, "-c", _READ_LOG, root, "big", mode]

    runs = [(mode, False) for mode in BIG_LOG_MODES]
    if baseline_tree is not None:
        runs += [(mode, True) for mode in OLD_MODES]
    for mode, old in runs:  # untimed: each way reads every event back
        got = int(run_process(argv(mode, old), env=env).stdout)
        if got != events:
            raise bug(
                f"{'the baseline tree' if old else 'this tree'}: {mode} of the big log gave {got} events, not {events}"
            )
    out = BigLogPeaks(events=events, plain=plain)
    floors = ["open", "cold-open"]
    for _ in range(sizes.log_reps):  # alternated: before and after, in the same minutes
        for mode in floors:
            out.peaks.setdefault(mode, []).append(peak_rss(argv(mode), env))
        for mode, old in runs:
            out.peaks.setdefault(f"old_{mode}" if old else mode, []).append(peak_rss(argv(mode, old), env))
    return out


def report_big_log(big: BigLogPeaks, baseline_tree: str | None) -> list[str]:
    """Print the peaks of 3b; returns the verdict lines."""
    plain = big.plain
    median = {key: statistics.median(values) for key, values in big.peaks.items()}
    verdicts = []
    for mode, (what, floor_mode) in BIG_LOG_MODES.items():
        floor = median[floor_mode]
        growth = (median[mode] - floor) / plain
        line = f"   {what}: peak {median[mode] / MB:.0f} MB, above its floor {floor / MB:.0f} MB: {growth:.2f}x plain"
        if f"old_{mode}" in median:
            old = (median[f"old_{mode}"] - floor) / plain
            line += f"; {baseline_tree}: {median[f'old_{mode}'] / MB:.0f} MB, {old:.2f}x (this tree / baseline {growth / old:.2f}x)"
        print(line)
        verdicts.append(
            f"peak RSS reading a {plain / MB:.0f} MB zstd log, {mode}: {growth:.2f}x the plain size above the import"
        )
    return verdicts


# --- 4: group commit ------------------------------------------------------------------------------


async def group_commit(root: str, appenders: int, total: int) -> tuple[float, int, int]:
    """Seconds for `appenders` tasks to append `total` one-event drafts to one session (each
    task its share, one call at a time), the fsyncs its actor made, and the events appended."""
    per_task = max(1, total // appenders)
    store = FileLogStore(root)
    try:
        async with open_session_store(store, runtime_registry(), now_ms=lambda: CREATED_AT) as sessions:
            ref = await sessions.create(SessionHeader(id="commit", created_at=CREATED_AT, cwd="/work/bench"))  # type: ignore[arg-type]  # a plain str id
            await ref.append([EventDraft(type="turn/start", data={"turn": 1}, time=CREATED_AT)])
            await ref.flush()
            actor = ref._actor  # noqa: SLF001 - a measurement: the actor's fsync counter
            fsyncs0 = actor.fsyncs

            async def appender(task: int) -> None:
                for k in range(per_task):
                    step = task * per_task + k + 1
                    await ref.append([EventDraft(type="step/start", data={"turn": 1, "step": step}, time=CREATED_AT)])

            gc.collect()
            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for task in range(appenders):
                    nursery.start_soon(appender, task)
            elapsed = time.perf_counter() - started
            fsyncs = actor.fsyncs - fsyncs0
            if await ref.flush() != 1 + per_task * appenders:
                raise bug("group commit: the log does not hold every acknowledged event")
            return elapsed, fsyncs, per_task * appenders
    finally:
        store.close_store()


def bench_commit(workdir: str, sizes: Sizes) -> dict[int, list[tuple[float, int, int]]]:
    out: dict[int, list[tuple[float, int, int]]] = {a: [] for a in sizes.appenders}
    for rep in range(sizes.commit_reps):
        order = list(sizes.appenders) if rep % 2 == 0 else list(reversed(sizes.appenders))
        for appenders in order:
            root = tempfile.mkdtemp(prefix=f"commit-{appenders}-", dir=workdir)
            try:
                out[appenders].append(trio.run(group_commit, root, appenders, max(sizes.commit_events, 5 * appenders)))
            finally:
                shutil.rmtree(root)
    return out


# --- main -----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes: a smoke run of about half a minute, no verdicts"
    )
    parser.add_argument("--only", default="1,2,3,4", help="which curves to run, e.g. 1,4 (3 needs 1's largest store)")
    parser.add_argument(
        "--baseline-tree",
        default=None,
        help="3: also read the big log with the storage/actors/runtime packages of this directory (before/after)",
    )
    parser.add_argument("--log-mb", type=int, default=None, help="3: the big log's plain size in MB")
    parser.add_argument("--dir", default=None, help="where to put the temporary stores (default: the system temp dir)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sizes = QUICK if args.quick else FULL
    if args.log_mb is not None:
        sizes = dataclasses.replace(sizes, log_mb=args.log_mb)
    only = {part.strip() for part in args.only.split(",")}
    workdir = tempfile.mkdtemp(prefix="subagents-scale-bench-", dir=args.dir)
    env = bytecode_env(os.path.join(workdir, "pycache"))
    started = time.perf_counter()
    print(
        f"scale bench ({'quick' if args.quick else 'full'}): python {sys.version.split()[0]}, "
        f"{os.cpu_count()} cpus, {load()}, stores in {workdir}"
    )
    verdicts: list[str] = []
    try:
        commands = bench_commands(workdir, sizes, env, only, args.quick)
        for curve in (commands.children_cold, commands.children_warm, commands.sessions_cold, commands.sessions_warm):
            if curve is not None:
                verdicts.append(curve.summary())
        if "3" in only:
            print("\n3. peak RSS of a new process (MB)")
            if commands.rss_cold_10k is not None and commands.rss_floor is not None:
                print(
                    f"   cold children of {sizes.children[-1]:,}: {commands.rss_cold_10k / MB:.0f} MB "
                    f"(the same command in a one-session store: {commands.rss_floor / MB:.0f} MB; "
                    f"{(commands.rss_cold_10k - commands.rss_floor) / sizes.children[-1] / 1e3:.1f} KB per child above it)"
                )
                verdicts.append(
                    f"peak RSS, cold children of {sizes.children[-1]:,}: {commands.rss_cold_10k / MB:.0f} MB"
                )
        if "3" in only or "3b" in only:
            big = bench_big_log(workdir, sizes, env, args.baseline_tree)
            verdicts += report_big_log(big, args.baseline_tree)
        if "4" in only:
            commit = bench_commit(workdir, sizes)
            print(f"\n4. group commit: one session, one-event appends, medians of {sizes.commit_reps}")
            print(f"   {'appenders':>9} {'events':>7} {'events/s':>9} {'events/fsync':>13} {'µs/event':>9}")
            per_event = {}
            for appenders, runs in commit.items():
                seconds = statistics.median(r[0] for r in runs)
                fsyncs = statistics.median(r[1] for r in runs)
                events = runs[0][2]
                per_event[appenders] = seconds / events * 1e6
                print(
                    f"   {appenders:>9,} {events:>7,} {events / seconds:>9.0f} {events / max(fsyncs, 1):>13.1f} "
                    f"{per_event[appenders]:>9.0f}"
                )
            low, high = min(sizes.appenders), max(sizes.appenders)
            ratio = per_event[high] / per_event[low]
            verdicts.append(
                f"group commit: µs per event at {high:,} appenders / at {low}: {ratio:.2f}x "
                f"({'batching pays' if ratio < 1 else 'no gain from batching'})"
            )
        print(f"\n{load()}; the measurements took {time.perf_counter() - started:.0f} s")
        for line in verdicts:
            print(line)
    finally:
        removing = time.perf_counter()
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"(the temporary stores removed in {time.perf_counter() - removing:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
