"""Runtimes ("hosts") on one in-memory disk: `MemoryLogStore`s and `MemoryMailbox`es on one
`CrashFs`, and for placement one `MemoryPlacements` queue, each host its own handle on it; for
tests under `autojump_clock`. `memory_host` opens one; `two_hosts` the pair the placement tests
use: the parent's host and a host that serves placements.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from subagents.runtime import ScenarioClock, open_runtime
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.hosts.serve import ServeStats, serve_placements
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel
from subagents.storage.testing import CrashFs, MemoryLogStore, MemoryMailbox, MemoryPlacements

__all__ = ["TwoHosts", "memory_host", "two_hosts"]

Json = dict[str, Any]


@asynccontextmanager
async def memory_host(
    tmp_path: Path, fs: CrashFs, mailbox: MemoryMailbox, *agents: Json, ids: str, **options: Any
) -> AsyncIterator[Any]:
    """A runtime on `fs` with its own log store, the given mailbox (and `placements`, if among
    `options`), a scripted model playing `agents` (script-format agents), ids counted from `ids`."""
    # No stall timeout: the stores and mailboxes work in worker threads, and while a thread works
    # every Trio task is blocked, so the autojump clock may leap past any deadline (the tests'
    # `until_virtual` guards hangs).
    model = ScriptedModel(load_script(json.dumps({"agents": list(agents)})), stall_timeout=None)
    async with open_runtime(
        tmp_path,
        model=model,
        clock=ScenarioClock(),
        id_factory=CountingIds(ids),
        log_store=MemoryLogStore(fs=fs, compression="none"),
        mailbox=mailbox,
        **options,
    ) as rt:
        yield rt


@dataclass(frozen=True)
class TwoHosts:
    """The parent's host (`here`, ids "p", placing on `queue`, host "parent-host") and a serving
    host (`there`, ids "s", host "serve-host"), on one disk `fs` and one placement queue."""

    fs: CrashFs
    queue: MemoryPlacements
    here: Any
    there: Any
    nursery: trio.Nursery

    async def serve(self, capacity: int) -> ServeStats:
        """`there` starts serving placements (until the hosts close)."""
        return await self.nursery.start(
            serve_placements, self.there.subagents, self.there.subagents.placements, capacity
        )


@asynccontextmanager
async def two_hosts(
    tmp_path: Path, parent: Sequence[Json], serving: Sequence[Json], **here_options: Any
) -> AsyncIterator[TwoHosts]:
    """Two hosts: `parent` the agents the parent's host plays, `serving` those the serving host
    plays; `here_options` more `open_runtime` options of the parent's host."""
    fs = CrashFs()
    mine = MemoryMailbox(fs=fs)
    queue = MemoryPlacements("parent-host")
    async with (
        memory_host(tmp_path, fs, mine, *parent, ids="p", placements=queue, **here_options) as here,
        memory_host(tmp_path, fs, mine.sibling(), *serving, ids="s", placements=queue.sibling("serve-host")) as there,
        trio.open_nursery() as nursery,
    ):
        yield TwoHosts(fs, queue, here, there, nursery)
        nursery.cancel_scope.cancel()  # the serving loop
