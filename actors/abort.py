"""`Abort`: a small cancellation token for listing, observation and delivery
(docs/design.md, "Cancellation").

A value wrapping a `trio.Event`, handed down explicitly: whoever holds it can `set()` it, and
work that takes it checks `is_set()` at its checkpoints or `wait()`s on it in a watcher task.
It is not a cancel scope: it asks, it does not interrupt. A call that takes one turns it into
cancellation once, at its edge (`cancelled_when`): below the edge, work is cancelled the Trio
way, and the edge tells an abort from an enclosing cancellation by `is_set()`. (It lives in
`actors` because the cold reader needs it.)
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import TypeGuard

import trio

from .groups import raise_bare_cancelled

__all__ = ["Abort", "cancelled_when"]


class Abort:
    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()

    def __repr__(self) -> str:
        return f"Abort(set={self.is_set()})"


@asynccontextmanager
async def cancelled_when(abort: Abort | None) -> AsyncGenerator[None]:
    """The one place an `Abort` becomes cancellation: the body runs in a cancel scope that one
    watcher task cancels when `abort` is set (at once, if it already is). A body cancelled so
    ends quietly — the caller then sees `abort.is_set()` and answers as its API says; anything
    the body raises (an enclosing `trio.Cancelled` included) passes bare, never in a group.
    Without an abort the body just runs."""
    if abort is None:
        yield
        return
    try:
        async with trio.open_nursery() as nursery:
            if abort.is_set():
                nursery.cancel_scope.cancel()
            else:
                nursery.start_soon(_cancel_when_set, abort, nursery.cancel_scope)
            yield
            nursery.cancel_scope.cancel()  # the body is done: stop the watcher
    except BaseExceptionGroup as group:  # unwrapped: a cancellation passes bare, the body's error as itself
        _, rest = group.split(trio.Cancelled)
        if rest is None:
            raise_bare_cancelled(group)  # an enclosing cancellation (the watcher's too)
        leaf: BaseException = rest
        while _is_group(leaf) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]
        if _is_group(leaf):
            raise  # several failures at once: nothing to pick from
        raise leaf from None  # the body's own error (the watcher never fails)


async def _cancel_when_set(abort: Abort, scope: trio.CancelScope) -> None:
    await abort.wait()
    scope.cancel()


def _is_group(exc: BaseException) -> TypeGuard[BaseExceptionGroup[BaseException]]:
    """An exception group (to the type checker, one of exceptions: `isinstance` alone leaves its
    leaves' type unknown)."""
    return isinstance(exc, BaseExceptionGroup)
