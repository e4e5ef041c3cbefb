"""The `list_agents` text (the tool's answer, `subagents agents`, the chat's `/agents`), apart
from the tool itself: the read-only `agents` command renders it without loading the agent loop
or the tools (issue 20, start-up)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .listing import ChildRow

__all__ = ["render_agents"]


def render_agents(rows: Sequence[Any], descendants: bool, status: Callable[[str], str]) -> str:
    """The `list_agents` text: one line per continuable child or diagnostic."""
    lines = []
    for row in rows:
        at = f" parent={row.parent_id} depth={row.depth}" if descendants else ""
        if isinstance(row, ChildRow):
            if row.mode != "continuable":
                continue
            lines.append(f"{row.id} [{status(row.id)}]{at} — {row.label}")
        else:
            lines.append(f"{row.id} [diagnostic: {row.reason}]{at}")
    return "\n".join(lines) if lines else "(no subagents)"
