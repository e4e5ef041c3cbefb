"""`Abort`: a small cancellation token for listing, observation and delivery
(docs/design.md, "Cancellation").

A value wrapping a `trio.Event`, handed down explicitly: whoever holds it can `set()` it, and
work that takes it checks `is_set()` at its checkpoints or `wait()`s on it in a watcher task.
It is not a cancel scope: it asks, it does not interrupt. (It lives in `actors` because the cold
reader needs it.)
"""

from __future__ import annotations

import trio

__all__ = ["Abort"]


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
