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
