"""Basic compaction (docs/design.md, "The agent loop and models"): which older part of the
surface to summarize.

Pure. The range lies between system messages (the system messages themselves stay), leaves the
`keep_recent` newest nodes alone, and never splits a tool call from its result: the first node
after the range is never a tool result (its call would be inside the range). It is the oldest
such run of at least two nodes: a system prompt that changed mid-history (a new system message)
starts a new run, so the history after it can still be compacted once the run before it is
down to its summary.
The loop brackets the summary with `compaction/*` events and appends a replacing
`user/message`; the raw log keeps everything, and log-only events (a descriptor) are never on
the surface, so compaction cannot touch them.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ..models.messages import SurfaceNode

__all__ = ["CompactionPlan", "CompactionPolicy", "plan_compaction"]


@attrs.frozen(kw_only=True)
class CompactionPolicy:
    max_chars: int  # compact when the surface holds more than this many characters
    keep_recent: int = 4

    def __attrs_post_init__(self) -> None:
        if self.max_chars < 0 or self.keep_recent < 0:
            raise ValueError("compaction max_chars and keep_recent must be >= 0")


@attrs.frozen
class CompactionPlan:
    nodes: tuple[SurfaceNode, ...]

    @property
    def start_seq(self) -> int:
        return self.nodes[0].first_seq

    @property
    def end_seq(self) -> int:
        return self.nodes[-1].seq


def plan_compaction(nodes: Sequence[SurfaceNode], *, keep_recent: int) -> CompactionPlan | None:
    end = len(nodes) - keep_recent
    lo = 0
    while lo < end:
        while lo < end and nodes[lo].type == "system/message":
            lo += 1
        hi = lo
        while hi < end and nodes[hi].type != "system/message":
            hi += 1
        cut = hi
        while cut > lo and cut < len(nodes) and nodes[cut].type == "tool/result":
            cut -= 1  # the range would end between a call and its result
        if cut - lo >= 2:
            return CompactionPlan(tuple(nodes[lo:cut]))
        lo = hi  # too small to summarize: the run after the next system message
    return None
