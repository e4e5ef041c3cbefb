"""`open_runtime`: the one composition root (SPEC 5.2).

It builds everything and passes it explicitly — the log store (and its index), the projection
registry with the subagent units, the session store (which owns the actors' nursery), the cold
reader, the session query and the listing service — and tears it down in reverse. Nothing below
it reads the environment or a global registry. Models, clocks and ids arrive with the agent loop.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Literal

import attrs

from subagents.actors import ColdReader, SessionStore, open_session_store
from subagents.storage import FileLogStore, LogStore
from subagents.storage.projection import ProjectionRegistry

from .query import SessionQuery
from .subagents.listing import ListingService
from .subagents.units import SUBAGENT_UNITS

__all__ = ["Runtime", "open_runtime"]


@attrs.frozen(kw_only=True)
class Runtime:
    root: str
    log_store: LogStore
    registry: ProjectionRegistry
    sessions: SessionStore
    query: SessionQuery
    listing: ListingService


def _wall_ms() -> Callable[[], int]:
    """Wall-clock milliseconds, strictly increasing so that events keep their order."""
    last = 0

    def now_ms() -> int:
        nonlocal last
        last = max(last + 1, time.time_ns() // 1_000_000)
        return last

    return now_ms


@asynccontextmanager
async def open_runtime(
    root: str | os.PathLike[str],
    *,
    compression: Literal["zstd", "none"] = "zstd",
    log_store: LogStore | None = None,
    now_ms: Callable[[], int] | None = None,
) -> AsyncIterator[Runtime]:
    root = os.fspath(root)
    store = log_store if log_store is not None else FileLogStore(root, compression=compression)
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    async with open_session_store(store, registry, now_ms=now_ms or _wall_ms()) as sessions:
        query = SessionQuery(store, sessions, registry, cold_reader=ColdReader(store))
        listing = ListingService(registry=registry, sessions=sessions, query=query, log_store=store)
        yield Runtime(root=root, log_store=store, registry=registry, sessions=sessions, query=query, listing=listing)
