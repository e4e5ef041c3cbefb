"""The projection registry the runtime folds sessions with, for tests below the runtime."""

from __future__ import annotations

from typing import Any

from subagents.runtime.subagents.units import SUBAGENT_UNITS
from subagents.storage.projection import ProjectionRegistry


def subagent_registry(*extra: Any) -> ProjectionRegistry:
    """The subagent units (identity, timing, ...), then `extra` units of the test's own."""
    return ProjectionRegistry([*SUBAGENT_UNITS, *extra])
