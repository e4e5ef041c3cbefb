"""The runtime renews its store's leases (runtime/lease_renewal.py, SPEC §9): every
`lease_renew_interval`, in a worker thread, in `open_runtime`'s nursery; a failed renewal is
logged and tried again; lost sessions are logged. A store without leases (the file store) runs
no renewal. In memory under `autojump_clock`: the intervals pass in virtual time."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
from subagents.runtime import open_runtime
from subagents.runtime.lease_renewal import renew_leases
from subagents.storage import PersistenceFailed, SessionId
from subagents.storage.testing import MemoryLogStore


async def _until(holds: Any) -> None:
    """Until `holds()`: looked at again every virtual 50 ms (the renewals run in threads, which
    signal nothing a test could wait on)."""
    with trio.fail_after(600):
        while not holds():
            with trio.move_on_after(0.05):
                await trio.sleep_forever()


class LeasedStore(MemoryLogStore):
    """A memory store with the lease renewal face of the PostgreSQL store."""

    def __init__(self, outcomes: list[Any] | None = None) -> None:
        super().__init__()
        self.lease_renew_interval = 5.0
        self.outcomes = list(outcomes or [])
        self.renewals = 0
        self.threads: set[int] = set()

    @property
    def leased(self) -> LeasedStore:
        return self

    def renew_leases(self) -> frozenset[SessionId]:
        self.renewals += 1
        self.threads.add(threading.get_ident())
        outcome = self.outcomes.pop(0) if self.outcomes else frozenset()
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


async def test_renewal_runs_every_interval_in_a_thread_and_survives_failures(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = LeasedStore([PersistenceFailed("the server went away"), frozenset({SessionId("s2")})])
    caplog.set_level(logging.WARNING, logger="subagents.runtime.lease_renewal")
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        nursery.start_soon(renew_leases, store)
        await trio.sleep(4.9)
        assert store.renewals == 0
        await _until(lambda: store.renewals == 3)  # the first failed: logged, tried again
        # Each renewal waits a whole interval after the one before (virtual time).
        assert trio.current_time() - start >= 15
        nursery.cancel_scope.cancel()
    assert threading.get_ident() not in store.threads  # never on the Trio thread
    messages = [r.getMessage() for r in caplog.records]
    assert any("the server went away" in m for m in messages)
    assert any("'s2'" in m and "taken over" in m for m in messages)


async def test_a_store_without_leases_runs_no_renewal(autojump_clock: Any) -> None:
    with trio.fail_after(1):
        await renew_leases(MemoryLogStore())  # returns at once


async def test_open_runtime_renews_its_store_s_leases_until_it_closes(tmp_path: Path, autojump_clock: Any) -> None:
    store = LeasedStore()
    async with open_runtime(tmp_path, log_store=store):
        await _until(lambda: store.renewals == 2)
    done = store.renewals
    await trio.sleep(60)
    assert store.renewals == done  # the task ended with the runtime
