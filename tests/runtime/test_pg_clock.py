"""Stale interrupts judged on one clock across hosts (runtime/agent/mailbox_owner.py, storage/pg_mailbox.py):
on PostgreSQL every sender stamps and every owner compares on the database's clock, so a host
whose wall clock is behind its peer's still interrupts a turn its peer runs, and one sent before
the owner started is still stale."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from subagents.runtime.agent.mailbox_owner import new_envelope
from subagents.runtime.app import open_runtime
from subagents.runtime.foundation.clock import ScenarioClock
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel
from subagents.runtime.tools.base import FunctionTool
from subagents.storage import Envelope, FileMailbox, PostgresMailbox

pytestmark = pytest.mark.pg

GUARD = 15.0  # seconds: a hang fails the test instead of blocking the suite
SKEW_NS = 30 * 1_000_000_000  # each host's wall clock is 30 s off, in opposite directions


class _Acks(PostgresMailbox):
    """The owner's mailbox, telling the test (a Trio event per delivery id) what it acked."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acked: dict[str, trio.Event] = {}

    def ack(self, session_id: str, delivery_id: str) -> None:
        super().ack(session_id, delivery_id)
        trio.from_thread.run_sync(self.acked.setdefault(delivery_id, trio.Event()).set)  # from a worker thread


def skewed(by_ns: int) -> Callable[[], int]:
    return lambda: time.time_ns() + by_ns


def database_ms(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as db:
        return int(db.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetchone()[0])


def test_the_postgresql_mailbox_clock_is_the_database_s(pg_url: str) -> None:
    behind = PostgresMailbox(pg_url, wall_ns=skewed(-SKEW_NS))
    ahead = PostgresMailbox(pg_url, wall_ns=skewed(SKEW_NS))
    try:
        assert ahead.now_ms() - behind.now_ms() > 59_000  # their wall clocks, until measured
        behind.sync_clock()
        ahead.sync_clock()
        server = database_ms(pg_url)
        for mailbox in (behind, ahead):
            assert abs(mailbox.now_ms() - server) < 2_000  # a round trip's worth, not 30 s
    finally:
        behind.close()
        ahead.close()


def test_a_deliver_measures_the_clock_again_once_a_measure_is_old(pg_url: str) -> None:
    offset = [0]
    mailbox = PostgresMailbox(pg_url, wall_ns=lambda: time.time_ns() + offset[0], clock_resync=0.0)
    try:
        mailbox.sync_clock()
        offset[0] = SKEW_NS  # this host's clock jumps 30 s ahead
        assert mailbox.now_ms() - database_ms(pg_url) > 29_000
        mailbox.deliver("child-1", Envelope.new(mailbox.ids, 1, "message", {"text": "hi"}))
        assert abs(mailbox.now_ms() - database_ms(pg_url)) < 2_000
    finally:
        mailbox.close()


def test_the_file_mailbox_clock_is_the_wall_clock(tmp_path: Path) -> None:
    mailbox = FileMailbox(str(tmp_path), now_ns=lambda: 42_000_000)  # temp files' clock only
    mailbox.sync_clock()  # nothing to measure
    before = time.time_ns() // 1_000_000
    assert before <= mailbox.now_ms() <= time.time_ns() // 1_000_000


async def test_an_interrupt_from_a_host_whose_clock_is_behind_aborts_the_turn(
    tmp_path: Path, pg_store_factory: Callable[..., Any], pg_url: str
) -> None:
    entered = trio.Event()

    async def forever(_args: dict[str, Any], _ctx: Any) -> str:
        entered.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    hang = {"tool_calls": [{"name": "slow", "arguments": {}}]}
    model = ScriptedModel(load_script(json.dumps({"agents": [{"responses": [hang]}]})))
    tools = [FunctionTool(name="slow", description="waits", fn=forever)]
    store = pg_store_factory()
    here = _Acks(pool=store.pool, wall_ns=skewed(SKEW_NS))  # the owner's host: 30 s ahead
    there = PostgresMailbox(pg_url, wall_ns=skewed(-SKEW_NS))  # the sender's host: 30 s behind
    try:
        with trio.fail_after(GUARD):
            async with open_runtime(
                tmp_path,
                log_store=store,
                mailbox=here,
                model=model,
                clock=ScenarioClock(),
                id_factory=CountingIds("c"),
                tools=lambda: tools,
            ) as rt:
                agent = await rt.agents.create(session_id="root")
                await agent.send("go")
                await entered.wait()
                stale = Envelope.new(there.ids, database_ms(pg_url) - 60_000, "interrupt", {})  # before the owner
                await trio.to_thread.run_sync(there.deliver, "root", stale)
                await here.acked.setdefault(stale.delivery_id, trio.Event()).wait()
                assert agent.status == "running"  # acked without effect
                await trio.to_thread.run_sync(there.sync_clock)
                fresh = new_envelope(there, "interrupt", {})
                await trio.to_thread.run_sync(there.deliver, "root", fresh)
                await here.acked.setdefault(fresh.delivery_id, trio.Event()).wait()
                assert agent.status == "idle"  # aborted, though its sender's clock is a minute behind
        with psycopg.connect(pg_url, autocommit=True) as db:
            assert db.execute("SELECT count(*) FROM mailbox WHERE session_id = 'root'").fetchone() == (0,)  # both acked
    finally:
        there.close()
