"""Children whose turns a dead process cut are taken up again when their parent is (issue 27
item 1; README "When a process dies").

Theory of operation. A `run` killed while its background children worked leaves each child's
log with an open turn. Nothing else would resume them on a host that does not serve: the
parent's resume (`run --session`, `subagents resume`, `chat --session`, a message to it) looks
at the continuable children its own catalog names and resumes, here, each one whose last turn is
open — the child's resume continues that turn (or closes it, as the child's policy says) and
the child runs as a resident Activation until it settles, so the parent's wait for its tree
waits for it and its notice reaches the parent. A child another process holds, one stopped for
good, one that cannot be read or has no room in its family is left as it is (logged). Where
hosts serve, their sweeps take such children over instead (their leases were never released).
Only with the runtime's policy `continue`: under `close` nothing is resumed by itself, as
before.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs
import msgspec
from subagents.actors import ContinuationManager
from subagents.storage import (
    AlreadyOwned,
    Event,
    InvalidPayload,
    StorageError,
    SubagentCatalogData,
    plan_continuation,
    stopped,
)

from ..agent.loop import Agent
from ..agent.registry import AgentRegistry
from ..foundation.errors import AgentError, SubagentError
from ..query import SessionQuery
from .placement import Placement
from .residency import Residency

__all__ = ["Revival", "catalogued_continuable"]

log = logging.getLogger(__name__)

_catalog = msgspec.json.Decoder(SubagentCatalogData)


def catalogued_continuable(events: Sequence[Event], inherited_event_count: int) -> dict[str, str | None]:
    """The continuable children the session's own `subagent/catalog` events name, in catalog
    order, with their labels (a fork's inherited catalog names its parent's children: left out)."""
    children: dict[str, str | None] = {}
    for event in events[inherited_event_count:]:
        if event.type != "subagent/catalog":
            continue
        data = _catalog.decode(event.data)  # checked by every read of the log
        if data.mode == "continuable":
            children[data.child_id] = data.label if isinstance(data.label, str) else None
    return children


@attrs.define(eq=False)
class Revival:
    """Resumes, under a resumed parent, the children whose turns a dead process cut."""

    agents: AgentRegistry
    manager: ContinuationManager
    query: SessionQuery
    residency: Residency
    placement: Placement

    async def resume_cut_children(self, parent: Agent, events: list[Event]) -> list[str]:
        """Resume here each catalogued continuable child of `parent` whose last turn is open;
        the ids resumed."""
        if self.agents.config.on_interrupted_turn != "continue":
            return []
        children = catalogued_continuable(events, parent.session.inherited_event_count)
        if not children or await self.placement.serving_hosts_up():
            return []
        resumed: list[str] = []
        for child_id, label in children.items():
            if self.manager.get(child_id) is not None or self.agents.get(child_id) is not None:
                continue  # resident or live here already
            if await self._cut(child_id) and await self._resume(parent, child_id, label):
                resumed.append(child_id)
        return resumed

    async def _cut(self, child_id: str) -> bool:
        """Whether the child's log ends with an open turn and it is not stopped for good."""
        try:
            inherited, events = await self.query.read_from(child_id, 0)
            return not stopped(events, inherited) and plan_continuation(events, session_id=child_id) is not None
        except (StorageError, InvalidPayload) as exc:
            log.info("subagent %s is not taken up again: %s", child_id, exc)
            return False

    async def _resume(self, parent: Agent, child_id: str, label: str | None) -> bool:
        try:
            activation = self.residency.admit(child_id, parent.session_id)
        except SubagentError as exc:  # no room in its family, or the family is closing
            log.info("subagent %s is not taken up again: %s", child_id, exc)
            return False
        try:
            child = await self.agents.resume(child_id, label=label)
        except (AlreadyOwned, StorageError, AgentError) as exc:
            log.info("subagent %s is not taken up again: %s", child_id, exc)
            self.manager.forget(activation)
            return False
        except BaseException:
            self.manager.forget(activation)
            raise
        self.residency.run(activation, child)
        log.info("subagent %s: its cut turn is taken up again under %s", child_id, parent.session_id)
        return True
