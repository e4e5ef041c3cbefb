"""The reply slot every ask waits on (actors/mailbox.py): set once, any number of waiters,
cancelled waiters forgotten, errors raised to every waiter."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from subagents.actors import ActorStopped
from subagents.actors.mailbox import Mailbox, Reply, Request


async def test_every_waiter_gets_the_one_value() -> None:
    reply: Reply[int] = Reply()
    got: list[int] = []
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(lambda: _append(got, reply))
        await trio.testing.wait_all_tasks_blocked()
        assert not reply.done
        reply.set(1)
        reply.set(2)  # set once: later values and errors are ignored
        reply.fail(RuntimeError("late"))
    assert got == [1, 1, 1]
    assert reply.result() == 1 and await reply.wait() == 1


async def _append(got: list[int], reply: Reply[int]) -> None:
    got.append(await reply.wait())


async def test_an_error_is_raised_to_every_waiter() -> None:
    reply: Reply[int] = Reply()
    errors: list[BaseException] = []

    async def wait() -> None:
        try:
            await reply.wait()
        except ValueError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        reply.fail(ValueError("no"))
    assert [str(e) for e in errors] == ["no", "no"]
    with pytest.raises(ValueError):
        reply.result()


@pytest.mark.parametrize("waiters", [1, 2, 3])
async def test_a_cancelled_waiter_is_forgotten_and_the_others_still_woken(waiters: int) -> None:
    reply: Reply[str] = Reply()
    got: list[str] = []
    async with trio.open_nursery() as nursery:
        cancelled = trio.CancelScope()

        async def doomed() -> None:
            with cancelled:
                await reply.wait()
            got.append("cancelled")

        nursery.start_soon(doomed)
        for _ in range(waiters - 1):
            nursery.start_soon(lambda: _append(got, reply))  # type: ignore[arg-type]  # a str reply
        await trio.testing.wait_all_tasks_blocked()
        cancelled.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert got == ["cancelled"]
        reply.set("value")  # must not reschedule the cancelled task (trio would raise)
    assert got == ["cancelled"] + ["value"] * (waiters - 1)


async def test_a_done_reply_answers_without_blocking_and_an_unready_one_refuses_result() -> None:
    reply: Reply[int] = Reply()
    with pytest.raises(RuntimeError, match="not ready"):
        reply.result()
    reply.set(7)
    with trio.CancelScope() as scope:
        scope.cancel()
        assert await reply.wait() == 7  # no checkpoint: a cancelled caller still gets a done value


async def test_a_request_is_its_own_reply_and_try_post_never_blocks() -> None:
    mailbox = Mailbox("m", 1)
    first: Request[int] = Request()
    assert first.reply is first
    assert mailbox.try_post(first)
    assert not mailbox.try_post(Request())  # full: False, nothing queued
    assert mailbox.receive.receive_nowait() is first
    mailbox.close("gone")
    with pytest.raises(ActorStopped):
        mailbox.try_post(Request())


class _Steps(trio.abc.Instrument):
    """Counts the steps (resumptions) of the tasks named `asker`."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name == "asker":
            self.steps += 1


async def test_an_ask_with_room_is_queued_at_once_and_resumes_only_for_its_reply() -> None:
    # Issue 28 item 3: an append's ask costs its task one step to send and wait, and one more
    # when its reply is set: no schedule point of its own between queueing and waiting.
    mailbox = Mailbox("m", 4)
    request: Request[int] = Request()
    got: list[int] = []
    steps = _Steps()

    async def asker() -> None:
        got.append(await mailbox.ask(request))

    trio.lowlevel.add_instrument(steps)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(asker, name="asker")
            await trio.testing.wait_all_tasks_blocked()
            assert steps.steps == 1  # queued and parked on the reply in its first step
            assert mailbox.receive.receive_nowait() is request
            assert mailbox.sent == 1
            request.reply.set(5)
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert got == [5] and steps.steps == 2


async def test_an_ask_cancelled_before_it_starts_sends_nothing() -> None:
    mailbox = Mailbox("m", 4)
    with trio.CancelScope() as scope:
        scope.cancel()
        await mailbox.ask(Request())
    assert scope.cancelled_caught
    assert mailbox.sent == 0
    with pytest.raises(trio.WouldBlock):
        mailbox.receive.receive_nowait()


async def test_an_ask_to_a_full_mailbox_waits_for_room_then_for_its_reply() -> None:
    mailbox = Mailbox("m", 1)
    assert mailbox.try_post(Request())
    request: Request[int] = Request()
    got: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _append(got, request.reply), name="waiter")
        nursery.start_soon(lambda: mailbox.ask(request))
        await trio.testing.wait_all_tasks_blocked()
        assert mailbox.sent == 2
        mailbox.receive.receive_nowait()  # room: the blocked ask is handed over
        assert mailbox.receive.receive_nowait() is request
        request.reply.set(3)
    assert got == [3]
