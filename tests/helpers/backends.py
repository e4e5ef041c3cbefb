"""One log store under test with the back doors an actor test needs, for the in-memory file store
(`MemoryLogStore` over a `CrashFs`) or PostgreSQL (issue 18: the same tests, the store a parameter).

A test gets `backend.store` to run actors on and asks the backend, never the store's own form,
what another process would see: `another()` is a second store over the same data (the same
`CrashFs`, or the same database), `read_log`/`reopen`/`listed`/`claimed` look through it, and
`crash()` ends this process's hold: on memory a power cut (what was not fsynced is lost, every
lock goes), on PostgreSQL the store's lock connection (`owner_backend_pid`) is terminated by
the server, as when a process dies, and its leases made to have expired (the ttl a dead host's
leases wait out, skipped): what it held goes with it, what committed stays.
`durable_writes()` counts what makes an append durable (fsyncs; on PostgreSQL the store's append
calls, each one transaction), `io()` every storage operation (the `CrashFs` counters; on
PostgreSQL the store calls, counted by a transparent `FaultyLogStore` around each store).

Faults of the next append: `fail_write()` makes it fail with nothing written and the handle
alive (memory: a partial write the store cuts back; PostgreSQL: the statement fails whole),
`fail_durability()` leaves what was written unknown and the handle dead (memory: a failed
fsync; PostgreSQL: the connection cut mid-statement twice in a row, tests/helpers/pg_faults.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pg_faults
import pytest
from pg_damage import sql
from subagents.storage import AlreadyOwned, Event, LogInfo, LogStore, Offset, SessionHeader
from subagents.storage.testing import CrashFs, FaultyLogStore, MemoryLogStore

__all__ = ["Backend", "memory_backend", "pg_backend"]


class Backend:
    """See the module docstring."""

    def __init__(
        self, kind: str, make: Callable[[], LogStore], crash: Callable[[], None], url: str | None = None
    ) -> None:
        self.kind = kind
        self.url = url
        self._make = make
        self._crash = crash
        self.made: list[LogStore] = []
        self.store = self.another()

    def another(self) -> LogStore:
        """A second store over the same data: what another process opens."""
        store = self._make()
        self.made.append(store)
        return store

    def crash(self) -> None:
        self._crash()

    @property
    def crash_fs(self) -> CrashFs | None:
        """The memory form's `CrashFs` (None on PostgreSQL): for faults only files have."""
        store = self.store
        return store.crash_fs if isinstance(store, MemoryLogStore) else None

    def fail_write(self) -> None:
        """The next append fails, nothing written, its handle alive."""
        if self.url is not None:
            pg_faults.arm(self.url, 1, "error")
        else:
            assert self.crash_fs is not None
            self.crash_fs.inject("write", partial=5)

    def fail_durability(self) -> None:
        """The next append fails with its outcome unknown: its handle is dead."""
        if self.url is not None:
            pg_faults.arm(self.url, 2, "disconnect")
        else:
            assert self.crash_fs is not None
            self.crash_fs.inject("fsync")

    def close(self) -> None:
        if self.url is not None:
            pg_faults.disarm(self.url)

    def io(self) -> Counter[str]:
        """Every storage operation so far (a snapshot)."""
        fs = self.crash_fs
        if fs is not None:
            return Counter(fs.counts)
        total: Counter[str] = Counter()
        for store in self.made:
            assert isinstance(store, FaultyLogStore)
            total.update(store.calls)
        return total

    def durable_writes(self) -> int:
        """fsyncs, or on PostgreSQL append transactions, so far."""
        fs = self.crash_fs
        return fs.counts["fsync"] if fs is not None else self.io()["append"]

    def read_log(self, sid: str) -> tuple[SessionHeader, Offset, list[Event]]:
        """Header, inherited count and events of a published log, read by another store."""
        other = self.another()
        handle = other.open_read(sid)
        try:
            return handle.header, handle.inherited_event_count, other.read(handle)
        finally:
            other.close(handle)

    def reopen(self, sid: str) -> list[Event]:
        """What a new process finds: take the write lock (validating the log), read, let go."""
        other = self.another()
        handle = other.open_write(sid)
        try:
            return other.read(handle)
        finally:
            other.close(handle)

    def listed(self) -> dict[str, LogInfo]:
        return {info.id: info for info in self.another().list()}

    @contextmanager
    def claimed(self, sid: str) -> Iterator[Any]:
        """Take the session's write lock from another store (raises `AlreadyOwned` if held)."""
        other = self.another()
        handle = other.open_write(sid)
        try:
            yield handle
        finally:
            other.close(handle)

    def assert_owned(self, sid: str) -> None:
        with pytest.raises(AlreadyOwned):
            with self.claimed(sid):
                pass


def memory_backend(compression: str = "zstd") -> Backend:
    fs = CrashFs()
    first: list[MemoryLogStore] = []

    def make() -> LogStore:
        store = MemoryLogStore(fs=fs, compression=compression)  # type: ignore[arg-type]  # a Compression literal from the caller
        first.append(store)
        return store

    def crash() -> None:
        first[0].crash()

    return Backend("memory", make, crash)


def pg_backend(make_store: Callable[..., LogStore], url: str) -> Backend:
    """`make_store`: the `pg_store_factory` fixture on the database at `url`."""
    inner: list[Any] = []

    def make() -> LogStore:
        store = make_store()
        inner.append(store)
        return FaultyLogStore(store)  # no rules: a transparent call counter

    def crash() -> None:
        for store in inner:
            pid = store.owner_backend_pid
            if pid is not None:
                # Waits (up to 5 s) until the backend is gone, and its advisory locks with it.
                sql(url, "SELECT pg_terminate_backend(%s, 5000)", (pid,))
            # A dead process renews nothing: its leases run out. (Since issue 27 a cut connection
            # alone is not a dead host: another store may take its sessions only once their
            # leases expired.) The ttl is skipped, not waited for.
            sql(url, "UPDATE leases SET expires_at = now() - interval '1 second' WHERE owner = %s", (store.host_id,))

    return Backend("pg", make, crash, url)
