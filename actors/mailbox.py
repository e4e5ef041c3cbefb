"""Bounded mailboxes with `trio.Event` reply slots, and what happens when an actor stops.

Callers hold a `Mailbox` (through a ref), never the actor. `ask` puts a request into a bounded
memory channel — a full mailbox makes the sender wait (backpressure) — and waits on the
request's reply slot: a `trio.Event` plus a value or an error, cheaper than a channel per ask.
When the actor stops, `close` refuses later asks and fails every request still queued, and the
actor fails the ones it had taken: nothing ever waits on a dead actor.

A requester cancelled while waiting gives up its answer, not its request: an append it sent may
still be written (and acknowledged to nobody).

`idle()` tells whether the actor waits for a request with nothing queued, handed over or being
served (its actor marks `parked`; sends and takes are counted), so a snapshot can be answered from
its state without asking (`snapshot_all`).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

import trio
from trio.lowlevel import Task, enable_ki_protection

from .errors import ActorStopped

__all__ = ["Mailbox", "Reply", "Request"]

T = TypeVar("T")


class Reply(Generic[T]):
    """A value or an error, set once, and the tasks waiting for it.

    Made per request, so it is kept small: a flag and the waiting task (rarely several) instead
    of a `trio.Event` and its set; a fan-out to a thousand actors makes a thousand of these.
    """

    __slots__ = ("_done", "_error", "_value", "_waiting")

    def __init__(self) -> None:
        self._done = False
        self._value: T | None = None
        self._error: BaseException | None = None
        self._waiting: Task | list[Task] | None = None

    @property
    def done(self) -> bool:
        return self._done

    @enable_ki_protection  # like trio.Event: a Ctrl-C must not strand a waiter
    def set(self, value: T) -> None:
        self._settle(value, None)

    @enable_ki_protection
    def fail(self, error: BaseException) -> None:
        self._settle(None, error)

    @enable_ki_protection
    def _settle(self, value: T | None, error: BaseException | None) -> None:
        """The first answer wins; it wakes every waiter."""
        if self._done:
            return
        self._value, self._error, self._done = value, error, True
        waiting, self._waiting = self._waiting, None
        if isinstance(waiting, list):
            for task in waiting:
                trio.lowlevel.reschedule(task)
        elif waiting is not None:
            trio.lowlevel.reschedule(waiting)

    @enable_ki_protection
    async def wait(self) -> T:
        if not self._done:
            task = trio.lowlevel.current_task()
            waiting = self._waiting
            if waiting is None:
                self._waiting = task
            elif isinstance(waiting, list):
                waiting.append(task)
            else:
                self._waiting = [waiting, task]

            def abort(_raise_cancel: object) -> trio.lowlevel.Abort:
                # A cancelled waiter gives up its answer, not the request (see the module note).
                current = self._waiting
                if current is task:
                    self._waiting = None
                elif isinstance(current, list) and task in current:
                    current.remove(task)
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        return self.result()

    def result(self) -> T:
        """The value (or raise the error) of a reply that is `done`."""
        if not self._done:
            raise RuntimeError("the reply is not ready")
        if self._error is not None:
            raise self._error
        return cast(T, self._value)  # set by `set` whenever there is no error


class Request(Reply[T]):
    """Base of every request: it is its own reply slot (one object per ask, not two)."""

    __slots__ = ()

    @property
    def reply(self) -> Reply[T]:
        return self


class Mailbox:
    def __init__(self, name: str, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a mailbox holds at least one request")
        self.name = name
        self._send, self.receive = trio.open_memory_channel[Request[Any]](capacity)
        self._stopped: str | None = None
        # Idle bookkeeping (`idle`): requests sent (counted before they are handed over, so a
        # request handed to the parked actor, which has not run yet, counts) and taken by the
        # actor, and whether the actor waits in `receive` with everything taken served.
        self.sent = 0
        self.taken = 0
        self.parked = False

    def idle(self) -> bool:
        """True when the actor waits for a request with nothing queued, nothing handed to it and
        nothing it took still being served: a request sent now would be served next, from the
        state the actor holds now (what `snapshot_all` answers from without asking)."""
        return self.parked and self.sent == self.taken and self._stopped is None

    @property
    def stopped(self) -> bool:
        return self._stopped is not None

    async def ask(self, request: Request[T]) -> T:
        if self._stopped is not None:
            raise ActorStopped(self.name, self._stopped)
        # Cancelled already: nothing is sent, as `send` would have it. With room, the request is
        # queued without the schedule point `send` takes (the wait for the reply is one): a
        # task switch fewer per append.
        await trio.lowlevel.checkpoint_if_cancelled()
        self.sent += 1
        try:
            self._send.send_nowait(request)
        except trio.WouldBlock:
            pass
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self.sent -= 1
            raise ActorStopped(self.name, self._stopped or "stopped") from None
        else:
            return await request.reply.wait()
        try:
            await self._send.send(request)
        except BaseException as exc:  # not sent (closed, or cancelled before it was queued): uncounted
            self.sent -= 1
            if isinstance(exc, (trio.ClosedResourceError, trio.BrokenResourceError)):
                raise ActorStopped(self.name, self._stopped or "stopped") from None
            raise
        return await request.reply.wait()

    def try_post(self, request: Request[T]) -> bool:
        """Queue a request if the mailbox has room, without a checkpoint; False when it is full
        (then `post` waits for room). Raises `ActorStopped` for a stopped actor."""
        if self._stopped is not None:
            raise ActorStopped(self.name, self._stopped)
        try:
            self._send.send_nowait(request)
        except trio.WouldBlock:
            return False
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ActorStopped(self.name, self._stopped or "stopped") from None
        self.sent += 1  # in the same synchronous stretch as the hand-over: the actor has not run
        return True

    async def post(self, request: Request[T]) -> None:
        """Queue a request without waiting for its reply (wait on `request.reply` later); waits
        only when the mailbox is full. Raises `ActorStopped` for a stopped actor."""
        if self._stopped is not None:
            raise ActorStopped(self.name, self._stopped)
        self.sent += 1
        try:
            self._send.send_nowait(request)
        except trio.WouldBlock:
            try:
                await self._send.send(request)
            except BaseException as exc:  # not sent (closed, or cancelled while full): uncounted
                self.sent -= 1
                if isinstance(exc, (trio.ClosedResourceError, trio.BrokenResourceError)):
                    raise ActorStopped(self.name, self._stopped or "stopped") from None
                raise
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self.sent -= 1
            raise ActorStopped(self.name, self._stopped or "stopped") from None

    def close(self, reason: str = "stopped") -> None:
        """Refuse later asks and fail every queued request. Idempotent; synchronous."""
        if self._stopped is None:
            self._stopped = reason
        self._send.close()
        while True:
            try:
                request = self.receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            request.reply.fail(ActorStopped(self.name, self._stopped))
        self.receive.close()  # a sender still blocked on a full mailbox gets ActorStopped
