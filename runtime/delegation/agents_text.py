"""The `list_agents` text (the tool's answer, `subagents agents`, the chat's `/agents`), apart
from the tool itself: the read-only `agents` command renders it without loading the agent loop
or the tools (issue 20, start-up)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .listing import ChildRow

__all__ = ["render_agents", "state_word"]


def state_word(row: ChildRow, status: str) -> str:
    """The one word every human-facing listing gives a child (list_agents, `agents`, the
    `children` table, the chat's tree): `status` is what its runner says — running, idle
    (resident here between turns) or ready (nobody holds it) — refined by the log and the
    listing's liveness (issue 29): a running child whose open turn made no durable progress
    for `stall_after` is `stalled`; one nobody runs whose last turn has no end (its runner
    died mid-turn) is `orphaned`, never `running` nor `ready`, unless it is stopped; a stopped
    child that does not run is `stopped`, a one-shot child nobody runs is `done` (it cannot be messaged), a
    continuable one `ready`."""
    if status == "running":
        return "stalled" if row.liveness == "stalled" else status
    if row.stopped and status in ("ready", "idle"):
        return "stopped"  # (over `orphaned`: a stopped tree stays stopped, whatever its turn)
    if row.liveness == "orphaned" and status == "ready":
        return "orphaned"
    if row.mode != "continuable" and status == "ready":
        return "done"
    return status


def render_agents(rows: Sequence[Any], descendants: bool, status: Callable[[str], str]) -> str:
    """The `list_agents` text: one line per continuable child or diagnostic. A stopped child
    that does not run is `stopped` (not ready or idle: nothing resumes it but a new message),
    and a child whose last turn holds results in doubt says how many (issue 27)."""
    lines = []
    for row in rows:
        at = f" parent={row.parent_id} depth={row.depth}" if descendants else ""
        if isinstance(row, ChildRow):
            if row.mode != "continuable":
                continue
            state = state_word(row, status(row.id))
            doubt = f" ({row.in_doubt} in doubt)" if row.in_doubt > 0 else ""
            lines.append(f"{row.id} [{state}]{at} — {row.label}{doubt}")
        else:
            lines.append(f"{row.id} [diagnostic: {row.reason}]{at}")
    return "\n".join(lines) if lines else "(no subagents)"
