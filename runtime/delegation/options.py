"""What a caller may choose for one child beyond its prompt: the descriptor's extras
(docs/format.md, "The subagent descriptor").

A continuable child records them in its descriptor and gets them back on every cold resume: the
model route (`agent_provider`, `agent_model`, `agent_reasoning_effort`, built by the runtime's
`child_model` factory), a `persona` that shadows the deployment's system prompt, and a
`tool_filter` over the tools every agent gets, and a `budget` (runtime/foundation/budgets.py). A one-shot
child may use them too; they are not recorded (a one-shot child is never resumed).

`budget` is what the caller asks for; the service lowers it to the parent's remainder before the
child is made (`with_budget`), and that effective, absolute budget is what is recorded and applied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from ..foundation.budgets import Budget
from .descriptor import SubagentDescriptor, ToolFilter
from .descriptor import _check_filter as _optional_filter  # the descriptor's own field rules
from .descriptor import _check_optional_str as _optional_str

if TYPE_CHECKING:
    # Annotations only: reading a child's options (an agent type, `subagents config`) loads no
    # agent loop; `filtered_tools` imports the tool set when an agent is built.
    from ..agent.loop import AgentConfig
    from ..models.base import AnyModel
    from ..tools.base import ToolSet

__all__ = ["ChildModel", "ChildOptions", "filtered_tools"]


@attrs.frozen(kw_only=True)
class ChildOptions:
    agent_provider: str | None = attrs.field(default=None, validator=_optional_str)
    agent_model: str | None = attrs.field(default=None, validator=_optional_str)
    agent_reasoning_effort: str | None = attrs.field(default=None, validator=_optional_str)
    persona: str | None = attrs.field(default=None, validator=_optional_str)
    tool_filter: ToolFilter | None = attrs.field(default=None, validator=_optional_filter)
    budget: Budget | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(Budget))
    )
    # What resuming it does with a turn a crash left open (None: the runtime's policy).
    on_interrupted_turn: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(("continue", "close")))
    )
    # The agent type that chose these options: written as the child's header `agent_preset` at
    # its creation (what a listing shows), never in its descriptor.
    agent_type: str | None = attrs.field(default=None, validator=_optional_str)

    @property
    def selects_model(self) -> bool:
        return (self.agent_provider, self.agent_model, self.agent_reasoning_effort) != (None, None, None)

    @classmethod
    def of(cls, descriptor: SubagentDescriptor) -> ChildOptions:
        return cls(
            agent_provider=descriptor.agent_provider,
            agent_model=descriptor.agent_model,
            agent_reasoning_effort=descriptor.agent_reasoning_effort,
            persona=descriptor.persona,
            tool_filter=descriptor.tool_filter,
            budget=descriptor.budget,
            on_interrupted_turn=descriptor.on_interrupted_turn,
        )

    def with_budget(self, budget: Budget | None) -> ChildOptions:
        return attrs.evolve(self, budget=budget)

    def config(self, base: AgentConfig) -> AgentConfig:
        """The child's config: `base` with its persona, and its own budget — never the base's
        (the root's budget reaches a child only through its parent's remainder)."""
        changes: dict[str, object] = {"budget": self.budget}
        if self.persona is not None:
            changes["system_prompt"] = self.persona
        if self.on_interrupted_turn is not None:
            changes["on_interrupted_turn"] = self.on_interrupted_turn
        return attrs.evolve(base, **changes)


# Builds the model a child's options select (called with options whose `selects_model` is true).
ChildModel = Callable[[ChildOptions], "AnyModel"]


def filtered_tools(tools: ToolSet, tool_filter: ToolFilter | None) -> ToolSet:
    """`tools` narrowed to `allow` (when given), without `deny`, in their order."""
    if tool_filter is None:
        return tools
    from ..tools.base import ToolSet

    allow = None if tool_filter.allow is None else set(tool_filter.allow)
    deny = set(tool_filter.deny or ())
    return ToolSet(tool for tool in tools if (allow is None or tool.name in allow) and tool.name not in deny)
