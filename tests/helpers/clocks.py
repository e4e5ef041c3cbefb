"""Test clocks: one fixed epoch, and millisecond clocks that stand still or tick once a call."""

from __future__ import annotations

import itertools
from collections.abc import Callable

T = 1_789_000_000_000  # a fixed epoch (ms): 2026-09-09, far from any real clock's edge cases


def ticking_ms(start: int = T) -> Callable[[], int]:
    """A `now_ms` that returns `start`, `start + 1`, ... one tick per call (distinct, growing)."""
    return itertools.count(start).__next__


def fixed_ms(at: int = T) -> Callable[[], int]:
    """A `now_ms` that always returns `at`."""
    return lambda: at


async def until_virtual(holds: Callable[[], bool]) -> None:
    """Until `holds()`: looked at again every virtual 50 ms (under `autojump_clock`, for what
    changes in a fake file system or in worker threads and signals nothing a test could wait on;
    the virtual 600 s limit is the hang guard)."""
    import trio

    with trio.fail_after(600):
        while not holds():
            with trio.move_on_after(0.05):
                await trio.sleep_forever()
