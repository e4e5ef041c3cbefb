"""Subagent descriptor payloads (the data of a `subagent/descriptor` event) for hand-built logs."""

from __future__ import annotations

from typing import Any

from subagents.runtime.delegation.descriptor import SubagentDescriptor, snapshot_descriptor


def descriptor(label: str | None, mode: str = "continuable", provider: str = "spawn") -> dict[str, Any]:
    """The descriptor data a child's log carries, as the runtime writes it."""
    return snapshot_descriptor(SubagentDescriptor(mode=mode, provider=provider, label=label))  # type: ignore[arg-type]  # plain strs from the test tables
