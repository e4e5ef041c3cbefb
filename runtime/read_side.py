"""`open_read_side`: what a read-only command (`children`, `agents`, `sessions`, `show`, `tail`)
opens, and what the operator commands (`send`, `interrupt`, `stop`) read through.

The read half of `open_runtime` (runtime/app.py): the log store, the projection registry, the
session store (no session is resident here; it serves the query's stats and the listing's live
rung), the session query and the listing service. No agent registry, model, tools, mailbox or
MCP servers, and none of their modules are imported, so a one-shot read starts in the time of
the storage, the actors and the listing alone (issue 20, start-up; tests/runtime/
test_startup_imports.py checks which modules such a command loads).

A command reads one state of the store: the corpus is listed once — `children` learns that its
parent exists from the listing itself (`ListingParentNotFound`) and shows creation times from
the query's last corpus (`SessionQuery.recorded`) — and a file store is opened without change
notification (inotify watches only pay off from a store's second listing on, and
setting one up per session folder cost as much as the listing itself at 10,000 sessions). A file
store is given the projection units, so rebuilding a lost index also writes each log's checkpoint
rows from the same read, and a `children P` command's store is focused on P (only line 1 of the
logs naming another parent is read: issue 28, item 1).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
from subagents.actors import SessionStore, open_session_store
from subagents.storage import FileLogStore, LogStore, ProjectionRegistry

from .delegation.listing import ListingService
from .delegation.listing_stall import STALL_AFTER
from .delegation.units import SUBAGENT_UNITS
from .foundation.clock import RealClock
from .query import SessionQuery
from .store_select import is_pg_url, open_log_store
from .usage import USAGE_UNIT

__all__ = ["ReadSide", "open_read_side", "runtime_registry"]


def runtime_registry() -> ProjectionRegistry:
    """The projection units every runtime folds: the subagent units and the usage unit (the
    same registry for `open_runtime` and a read-only command, so both read the same rows)."""
    return ProjectionRegistry([*SUBAGENT_UNITS, USAGE_UNIT])


@attrs.frozen(kw_only=True)
class ReadSide:
    """The parts of a runtime a read-only command uses."""

    log_store: LogStore
    registry: ProjectionRegistry
    sessions: SessionStore
    query: SessionQuery
    listing: ListingService


@asynccontextmanager
async def open_read_side(
    root: str | os.PathLike[str],
    *,
    store: str | None = None,
    focus: str | None = None,
    subtree: bool = False,
    stall_after: float = STALL_AFTER,
    watch: bool = False,
) -> AsyncIterator[ReadSide]:
    """Open the store at `store` (a `postgresql://` URL or a folder; default `root`) for reading
    and close it after. `focus`: the one parent whose children the command lists — a file
    store then reads only line 1 of a log without an index row whose line 1 names another
    parent (`LogInfo.checked`); such a side serves that listing, not a corpus of every session.
    `subtree`: the command lists the focus's descendants (line 1 must place a log outside them).
    `stall_after` (seconds): when the listing calls a running child `stalled`. `watch`: a file
    store lists with change notification (a side that lists again and again: `subagents web`)."""
    spec = store or os.fspath(root)
    registry = runtime_registry()
    # A file store given units writes a log's checkpoint rows as its index scans it: a command
    # on a store without its index reads each log once (issue 28, item 1). A children listing
    # folds only the units its rows come from (the usage unit is a sixth of a rebuild's fold);
    # a later observation adds the rest beside them.
    units = registry if focus is None else ProjectionRegistry(SUBAGENT_UNITS)
    logs = (
        open_log_store(spec, create_schema=False)
        if is_pg_url(spec)
        else FileLogStore(spec, watch=watch, projections=units, focus=focus, subtree=subtree)
    )
    try:
        async with open_session_store(logs, registry, now_ms=RealClock().now_ms) as sessions:
            query = SessionQuery(logs, sessions, registry)
            listing = ListingService(registry=registry, sessions=sessions, query=query, stall_after=stall_after)
            yield ReadSide(log_store=logs, registry=registry, sessions=sessions, query=query, listing=listing)
    finally:
        logs.close_store()
