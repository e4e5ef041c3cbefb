"""Stores for the process benchmarks (bench/startup.py, bench/scale.py, bench/listing_cli.py),
written with the storage layer directly: `FileLogStore.create` + `append` (`write_log`), with
every fsync skipped (`NoSyncFs`, `build_store`).

The files are exactly what the store writes (the same code path, the same bytes); only their
durability is given up, which a benchmark that reads them from the page cache does not need.
Building 50,000 sessions this way takes seconds instead of the minutes 100,000 real fsyncs take.
"""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from subagents.runtime.delegation.descriptor import SubagentDescriptor, snapshot_descriptor
from subagents.storage import Batch, Event, FileLogStore, Offset, OsFs, SessionHeader, make_event
from subagents.storage.index import INDEX_NAME

__all__ = [
    "CREATED_AT",
    "NoSyncFs",
    "Run",
    "build_store",
    "bytecode_env",
    "child_events",
    "cli_command",
    "descriptor_data",
    "drop_index",
    "events_of",
    "header",
    "root_events",
    "run_process",
    "storage_bench",
    "write_log",
]

CREATED_AT = 1_764_547_200_000  # 2025-12-01T00:00:00Z


class _NoSyncFile:
    """An `OsFs` file whose `fsync` does nothing."""

    def __init__(self, file: Any) -> None:
        self._file = file

    def fsync(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


class NoSyncFs(OsFs):
    """`OsFs` without fsyncs: for building benchmark corpora only."""

    def open(self, path: str, mode: Any) -> Any:  # type: ignore[override]  # the same file, wrapped
        return _NoSyncFile(super().open(path, mode))

    def fsync_dir(self, path: str) -> None:
        pass


def storage_bench() -> ModuleType:
    """bench/storage.py as a module: its realistic event generator (`turn_events`, `event_stream`)."""
    name = "bench_storage"
    if name not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "storage.py")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def events_of(first_seq: int, items: Iterable[tuple[str, Any, bool]]) -> list[Event]:
    """`items` (bench/storage.py's `(type, data, surface)` triples) as events from `first_seq`."""
    return [
        make_event(first_seq + i, type_, CREATED_AT + first_seq + i, data, surface_op="append" if surface else None)
        for i, (type_, data, surface) in enumerate(items)
    ]


def _turn(turn: int, first_seq: int) -> list[Event]:
    """One realistic turn (bench/storage.py's: a prompt, a tool round trip, an answer; ~3 KB)."""
    return events_of(first_seq, storage_bench().turn_events(random.Random(turn), turn))


def descriptor_data(label: str) -> dict[str, Any]:
    """A continuable child's `subagent/descriptor` data."""
    return snapshot_descriptor(SubagentDescriptor(mode="continuable", provider="scripted", label=label))


def root_events(turns: int = 1) -> list[Event]:
    """A root session's log: `turns` small turns."""
    events: list[Event] = []
    for turn in range(1, turns + 1):
        events += _turn(turn, len(events))
    return events


def child_events(label: str, turns: int = 1) -> list[Event]:
    """A continuable child's log: its descriptor, then `turns` small turns."""
    events = [make_event(0, "subagent/descriptor", CREATED_AT, descriptor_data(label))]
    for turn in range(1, turns + 1):
        events += _turn(turn, len(events))
    return events


def header(sid: str, i: int, parent: str | None, *, seeded: bool = False) -> SessionHeader:
    """A session's header: created `i` ms after CREATED_AT; a child of `parent` (a subagent), if given."""
    return SessionHeader(
        id=sid,  # type: ignore[arg-type]  # plain strs where the header takes SessionIds
        created_at=CREATED_AT + i,
        is_seeded=seeded,
        delegation_depth=0 if parent is None else 1,
        cwd="/work/bench",
        parent_session=parent,  # type: ignore[arg-type]  # plain strs where the header takes SessionIds
        origin=None if parent is None else "subagent",
    )


def build_store(
    root: str,
    *,
    roots: Iterable[str] = (),
    children: Sequence[tuple[str, int]] = (),
    others: int = 0,
    first_other: int = 0,
    compression: str = "zstd",
) -> int:
    """Write a store at `root`: the sessions `roots` (one turn each), `count` children of each
    `(parent, count)` in `children` (a descriptor and one turn each; the parent must be among
    `roots`), and `others` more root sessions (`s-00000`, ... numbered from `first_other`, so a
    later call can add more to the same store). Returns the sessions written.
    Every child of one parent shares one event list (their logs differ only in the header), so
    only the writes cost."""
    store = FileLogStore(fs=NoSyncFs(root), compression=compression)  # type: ignore[arg-type]  # a str checked by the store
    written = 0
    shared_root = root_events()
    try:

        def one(sid: str, i: int, parent: str | None, events: list[Event]) -> None:
            write_log(store, header(sid, i, parent), events)

        for i, sid in enumerate(roots):
            one(sid, i, None, shared_root)
            written += 1
        for parent, count in children:
            events = child_events(f"child of {parent}")
            for i in range(count):
                one(f"{parent}-c{i:05d}", 1_000 + i, parent, events)
                written += 1
        for i in range(first_other, first_other + others):
            one(f"s-{i:05d}", 100_000 + i, None, shared_root)
            written += 1
    finally:
        store.close_store()
    return written


def write_log(
    store: FileLogStore, head: SessionHeader, events: list[Event], *, inherited: int = 0, batch: int | None = None
) -> None:
    """Create the session and append `events`: in one batch, or in batches of `batch` events (one
    zstd frame each, as group commit writes). A seeded log (`inherited` events, then the
    `session/end-seed` marker, first in `events`) is published with its whole seed at once."""
    handle = store.create(head, inherited_event_count=Offset(inherited))
    try:
        first = inherited + 1 if inherited else 0
        if first:
            store.append(handle, [Batch(Offset(0), events[:first])])
        step = batch or max(len(events), 1)
        for start in range(first, len(events), step):
            store.append(handle, [Batch(Offset(start), events[start : start + step])])
    finally:
        store.close(handle)


def drop_index(root: str) -> None:
    """Remove the store's index (a cache): the next listing finds no row and reads every log."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.unlink(os.path.join(root, INDEX_NAME + suffix))
        except FileNotFoundError:
            pass  # that part of the index was never made: nothing to remove


def cli_command() -> list[str]:
    """How a person runs `subagents`: the console script next to this Python, else `-m`."""
    script = os.path.join(os.path.dirname(sys.executable), "subagents")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "subagents.runtime.hosts.cli"]


@dataclass(frozen=True)
class Run:
    """One process: wall seconds, CPU seconds (user + system), peak RSS in bytes, its stdout."""

    wall: float
    cpu: float
    max_rss: int
    stdout: bytes


def bytecode_env(cache: str) -> dict[str, str]:
    """The environment a benchmarked process runs in: this one, with Python's bytecode cache on
    and kept under `cache` (`PYTHONPYCACHEPREFIX`), as an installed package has it (pip writes
    the .pyc files at install). With `PYTHONDONTWRITEBYTECODE=1` and no .pyc next to the
    sources (an editable install in a checkout), every start compiles every module of the
    project again. Run each command once before timing it: that run writes the cache."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = cache
    return env


def run_process(argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None) -> Run:
    """Run `argv` to its end and measure it (`os.wait4`: this process's own resources, peak RSS
    included); `SystemExit` (a bench bug) when it fails."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env)
    assert process.stdout is not None and process.stderr is not None
    errors: list[bytes] = []
    reader = threading.Thread(target=lambda: errors.append(process.stderr.read()))  # type: ignore[union-attr]  # stderr is a pipe (Popen above)
    reader.start()
    out = process.stdout.read()
    reader.join()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    process.stdout.close()
    process.stderr.close()
    if process.returncode != 0:
        raise SystemExit(f"bench bug: {' '.join(argv)} exited {process.returncode}: {b''.join(errors).decode()[-500:]}")
    return Run(wall=wall, cpu=usage.ru_utime + usage.ru_stime, max_rss=usage.ru_maxrss * 1024, stdout=out)
