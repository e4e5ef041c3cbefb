"""The observation rung through the CLI (issue 20 item 4): `subagents children` of a parent whose
CHILDREN children no index knows, first run, against a plain msgspec decode of the same files.

Corpus. One root session `bench-parent` with CHILDREN subagent children, and a childless root
session `bench-lonely`, written with the storage layer directly (bench/corpus.py's `write_log`:
`FileLogStore.create` + `append`, fsynced, batches of 64 events, one zstd frame per append in the
default form): no runtime, no actor, so no checkpoint rows; `index.sqlite3` is removed after
writing and again before every command, so every command is a first run (the corpus is scanned,
every child observed in full).
Half the children are seeded (inherited events, the tagged `session/end-seed` marker, then
their own), each has a continuable `subagent/descriptor` as its first own event and about
LOG_BYTES of events (bench/storage.py's realistic turns) in all.

Measured, interleaved (the order reverses every repetition), page cache warm:
- subject: `subagents children --root R bench-parent --json` in a new process (wall time);
- childless: `subagents children --root R bench-lonely --json` (the same command with nothing to
  observe: process start, imports, the corpus scan, the index write; since issue 28 that scan
  reads only line 1 of the logs naming another parent, so every child's whole read, validation
  and fold is in the listing cost, as the index rebuild now does them);
- baseline: in this process, every child's log file read and decoded with msgspec's untyped
  `Decoder().decode_lines` (for the zstd form, after one `stream_reader(...,
  read_across_frames=True)` decompression), every line including line 1, cyclic GC on (and,
  as context, paused).
The listing cost is subject - childless (the median of the per-repetition differences; the
ratio is the median of the per-repetition ratios). The same figures in CPU time (user + system
of the command's process, all threads; the baseline's process time) are printed as context: on
a loaded machine they move far less than wall times.
Target: listing cost <= 1.43x the baseline (>= 0.7x its throughput, the SPEC's codec target,
through the product). The bench checks the rows (every child, in order, `inactive`,
continuable, its label) and that the childless command printed `[]`.

Run: `.venv/bin/python bench/listing_cli.py` (2-3 minutes); `--quick` (a smoke run);
`--plain` for the plain form (`compression="none"`; the baseline then has no decompression);
`--reps N`; `--profile` also runs one subject command under cProfile and prints its top
functions. See bench/README.md for the recorded figures.
"""

from __future__ import annotations

import argparse
import gc
import io
import itertools
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec
import zstandard
from bench_common import bug, load, per_rep, spread
from corpus import cli_command, descriptor_data, drop_index, events_of, header, storage_bench, write_log
from subagents.storage import FileLogStore, make_event
from subagents.storage.file_store import _LOG_NAMES
from subagents.storage.forms import Compression

TARGET = 1.43  # listing cost at most this many times the plain decode (>= 0.7x its throughput)
PARENT = "bench-parent"
LONELY = "bench-lonely"
SEED = 20261201
KB = 1_000
BATCH = 64  # events per append: one zstd frame each, as group commit writes


@dataclass(frozen=True)
class Sizes:
    children: int
    log_bytes: int  # event bytes (uncompressed) per child
    reps: int


STANDARD = Sizes(children=200, log_bytes=256 * KB, reps=9)
QUICK = Sizes(children=40, log_bytes=64 * KB, reps=3)


# --- corpus -------------------------------------------------------------------------------------


@dataclass
class Material:
    """Event payloads reused by every child (the content does not matter to a listing, the bytes do)."""

    turns: list[tuple[str, dict[str, object], bool]]  # (type, data, surface) of whole turns


def material(log_bytes: int) -> Material:
    sb = storage_bench()
    rng = random.Random(SEED)
    turns: list[tuple[str, dict[str, object], bool]] = []
    size = 0
    for turn in itertools.count(1):
        for item in sb.turn_events(rng, turn):
            turns.append(item)
            size += len(msgspec.json.encode(item[1])) + 60
        if size >= log_bytes:
            return Material(turns)
    raise AssertionError("unreachable")


def build(root: str, sizes: Sizes, compression: Compression) -> None:
    stuff = material(sizes.log_bytes)
    store = FileLogStore(root, compression=compression)
    try:
        for n, sid in enumerate((PARENT, LONELY)):
            write_log(store, header(sid, n, None), events_of(0, stuff.turns[:11]), batch=BATCH)
        half = len(stuff.turns) // 2
        while stuff.turns[half - 1][0] != "turn/end":  # halves are whole turns
            half += 1
        for i in range(sizes.children):
            seeded = i % 2 == 1
            descriptor = ("subagent/descriptor", descriptor_data(f"child-{i}"), False)
            if seeded:
                inherited = events_of(0, stuff.turns[:half])
                k = len(inherited)
                marker = make_event(k, "session/end-seed", inherited[-1].time, {"inherited": True})
                events = [*inherited, marker, *events_of(k + 1, [descriptor, *stuff.turns[half:]])]
            else:
                k = 0
                events = events_of(0, [descriptor, *stuff.turns])
            sid_header = header(f"child-{i:05d}", 1_000 + i, PARENT, seeded=seeded)
            write_log(store, sid_header, events, inherited=k, batch=BATCH)
    finally:
        store.close_store()
    drop_index(root)


def log_files(root: str) -> list[str]:
    out = []
    for folder in sorted(os.scandir(os.path.join(root, "sessions")), key=lambda e: e.name):
        for name in _LOG_NAMES.values():
            path = os.path.join(folder.path, name)
            if os.path.exists(path):
                out.append(path)
    return out


def expected_rows(n: int) -> list[dict[str, object]]:
    return [
        {
            "kind": "child",
            "id": f"child-{i:05d}",
            "activity": "inactive",
            "has_children": False,
            "mode": "continuable",
            "label": f"child-{i}",
        }
        for i in range(n)
    ]


# --- the three measurements ------------------------------------------------------------------------


def command(root: str, parent: str, want: list[dict[str, object]], profile: str | None = None) -> float:
    drop_index(root)  # no index: no rows, no checkpoint rows (every command is a first run)
    argv = [*cli_command(), "children", "--root", root, parent, "--json"]
    if profile is not None:
        argv = [
            sys.executable,
            "-m",
            "cProfile",
            "-o",
            profile,
            "-m",
            "subagents.runtime.hosts.cli",
            *argv[len(cli_command()) :],
        ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    if done.returncode != 0:
        raise bug(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    if profile is None:
        rows = json.loads(done.stdout)
        for row in rows:
            row.pop("last_event", None)  # when its log was last written (issue 29): not the bench's to check
        if rows != want:
            raise bug(f"`children {parent}` listed wrongly: {rows[:2]} ... ({len(rows)} rows)")
    return elapsed


def plain_bytes(path: str, compression: Compression) -> bytes:
    """A log file's lines: read, and for the zstd form decompressed across its frames."""
    with open(path, "rb") as f:
        data = f.read()
    if compression == "zstd":
        data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True).read()
    return data


def decode_all(paths: list[str], compression: Compression) -> int:
    """Every line of every log, untyped, in this thread (file read and decompression included)."""
    decoder = msgspec.json.Decoder()
    return sum(len(decoder.decode_lines(plain_bytes(path, compression))) for path in paths)


def baseline(paths: list[str], compression: Compression, items: int, gc_off: bool) -> float:
    gc.collect()
    if gc_off:
        gc.disable()
    try:
        cpu = time.process_time()
        start = time.perf_counter()
        got = decode_all(paths, compression)
        elapsed = time.perf_counter() - start
        CPU.append(time.process_time() - cpu)
    finally:
        gc.enable()
    if got != items:
        raise bug(f"the baseline decoded {got} lines, not {items}")
    return elapsed


CPU: list[float] = []  # the CPU time (user + system) of the last measurement, appended by it


def interleaved(
    reps: int, runs: dict[str, Callable[[], float]]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and CPU times of every run, the order reversing every repetition."""
    out: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            out[name].append(runs[name]())
            cpu[name].append(CPU[-1])
    return out, cpu


# --- main ------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--plain", action="store_true", help="the plain form (compression='none') instead of zstd")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 9)")
    parser.add_argument("--dir", default=None, help="where to put the store (default: the system temp dir)")
    parser.add_argument("--profile", action="store_true", help="also cProfile one subject command")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sizes = QUICK if args.quick else STANDARD
    if args.reps:
        sizes = Sizes(sizes.children, sizes.log_bytes, args.reps)
    compression: Compression = "none" if args.plain else "zstd"
    workdir = tempfile.mkdtemp(prefix="subagents-listing-cli-bench-", dir=args.dir)
    print(
        f"listing CLI bench: {sizes}, {compression} form, python {sys.version.split()[0]}, "
        f"msgspec {msgspec.__version__}, zstandard {zstandard.__version__}, {os.cpu_count()} cpus, {load()}"
    )
    started = time.perf_counter()
    try:
        root = os.path.join(workdir, "root")
        t0 = time.perf_counter()
        build(root, sizes, compression)
        paths = log_files(root)
        items = decode_all(paths, compression)
        on_disk = sum(os.path.getsize(p) for p in paths)
        child_paths = [p for p in paths if "child-" in p]
        events_bytes = sum(len(plain_bytes(p, compression)) for p in child_paths)
        print(
            f"corpus: {len(paths)} logs ({sizes.children} children + 2 root sessions), {items} lines, "
            f"{on_disk / 1e6:.1f} MB on disk, children {events_bytes / 1e6:.1f} MB of lines; "
            f"built in {time.perf_counter() - t0:.1f} s"
        )
        want = expected_rows(sizes.children)
        command(root, PARENT, want)  # warm-up (page cache, bytecode), untimed
        command(root, LONELY, [])
        runs, cpu = interleaved(
            sizes.reps,
            {
                "childless": lambda: command(root, LONELY, []),
                "subject": lambda: command(root, PARENT, want),
                "baseline": lambda: baseline(child_paths, compression, items_of(child_paths, compression), False),
                "baseline, GC paused": lambda: baseline(
                    child_paths, compression, items_of(child_paths, compression), True
                ),
            },
        )
        cost = [s - c for s, c in zip(runs["subject"], runs["childless"], strict=True)]
        factors = per_rep(cost, runs["baseline"])
        factor = statistics.median(factors)
        paused = statistics.median(per_rep(cost, runs["baseline, GC paused"]))
        med = {name: statistics.median(values) * 1e3 for name, values in runs.items()}
        print(f"ms, medians of {sizes.reps} interleaved runs:")
        print(f"   {'children of a childless parent (new process, first run)':<62} {med['childless']:>9.1f}")
        print(f"   {'children of the parent (new process, first run)':<62} {med['subject']:>9.1f}")
        print(
            f"   {'  listing cost: the difference (median of per-run differences)':<62} "
            f"{statistics.median(cost) * 1e3:>9.1f}   {events_bytes / 1e6 / statistics.median(cost):.0f} MB/s"
        )
        print(
            f"   {'untyped decode_lines of every child log, one thread (baseline)':<62} {med['baseline']:>9.1f}"
            f"   {events_bytes / 1e6 / (med['baseline'] / 1e3):.0f} MB/s"
        )
        print(f"   {'  context: the same, cyclic GC paused':<62} {med['baseline, GC paused']:>9.1f}")
        print(
            f"   listing cost / baseline: {factor:.2f}x ({spread(factors)}); throughput {1 / factor:.2f}x the "
            f"baseline's; against the GC-paused baseline (context): {paused:.2f}x"
        )
        cpu_cost = [s - c for s, c in zip(cpu["subject"], cpu["childless"], strict=True)]
        cpu_factors = per_rep(cpu_cost, cpu["baseline"])
        print(
            f"   CPU time (user + system, all threads; less moved by other load): childless "
            f"{statistics.median(cpu['childless']) * 1e3:.1f}, subject {statistics.median(cpu['subject']) * 1e3:.1f}, "
            f"cost {statistics.median(cpu_cost) * 1e3:.1f}, baseline {statistics.median(cpu['baseline']) * 1e3:.1f} ms; "
            f"cost / baseline {statistics.median(cpu_factors):.2f}x ({spread(cpu_factors)})"
        )
        if args.profile:
            out = os.path.join(workdir, "children.prof")
            command(root, PARENT, want, profile=out)
            import pstats

            pstats.Stats(out).sort_stats("tottime").print_stats(30)
        print(f"\nafter the run ({time.perf_counter() - started:.0f} s): {load()}\n")
        print(
            f"listing cost through the CLI target <= {TARGET}x the plain decode: "
            f"{'PASS' if factor <= TARGET else 'BELOW'} ({factor:.2f}x)"
        )
    finally:
        shutil.rmtree(workdir)
    return 0


_ITEMS: dict[tuple[str, ...], int] = {}


def items_of(paths: list[str], compression: Compression) -> int:
    key = tuple(paths)
    if key not in _ITEMS:
        _ITEMS[key] = decode_all(paths, compression)
    return _ITEMS[key]


if __name__ == "__main__":
    raise SystemExit(main())
