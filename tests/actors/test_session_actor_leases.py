"""The session actor on a PostgreSQL store whose lease another host took over (SPEC §9): the
append fails with `OwnershipLost`, nothing is written, and the actor stops — never retrying,
exactly as after a dead handle. Two stores on one database are the two hosts; the lease
"expires" by an UPDATE of its `expires_at` (no time passes for real)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import trio
from clocks import T, fixed_ms
from drafts import note, turn_start
from events import turn_start_event
from log_lines import header
from registries import subagent_registry as registry
from subagents.actors import ActorStopped, open_session_store
from subagents.storage import Batch, Offset, OwnershipLost

pytestmark = pytest.mark.pg

BOUND = 10  # seconds; a safety net only, never the mechanism of a test

Factory = Callable[..., Any]


async def test_an_append_after_a_takeover_fails_with_ownership_lost_and_stops_the_actor(
    pg_store_factory: Factory, pg_url: str
) -> None:
    a, b = pg_store_factory(), pg_store_factory()
    with psycopg.connect(pg_url, autocommit=True) as db:
        async with open_session_store(a, registry(), now_ms=fixed_ms()) as sessions:
            ref = await sessions.create(header("s1"))
            with trio.fail_after(BOUND):
                await ref.append([turn_start(1)])
                await ref.flush()
                db.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE session_id = 's1'")
                taken = await trio.to_thread.run_sync(b.open_write, "s1")
                assert taken.impl.epoch == 2
                rows = db.execute("SELECT count(*), sum(count) FROM batches").fetchone()
                with pytest.raises(OwnershipLost) as info:
                    await ref.append([note(i=1)])
                assert info.value.epoch == 1
                await ref.wait_finished()
                assert ref.stopped and sessions.get("s1") is None
                with pytest.raises(ActorStopped) as stopped:
                    await ref.append([note(i=2)])
                assert stopped.value.reason == "stopped: ownership lost (epoch 1)"
                # Nothing written, nothing retried; B's lease stands.
                assert db.execute("SELECT count(*), sum(count) FROM batches").fetchone() == rows
                assert db.execute("SELECT owner, epoch FROM leases").fetchall() == [(b.host_id, 2)]
                assert b.append(taken, [Batch(Offset(1), [turn_start_event(1, T + 1)])]) == 2  # B writes on
        b.close(taken)
