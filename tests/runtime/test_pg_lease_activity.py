"""Activity across hosts (SPEC §9): on the PostgreSQL store, a child with an unexpired lease held
by another live host lists as `running` wherever it is listed — here from a runtime on a second
store (a second host) of the same database. An expired lease, a released one, or one whose host
is gone (its liveness lock freed with its connection) is not running. No time passes for real:
a lease "expires" by an UPDATE of its `expires_at`."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from drafts import descriptor_draft, turn_start
from log_lines import header
from subagents.actors import open_session_store
from subagents.runtime import SUBAGENT_UNITS, open_runtime
from subagents.storage import ProjectionRegistry

pytestmark = pytest.mark.pg

GUARD = 15.0  # seconds: a hang fails the test instead of blocking the suite


async def test_a_child_another_host_holds_lists_as_running_until_its_lease_is_not_held(
    tmp_path: Path, pg_store_factory: Callable[..., Any], pg_url: str
) -> None:
    a, b = pg_store_factory(), pg_store_factory()
    clock = itertools.count(1)
    with trio.fail_after(GUARD), psycopg.connect(pg_url, autocommit=True) as db:
        async with open_session_store(a, ProjectionRegistry(SUBAGENT_UNITS), now_ms=lambda: next(clock)) as sessions:
            await sessions.create(header("p", 1))
            ref = await sessions.create(header("c", 2, parent_session="p", origin="subagent"))
            await ref.append([descriptor_draft("Busy")])
            await ref.append([turn_start(1)])
            await sessions.release("c")  # checkpoint rows written
            await sessions.release("p")

        async def activity() -> str:
            [row] = await rt.listing.list_children("p")
            assert (row.id, row.label) == ("c", "Busy")
            return row.activity

        async with open_runtime(tmp_path, log_store=b) as rt:
            assert await activity() == "inactive"
            held = a.open_write("c")  # host A runs the child
            assert await activity() == "running"
            db.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE session_id = 'c'")
            assert await activity() == "inactive"  # A paused past its ttl
            a.close(held)
            held = a.open_write("c")
            assert await activity() == "running"
            a.close(held)  # released
            assert await activity() == "inactive"
            held = a.open_write("c")
            assert await activity() == "running"
            # Host A's owner connection is cut (issue 27: a cut connection is not a dead host —
            # before, the child listed as inactive at once and could be taken while A ran it):
            # it is running until its lease expires, or A's row goes.
            pid = a.owner_backend_pid
            assert db.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,)).fetchone() == (True,)
            assert db.execute("SELECT expires_at > now() FROM leases WHERE session_id = 'c'").fetchone() == (True,)
            assert await activity() == "running"
            db.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE session_id = 'c'")
            assert await activity() == "inactive"  # A died: its lease ran out
            a.close(held)
