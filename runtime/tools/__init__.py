"""Model-facing tools that act on the subagent service (SPEC 5.5)."""
