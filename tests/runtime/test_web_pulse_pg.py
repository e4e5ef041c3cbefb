"""The corpus pulse on PostgreSQL (issue 31): a look asks the store's change mark first and lists
the corpus only when it moved, so an idle store costs one small query a look, while an append, a
session made, and a lease taken or let go by another host still pass a generation.

A real embedded PostgreSQL server; a pulse interval of a microsecond, so each `fresh()` makes a
look (no sleeping: the looks are asked for one by one)."""

from __future__ import annotations

import pytest
import trio
from events import turn_end_event, turn_start_event
from subagents.runtime.hosts.web.pulse import CorpusPulse
from subagents.runtime.read_side import open_read_side
from subagents.storage import LogStore, PostgresLogStore
from web_console import T0, append_to, session_header, write_to

pytestmark = pytest.mark.pg

TICK = 1e-6  # seconds: every `fresh()` is a look


def _create(store: LogStore, sid: str) -> None:
    write_to(store, session_header(sid), [turn_start_event(0, T0)])


def _append(store: LogStore, sid: str, seq: int) -> None:
    append_to(store, sid, [turn_end_event(seq, T0 + 1)])


async def test_an_idle_store_makes_no_listing_and_an_append_passes_a_generation(pg_url: str) -> None:
    store = PostgresLogStore(pg_url)
    try:
        await trio.to_thread.run_sync(_create, store, "one")
        await trio.to_thread.run_sync(_create, store, "two")
        async with open_read_side(".", store=pg_url) as side:
            pulse = CorpusPulse(side, interval=TICK)
            first = await pulse.fresh()
            assert (pulse.looks, pulse.listings) == (1, 1)
            for _ in range(3):
                assert await pulse.fresh() == first  # nothing changed: no generation
            assert (pulse.looks, pulse.listings) == (4, 1)  # three looks, no listing

            await trio.to_thread.run_sync(_append, store, "two", 1)
            grew = await pulse.fresh()
            assert grew.generation == first.generation + 1
            assert grew.changed == ("two",)
            assert pulse.listings == 2

            await trio.to_thread.run_sync(_create, store, "three")
            made = await pulse.fresh()
            assert (made.generation, made.changed) == (grew.generation + 1, ("three",))
            assert pulse.listings == 3
            await pulse.fresh()
            assert pulse.listings == 3
    finally:
        store.close_store()


async def test_a_lease_another_host_takes_and_lets_go_passes_a_generation(pg_url: str) -> None:
    """Held elsewhere is part of a session's mark though its row does not change: the mark holds
    the leases in force."""
    store = PostgresLogStore(pg_url)
    try:
        await trio.to_thread.run_sync(_create, store, "held")
        async with open_read_side(".", store=pg_url) as side:
            pulse = CorpusPulse(side, interval=TICK)
            first = await pulse.fresh()
            handle = await trio.to_thread.run_sync(store.open_write, "held")
            try:
                taken = await pulse.fresh()
                assert taken.generation == first.generation + 1
                assert "held" in taken.changed  # beside its host's row, registered as it took it
                listed = pulse.listings
                assert await pulse.fresh() == taken
                assert pulse.listings == listed
            finally:
                await trio.to_thread.run_sync(store.close, handle)
            let_go = await pulse.fresh()
            assert let_go.generation == taken.generation + 1
            assert "held" in let_go.changed
    finally:
        store.close_store()


async def test_a_running_session_turns_stalled_without_a_listing(pg_url: str) -> None:
    """Stalled is a matter of time alone: a look that lists nothing still judges the running
    sessions against the clock, and one turning stalled passes a generation."""
    store = PostgresLogStore(pg_url)
    now = [T0]  # the pulse's wall clock, moved by hand
    try:
        await trio.to_thread.run_sync(_create, store, "quiet")
        await trio.to_thread.run_sync(_create, store, "idle")
        handle = await trio.to_thread.run_sync(store.open_write, "quiet")
        try:
            async with open_read_side(".", store=pg_url, stall_after=60) as side:
                pulse = CorpusPulse(side, interval=TICK, now_ms=lambda: now[0])
                first = await pulse.fresh()
                listed = pulse.listings
                now[0] = T0 + 59_000
                assert await pulse.fresh() == first
                now[0] = T0 + 61_000
                stalled = await pulse.fresh()
                assert (stalled.generation, stalled.changed) == (first.generation + 1, ("quiet",))
                assert pulse.listings == listed  # the held session judged again, nothing listed
        finally:
            await trio.to_thread.run_sync(store.close, handle)
    finally:
        store.close_store()
