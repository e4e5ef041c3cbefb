"""Clocks: where event times, `created_at` and every runtime delay come from
(docs/design.md, "Determinism for tests and demos").

A clock gives `now_ms()` (epoch milliseconds) and `async sleep(seconds)`. `RealClock` reads the
wall clock and sleeps with Trio; `ScenarioClock` is virtual and deterministic — its k-th reading
is `start + k·step_ms` plus whatever was slept so far, and `sleep` only yields once — so
scenario goldens and backoff tests never wait for real.

`observe(ms)` tells a clock about a time already in a log (the registry calls it with the newest
event time of every session it resumes), so that what is written next is never older than what
was written before — across a restart too, when a new process's `ScenarioClock` starts again
at its `start`, or the wall clock has stepped back.
"""

from __future__ import annotations

import time
from typing import Protocol

import trio

__all__ = ["Clock", "RealClock", "ScenarioClock"]

_AHEAD_MS = 24 * 3600 * 1000


class Clock(Protocol):
    def now_ms(self) -> int: ...

    async def sleep(self, seconds: float) -> None: ...

    def observe(self, ms: int) -> None: ...


class RealClock:
    """Wall-clock milliseconds, strictly increasing so that events created in one process keep
    their order even when two land in the same millisecond or the wall clock steps back."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last = 0

    def now_ms(self) -> int:
        self._last = max(self._last + 1, time.time_ns() // 1_000_000)
        return self._last

    def observe(self, ms: int) -> None:
        # A log from a machine whose clock ran far ahead must not drag every session of this
        # process into its future: only a day ahead of the wall clock is taken.
        if ms <= time.time_ns() // 1_000_000 + _AHEAD_MS:
            self._last = max(self._last, ms)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(max(0.0, seconds))


class ScenarioClock:
    __slots__ = ("_calls", "_floor", "_slept_ms", "start", "step_ms")

    def __init__(self, start: int = 1_789_000_000_000, step_ms: int = 1) -> None:
        if start < 0 or step_ms < 0:
            raise ValueError("ScenarioClock needs start >= 0 and step_ms >= 0")
        self.start = start
        self.step_ms = step_ms
        self._calls = 0
        self._slept_ms = 0
        self._floor = 0  # added by `observe`: readings stay after every time observed

    def now_ms(self) -> int:
        value = self.start + self._calls * self.step_ms + self._slept_ms + self._floor
        self._calls += 1
        return value

    def observe(self, ms: int) -> None:
        """The next reading is at least `ms + 1` (deterministic: it depends only on `ms`)."""
        nxt = self.start + self._calls * self.step_ms + self._slept_ms + self._floor
        if nxt <= ms:
            self._floor += ms + 1 - nxt

    @property
    def slept_ms(self) -> int:
        """Virtual time spent in `sleep` so far (tests check backoff with it)."""
        return self._slept_ms

    async def sleep(self, seconds: float) -> None:
        self._slept_ms += max(0, round(seconds * 1000))
        await trio.lowlevel.checkpoint()
