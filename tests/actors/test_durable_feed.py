"""The session store's durable feed (SPEC §8, the event stream's hook): every group commit's
events are published after their fsync — a fork's seed with its first append — in the same
synchronous stretch as the acks; a refused or failed append publishes nothing; a subscriber
that fails never takes the session down. On the in-memory file store and on PostgreSQL (the
`backend` fixture; issue 18).
"""

from __future__ import annotations

import pytest
import trio
from backends import Backend
from clocks import fixed_ms
from drafts import note, turn_start
from log_lines import header
from registries import subagent_registry as registry
from subagents.actors import SessionStore, open_session_store
from subagents.storage import Offset, SequenceConflict

BOUND = 10  # seconds; a safety net only
now_ms = fixed_ms()


def pushed(batches: list) -> list[tuple[str, int, list[int]]]:
    return [(b.session_id, b.inherited_event_count, [e.seq for e in b.events]) for b in batches]


async def test_group_commits_are_published_once_durable_seed_included(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        with trio.fail_after(BOUND), store.feed.subscribe() as sub:
            a = await store.create(header("a"))
            first = await a.append([turn_start(1), note()])
            # Answered means published: no checkpoint between the ack and the push.
            assert pushed(sub.take()[0]) == [("a", 0, [0, 1])]
            assert first.next_seq == a.durable_next == 2
            fork = await store.fork(a, Offset(2), header("f", is_seeded=True))
            assert sub.take() == ([], set())  # a fork is lazy: nothing durable yet
            await fork.append([note()])
            assert pushed(sub.take()[0]) == [("f", 2, [0, 1, 2, 3])]  # seed, marker, own event
            with pytest.raises(SequenceConflict):
                await a.append([note()], expected_seq=0)
            assert sub.take() == ([], set())


async def test_a_failing_subscriber_is_logged_and_the_session_carries_on(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        assert isinstance(store, SessionStore)

        def broken(session_id: str, inherited: int, events: object) -> None:
            raise RuntimeError("subscriber bug")

        with trio.fail_after(BOUND):
            store.feed.publish = broken  # type: ignore[method-assign]  # a subscriber that raises, on purpose
            a = await store.create(header("a"))
            assert (await a.append([note()])).next_seq == 1
            assert (await a.append([note()])).next_seq == 2
    assert "a durable-event subscriber failed" in caplog.text


async def test_an_observer_sees_each_batch_by_the_time_the_append_is_answered(backend: Backend) -> None:
    async with open_session_store(backend.store, registry(), now_ms=now_ms) as store:
        seen: list = []
        store.feed.add_observer(seen.append)
        with trio.fail_after(BOUND):
            a = await store.create(header("a"))
            await a.append([turn_start(1), note()])
            assert pushed(seen) == [("a", 0, [0, 1])]  # no buffer, no take: called in the stretch
            store.feed.remove_observer(seen.append)
            await a.append([note()])
        assert pushed(seen) == [("a", 0, [0, 1])]
        with pytest.raises(ValueError):
            store.feed.remove_observer(seen.append)
