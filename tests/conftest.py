"""Shared fixtures: every log-store implementation, for the conformance suite and friends."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from subagents.storage import FileLogStore, LogStore
from subagents.storage.testing import FaultyLogStore, MemoryLogStore

StoreFactory = Callable[[], LogStore]


@pytest.fixture(params=["file", "file-zstd", "memory", "memory-zstd", "faulty"])
def store_factory(request: pytest.FixtureRequest, tmp_path) -> Iterator[StoreFactory]:
    """Makes stores that share one root, so a test can open a second store on the same data."""
    kind, _, form = request.param.partition("-")
    compression = "zstd" if form == "zstd" else "none"
    if kind == "file":
        yield lambda: FileLogStore(str(tmp_path), compression=compression)
    elif kind == "memory":
        shared = MemoryLogStore()
        yield lambda: MemoryLogStore(fs=shared.crash_fs, compression=compression)
    else:
        yield lambda: FaultyLogStore(FileLogStore(str(tmp_path), compression=compression))


@pytest.fixture
def store(store_factory: StoreFactory) -> LogStore:
    return store_factory()
