"""Where the tree feed starts following each session (issue 31): at the end its listing
record knows, so opening a tree page's feed reads no descendant's history.

The runtime's event stream finds a tree's existing children by reading the root's history and
then reads each child's log to its end before following it. The tree page was listed just
before (the listing service's rows and the query's corpus records, each with its log's size and
event count), so the feed hands the stream those ends (`open_event_stream(known=...)`): every
session is followed from the bytes past its end on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...delegation.listing import ChildRow
from ...foundation.errors import SubagentError

if TYPE_CHECKING:
    from subagents.storage import LogInfo

    from ...log_follow import Mark
    from ...read_side import ReadSide

__all__ = ["tree_ends"]


async def tree_ends(side: ReadSide, root_id: str, root: LogInfo) -> dict[str, Mark] | None:
    """The end of `root_id`'s log (its stat, `root`) and of each descendant the listing places
    below it; None when the tree cannot be listed now (the stream then reads the root's history
    to find its children, as before)."""
    try:
        rows = await side.listing.list_descendants(root_id)
    except SubagentError:
        return None
    ends: dict[str, Mark] = {root_id: (int(root.revision.size), int(root.event_count))}
    for row in rows:
        record = side.query.recorded(row.id) if isinstance(row, ChildRow) else None
        if record is None or record.revision is None or record.event_count is None or record.damage is not None:
            continue  # a diagnostic row or a live-only record: not followed (its catalog entry is history)
        ends[row.id] = (int(record.revision.size), int(record.event_count))
    return ends
