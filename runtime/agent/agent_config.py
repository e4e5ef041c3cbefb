"""What an agent is configured with (runtime/agent/loop.py): its system prompt, step and tool
limits, inbox size, compaction policy and budget."""

from __future__ import annotations

from typing import Literal

import attrs

from ..foundation.budgets import Budget
from ..telemetry.seam import Telemetry
from .compaction import CompactionPolicy
from .tree_ledger import TreeLedger

__all__ = ["DEFAULT_CONFIG", "AgentConfig"]


@attrs.frozen(kw_only=True)
class AgentConfig:
    """An agent's limits and policies; the runtime's default, or a child's from its options."""

    system_prompt: str | None = None
    max_steps: int = 64
    max_parallel_tools: int = 10
    tool_abort_grace: float = 2.0
    inbox_capacity: int = 64
    compaction: CompactionPolicy | None = None
    # Limits on the session's own work (runtime/foundation/budgets.py): the root's from the embedder, a
    # child's from its descriptor.
    budget: Budget | None = None
    # What a resume does with a turn a crash left open (docs/format.md, "Continued turns"):
    # continue it, or close it as interrupted (the closers).
    on_interrupted_turn: Literal["continue", "close"] = "continue"
    # The runtime's running totals of budgets shared down the tree (tree_ledger.py; None: each
    # session counts only its own work, as an agent built outside `open_runtime` does).
    ledger: TreeLedger | None = attrs.field(default=None, eq=False)
    # Tracing (README "Traces (OpenTelemetry)"); None: off, and nothing of it is imported.
    telemetry: Telemetry | None = None


# Frozen: one value serves every agent given no config.
DEFAULT_CONFIG = AgentConfig()
