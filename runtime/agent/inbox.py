"""The agent inbox (docs/design.md, "The agent loop and models"): follow-ups for the next turn,
steering and injections for the next step.

- *follow-up*: queued for a later turn (one per turn, FIFO); wakes an idle agent.
- *steer*: joins the next step of the running turn, or starts a turn when idle; wakes.
- *inject*: joins the next step, whenever that is; does not wake.

Bounded (default 64 queued deliveries): a sender waits for room under its `Abort`, and an abort
set before the delivery is accepted raises `DeliveryCancelled` with nothing delivered.

Published state: `statistics()` (counts, frozen) and `wait_changed()` (a wake on every delivery
or claim) let an observer pace itself on the inbox without reaching into it. A steer accepted
while the model call is held is recorded only at the next step, so "a message arrived in this
turn" can be known here before any log has it (the scripted model's `wait_for: steered`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs
import trio
from subagents.actors import Abort
from trio_util import RepeatedEvent, wait_any

__all__ = ["Delivery", "DeliveryCancelled", "Inbox", "InboxStatistics", "Mode", "Trigger"]

Mode = Literal["follow-up", "steer", "inject"]
Trigger = Literal["message", "notice", "resume"]


class DeliveryCancelled(Exception):
    """The sender's abort was set before the inbox accepted the delivery."""

    def __init__(self) -> None:
        super().__init__("message delivery was cancelled")


@attrs.frozen(kw_only=True)
class Delivery:
    """One incoming message: written as a `user/message` when a step claims it."""

    content: Sequence[Mapping[str, Any]]
    source: Mapping[str, Any] = attrs.field(factory=lambda: {"kind": "user"})
    source_event_seqs: Sequence[int] | None = None
    trigger: Trigger = "message"
    # A mailbox delivery's id: its `user/message` records it, so the owner acks it once durable
    # and drops a redelivery (SPEC §9).
    delivery_id: str | None = None


@attrs.frozen(kw_only=True)
class InboxStatistics:
    """Where an inbox stands: deliveries accepted since it was made (`received`) and since the
    current (or last) turn claimed its input (`received_in_turn`), and those queued now."""

    received: int
    received_in_turn: int
    queued: int


class Inbox:
    def __init__(self, capacity: int = 64) -> None:
        if capacity < 1:
            raise ValueError("inbox capacity must be at least 1")
        self.capacity = capacity
        self._next_turn: deque[Delivery] = deque()
        self._next_step: deque[tuple[Delivery, bool]] = deque()  # (delivery, wakes)
        self._changed = RepeatedEvent()  # anything arrived or was claimed
        self._changes = 0  # counts the sets of `_changed` (a waiter started later sees it moved)
        self.received = 0  # deliveries accepted so far
        self._turn_mark = 0  # `received` when the last turn claimed its input
        self.parked = False  # after an interrupt: what is queued waits for a later waking delivery

    def __len__(self) -> int:
        return len(self._next_turn) + len(self._next_step)

    def wakes(self) -> bool:
        """Is there input that should start (or continue) a turn?"""
        return not self.parked and (bool(self._next_turn) or any(w for _d, w in self._next_step))

    def steered(self) -> bool:
        """Did steering arrive for the next step?"""
        return not self.parked and any(w for _d, w in self._next_step)

    def park(self) -> None:
        """Keep what is queued from waking the agent until a later waking delivery (an
        interrupt stops only the current turn; queued messages stay parked)."""
        self.parked = True

    async def wait_changed(self) -> None:
        """Until the next delivery or claim (callers test the inbox again, then wait on)."""
        await self._changed.wait()

    def statistics(self) -> InboxStatistics:
        return InboxStatistics(
            received=self.received, received_in_turn=self.received - self._turn_mark, queued=len(self)
        )

    async def put(self, delivery: Delivery, mode: Mode, abort: Abort | None = None) -> None:
        while len(self) >= self.capacity:
            await self._wait_changed(abort)
        if abort is not None and abort.is_set():
            raise DeliveryCancelled()
        self.put_nowait(delivery, mode, force=True)

    def put_nowait(self, delivery: Delivery, mode: Mode, *, force: bool = False) -> None:
        """Accept at once; over capacity only with `force` (durable notices are never dropped)."""
        if not force and len(self) >= self.capacity:
            raise trio.WouldBlock
        if mode == "follow-up":
            self._next_turn.append(delivery)
            self.parked = False
        elif mode == "steer":
            self._next_step.append((delivery, True))
            self.parked = False
        elif mode == "inject":
            self._next_step.append((delivery, False))
        else:
            raise ValueError(f"unknown inbox mode {mode!r}")
        self.received += 1
        self._signal()

    def claim_step(self) -> list[Delivery]:
        """Everything queued for the next step."""
        claimed = [d for d, _w in self._next_step]
        self._next_step.clear()
        if claimed:
            self._signal()
        return claimed

    def claim_turn(self) -> list[Delivery]:
        """The first step of a new turn: the next-step input plus one queued follow-up."""
        self._turn_mark = self.received
        claimed = self.claim_step()
        if self._next_turn:
            claimed.append(self._next_turn.popleft())
            self._signal()
        return claimed

    async def wait_wake(self) -> None:
        while not self.wakes():
            await self._changed.wait()

    async def wait_received(self, count: int) -> None:
        """Return once more than `count` deliveries have been accepted."""
        while self.received <= count:
            await self._changed.wait()

    def _signal(self) -> None:
        self._changes += 1
        self._changed.set()

    async def _wait_changed(self, abort: Abort | None) -> None:
        if abort is None:
            await self._changed.wait()
            return
        if abort.is_set():
            raise DeliveryCancelled()
        seen = self._changes

        async def changed() -> None:
            # wait_any starts this a checkpoint later: a change made meanwhile must not be missed.
            while self._changes == seen:
                await self._changed.wait()

        await wait_any(abort.wait, changed)
        if abort.is_set():
            raise DeliveryCancelled()
