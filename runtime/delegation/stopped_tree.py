"""What the log says of a stopped tree (issue 27 item 5): whether a session is stopped, the
stopped descendants of one stopped with its tree, and the notice that names them — read through
the session query, for the parts that stop trees (stopping.py), settle children (settlement.py)
and claim them (placement.py), none of which needs the others for it."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from subagents.storage import SessionNotFound, SubagentsError, stop_marker, stopped

from ..query import SessionQuery
from .lineage import walk_descendants

log = logging.getLogger(__name__)

__all__ = ["is_stopped", "stopped_descendants", "tree_notice_tail", "tree_stop_detail", "tree_stop_reason"]


def tree_stop_detail(descendants: Sequence[str]) -> str | None:
    """What the notice of a child stopped with its tree adds: "with its descendants A, B, C" —
    each named once, in the order given (pre-order); None when none was stopped with it. A
    settlement keeps it as its `reason_message`, so a redelivered notice says it too."""
    names = list(dict.fromkeys(descendants))
    if not names:
        return None
    noun = "descendant" if len(names) == 1 else "descendants"
    return f"with its {noun} {', '.join(names)}"


def tree_notice_tail(descendants: Sequence[str]) -> str:
    """The tail of the notice of a child stopped with its tree: "was stopped before it finished,
    with its descendants A, B, C." (`tree_stop_detail`)."""
    detail = tree_stop_detail(descendants)
    return "was stopped before it finished." if detail is None else f"was stopped before it finished, {detail}."


async def is_stopped(query: SessionQuery, session_id: str) -> bool:
    """Whether the session's log says it is stopped (`stopped`; False for no such session): what
    a resume path asks before it resumes a session on its own — a serving host's claim
    (`Placement.adopt` with `settle_idle`: a stopped child with nothing in its inbox is let go
    unsettled, its settlement was recorded when it was stopped) and its sweep
    (`Placement.take_over`). A read of the log (live sessions included); storage errors are
    the caller's."""
    try:
        inherited, events = await query.read_from(session_id, 0)
    except SessionNotFound:
        return False
    return stopped(events, inherited)


async def stopped_descendants(query: SessionQuery, session_id: str) -> list[str] | None:
    """The stopped descendants of a session stopped with its tree, in pre-order (each once), or
    None when its marker in force is not a tree stop's: what the notice of its settlement names
    (`tree_notice_tail`) — for `Settlement`, which builds that notice and holds no `Stopping`."""
    try:
        inherited, events = await query.read_from(session_id, 0)
    except SessionNotFound:
        return None
    marker = stop_marker(events[inherited:])
    if marker is None or marker.get("tree") is not True:
        return None
    corpus = await query.list_sessions()
    below = [node.id for node, _parent, _depth in walk_descendants(corpus, session_id)]
    return [sid for sid in below if await is_stopped(query, sid)]


async def tree_stop_reason(query: SessionQuery, child_id: str) -> str | None:
    """The `reason_message` of the settlement of a child stopped with its tree
    (`tree_stop_detail` of its stopped descendants), or None. Never raises on a log it cannot
    read: the settlement goes on without it."""
    try:
        below = await stopped_descendants(query, child_id)
    except SubagentsError as exc:  # a storage or query failure: the notice names nobody, that is all
        log.warning("the stopped descendants of %s cannot be named: %s", child_id, exc)
        return None
    return None if below is None else tree_stop_detail(below)
