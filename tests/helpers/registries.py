"""The projection registry the runtime folds sessions with, for tests below the runtime."""

from __future__ import annotations

from typing import Any

from subagents.runtime import SUBAGENT_UNITS
from subagents.storage import ProjectionRegistry


def subagent_registry(*extra: Any) -> ProjectionRegistry:
    """The subagent units (identity, timing, ...), then `extra` units of the test's own."""
    return ProjectionRegistry([*SUBAGENT_UNITS, *extra])


class HostileView:
    """A unit that folds fine (it counts events) but whose view always raises: a bug in
    someone else's unit, which must break only a read that names it."""

    key = "hostile_view"
    state_version = 1

    def initial(self, header: Any, inherited_event_count: int) -> int:
        return 0

    def apply(self, state: int, event: Any) -> int:
        return state + 1

    def view(self, state: int) -> Any:
        raise RuntimeError("hostile view")
