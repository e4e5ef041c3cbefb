"""Basic compaction (SPEC 5.2): which older part of the surface to summarize.

Pure. The range starts after the leading system message(s), leaves the `keep_recent` newest
nodes alone, never includes a system message, and never splits a tool call from its result: the
first node after the range is never a tool result (its call would be inside the range).
The loop brackets the summary with `compaction/*` events and appends a replacing
`user/message`; the raw log keeps everything, and log-only events (a descriptor) are never on
the surface, so compaction cannot touch them.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .messages import SurfaceNode

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
    lo = 0
    while lo < len(nodes) and nodes[lo].type == "system/message":
        lo += 1
    hi = lo
    while hi < len(nodes) - keep_recent and nodes[hi].type != "system/message":
        hi += 1
    while hi > lo and hi < len(nodes) and nodes[hi].type == "tool/result":
        hi -= 1  # the range would end between a call and its result
    if hi - lo < 2:
        return None
    return CompactionPlan(tuple(nodes[lo:hi]))
