"""Clocks: where event times, `created_at` and every runtime delay come from (SPEC 5.2).

A clock gives `now_ms()` (epoch milliseconds) and `async sleep(seconds)`. `RealClock` reads the
wall clock and sleeps with Trio; `ScenarioClock` is virtual and deterministic — its k-th reading
is `start + k·step_ms` plus whatever was slept so far, and `sleep` only yields once — so
scenario goldens and backoff tests never wait for real.
"""

from __future__ import annotations

import time
from typing import Protocol

import trio

__all__ = ["Clock", "RealClock", "ScenarioClock"]


class Clock(Protocol):
    def now_ms(self) -> int: ...

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    """Wall-clock milliseconds, strictly increasing so that events created in one process keep
    their order even when two land in the same millisecond or the wall clock steps back."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last = 0

    def now_ms(self) -> int:
        self._last = max(self._last + 1, time.time_ns() // 1_000_000)
        return self._last

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(max(0.0, seconds))


class ScenarioClock:
    __slots__ = ("_calls", "_slept_ms", "start", "step_ms")

    def __init__(self, start: int = 1_789_000_000_000, step_ms: int = 1) -> None:
        if start < 0 or step_ms < 0:
            raise ValueError("ScenarioClock needs start >= 0 and step_ms >= 0")
        self.start = start
        self.step_ms = step_ms
        self._calls = 0
        self._slept_ms = 0

    def now_ms(self) -> int:
        value = self.start + self._calls * self.step_ms + self._slept_ms
        self._calls += 1
        return value

    @property
    def slept_ms(self) -> int:
        """Virtual time spent in `sleep` so far (tests check backoff with it)."""
        return self._slept_ms

    async def sleep(self, seconds: float) -> None:
        self._slept_ms += max(0, round(seconds * 1000))
        await trio.lowlevel.checkpoint()
