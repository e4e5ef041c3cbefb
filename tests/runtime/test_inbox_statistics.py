"""The inbox's published state (issue 26 item 4): frozen counts an observer reads, with the
change notification it waits on — what the scripted model's `wait_for: steered` is derived from
instead of a hook in the agent loop."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from subagents.runtime.agent.inbox import Delivery, Inbox, InboxStatistics


def _delivery(text: str) -> Delivery:
    return Delivery(content=[{"type": "text", "text": text}])


def test_the_counts_follow_deliveries_and_the_turn_claim() -> None:
    inbox = Inbox()
    assert inbox.statistics() == InboxStatistics(received=0, received_in_turn=0, queued=0)
    inbox.put_nowait(_delivery("a"), "follow-up")
    inbox.put_nowait(_delivery("b"), "inject")
    assert inbox.statistics() == InboxStatistics(received=2, received_in_turn=2, queued=2)
    inbox.claim_turn()  # a turn starts: what came before it is not "in the turn"
    assert inbox.statistics() == InboxStatistics(received=2, received_in_turn=0, queued=0)
    inbox.put_nowait(_delivery("steer"), "steer")
    assert inbox.statistics() == InboxStatistics(received=3, received_in_turn=1, queued=1)
    inbox.claim_step()  # claimed within the turn: still received in it
    assert inbox.statistics() == InboxStatistics(received=3, received_in_turn=1, queued=0)


async def test_a_waiter_on_the_counts_wakes_on_a_delivery(autojump_clock: Any) -> None:
    inbox = Inbox()
    inbox.claim_turn()
    woke: list[int] = []

    async def steered() -> None:
        while inbox.statistics().received_in_turn == 0:
            await inbox.wait_changed()
        woke.append(inbox.statistics().received)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(steered)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == []
        inbox.put_nowait(_delivery("steer"), "steer")
    assert woke == [1]
