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
