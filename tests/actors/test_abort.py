"""`cancelled_when`: the one place an `Abort` becomes cancellation."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from subagents.actors import Abort, cancelled_when


async def test_a_set_abort_cancels_the_body_quietly() -> None:
    abort = Abort()
    reached: list[str] = []

    async def later() -> None:
        await trio.testing.wait_all_tasks_blocked()
        abort.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        async with cancelled_when(abort):
            reached.append("in")
            await trio.sleep_forever()
        reached.append("after")
    assert reached == ["in", "after"] and abort.is_set()


async def test_an_abort_set_before_cancels_at_the_first_checkpoint() -> None:
    abort = Abort()
    abort.set()
    reached: list[str] = []
    async with cancelled_when(abort):
        reached.append("in")
        await trio.lowlevel.checkpoint()
        reached.append("not here")
    assert reached == ["in"]


async def test_the_bodys_error_passes_bare() -> None:
    with pytest.raises(KeyError):
        async with cancelled_when(Abort()):
            raise KeyError("x")


async def test_an_enclosing_cancellation_passes_bare() -> None:
    with trio.CancelScope() as scope:
        try:
            async with cancelled_when(Abort()):
                scope.cancel()
                await trio.sleep_forever()
        except BaseException as exc:  # caught only to assert its type, then re-raised
            assert type(exc) is trio.Cancelled  # never a group
            raise
    assert scope.cancelled_caught


async def test_without_an_abort_the_body_just_runs() -> None:
    async with cancelled_when(None):
        await trio.lowlevel.checkpoint()
