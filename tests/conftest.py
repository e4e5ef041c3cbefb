"""Shared fixtures: every log-store implementation, for the conformance suite and friends, and
the real PostgreSQL server the PostgreSQL store's tests run against (tests/helpers/pg_server.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from backends import Backend, memory_backend, pg_backend
from pg_server import EmbeddedServer, drop_database, fresh_database, module_database_name, reset_tables
from places import Place, open_place
from subagents.storage import FileLogStore, LogStore
from subagents.storage.testing import FaultyLogStore, MemoryLogStore

StoreFactory = Callable[[], LogStore]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[EmbeddedServer]:
    """One PostgreSQL server for the whole run, started on first use (about 2 s)."""
    server = EmbeddedServer.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pg_url(request: pytest.FixtureRequest, pg_server: EmbeddedServer) -> Iterator[str]:
    """A fresh database for one test module, dropped after it."""
    name = module_database_name(request.module.__name__)
    yield fresh_database(pg_server.url, name)
    drop_database(pg_server.url, name)


@pytest.fixture
def pg_store_factory(request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    """PostgreSQL stores on the module's database, emptied for this test; closed after it
    (which releases their write locks)."""
    from subagents.storage import PostgresLogStore

    url = request.getfixturevalue("pg_url")
    reset_tables(url)
    stores: list[PostgresLogStore] = []

    def make(**options: Any) -> LogStore:
        store = PostgresLogStore(url, **options)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close_store()


@pytest.fixture(params=["memory", pytest.param("pg", marks=pytest.mark.pg)])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The store an actor test runs on, in memory or on PostgreSQL, with its back doors
    (tests/helpers/backends.py)."""
    if request.param == "memory":
        found = memory_backend()
    else:
        found = pg_backend(request.getfixturevalue("pg_store_factory"), request.getfixturevalue("pg_url"))
    yield found
    found.close()


@pytest.fixture(params=["file", pytest.param("pg", marks=pytest.mark.pg)])
def place(request: pytest.FixtureRequest, tmp_path) -> Iterator[Place]:
    """Where a runtime-level test keeps its sessions: a folder, or the module's PostgreSQL
    database, emptied for the test (tests/helpers/places.py)."""
    yield from open_place(request, tmp_path, request.param)


@pytest.fixture(
    params=["file", "file-zstd", "memory", "memory-zstd", "faulty", pytest.param("pg", marks=pytest.mark.pg)]
)
def store_factory(request: pytest.FixtureRequest, tmp_path) -> Iterator[StoreFactory]:
    """Makes stores that share one root (or database), so a test can open a second store on the same data."""
    kind, _, form = request.param.partition("-")
    compression = "zstd" if form == "zstd" else "none"
    if kind == "file":
        yield lambda: FileLogStore(str(tmp_path), compression=compression)
    elif kind == "memory":
        shared = MemoryLogStore()
        yield lambda: MemoryLogStore(fs=shared.crash_fs, compression=compression)
    elif kind == "pg":
        yield request.getfixturevalue("pg_store_factory")
    else:
        yield lambda: FaultyLogStore(FileLogStore(str(tmp_path), compression=compression))


@pytest.fixture
def store(store_factory: StoreFactory) -> LogStore:
    return store_factory()
