"""A session's release closes its write handle in a worker thread (actors/session_actor.py
`close_handle`): on PostgreSQL the close is a statement behind the lease lock a renewal may hold
for a network round trip, and the event loop (every agent and owner of the host) must run on
meanwhile."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
from log_lines import header
from subagents.actors import EventDraft, open_session_store
from subagents.storage import ProjectionRegistry

pytestmark = pytest.mark.pg


async def test_a_release_waiting_for_the_lease_lock_does_not_stall_the_event_loop(pg_store_factory: Any) -> None:
    store = pg_store_factory()
    leases = store._leases  # the lock a renewal holds during its statement
    held, let_go, closing = threading.Event(), threading.Event(), threading.Event()
    real_close = store.close

    def close(handle: Any) -> None:
        closing.set()
        real_close(handle)

    store.close = close  # the release reached the close (which waits for the lock)

    def renewal_in_flight() -> None:
        with leases._lock:
            held.set()
            let_go.wait(10)  # a bound on failure only: a stalled loop cannot set it

    async with open_session_store(store, ProjectionRegistry([]), now_ms=lambda: 1) as sessions:
        ref = await sessions.create(header("s1"))
        await ref.append([EventDraft(type="turn/start", data={"turn": 1})])
        thread = threading.Thread(target=renewal_in_flight)
        thread.start()
        await trio.to_thread.run_sync(held.wait)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sessions.release, "s1")
            await trio.to_thread.run_sync(closing.wait)  # back here only if the loop runs on
            ran_while_held = not let_go.is_set() and thread.is_alive()
            let_go.set()
        thread.join()
    assert ran_while_held, "the event loop stood still while the release waited for the lease lock"
    assert "s1" not in store._leases._held  # released once the lock was free
